"""``chatcodec serve --mcp-config``: ``{"type": "mcp"}`` tools in ``/v1/responses``, whose calls the server runs.

The request's ``mcp`` tools as the internal request's functions and their 400s (tables); the hosted calls through
the toolbox's call path on a real MCP server (tests/tools/mcp_server.py, a child over stdio); their items and events
as the ``openai`` SDK types them; then one server per module on the embedded model, driven by the ``openai``
client: a forced call whose ``mcp_call`` output is what the MCP tool returned, then the model's answer, whole and
streamed; and no child left once the server stops.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import openai
import pytest
from pydantic import TypeAdapter

from chatcodec import load_template
from chatcodec.backends import default_model_path
from chatcodec.server.chat import Outcome
from chatcodec.server.dialects.responses import EventStream, parse_responses
from chatcodec.server.errors import APIError
from chatcodec.server.hosted import ROUNDS, HostedCall, HostedTools
from chatcodec.tools import Toolbox

from .. import forced
from .conftest import Server, chatcodec_serve
from .test_constrain import served_grammar

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER = ROOT / "tests" / "tools" / "mcp_server.py"
GUIDE = ROOT / "docs" / "guide" / "mcp.md"
MODEL = "SmolLM2-135M-Instruct"
ADD = {"type": "mcp", "server_label": "probe", "allowed_tools": ["add"], "require_approval": "never"}


def _guide(fence: str) -> str:
    """The one block of docs/guide/mcp.md in ``fence``."""
    (block,) = re.findall(f"```{re.escape(fence)}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.DOTALL)
    return str(block)


def _config(path: Path, guide: bool = False) -> Path:
    """A ``{"mcpServers": ...}`` file with the test MCP server labelled probe (and the guide's own servers, run
    from the repository's root with this Python)."""
    servers = {"probe": {"command": sys.executable, "args": [str(MCP_SERVER), "--name=probe"]}}
    if guide:
        for label, entry in json.loads(_guide("json"))["mcpServers"].items():
            servers[label] = {**entry, "command": sys.executable, "cwd": str(ROOT)}
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def toolbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toolbox]:
    """The test MCP server as the server's toolbox holds it, in this process."""
    with Toolbox.from_mcp_config(_config(tmp_path_factory.mktemp("mcp") / "mcp.json"), timeout=20) as box:
        yield box


# --- the request --------------------------------------------------------------------------------------


def test_mcp_tools_become_the_functions_the_model_sees(toolbox: Toolbox) -> None:
    hosted = HostedTools(toolbox)
    own = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    body = {"model": MODEL, "input": "Hi", "tools": [own, ADD], "tool_choice": "required"}
    req = parse_responses(body, hosted=hosted)
    assert [t["function"]["name"] for t in req.chat.tools or []] == ["lookup", "add"]
    add = (req.chat.tools or [])[1]["function"]
    assert add["parameters"]["required"] == ["a", "b"] and add["description"].startswith("Add two numbers")
    assert [(m.server_label, list(m.tools)) for m in req.mcp] == [("probe", ["add"])]
    everything = parse_responses({**body, "tools": [{"type": "mcp", "server_label": "probe"}]}, hosted=hosted)
    assert {t["function"]["name"] for t in everything.chat.tools or []} >= {"echo", "add", "fail", "pid"}
    by_filter = {**ADD, "allowed_tools": {"tool_names": ["echo"]}}
    assert list(parse_responses({**body, "tools": [by_filter]}, hosted=hosted).mcp[0].tools) == ["echo"]


