"""The package's floors: a module imports only from its own floor or lower, and no two modules import each other,
directly or around a circle. Function-level imports count too. The floors are listed in nbs/index.ipynb."""
import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "litellama"

# Low to high. A top-level module or folder of the package, and its floor.
FLOORS = {
    "utils": 0, "config": 0, "sampling_params": 0, "kernels": 0,
    "distributed": 1, "multimodal": 1,
    "layers": 2,
    "models": 3,
    "testing": 4,
    "executor": 5, "quantization": 5,
    "engine": 6,
    "entrypoints": 7, "benchmarks": 7,
    "devtools": 8,
    "__init__": 9,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def modules() -> dict:
    return {module_name(p): p for p in PKG.rglob("*.py") if p.name != "_modidx.py"}


def imports_of(name: str, path: Path, known: set) -> set:
    "The package modules `name` imports, anywhere in its file."
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] if node.level > 1 else here
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
        for t in targets:
            t = t.removeprefix("litellama.") if t.startswith("litellama.") else ("" if t == "litellama" else t if node.__class__ is ast.ImportFrom and node.level else None)
            if not t:
                continue
            while t and t not in known:  # `from .kernels import rope` names a module; `from .x import f` names a function
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def floor(name: str) -> int:
    top = name.split(".")[0]
    if top not in FLOORS:
        raise KeyError(f"module litellama.{name} is in no floor: add its folder to FLOORS and to the overview")
    return FLOORS[top]


MODS = modules()
GRAPH = {n: imports_of(n, p, set(MODS)) for n, p in MODS.items()}


def test_every_module_has_a_floor():
    for n in MODS:
        floor(n)


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_go_down(name):
    up = sorted(t for t in GRAPH[name] if floor(t) > floor(name))
    assert not up, f"litellama.{name} (floor {floor(name)}) imports from a higher floor: {up}"


def test_no_import_circles():
    state, stack, circles = {}, [], []

    def visit(n):
        state[n] = "open"
        stack.append(n)
        for t in sorted(GRAPH.get(n, ())):
            if state.get(t) == "open":
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[n] = "done"

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_runtime_does_not_import_devtools():
    users = sorted(n for n, ts in GRAPH.items() if any(t.startswith("devtools") for t in ts) and not n.startswith("devtools"))
    assert not users, f"runtime modules import the developer tools: {users}"


def test_the_checker_sees_imports(tmp_path):
    "A hand-made package: a low module importing a high one, and a circle, both found."
    global PKG
    pkg = tmp_path / "litellama"
    (pkg / "kernels").mkdir(parents=True)
    (pkg / "engine").mkdir()
    (pkg / "kernels" / "a.py").write_text("def f():\n    from litellama.engine.b import g\n")
    (pkg / "engine" / "b.py").write_text("from ..kernels.a import f\nfrom . import c\n")
    (pkg / "engine" / "c.py").write_text("from .b import x\n")
    old, PKG = PKG, pkg
    try:
        mods = modules()
        g = {n: imports_of(n, p, set(mods)) for n, p in mods.items()}
    finally:
        PKG = old
    assert g["kernels.a"] == {"engine.b"} and floor("kernels.a") < floor("engine.b")
    assert g["engine.b"] == {"kernels.a", "engine.c"} and g["engine.c"] == {"engine.b"}
