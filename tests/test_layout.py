"""The package's shape: no import cycles, the core never imports the floors above it, lazy public names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import chatcodec

PACKAGE = Path(chatcodec.__file__).resolve().parent
#: modules and packages on the upper floors: nothing below them may import them (architecture.md)
UPPER = ("cli", "server", "backends", "tools", "inspect", "inspection", "dataset", "compat", "unrender")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The chatcodec modules ``name`` imports, at module level or inside functions (not for type checking)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from . import render` imports the module chatcodec.render
                submodule = f"{target}.{alias.name}"
                found.add(submodule if submodule in modules else target)
    return {module for module in found if module in modules and module != name}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_outside_decoders() -> None:
    graph = _graph()
    assert "chatcodec.cli.common" in graph and graph["chatcodec.cli.render"] >= {"chatcodec.cli.common"}
    cycles = [c for c in _cycles(graph) if not all(m.startswith("chatcodec.decoders.") for m in c)]
    assert cycles == []


def test_no_import_cycles_in_decoders() -> None:
    assert _cycles(_graph()) == []


def test_the_core_never_imports_the_floors_above_it() -> None:
    def upper(module: str) -> bool:
        return any(module == f"chatcodec.{u}" or module.startswith(f"chatcodec.{u}.") for u in UPPER)

    graph = _graph()
    del graph["chatcodec.__main__"]  # `python -m chatcodec` is the command
    wrong = {name: sorted(filter(upper, deps)) for name, deps in graph.items() if not upper(name)}
    assert {name: deps for name, deps in wrong.items() if deps} == {}


def test_import_chatcodec_loads_no_upper_floor_and_no_optional_dependency() -> None:
    code = (
        "import sys, chatcodec\n"
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in"
        " {'tokenizers', 'transformers', 'rich', 'gguf', 'numpy', 'datasets'}"
        f" or any(m == 'chatcodec.' + u or m.startswith('chatcodec.' + u + '.') for u in {UPPER!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_lazy_names_resolve_on_use_and_are_public() -> None:
    lazy = chatcodec._LAZY
    assert set(lazy) <= set(chatcodec.__all__)
    for name, module in lazy.items():
        value = getattr(chatcodec, name)
        assert value is getattr(sys.modules[module], name)
        assert name in dir(chatcodec)
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = chatcodec.no_such_name  # type: ignore[attr-defined]