#: (the mcp tool, the field the 400 names, words of its message)
BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"type": "mcp", "server_label": "nowhere"}, "tools[0].server_label", "'nowhere' is not an MCP server"),
    ({**ADD, "require_approval": "always"}, "tools[0].require_approval", "does not support approvals"),
    ({**ADD, "require_approval": {"never": {"tool_names": ["add"]}}}, "tools[0].require_approval", "approvals"),
    ({**ADD, "allowed_tools": ["add", "mul"]}, "tools[0].allowed_tools", "'mul', which the MCP server 'probe'"),
    ({**ADD, "allowed_tools": "add"}, "tools[0].allowed_tools", "list of tool names"),
    ({**ADD, "server_url": "https://example.com/mcp"}, "tools[0].server_url", "runs the MCP servers it was started"),
    ({"type": "mcp"}, "tools[0].server_label", "must name one of this server's MCP servers"),
]


@pytest.mark.parametrize(("tool", "param", "words"), BAD)
def test_bad_mcp_tools_are_400s_naming_the_field(
    toolbox: Toolbox, tool: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(APIError) as caught:
        parse_responses({"model": MODEL, "input": "Hi", "tools": [tool]}, hosted=HostedTools(toolbox))
    assert (caught.value.status, caught.value.param) == (400, param) and words in caught.value.message
    assert "\n" not in caught.value.message


def test_a_server_without_mcp_config_names_no_mcp_server() -> None:
    with pytest.raises(APIError, match="'probe' is not an MCP server of this server \\(none: start it with --mcp"):
        parse_responses({"model": MODEL, "input": "Hi", "tools": [ADD]})
    clash = SimpleNamespace(mcp_servers={"probe": {"add": {"name": "add", "parameters": {"type": "object"}}}})
    own = {"type": "function", "name": "add"}
    with pytest.raises(APIError, match="a function named 'add', as a tool of the MCP server 'probe'"):
        parse_responses({"model": MODEL, "input": "Hi", "tools": [own, ADD]}, hosted=HostedTools(cast(Any, clash)))


# --- the calls and their items ----------------------------------------------------------------------------


def test_hosted_calls_go_through_the_toolbox_call_path(toolbox: Toolbox) -> None:
    hosted = HostedTools(toolbox)
    calls = [
        HostedCall("call_1", "probe", "add", '{"a": 2, "b": 40}'),
        HostedCall("call_2", "probe", "fail", '{"reason": "no"}'),
        HostedCall("call_3", "probe", "add", '{"a": "two"}'),
        HostedCall("call_4", "probe", "echo", '{"text": "hi"}'),
    ]
    done = asyncio.run(hosted.call(calls))
    assert [c.status for c in done] == ["completed", "failed", "failed", "completed"]
    assert json.loads(done[0].output or "") == {"sum": 42} and done[0].error is None
    assert "Error executing tool fail" in (done[1].error or "") and done[1].output is None
    assert "invalid arguments for add" in (done[2].error or "")
    assert json.loads(done[3].output or "") == {"result": "probe: hi"}


def _events(chunks: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(chunk.decode().split("\ndata: ", 1)[1]) for chunk in chunks]


def test_the_items_and_events_of_hosted_calls(toolbox: Toolbox) -> None:
    hosted = HostedTools(toolbox)
    req = parse_responses({"model": MODEL, "input": "Hi", "tools": [ADD]}, hosted=hosted)
    stream = EventStream(req, "resp_1", MODEL)
    calls = [HostedCall("call_1", "probe", "add", '{"a": 1, "b": 2}'), HostedCall("call_2", "probe", "fail", "{}")]
    chunks = stream.start() + stream.listed(req.mcp)
    for call in calls:
        chunks += stream.hosted(call)
    for call in asyncio.run(hosted.call(calls)):
        chunks += stream.hosted(call)
    chunks += stream.finish(Outcome(None, None, [], [], "stop", 10, 5))
    chunks.append(stream.closing())
    events = _events(chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [(e["type"], e.get("output_index")) for e in events] == [
        ("response.created", None),
        ("response.in_progress", None),
        ("response.output_item.added", 0),
        ("response.mcp_list_tools.in_progress", 0),
        ("response.mcp_list_tools.completed", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.mcp_call.in_progress", 1),
        ("response.mcp_call_arguments.done", 1),
        ("response.output_item.added", 2),
        ("response.mcp_call.in_progress", 2),
        ("response.mcp_call_arguments.done", 2),
        ("response.mcp_call.completed", 1),
        ("response.output_item.done", 1),
        ("response.mcp_call.failed", 2),
        ("response.output_item.done", 2),
        ("response.completed", None),
    ]
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    for event in events:  # the SDK reads each event as its own type
        assert adapter.validate_python(event).type == event["type"]
    listing, added, failed = (i for i in events[-1]["response"]["output"])
    assert [t["name"] for t in listing["tools"]] == ["add"] and listing["server_label"] == "probe"
    assert (added["status"], json.loads(added["output"]), added["error"]) == ("completed", {"sum": 3}, None)
    assert failed["status"] == "failed" and failed["output"] is None
    assert "'reason' is a required property" in failed["error"]["content"][0]["text"]


def test_the_rounds_limit_is_documented_in_the_serve_help() -> None:
    from chatcodec.cli import serve

    parser = __import__("argparse").ArgumentParser()
    serve.configure(parser)
    assert f"(default: {ROUNDS})" in " ".join(parser.format_help().split())


# --- end to end, on the embedded model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The embedded model with the test MCP server, two rounds per request (a forced call, then the answer)."""
    tmp = tmp_path_factory.mktemp("mcp-serve")
    server = chatcodec_serve(
        tmp,
        "--mcp-config",
        str(_config(tmp / "mcp.json", guide=True)),
        "--mcp-rounds",
        "2",
        "--responses-store",
        str(tmp / "responses.sqlite3"),
        name="mcp-serve",
    )
    yield server
    server.stop()


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=600, max_retries=0)


def _request(**extra: Any) -> dict[str, Any]:
    return dict(
        model=MODEL,
        input="Add two and three.",
        tools=[ADD],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=forced.CALL_TOKENS,  # one call of add, its two integers at most 17 bytes each
        temperature=0,  # greedy: the same call and answer every run (sampled, the model can end with no text)
        **extra,
    )


def test_the_forced_call_of_the_requests_here_always_finishes(toolbox: Toolbox) -> None:
    """The forced call of :func:`_request` has a bound (integers of at most 16 digits, one call): within its
    max_output_tokens whatever the model writes (tests/forced.py)."""
    req = parse_responses(_request(), hosted=HostedTools(toolbox))
    grammar = served_grammar(load_template(default_model_path()), req.chat)
    assert forced.longest(grammar) + 1 <= _request()["max_output_tokens"]


def _children(pid: int) -> list[int]:
    """The process ids of ``pid``'s children (Linux)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _mcp_children(server: Server) -> list[int]:
    """The server's MCP children: the test server and the guide's (examples/temperature_mcp.py)."""
    found = []
    for child in _children(server.process.pid):
        line = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace")
        if str(MCP_SERVER) in line or "examples/temperature_mcp.py" in line:
            found.append(child)
    return found


def _temperature() -> Any:
    """examples/temperature.py, whose functions are the tools of the guide's MCP server."""
    spec = importlib.util.spec_from_file_location("temperature_example", ROOT / "examples" / "temperature.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_guide_answer(response: Any, printed: str) -> None:
    """What the code guarantees of the guide's request. Its tool's location is a free string, so no
    max_output_tokens holds every call (on another CPU the model may write a longer one): either the call ran and
    the model answered (an answer max_output_tokens may cut), or max_output_tokens cut the call, which was not run,
    and the response ended there."""
    kinds = [item.type for item in response.output]
    listing = response.output[0]
    assert kinds[0] == "mcp_list_tools" and listing.server_label == "temperature", kinds
    assert [t.name for t in listing.tools] == ["get_current_temperature"]
    assert printed.endswith(response.output_text + "\n") and response.usage.input_tokens > 0
    if "mcp_call" not in kinds:  # cut before a call was whole: its text, if the cut came before the tool's name
        assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
        assert kinds in (["mcp_list_tools"], ["mcp_list_tools", "message"]), kinds
        assert response.usage.output_tokens == response.max_output_tokens
        return
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    call = response.output[1]
    assert (call.server_label, call.name, call.status, call.error) == (
        "temperature",
        "get_current_temperature",
        "completed",
        None,
    )
    returned = _temperature().get_current_temperature(**json.loads(call.arguments))
    assert json.loads(call.output) in (returned, {"result": returned})  # what the function behind the tool gives
    # the last round is asked with tool_choice "none": an answer whose first character is not a call's "{"
    assert response.output_text and response.usage.output_tokens > 0
    if response.status != "completed":
        assert (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")


def test_the_guides_client_runs_a_forced_mcp_call_and_the_model_answers(
    served: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/guide/mcp.md's client, as it stands, against the server started with the guide's configuration."""
    before = _mcp_children(served)
    space: dict[str, Any] = {"__name__": "client"}
    exec(
        compile(_guide('python title="client.py"').replace("http://127.0.0.1:8000", served.url), "client", "exec"),
        space,
    )
    space["client"].close()  # its connections, before the next test's warnings are errors
    response = space["response"]
    assert len(before) == 2 and _mcp_children(served) == before  # the sessions opened at start serve the calls
    check_guide_answer(response, capsys.readouterr().out)
    # the stored response is the same answer, its conversation holding the call and its result
    with _client(served) as sdk:
        stored = sdk.responses.retrieve(response.id)
    assert [item.type for item in stored.output] == [item.type for item in response.output]


def test_a_streamed_mcp_call_gives_its_events_in_order(served: Server) -> None:
    with _client(served) as sdk:
        events = list(sdk.responses.create(**_request(stream=True)))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events if not e.type.endswith(".delta")]
    at = kinds.index("response.mcp_call.in_progress")
    assert kinds[:at] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.mcp_list_tools.in_progress",
        "response.mcp_list_tools.completed",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert kinds[at : at + 4] == [
        "response.mcp_call.in_progress",
        "response.mcp_call_arguments.done",
        "response.mcp_call.completed",
        "response.output_item.done",
    ]
    assert kinds[at + 4] == "response.output_item.added" and kinds[-1] in ("response.completed", "response.incomplete")
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    final = events[-1].response  # type: ignore[union-attr]
    call, message = final.output[1], final.output[-1]
    assert call.type == "mcp_call" and message.type == "message"
    arguments = json.loads(call.arguments)
    assert json.loads(call.output or "") == {"sum": arguments["a"] + arguments["b"]}
    assert "".join(d.delta for d in deltas) == final.output_text and final.output_text.strip()  # type: ignore[union-attr]


def test_bad_mcp_tools_over_http_are_400s(served: Server) -> None:
    elsewhere = "'elsewhere' is not an MCP server of this server \\('probe', 'temperature'\\)"
    with _client(served) as sdk:
        with pytest.raises(openai.BadRequestError, match=elsewhere):
            sdk.responses.create(model=MODEL, input="Hi", tools=[{"type": "mcp", "server_label": "elsewhere"}])
        with pytest.raises(openai.BadRequestError, match="does not support approvals"):
            sdk.responses.create(model=MODEL, input="Hi", tools=[{**ADD, "require_approval": "always"}])  # type: ignore[list-item]


def test_the_mcp_server_runs_as_long_as_the_server(served: Server) -> None:
    """Last in this module: it stops the module's server. The MCP session was opened once, at start (one child, the
    same before and after the requests), and closes with the server: no child is left."""
    children = _mcp_children(served)
    assert len(children) == 2
    served.stop()
    assert served.process.returncode in (0, -15)  # uvicorn ends by raising the SIGTERM it was stopped with again
    deadline = time.monotonic() + 20
    while any(Path(f"/proc/{child}").exists() for child in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [child for child in children if Path(f"/proc/{child}").exists()] == []
    assert "MCP server 'probe': echo, add, fail" in served.log.read_text(errors="replace")
