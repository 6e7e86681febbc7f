"""The examples in docstrings, the README and the docs site run and print what they claim; the README stays
short, every old README section has a page, the command-line page matches the parsers, and every public
name has a docstring and a reference entry."""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import chatcodec
from chatcodec.cli import COMMANDS

from . import docs_generated
from .conftest import require_shared

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
#: every page a reader is given: the README and the site's pages
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
#: a fence whose code needs a running ``chatcodec serve``: run by tests/server/test_readme.py
CLIENT = 'python title="client.py"'
#: the sections of the README before it was cut to a page (78 KB, at dc685fa), each with a home in the docs
OLD_README_ANCHORS = (
    "chatcodec", "install", "render", "capabilities-and-polyfills", "tokens", "decode",
    "read-a-prompt-back-into-messages", "transformers-drop-in", "command-line", "serve", "tools", "inspect",
    "datasets", "speed", "development",
)  # fmt: skip
MODULES = sorted(
    info.name for info in pkgutil.walk_packages(chatcodec.__path__, "chatcodec.") if "__main__" not in info.name
)


class Finder(doctest.DocTestFinder):
    """Finds each example once, in the module that defines it (exported names report ``chatcodec`` as theirs)."""

    def _from_module(self, module: Any, object: Any) -> bool:
        if inspect.isclass(object) and object.__module__ == "chatcodec":
            return bool(chatcodec._DEFINED_IN.get(object.__name__) == module.__name__)
        return bool(super()._from_module(module, object))  # type: ignore[misc]


def docstring_examples(name: str) -> list[doctest.DocTest]:
    return Finder().find(importlib.import_module(name), name)


@pytest.mark.parametrize("name", ["chatcodec", *MODULES])
def test_docstring_examples(name: str) -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in docstring_examples(name):
        runner.run(test)
    assert runner.failures == 0


def test_exported_classes_keep_their_examples() -> None:
    """A class that reports ``chatcodec`` as its module is still searched for examples where it is defined."""
    found = {test.name for name in MODULES for test in docstring_examples(name)}
    assert "chatcodec.render.ChatTemplate" in found and "chatcodec.limits.Limits" in found
    assert chatcodec.ChatTemplate.__module__ == "chatcodec"


def fences(page: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of ``page``: (info string, code)."""
    return re.findall(r"(?m)^```([^\n]*)\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.DOTALL)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def python_blocks() -> list[tuple[Path, int, str]]:
    return [(page, n, code) for page in PAGES for n, (info, code) in enumerate(fences(page)) if info == "python"]


def test_the_readme_is_short() -> None:
    assert len(README.read_bytes()) <= 12 * 1024


def test_every_page_has_python_examples_that_are_run() -> None:
    """A Python block is run here (``python``) or against a server (the client fence); no other spelling
    of Python can slip past both."""
    for page in PAGES:
        for info, _ in fences(page):
            assert info in ("python", CLIENT) or not info.startswith(("py", "pycon")), (page_id(page), info)
            # tests/server/test_readme.py runs the client blocks of the first two pages, test_mcp_serve.py the third's
            served = (README, DOCS / "guide" / "serving.md", DOCS / "guide" / "mcp.md")
            assert info != CLIENT or page in served, page_id(page)
    ran = {page for page, _, _ in python_blocks()}
    assert README in ran and DOCS / "getting-started.md" in ran and len(ran) >= 10


@pytest.mark.parametrize(
    ("page", "code"),
    [pytest.param(page, code, id=f"{page_id(page)}:{n}") for page, n, code in python_blocks()],
)
def test_python_block_runs_on_its_own(page: Path, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each block runs alone, in a fresh namespace, from the root of the checkout: no block depends on an
    earlier one, on its page or another."""
    require_shared()
    monkeypatch.chdir(ROOT)
    exec(compile(code, page_id(page), "exec"), {"__name__": "__docs__"})


def test_the_readmes_links_lead_somewhere() -> None:
    """mkdocs checks the site's links; the README is not part of the site, so its own are checked here: each
    file exists, and each anchor is a heading of its page."""
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]*))?\)", README.read_text(encoding="utf-8"))
    local = [(path, fragment) for path, fragment in links if "://" not in path]
    assert len(local) >= 15
    for path, fragment in local:
        target = ROOT / path
        assert target.is_file(), path
        if fragment:
            headings = re.findall(r"(?m)^#+ (.+)$", target.read_text(encoding="utf-8"))
            assert fragment in {slug(h) for h in headings}, (path, fragment)


def test_every_old_readme_section_has_a_home() -> None:
    """The home page's map sends each section of the old README to a page (and heading) that exists."""
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"(?m)^\| `#([a-z0-9-]+)` \| \[[^]]+\]\(([^)]+)\)", home))
    assert set(rows) == set(OLD_README_ANCHORS)
    for anchor, link in rows.items():
        path, _, fragment = link.partition("#")
        target = DOCS / path
        assert target.is_file(), (anchor, link)
        if fragment:
            headings = re.findall(r"(?m)^#+ (.+)$", target.read_text(encoding="utf-8"))
            assert fragment in {slug(h) for h in headings}, (anchor, link)
        assert f"]({path}" in home  # linked from the home page: one click, then the section


def slug(heading: str) -> str:
    """The anchor Python-Markdown's toc gives a heading (lower case, punctuation dropped, spaces to -)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_command_line_page_matches_the_parsers() -> None:
    """docs/guide/cli.md holds a section per command, written from its parser: regenerate it with
    ``PYTHONPATH=src .venv/bin/python -m tests.docs_generated`` after changing the command line."""
    assert docs_generated.written(docs_generated.CLI_PAGE) == docs_generated.cli_reference()
    page = docs_generated.CLI_PAGE.read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"### `chatcodec {name}`" in page
    assert "#### `chatcodec tools schema`" in page and "#### `chatcodec tools run`" in page


def test_the_architecture_page_matches_the_imports() -> None:
    """docs/architecture.md's table of who imports whom is the package's import graph (same regeneration)."""
    assert docs_generated.written(docs_generated.LAYOUT_PAGE) == docs_generated.layout_table()
    assert "| `cli/` |" in docs_generated.LAYOUT_PAGE.read_text(encoding="utf-8")


def test_every_public_name_has_a_docstring() -> None:
    for name in chatcodec.__all__:
        doc = getattr(chatcodec, name).__doc__
        assert doc and doc.strip(), name


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built as CI builds it (``mkdocs build --strict``), into a temporary folder."""
    pytest.importorskip("mkdocs")
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


def test_every_public_name_has_a_reference_entry(site: Path) -> None:
    """Under ``chatcodec.NAME``, or under the module that defines it where static analysis cannot see the
    re-export (a lazy name that ``__init__`` imports for type checkers gets its entry under ``chatcodec``)."""
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    for name in chatcodec.__all__:
        ids = {f'id="chatcodec.{name}"', f'id="{chatcodec._LAZY.get(name, "chatcodec")}.{name}"'}
        assert any(entry in reference for entry in ids), name


def test_the_site_has_every_page(site: Path) -> None:
    for page in DOCS.rglob("*.md"):
        built = page.relative_to(DOCS).with_suffix("")
        folder = built.parent if built.name == "index" else built
        assert (site / folder / "index.html").is_file(), page_id(page)
