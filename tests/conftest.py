"""Shared fixtures: the corpus in ../shared, found from this file, never copied into the project."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from datetime import datetime
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

import pytest

#: ../shared beside the checkout (the corpus, the parse vectors and the real tokenizers)
SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPUS = SHARED / "corpus"
#: the clock the goldens were rendered with
GOLDEN_NOW = datetime(2026, 11, 29, 12, 0, 0)


def require_shared() -> Path:
    if not CORPUS.is_dir():
        pytest.skip(f"the shared corpus is not at {CORPUS}; these tests need ../shared beside the checkout")
    return SHARED


@lru_cache(maxsize=1)
def manifest() -> dict[str, dict[str, Any]]:
    data = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
    return {entry["name"]: entry for entry in data["templates"]}


@lru_cache(maxsize=1)
def conversations() -> dict[str, dict[str, Any]]:
    data = json.loads((CORPUS / "conversations.json").read_text(encoding="utf-8"))
    return {conv["id"]: conv for conv in data["conversations"]}


@cache
def template_source(name: str) -> str:
    return (CORPUS / manifest()[name]["file"]).read_bytes().decode("utf-8")


def goldens() -> list[dict[str, Any]]:
    if not CORPUS.is_dir():
        return []
    with (CORPUS / "goldens.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def in_threads(target: Callable[[int], None], count: int) -> None:
    """``target(0)`` ... ``target(count - 1)``, each in a thread of its own, all at once; back when all are done."""
    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _utf8(text: str) -> str:
    """``text`` with any lone surrogate written as its escape: the worker process sends reports to the run as
    UTF-8, and a report holding one (a test of lone surrogates, its captured log) would end the whole run."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _utf8(content)) for title, content in report.sections]
    if report.longrepr is not None:
        text = str(report.longrepr)
        if _utf8(text) != text:
            report.longrepr = _utf8(text)


def pytest_report_header(config: pytest.Config) -> str:
    """The engine check, once, before any test loads llama.cpp: every process of the run (test workers, the
    servers the tests start) then reads its cached choice, so a machine where the default configuration
    crashes runs every engine test on the safe one."""
    try:
        from chatcodec.backends import default_model_path
        from chatcodec.backends.probe import choose_engine

        return "engine: " + choose_engine(default_model_path()).line
    except Exception as exc:  # reported by the tests that need the engine, as their failure
        return f"engine: not checked ({type(exc).__name__}: {exc})"


def _skipped_where_all_must_run(config: pytest.Config) -> int:
    """How many tests were skipped, where every test must run (``.ci/run`` sets ``CHATCODEC_NO_SKIP=1``): a
    missing ``../shared``, extra or browser would otherwise leave CI green with fewer tests."""
    if os.environ.get("CHATCODEC_NO_SKIP") != "1":
        return 0
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return len(reporter.stats.get("skipped", [])) if reporter is not None else 0


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.OK and _skipped_where_all_must_run(session.config):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = _skipped_where_all_must_run(config)
    if skipped:
        terminalreporter.write_sep("=", f"CHATCODEC_NO_SKIP=1: {skipped} skipped test(s) fail the run", red=True)
