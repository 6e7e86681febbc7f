"""A stand-in for the engine check's probe child, driven by the environment (tests/engine/test_probe.py).

FAKE_PROBE_LOG: a file each run appends its configuration to. FAKE_PROBE_CRASH: the configurations that die
(``default:SIGSEGV,safe:SIGILL``); FAKE_PROBE_HANG: the ones that never answer. The others print one JSON
line as the real child does.
"""

import json
import os
import signal
import sys
import time

config = sys.argv[sys.argv.index("--config") + 1]
with open(os.environ["FAKE_PROBE_LOG"], "a", encoding="utf-8") as log:
    log.write(config + "\n")
crashes = dict(item.split(":") for item in os.environ.get("FAKE_PROBE_CRASH", "").split(",") if item)
if config in crashes:
    sys.stdout.flush()
    signal.signal(getattr(signal, crashes[config]), signal.SIG_DFL)
    os.kill(os.getpid(), getattr(signal, crashes[config]))
if config in os.environ.get("FAKE_PROBE_HANG", "").split(","):
    time.sleep(60)
if config in os.environ.get("FAKE_PROBE_FAIL", "").split(","):
    print("llama_model_load: error loading model: bad magic", file=sys.stderr)
    sys.exit(1)
print(json.dumps({"config": config, "tokens_per_second": 123.4, "system_info": "CPU : FAKE = 1"}))
