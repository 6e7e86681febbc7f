"""The serving examples of the README and of docs/guide/serving.md (the curl call, and each official-client
call, streamed or not, each with a tool) run against ``chatcodec serve`` and give schema-valid tool calls."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from .conftest import Server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SERVING = ROOT / "docs" / "guide" / "serving.md"
SCHEMA = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
#: the fence of a block that is a client of a running server (tests/test_docs.py leaves these to this file)
CLIENT = r'```python title="client.py"\n(.*?)```'


def test_the_readme_starts_with_chatcodec_serve() -> None:
    first = re.search(r"```bash\n(.*?)\n", README.read_text(encoding="utf-8"))
    assert first is not None and first.group(1).endswith("chatcodec serve")


def test_the_serving_page_starts_with_chatcodec_serve() -> None:
    first = re.search(r"```bash\n(.*?)\n", SERVING.read_text(encoding="utf-8"))
    assert first is not None and first.group(1).startswith("chatcodec serve ")


def test_docs_curl_call(embedded: Server) -> None:
    text = SERVING.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL) if "curl" in b)
    command = block.replace("http://127.0.0.1:8000", embedded.url)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    calls = answer["choices"][0]["message"]["tool_calls"]
    # "length" when max_tokens cut a further parallel call (OpenAI's semantics); the calls before it stand
    assert answer["choices"][0]["finish_reason"] in ("tool_calls", "length") and calls
    for call in calls:
        assert call["function"]["name"] == "get_current_temperature"
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


@pytest.mark.parametrize("page", [README, SERVING], ids=["README.md", "docs/guide/serving.md"])
def test_docs_openai_client_call(page: Path, embedded: Server) -> None:
    (block,) = re.findall(CLIENT, page.read_text(encoding="utf-8"), flags=re.DOTALL)
    code = block.replace("http://127.0.0.1:8000", embedded.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    name, _, arguments = done.stdout.strip().partition(" ")
    assert name == "get_current_temperature"
    jsonschema.validate(json.loads(arguments), SCHEMA)
