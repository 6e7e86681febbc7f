"""chatcodec.lint: each rule fires on a template written to have its risk, and a clean template is quiet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import chatcodec
from chatcodec import ChatTemplate
from chatcodec.inspection import Finding

from ..conftest import manifest, require_shared
from .conftest import corpus_template

#: a template with none of the risks: every role, tools, calls and results, reasoning kept in history,
#: a generation prompt, its markers stripped from content, and only features every engine renders alike
CLEAN = """\
{%- if tools %}<|im_start|>system
Tools: {{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}<|im_end|>
{% endif %}
{%- for m in messages %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}
{{- (m.content or '') | replace('<|im_end|>', '') | replace('<|im_start|>', '') }}
{%- for call in m.tool_calls or [] %}
<call>{{ call.function.name }} {{ call.function.arguments | tojson }}</call>{% endfor %}
<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def codes(template: ChatTemplate) -> list[str]:
    return [f.code for f in chatcodec.lint(template)]


def only(template: ChatTemplate, code: str) -> list[Finding]:
    return [f for f in chatcodec.lint(template) if f.code == code]


def test_a_clean_template_is_quiet() -> None:
    assert chatcodec.lint(ChatTemplate(CLEAN)) == []


def test_raises_on_a_common_role_with_the_templates_message_and_line() -> None:
    source = CLEAN.replace(
        "{%- for m in messages %}",
        "{%- for m in messages %}{% if m.role == 'system' %}\n{{ raise_exception('No system prompts, please') }}"
        "{% endif %}",
    )
    [finding] = only(ChatTemplate(source), "raises-on-role")
    assert finding.severity == "error" and "No system prompts, please" in finding.message
    assert finding.line == 5  # the raise_exception call


def test_drops_tool_calls() -> None:
    source = CLEAN.replace(
        "{%- for call in m.tool_calls or [] %}\n<call>{{ call.function.name }} {{ call.function.arguments | tojson }}"
        "</call>{% endfor %}",
        "",
    )
    [finding] = only(ChatTemplate(source), "drops-tool-calls")
    assert finding.severity == "error"  # the template renders tool definitions, then loses the calls


def test_drops_tool_results() -> None:
    source = CLEAN.replace("{%- for m in messages %}", "{%- for m in messages if m.role != 'tool' %}")
    [finding] = only(ChatTemplate(source), "drops-tool-results")
    assert finding.severity == "error"


def test_not_prefix_stable() -> None:
    source = CLEAN.replace("{% if m.reasoning_content %}", "{% if m.reasoning_content and loop.last %}")
    found = only(ChatTemplate(source), "not-prefix-stable")
    assert found and all(f.severity == "warning" for f in found)
    assert "history reasoning dropped" in found[0].message
    assert found[0].line == 5  # where the template writes reasoning_content


def test_hard_coded_date() -> None:
    source = (
        '{%- if not date_string is defined %}\n{%- set date_string = "26 Jul 2024" %}\n{%- endif %}'
        "<|im_start|>system\nToday Date: {{ date_string }}<|im_end|>\n" + CLEAN
    )
    [finding] = only(ChatTemplate(source), "hard-coded-date")
    assert "'26 Jul 2024'" in finding.message and finding.line == 2
    # the same default behind the clock the host provides never shows: no finding
    clocked = source.replace('"26 Jul 2024"', "strftime_now('%d %b %Y')")
    assert only(ChatTemplate(clocked), "hard-coded-date") == []


@pytest.mark.parametrize(
    "written",
    [
        "Today Date: 26 Jul 2024",
        "{{ 'Date: ' ~ '2024-07-26' }}",
        "It is July 4, 2020.",
        "{% set today = 'x' %}Current date: 03/12/2026",
        "{{ (messages[0].date | default('1st of January 2025')) }}",
    ],
)
def test_fixed_date(written: str) -> None:
    source = f"<|im_start|>system\n{written}<|im_end|>\n" + CLEAN
    [finding] = only(ChatTemplate(source), "fixed-date")
    assert finding.severity == "warning" and finding.line == 2  # the line the date is on
    assert "whatever day it is rendered on" in finding.message


@pytest.mark.parametrize(
    "written",
    [
        "Knowledge cutoff: December 2023",  # a month and a year: a cutoff, not today
        "Your knowledge base was last updated on 2023-10-01.",  # a cutoff, fixed on purpose
        "Today Date: {{ strftime_now('%d %b %Y') }}",  # the real date
        "{% if false %}Today is 26 Jul 2024.{% endif %}",  # never written
        "Version 2024.1",  # not a date
    ],
)
def test_no_fixed_date(written: str) -> None:
    source = f"<|im_start|>system\n{written}<|im_end|>\n" + CLEAN
    assert only(ChatTemplate(source), "fixed-date") == []


def test_every_engine_sentence_reads_as_one() -> None:
    from chatcodec.inspection.engines import RULES

    for rule in RULES.values():
        sentence = f"{rule.what}; renders differently in {rule.engines}"
        assert "without them fail" not in sentence, sentence
        assert not re.search(r"\bin \w+ \w+ them fail\b", sentence), sentence
    assert RULES["engine-host-function"].engines.startswith("runtimes that do not provide them")


def test_inspection_modules_import_in_one_direction() -> None:
    """linting -> report -> text, with nothing back, not even for types."""
    import ast

    package = Path(chatcodec.__file__).parent / "inspection"
    text = ast.parse((package / "text.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(text) if isinstance(node, ast.ImportFrom)}
    assert not imported & {"linting", "report"}, imported
    report = ast.parse((package / "report.py").read_text(encoding="utf-8"))
    assert "linting" not in {node.module for node in ast.walk(report) if isinstance(node, ast.ImportFrom)}


def test_special_token_injection() -> None:
    source = CLEAN.replace("(m.content or '') | replace('<|im_end|>', '') | replace('<|im_start|>', '')", "m.content")
    [finding] = only(ChatTemplate(source), "special-token-injection")
    assert "<|im_end|>" in finding.message and finding.severity == "warning"


def test_no_generation_prompt() -> None:
    source = CLEAN.split("{%- if add_generation_prompt %}")[0]
    [finding] = only(ChatTemplate(source), "no-generation-prompt")
    assert finding.severity == "warning"
    # a template whose every prompt already ends with the assistant's header needs none
    always = "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}### assistant: "
    assert only(ChatTemplate(always), "no-generation-prompt") == []


def test_writes_bos() -> None:
    template = ChatTemplate("{{ bos_token }}" + CLEAN, special_tokens={"bos_token": "<s>"})
    [finding] = only(template, "writes-bos")
    assert finding.severity == "info" and finding.line == 1


@pytest.mark.parametrize(
    ("snippet", "code"),
    [
        ("{% generation %}{{ m.content }}{% endgeneration %}", "engine-generation-tag"),
        ("{% if m.content %}{% break %}{% endif %}", "engine-loop-controls"),
        ("{{ m.content.rsplit(' ', 1)[0] }}", "engine-python-method"),
        ("{{ '%s!' % m.role }}", "engine-percent-format"),
        ("{{ m.content is sequence }}", "engine-sequence-test"),
        ("{{ m | tojson(indent=2) }}", "engine-tojson-arguments"),
        ("{{ m | tojson(4) }}", "engine-tojson-positional"),
        ("{{ m.content | indent(2) }}", "engine-indent-filter"),
        ("{{ '1e3' | float }}", "engine-float-filter"),
        ("{{ m.content | wordcount }}", "engine-missing-filter"),
        ("{{ m.content[-3:] }}", "engine-negative-slice"),
        ("{% for i in range(3, 0, -1) %}{% endfor %}", "engine-range-step"),
        ("{{ loop.previtem }}", "engine-loop-neighbours"),
        ("{{ strftime_now('%Y') }}", "engine-host-function"),
    ],
)
def test_engine_features_are_found_on_their_line(snippet: str, code: str) -> None:
    source = "{% for m in messages %}\n<|im_start|>{{ m.role }}\n" + snippet + "\n<|im_end|>\n{% endfor %}"
    found = [f for f in chatcodec.lint(ChatTemplate(source)) if f.code.startswith("engine-")]
    assert [(f.code, f.line) for f in found] == [(code, 3)]
    assert "renders differently in" in found[0].message


def test_carriage_returns_in_the_source() -> None:
    found = only(ChatTemplate("{% for m in messages %}{{ m.content }}\r\n{% endfor %}"), "engine-carriage-return")
    assert [f.line for f in found] == [1]


def test_findings_are_sorted_errors_first() -> None:
    severities = [f.severity for f in chatcodec.lint(corpus_template("google-gemma-2-2b-it"))]
    assert severities == sorted(severities, key=["error", "warning", "info"].index)
    assert severities[0] == "error"


def test_every_corpus_template_lints() -> None:
    require_shared()
    seen = {}
    for name in manifest():
        findings = chatcodec.lint(corpus_template(name))
        assert all(f.severity in ("error", "warning", "info") and f.message for f in findings), name
        seen[name] = {f.code for f in findings}
    # what the corpus is known to hold, found
    assert "hard-coded-date" in seen["meta-llama-Llama-3.1-8B-Instruct"]
    assert "fixed-date" not in seen["meta-llama-Llama-3.1-8B-Instruct"]  # reported once, as the default it is
    assert "raises-on-role" in seen["google-gemma-2-2b-it"]
    assert "not-prefix-stable" in seen["Qwen-Qwen3-0.6B"]
    assert "not-prefix-stable" not in seen["chujiezheng-qwen2.5-instruct"]
