"""``chatcodec inspect`` and ``chatcodec render --polyfill``."""

from __future__ import annotations

import json

from chatcodec import Capabilities, load_template

from ..conftest import CORPUS, require_shared
from .test_render import run

GEMMA2 = str(CORPUS / "templates" / "google-gemma-2-2b-it.jinja")
SYSTEM_CHAT = json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])


def test_inspect_json_has_every_boolean() -> None:
    code, out, err = run(["inspect", "qwen3", "--json"])
    assert code == 0, err
    body = json.loads(out)
    assert body["template"] == "qwen3"
    assert body["capabilities"] == load_template("qwen3").capabilities.to_dict()
    assert all(isinstance(body["capabilities"][flag], bool) for flag in Capabilities.flags())


def test_inspect_table_keeps_the_templates_message() -> None:
    require_shared()
    code, out, err = run(["inspect", GEMMA2])
    assert code == 0, err
    lines = out.decode().splitlines()
    assert "                  system: 'System role not supported' (template line 1)" in lines
    assert "  stop markers    <end_of_turn>" in lines
    assert "  system: 'System role not supported'" in lines  # the capability's message, below the flags


def test_inspect_reads_a_tokenizer_config() -> None:
    require_shared()
    config = CORPUS.parent / "tokenizers" / "qwen3" / "tokenizer_config.json"
    code, out, _ = run(["inspect", str(config), "--json"])
    assert code == 0
    assert "eos_token" in json.loads(out)["capabilities"]["special_tokens"]  # its special tokens are used


def test_inspect_bad_template_is_one_line() -> None:
    code, out, err = run(["inspect", "no-such-template"])
    assert code == 2 and out == b""
    assert err.startswith("chatcodec: error: ") and err.count("\n") == 1


def test_render_polyfill_auto() -> None:
    require_shared()
    code, out, err = run(["render", "-t", GEMMA2, "--polyfill", "auto", "--add-generation-prompt"], stdin=SYSTEM_CHAT)
    assert code == 0, err
    assert out.decode() == "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert "polyfills applied: system_to_user" in err
    code, out, err = run(["render", "-t", GEMMA2, "--polyfill", "auto", "--json"], stdin=SYSTEM_CHAT)
    assert json.loads(out)["polyfills"] == ["system_to_user"]


def test_render_without_polyfill_keeps_the_templates_error() -> None:
    require_shared()
    code, _, err = run(["render", "-t", GEMMA2], stdin=SYSTEM_CHAT)
    assert code == 2 and "System role not supported" in err


def test_render_polyfill_by_name_and_unknown_names() -> None:
    code, out, _ = run(["render", "-t", "qwen3", "--polyfill", "system_to_user"], stdin=SYSTEM_CHAT)
    assert code == 0 and out.decode().startswith("<|im_start|>user\nBe brief.\n\nHi")
    code, out, err = run(["render", "-t", "qwen3", "--polyfill", "nope"], stdin=SYSTEM_CHAT)
    assert code == 2 and out == b"" and "Unknown polyfill 'nope'" in err
