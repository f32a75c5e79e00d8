"""The package's layering (docs/architecture.md): each module imports only modules of lower layers
(or of its own subpackage), and no import cycle exists, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lower number = lower layer. A module may import its own subpackage and any lower layer.
LAYERS = {
    "errors": 0,
    "checkpoint_info": 0.5,  # a folder's JSON files, below the config that reads them
    "config": 1,
    "batch": 1,
    "tokenizer": 1,
    "demo": 1,
    "util": 2,
    "ops": 3,
    "cache": 3,
    "layers": 4,
    "checks": 4,  # the kernels' checks: over ops, beside the layers
    "models": 5,
    "runner": 6,
    "drafters": 6.5,  # where drafts come from: over the models and the runner, below the engine
    "engine": 7,
    "llm": 8,
    "tools": 9,
    "server": 9,
    "receipts": 9,
    "cli": 10,
    "": 11,  # "": the package's own __init__ (its public surface)
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str) -> set[str]:
    """tensorfold modules a file imports, anywhere in it; `from .x import y` counts as x.y too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m == "tensorfold" or m.startswith("tensorfold.")}


def _graph() -> dict[str, set[str]]:
    files = sorted((SRC / "tensorfold").rglob("*.py"))
    modules = {_module_name(f) for f in files}
    # keep only names that are modules or packages (not `from .x import function`)
    return {
        _module_name(f): {m for m in _imports(f, _module_name(f)) if m in modules}
        - {_module_name(f)}
        for f in files
    }


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_top_level_module_has_a_layer():
    tops = {_top(m) for m in _graph()}
    assert tops <= set(LAYERS), (
        f"add these to LAYERS and docs/architecture.md: {tops - set(LAYERS)}"
    )


def test_no_module_imports_upward():
    upward = [
        f"{src} -> {dst}"
        for src, dsts in _graph().items()
        for dst in dsts
        if _top(src) != _top(dst) and LAYERS[_top(dst)] >= LAYERS[_top(src)]
    ]
    assert not upward, "imports that go up or sideways between layers:\n" + "\n".join(upward)


def test_no_import_cycle():
    graph, state, cycles = _graph(), {}, []

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_walk_sees_relative_and_lazy_imports(tmp_path):
    """A planted module of ops/ importing the server, once at the top and once inside a function."""
    planted = tmp_path / "planted.py"
    planted.write_text("from ..server import api\n\ndef f():\n    from ..engine import engine\n")
    found = _imports(planted, "tensorfold.ops.planted")
    assert {"tensorfold.server", "tensorfold.server.api"} <= found
    assert any(LAYERS[_top(m)] >= LAYERS["ops"] for m in found)
