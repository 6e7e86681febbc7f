"""llama-cpp-python's own server, run with the configuration the engine check chose for this machine.

``python tests/server/engine_server.py ARGS...`` is ``python -m llama_cpp.server ARGS...``, except that where
llama.cpp's default parameters crash (the check fell back to the safe configuration), the server's model is
built without extra buffer types too: the remote-backend tests then run on every machine the embedded ones do.
"""

import runpy
import sys

import llama_cpp

from chatcodec.backends import default_model_path
from chatcodec.backends.probe import choose_engine, engine_params

if __name__ == "__main__":
    choice = choose_engine(default_model_path())
    print(choice.line, file=sys.stderr, flush=True)
    sys.argv[0] = "llama_cpp.server"
    with engine_params(llama_cpp, choice.config):  # this process builds one model, at its start
        runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
