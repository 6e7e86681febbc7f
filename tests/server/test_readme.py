"""The serving examples of the README and of docs/guide/serving.md (the curl call, and each official-client
call, streamed or not, each with a tool) run against ``chatcodec serve`` and give one whole, schema-valid tool
call; the grammar each request is constrained to has a longest text within its ``max_tokens``, so that the call
is whole whatever the model samples (tests/forced.py)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from chatcodec import load_template
from chatcodec.backends import default_model_path
from chatcodec.server.protocol import parse_chat

from .. import forced
from .conftest import Server
from .test_constrain import served_grammar

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SERVING = ROOT / "docs" / "guide" / "serving.md"
#: the fence of a block that is a client of a running server (tests/test_docs.py leaves these to this file)
CLIENT = r'```python title="client.py"\n(.*?)```'
PAGES = pytest.mark.parametrize("page", [README, SERVING], ids=["README.md", "docs/guide/serving.md"])


def _curl() -> str:
    text = SERVING.read_text(encoding="utf-8")
    return next(b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL) if "curl" in b)


def _client(page: Path) -> str:
    (block,) = re.findall(CLIENT, page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return str(block)


def _curl_body() -> dict[str, Any]:
    """The JSON body the curl call sends."""
    (body,) = re.findall(r"-d '(.*?)'", _curl(), flags=re.DOTALL)
    found: dict[str, Any] = json.loads(body)
    return found


def _client_body(page: Path) -> dict[str, Any]:
    """The keyword arguments of the client block's ``create(...)``, its names (``weather``) read from the block."""
    tree = ast.parse(_client(page))
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            (target,) = node.targets
            assert isinstance(target, ast.Name)
            names[target.id] = ast.literal_eval(node.value)
    (call,) = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "create"
    ]
    return {
        keyword.arg: eval(compile(ast.Expression(keyword.value), "block", "eval"), {}, names)
        for keyword in call.keywords
        if keyword.arg is not None
    }


def _parameters(body: dict[str, Any]) -> dict[str, Any]:
    """The parameters schema of the request's one tool."""
    (tool,) = body["tools"]
    parameters: dict[str, Any] = tool["function"]["parameters"]
    return parameters


REQUESTS = {
    "curl": _curl_body,
    "README.md client": lambda: _client_body(README),
    "serving.md client": lambda: _client_body(SERVING),
}


@pytest.fixture(scope="module")
def bounds() -> dict[str, float]:
    """For each request of the pages: the most tokens its forced call takes (the longest text the grammar the
    server builds for it admits, in bytes, then the end token)."""
    smol = load_template(default_model_path())
    return {name: forced.longest(served_grammar(smol, parse_chat(body()))) + 1 for name, body in REQUESTS.items()}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_the_forced_call_of_each_example_is_whole_within_its_max_tokens(name: str, bounds: dict[str, float]) -> None:
    body = REQUESTS[name]()
    assert (body["tool_choice"], body["parallel_tool_calls"], body["temperature"]) == ("required", False, 0)
    assert bounds[name] <= body["max_tokens"], (name, bounds[name])


def test_the_serving_page_says_the_bound_of_its_examples(bounds: dict[str, float]) -> None:
    assert bounds["curl"] == bounds["serving.md client"] == 482
    assert "plus the end token: 482 here" in " ".join(SERVING.read_text(encoding="utf-8").split())


def test_the_readme_starts_with_chatcodec_serve() -> None:
    first = re.search(r"```bash\n(.*?)\n", README.read_text(encoding="utf-8"))
    assert first is not None and first.group(1).endswith("chatcodec serve")


def test_the_serving_page_starts_with_chatcodec_serve() -> None:
    first = re.search(r"```bash\n(.*?)\n", SERVING.read_text(encoding="utf-8"))
    assert first is not None and first.group(1).startswith("chatcodec serve ")


def test_docs_curl_call(embedded: Server) -> None:
    command = _curl().replace("http://127.0.0.1:8000", embedded.url)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    choice = json.loads(done.stdout)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and "invalid_tool_calls" not in choice["message"]
    (call,) = choice["message"]["tool_calls"]  # one call at a time
    assert call["function"]["name"] == "get_current_temperature"
    jsonschema.validate(json.loads(call["function"]["arguments"]), _parameters(_curl_body()))


@PAGES
def test_docs_openai_client_call(page: Path, embedded: Server) -> None:
    code = _client(page).replace("http://127.0.0.1:8000", embedded.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    name, _, arguments = done.stdout.strip().partition(" ")
    assert name == "get_current_temperature"
    jsonschema.validate(json.loads(arguments), _parameters(_client_body(page)))
