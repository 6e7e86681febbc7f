"""chatcodec show's page: its spans and tokens, that it is self-contained, and what Chromium shows of it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import chatcodec
from chatcodec import load_template
from chatcodec.inspection.page import build_page, layout

from ..conftest import require_shared
from .browser import Browser, find_chromium
from .conftest import QWEN3_TOKENIZER

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Capital of France? <|im_end|>"},
    {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy one."},
    {"role": "user", "content": "Thanks"},
]


def test_layout_with_the_real_tokenizer() -> None:
    require_shared()
    codec = chatcodec.load(QWEN3_TOKENIZER)
    data = layout(codec.template, CHAT, codec=codec, add_generation_prompt=True)
    encoding = codec.encode(CHAT, add_generation_prompt=True)
    assert data.text == encoding.text
    assert data.counts == encoding.message_token_counts
    assert data.tokens is not None
    assert [t[2] for t in data.tokens] == encoding.input_ids
    assert [int(t[3]) for t in data.tokens] == encoding.assistant_mask
    # each message's span holds its text; the spans follow each other
    for message, (start, end) in zip(CHAT, data.spans, strict=True):
        assert message["content"] in data.text[start:end]
    assert all(a[1] <= b[0] for a, b in zip(data.spans, data.spans[1:], strict=False))
    # the user's <|im_end|> is content (escaped), the template's are special tokens
    user_end = data.text.index("<|im_end|>", data.text.index("France?"))
    assert (user_end, user_end + len("<|im_end|>")) in data.escaped
    assert all(start != user_end for start, _ in data.specials)
    assert sum(data.text[s:e] == "<|im_end|>" for s, e in data.specials) == 4


def test_layout_without_a_tokenizer_still_finds_the_messages() -> None:
    data = layout(load_template("qwen3"), CHAT, add_generation_prompt=True)
    assert data.tokens is None and data.counts is None
    assert [data.text[s:e].split("\n")[0] for s, e in data.spans] == [
        "<|im_start|>system",
        "<|im_start|>user",
        "<|im_start|>assistant",
        "<|im_start|>user",
    ]
    assert data.text.endswith("<|im_start|>assistant\n") and data.spans[-1][1] < len(data.text)


def _page(tmp_path: Path) -> Path:
    codec = chatcodec.load(QWEN3_TOKENIZER)
    data = layout(codec.template, CHAT, codec=codec, add_generation_prompt=True)
    html = build_page(
        data, title="qwen3 test", report=chatcodec.inspect(codec.template), findings=chatcodec.lint(codec.template)
    )
    path = tmp_path / "page.html"
    path.write_text(html, encoding="utf-8")
    return path


def test_the_page_refers_to_nothing_outside_itself(tmp_path: Path) -> None:
    require_shared()
    html = _page(tmp_path).read_text(encoding="utf-8")
    assert not re.search(r"\b(src|href)\s*=|url\(|@import|<script|<link|https?://", html, re.IGNORECASE)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def _chromium() -> str:
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("chromium is not installed here (apt-get install -y chromium)")
    return binary


def test_chromium_shows_the_text_the_legend_and_the_mask_and_fetches_nothing(tmp_path: Path) -> None:
    require_shared()
    page = _page(tmp_path)
    with Browser(_chromium()) as browser:
        browser.open(page)
        assert browser.requests() == [page.resolve().as_uri()]  # the page itself, and nothing else
        visible = """(el) => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
            return r.width > 0 && r.height > 0 && s.visibility === 'visible' && s.display !== 'none'
                && parseFloat(s.opacity) > 0 && r.top < window.innerHeight * 4; }"""
        legend = browser.evaluate(f"({visible})(document.getElementById('legend'))")
        assert legend is True
        assert "trained (assistant mask = 1)" in browser.evaluate("document.getElementById('legend').innerText")
        prompt_text = browser.evaluate("document.getElementById('prompt').innerText")
        for message in CHAT:
            assert message["content"] in prompt_text
        assert browser.evaluate(f"({visible})(document.getElementById('prompt'))") is True
        # every message span is visible, coloured by its role
        roles = browser.evaluate(
            f"Array.from(document.querySelectorAll('#prompt .msg[data-message]')).filter({visible})"
            ".map(el => [el.dataset.message, el.className, getComputedStyle(el).backgroundColor])"
        )
        assert [r[0] for r in roles] == ["0", "1", "2", "3"]
        assert len({r[2] for r in roles[:3]}) == 3  # system, user, assistant: three colours
        # the trained tokens are underlined, visible, and exactly the mask's tokens
        trained = browser.evaluate(
            f"Array.from(document.querySelectorAll('#prompt .tok.trained')).filter({visible})"
            ".map(el => [el.innerText, getComputedStyle(el).textDecorationLine])"
        )
        codec = chatcodec.load(QWEN3_TOKENIZER)
        encoding = codec.encode(CHAT, add_generation_prompt=True)
        masked = [t for t, m in zip(encoding.tokens, encoding.assistant_mask, strict=True) if m and t.strip()]
        assert [t for t, _ in trained if t.strip()] == masked
        assert all("underline" in decoration for _, decoration in trained)
        assert "Paris." in "".join(t for t, _ in trained)
        # special tokens stand out from the text around them
        special = browser.evaluate(
            "[getComputedStyle(document.querySelector('#prompt .special')).fontWeight,"
            " getComputedStyle(document.querySelector('#prompt')).fontWeight]"
        )
        assert int(special[0]) > int(special[1])


def test_the_request_log_catches_a_page_that_fetches(tmp_path: Path) -> None:
    """The check above can fail: a page that loads an image is caught asking for it."""
    page = tmp_path / "fetching.html"
    page.write_text('<!DOCTYPE html><img src="http://127.0.0.1:9/pixel.png"><p>hi</p>', encoding="utf-8")
    with Browser(_chromium()) as browser:
        browser.open(page)
        assert browser.requests() == [page.resolve().as_uri(), "http://127.0.0.1:9/pixel.png"]
