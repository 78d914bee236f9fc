"""The house rules that drift quietly, checked on the exported package: interfaces declared whole (no name defined
twice in a module), modules of a readable size, annotated signatures where interfaces live, tuned launch tables as
data, one execution path, capabilities declared rather than asked of a class."""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "litellama"
SOURCES = sorted(p for p in PKG.rglob("*.py") if p.name != "_modidx.py")
KERNEL_MODULES = {"kernels"}  # Triton kernel modules may be long: a kernel and its launcher read best together
TYPED = ["engine", "executor", "layers", "models", "entrypoints"]


def rel(p: Path) -> str:
    return str(p.relative_to(PKG.parent))


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_no_name_defined_twice(path):
    assert "noqa: F811" not in path.read_text(), f"{rel(path)} redefines a name (declare the interface whole)"


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_module_size(path):
    n = len(path.read_text().splitlines())
    top = path.relative_to(PKG).parts[0]
    limit = 600 if top == "entrypoints" else None if top in KERNEL_MODULES else 1000
    assert limit is None or n <= limit, f"{rel(path)} has {n} lines (at most {limit})"


def annotated_share(folder: str) -> tuple[int, int]:
    tot = ann = 0
    for f in sorted((PKG / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                ps = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
                ps = [p for p in ps if p.arg not in ("self", "cls")]
                tot += len(ps)
                ann += sum(p.annotation is not None for p in ps)
    return ann, tot


def test_signatures_are_annotated():
    ann = sum(annotated_share(f)[0] for f in TYPED)
    tot = sum(annotated_share(f)[1] for f in TYPED)
    assert ann >= 0.85 * tot, f"{ann} of {tot} parameters annotated in {', '.join(TYPED)} (at least 85 %)"


def test_tuned_tables_are_data():
    pasted = [
        rel(p) for p in (PKG / "kernels").rglob("*.py") if "_TUNED |=" in p.read_text() or "\nTUNED |=" in p.read_text()
    ]
    assert not pasted, f"launch tables pasted into kernel modules (keep them in kernels/tuned/*.json): {pasted}"


def test_one_execution_path():
    users = [rel(p) for p in SOURCES if re.search(r"\bin_process\b", p.read_text())]
    assert not users, f"the engine asks which executor it holds: {users}"


EXECUTOR_CLASSES = r"\b(?:InProcessExecutor|MultiprocExecutor|Executor)\b"


@pytest.mark.parametrize("path", [p for p in SOURCES if p.relative_to(PKG).parts[0] != "executor"], ids=rel)
def test_capabilities_not_isinstance(path):
    "What an executor can do is read from its declared `Capabilities`, never from which class it is."
    asks = [
        f"{rel(path)}:{node.lineno}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass")
        and len(node.args) == 2 and re.search(EXECUTOR_CLASSES, ast.unparse(node.args[1]))
    ]  # fmt: skip
    assert not asks, f"asks which executor it holds (declare a capability instead): {asks}"
