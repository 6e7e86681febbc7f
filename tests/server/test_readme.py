"""The README's Serve examples (the curl call and the openai client call, each with a tool) run against
``chatcodec serve`` and give schema-valid tool calls."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema

from .conftest import Server

README = Path(__file__).resolve().parents[2] / "README.md"
SCHEMA = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}


def serve_section() -> str:
    text = README.read_text(encoding="utf-8")
    return text[text.index("## Serve\n") : text.index("\n## ", text.index("## Serve\n") + 1)]


def test_the_readme_starts_with_chatcodec_serve() -> None:
    first = re.search(r"```bash\n(.*?)\n", README.read_text(encoding="utf-8"))
    assert first is not None and first.group(1).endswith("chatcodec serve")


def test_readme_curl_call(embedded: Server) -> None:
    block = next(b for b in re.findall(r"```bash\n(.*?)```", serve_section(), flags=re.DOTALL) if "curl" in b)
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


def test_readme_openai_client_call(embedded: Server) -> None:
    (block,) = re.findall(r"```python client\n(.*?)```", serve_section(), flags=re.DOTALL)
    code = block.replace("http://127.0.0.1:8000", embedded.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    name, _, arguments = done.stdout.partition(" ")
    assert name == "get_current_temperature"
    jsonschema.validate(json.loads(arguments), SCHEMA)
