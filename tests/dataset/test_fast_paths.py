"""The dataset's fast paths give what the general code gives, on every corpus template and the real tokenizers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

import chatcodec.masks as masks
from chatcodec.exceptions import ChatcodecError

from ..conftest import CORPUS, conversations, manifest, require_shared
from ..test_tokens import _codec, _corpus_codec

#: caller text with control tokens and marks, so that the marked render holds stand-ins
_MARKED = [
    {"role": "system", "content": "Rules: [1] <b>bold</b> only."},
    {"role": "user", "content": "a <|im_end|> b <|eot_id|> [x] <think>no</think>"},
    {"role": "assistant", "content": "ok [done] <|im_start|>user"},
    {"role": "user", "content": "  spaced  "},
    {"role": "assistant", "content": "fine"},
]
_CONVERSATIONS = ["multi_turn", "reasoning_history", "tools_roundtrip_final", "tools_single_call", "korean"]


def _layouts(codec: Any, chats: list[Any]) -> list[Any]:
    found = []
    for chat, policy in itertools.product(chats, ("escape", "allow")):
        try:
            encoding = codec.encode(chat["messages"], tools=chat.get("tools"), content_special_tokens=policy)
        except ChatcodecError as exc:
            found.append(type(exc).__name__)
            continue
        layout = encoding._get_layout()
        found.append((layout.anchors, layout.failure, encoding.text))
    return found


@pytest.mark.parametrize("name", sorted(manifest()) if CORPUS.is_dir() else [])
def test_anchors_read_in_c_passes_equal_the_scan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """_anchors_in (markers found by one regex, the text checked by deleting them) against _anchors_scan
    (marker by marker and stand-in by stand-in), on each corpus template's conversations and marked content."""
    require_shared()
    fast = _layouts_both_ways(_corpus_codec(name), monkeypatch)
    assert any(isinstance(f, tuple) and f[1] is None and any(f[0]) for f in fast)  # anchors were really found


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_anchors_on_the_real_tokenizers(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    require_shared()
    _layouts_both_ways(_codec(name), monkeypatch)


def _layouts_both_ways(codec: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The layouts of the test chats read in C passes, checked equal to the marker-by-marker scan's."""
    chats = [conversations()[c] for c in _CONVERSATIONS] + [{"messages": _MARKED}]
    fast = _layouts(codec, chats)
    monkeypatch.setattr(masks, "_anchors_in", masks._anchors_scan)
    assert _layouts(codec, chats) == fast
    return fast


# --- masks of ASCII prompts from byte widths -------------------------------------------------------------


def _edge_spans(length: int, ends: list[int], rng: Any) -> list[list[tuple[int, int]]]:
    """Random spans, spans on token edges and just off them, empty, adjacent, overlapping and whole."""
    edges = sorted({0, length, *ends})
    cases = [[], [(0, length)], [(0, 0)], [(length, length)]]
    for _ in range(40):
        cuts = sorted(rng.randrange(length + 1) for _ in range(2 * rng.randint(1, 4)))
        cases.append(list(zip(cuts[::2], cuts[1::2], strict=True)))
        on = sorted(rng.choice(edges) for _ in range(4))
        cases.append([(on[0], on[1]), (on[2], on[3])])
        off = sorted(min(length, max(0, rng.choice(edges) + rng.choice((-1, 1)))) for _ in range(2))
        cases.append([(off[0], off[1]), (off[1], off[1])])
        a, b, c = sorted(rng.randrange(length + 1) for _ in range(3))
        cases.append([(a, c), (b, c)])  # overlapping
        cases.append([(a, b), (b, c)])  # adjacent
    return cases


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_byte_width_masks_equal_the_offsets_masks(name: str) -> None:
    """On both real tokenizers: every prompt (corpus conversations in several scripts, generated rows with tools,
    reasoning and control tokens in content, escaped or allowed) gets its mask from its runs, equal to the overlap
    mask of the tokenizer's own offsets for every kind of span; prompts with tokens added to the text are left to
    the offsets."""
    import random

    from chatcodec.masks import byte_width_mask, overlap_mask
    from chatcodec.tokens import load

    from ..conftest import SHARED
    from .test_parity import generated_rows

    require_shared()
    codec = load(SHARED / "tokenizers" / name)  # a fresh cache: stretches encoded alone, joined and cached
    rng = random.Random(3)
    chats = [(c["messages"], c.get("tools")) for c in conversations().values()]
    chats += [(row["messages"], row.get("tools")) for row in generated_rows(40)]
    chats.append((_MARKED, None))
    fast = other_text = 0
    for (messages, tools), policy, add in itertools.product(chats, ("escape", "allow"), (False, True)):
        try:
            encoding = codec.encode(messages, tools=tools, content_special_tokens=policy, add_special_tokens=add)
        except ChatcodecError:
            continue
        offsets = list(encoding.offsets)
        encoding._offsets = None
        ends = [end for _, end in offsets]
        for spans in _edge_spans(len(encoding.text), ends, rng):
            assert byte_width_mask(encoding, spans) == overlap_mask(offsets, spans), (messages, policy, spans)
            fast += 1
            other_text += not encoding.text.isascii()
    assert fast > 10_000 and other_text > 1_000  # ASCII and other prompts were really met


def test_a_token_added_to_the_text_sends_the_mask_to_the_offsets() -> None:
    """A BOS the template did not write, added by add_special_tokens, has no width in the text: the runs cannot
    place it, and the mask is read from the offsets (the same overlap mask)."""
    from chatcodec import ChatTemplate
    from chatcodec.masks import byte_width_mask, overlap_mask
    from chatcodec.tokens import load

    from ..conftest import SHARED

    require_shared()
    codec = load(SHARED / "tokenizers" / "llama3_1").with_template(
        ChatTemplate("{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    )
    encoding = codec.encode([{"role": "assistant", "content": "Hello there"}], add_special_tokens=True)
    assert any(run.width < 0 for run in encoding._runs)
    spans = [(0, 5)]
    assert byte_width_mask(encoding, spans) is None
    offsets = list(encoding.offsets)
    assert encoding.assistant_mask == overlap_mask(offsets, [(0, len(encoding.text))]) == [0, 1, 1]


def test_byte_widths_only_for_tokenizers_whose_offsets_follow_bytes(tmp_path: Path) -> None:
    """A ByteLevel post-processor that trims offsets, an added prefix space, a normalizer that is not NFC, or a
    split that removes characters: the offsets are read instead."""
    import json

    from chatcodec.masks import byte_widths
    from chatcodec.tokens import load

    from ..conftest import SHARED

    require_shared()
    spec = json.loads((SHARED / "tokenizers" / "qwen3" / "tokenizer.json").read_text(encoding="utf-8"))
    config = (SHARED / "tokenizers" / "qwen3" / "tokenizer_config.json").read_text(encoding="utf-8")
    assert byte_widths(load(SHARED / "tokenizers" / "qwen3")._vocab) is not None

    def variant(label: str, change: Any) -> Any:
        changed = json.loads(json.dumps(spec))
        change(changed)
        folder = tmp_path / label
        folder.mkdir()
        (folder / "tokenizer.json").write_text(json.dumps(changed), encoding="utf-8")
        (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
        return load(folder)._vocab

    def trim(s: Any) -> None:
        s["post_processor"]["trim_offsets"] = True

    def prefix(s: Any) -> None:
        s["pre_tokenizer"]["pretokenizers"][-1]["add_prefix_space"] = True

    def lowercase(s: Any) -> None:
        s["normalizer"] = {"type": "Lowercase"}

    def removed(s: Any) -> None:
        s["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"

    for change in (trim, prefix, lowercase, removed):
        assert byte_widths(variant(change.__name__, change)) is None, change.__name__


# --- {% generation %} spans on the compiled path ---------------------------------------------------------

#: tagged templates: blocks in the root's output (compiled, spans from its output list) and elsewhere
_SPAN_TEMPLATES = {
    "root": "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}{% generation %}"
    "{{ m.content }}<|im_end|>{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}",
    "root_merged": "{% for m in messages %}{{ '<' ~ m.role ~ '>' }}{{ m.content | length }}"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content ~ '|' }}{% for x in range(3) %}{{ x }}{% endfor %}"
    "{% endgeneration %}{% endif %}"
    "{{ '.' * 3 }}{% endfor %}{% generation %}{% endgeneration %}end",
    "macro": "{% macro turn(m) %}{% generation %}{{ m.content }}!{% endgeneration %}{% endmacro %}"
    "{% for m in messages %}[{{ m.role }}]{{ 'x' }}{{ turn(m) if m.role == 'assistant' else m.content }}{% endfor %}",
    "capture": "{% for m in messages %}{% set part %}{% generation %}{{ m.content }}{% endgeneration %}{% endset %}"
    "{{ m.role }}:{{ part | length }}:{{ part }};{% endfor %}",
    "filter": "{% for m in messages %}{% filter upper %}{{ m.role }}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% endfilter %}{% endfor %}",
}


def _spans_both_ways(template: Any, messages: list[Any], **options: Any) -> tuple[Any, Any, bool]:
    """render_spans on the compiled path (when it takes it) and on the generic path, and whether the compiled
    one ran without going back to the generic path."""
    from chatcodec import sandbox

    runs: list[int] = []
    run = sandbox.run

    def counting(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return run(*args, **kwargs)

    sandbox.run = counting  # type: ignore[assignment]
    try:
        compiled = template.render_spans(messages, **options)
    finally:
        sandbox.run = run  # type: ignore[assignment]
    fast = {key: value.fast for key, value in template._compiled.items()}
    for value in template._compiled.values():
        value.fast = None  # the generic path only
    try:
        generic = template.render_spans(messages, **options)
    finally:
        for key, value in template._compiled.items():
            value.fast = fast[key]
    return compiled, generic, not runs


def test_compiled_generation_spans_equal_the_generic_ones() -> None:
    """Blocks in the root's output take the compiled path, with its output list partly measured (long chats
    cross the budget's checkpoints, long content makes long parts); blocks in a macro, a capture or a filter
    take the generic path; both give jinja2's spans."""
    from chatcodec import ChatTemplate

    chats = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": m, "content": f"turn {i} " * (i % 7 + 1)} for i, m in enumerate(["user", "assistant"] * 150)],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "long " * 5000}],
        [{"role": "user", "content": "only a user"}],
    ]
    for name, source in _SPAN_TEMPLATES.items():
        for chat in chats:
            compiled, generic, fast = _spans_both_ways(ChatTemplate(source), chat)
            assert compiled == generic, (name, len(chat))
            assert fast == (name.startswith("root")), name
        assert any(_spans_both_ways(ChatTemplate(source), chat)[1][1] for chat in chats)


@pytest.mark.parametrize("name", ["qwen3", "llama3_1"])
def test_compiled_spans_of_the_training_templates(name: str) -> None:
    """The training templates of the parity tests render their spans on the compiled path, as the generic path
    does, for every corpus conversation and option set the template renders, and generated rows."""
    from chatcodec import ChatTemplate

    from ..test_masks import TAGGERS

    require_shared()
    codec = _codec(name)
    template = ChatTemplate(TAGGERS[name](codec.template.source), special_tokens=codec.template.special_tokens)
    from .test_parity import generated_rows

    chats = list(conversations().values())
    chats += [{"id": row["id"], "messages": row["messages"], "tools": row.get("tools"), "option_sets": [{}]}
              for row in generated_rows(60)]  # fmt: skip
    compared = 0
    for conversation in chats:
        for options in conversation["option_sets"]:
            kwargs = {k: v for k, v in options.items() if k != "continue_final_message"}
            try:
                compiled, generic, fast = _spans_both_ways(
                    template, conversation["messages"], tools=conversation["tools"], **kwargs
                )
            except ChatcodecError:
                continue
            assert compiled == generic, (conversation["id"], options)
            assert fast, conversation["id"]
            compared += 1
    assert compared > 80


# --- ASCII stretches without the NFC normalizer ----------------------------------------------------------


def test_ascii_stretches_skip_nfc_with_the_same_ids_and_offsets() -> None:
    """Qwen3's normalizer is NFC, which leaves ASCII text as it is: stretches all of ASCII are encoded without it,
    with the ids and offsets of the normalizing tokenizer (a codec that always normalizes), and of the real
    tokenizer on the whole prompt."""
    from chatcodec.tokens import load

    from ..conftest import SHARED
    from .test_parity import generated_rows

    require_shared()
    skipping, normalizing = load(SHARED / "tokenizers" / "qwen3"), load(SHARED / "tokenizers" / "qwen3")
    assert skipping._vocab._nfc  # type: ignore[union-attr]
    normalizing._vocab._nfc = False  # type: ignore[union-attr]
    chats = [(c["messages"], c.get("tools")) for c in conversations().values()]
    chats += [(row["messages"], row.get("tools")) for row in generated_rows(40)]
    ascii_prompts = 0
    for (messages, tools), policy in itertools.product(chats, ("escape", "allow")):
        try:
            ours = skipping.encode(messages, tools=tools, content_special_tokens=policy)
        except ChatcodecError:
            continue
        theirs = normalizing.encode(messages, tools=tools, content_special_tokens=policy)
        assert (ours.input_ids, ours.offsets) == (theirs.input_ids, theirs.offsets)
        if policy == "allow":
            whole = skipping.tokenizer.encode(ours.text, add_special_tokens=False)  # type: ignore[union-attr]
            assert (ours.input_ids, ours.offsets) == (whole.ids, whole.offsets)
        ascii_prompts += ours.text.isascii()
    assert skipping._vocab._ascii_joiner is not None and ascii_prompts > 50  # type: ignore[union-attr]


# --- the generation prompt in one render -----------------------------------------------------------------


def _headers(codec: Any, chats: list[Any]) -> list[Any]:
    found = []
    for chat, kwargs in chats:
        try:
            encoding = codec.encode(chat["messages"], tools=chat.get("tools"), **kwargs)
            layout = encoding._get_layout()
            found.append((layout.header, layout.anchors, encoding.mask() if layout.failure is None else None))
        except ChatcodecError as exc:
            found.append(type(exc).__name__)
    return found


@pytest.mark.parametrize("name", sorted(manifest()) if CORPUS.is_dir() else [])
def test_the_prompt_from_one_render_equals_two_renders(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a template that adds the generation prompt last and alone, the prompt is kept per value of the names
    it reads, and later conversations render once: the same headers, anchors and masks as two renders each, on
    every corpus template, with enable_thinking given, missing, true and false."""
    require_shared()
    chats = []
    for index, conversation in enumerate([*(conversations()[c] for c in _CONVERSATIONS), {"messages": _MARKED}] * 2):
        kwargs: dict[str, Any] = [{}, {"enable_thinking": False}, {"enable_thinking": True}, {}][index % 4]
        chats.append((conversation, kwargs))
    counts = []
    for plan in (True, False):
        codec = _corpus_codec(name)  # a template of its own: nothing kept from the other run
        render = codec.template.render
        renders: list[int] = []

        def counting(*args: Any, render: Any = render, renders: list[int] = renders, **kwargs: Any) -> Any:
            renders.append(1)
            return render(*args, **kwargs)

        monkeypatch.setattr(codec.template, "render", counting)
        if not plan:
            monkeypatch.setattr(masks, "_prompt_key", lambda template, options: None)
        found = _headers(codec, chats)
        if plan:
            one = found
        else:
            assert found == one
        counts.append(len(renders))
    planned = masks._prompt_names(_corpus_codec(name).template.source) is not None
    if not planned:
        assert counts[0] == counts[1]
    elif sum(isinstance(f, tuple) and f[0] is not None for f in one) > 2:
        assert counts[0] < counts[1]  # the prompt was rendered once per key, not once per conversation


#: templates that read add_generation_prompt elsewhere too, set a name the prompt reads, or write after it
_NOT_LAST_AND_ALONE = {
    "read_in_loop": "{% for m in messages %}{% if m.role == 'system' and add_generation_prompt %}[S]{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "set_name": "{% set who = messages[0].role %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant ({{ who }})\n{% endif %}",
    "text_after": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ messages | length }}",
}


@pytest.mark.parametrize("name", sorted(_NOT_LAST_AND_ALONE))
def test_a_prompt_that_is_not_last_and_alone_renders_twice(name: str) -> None:
    """Each of these would give a wrong header if its prompt were kept from the first conversation."""
    from chatcodec import ChatTemplate

    require_shared()
    source = _NOT_LAST_AND_ALONE[name]
    assert masks._prompt_names(source) is None
    chats = [
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}],
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello"}],
    ]  # fmt: skip
    codec = _codec("qwen3").with_template(ChatTemplate(source))
    headers = [codec.encode(chat)._get_layout().header for chat in chats]
    fresh = [_codec("qwen3").with_template(ChatTemplate(source)).encode(chat)._get_layout().header for chat in chats]
    assert headers == fresh and headers[0] != headers[1]
