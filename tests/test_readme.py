"""README.md is a front page rendered, not typed: its tables are what the results files render, no measured number stands
outside them, it stays under 1,000 words, names no commit, and every relative link resolves."""
import json
import re
from pathlib import Path

import pytest

from litellama.benchmarks import report

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
MEASURED = re.compile(r"\d[\d,.]*\s?(?:tok/s|tokens/s|req/s|ms|µs|s\b|[KMGT]B/s|TFLOP/s|×|%|GiB|GB|MB)")


@pytest.fixture(scope="module")
def rendered():
    return {k: f() for k, f in report.RENDERERS.items()}


def test_readme_blocks_are_what_the_results_render(rendered):
    have = report.blocks(README)
    assert {"headline", "floors"} <= set(have), f"README.md lacks rendered blocks: {sorted(have)}"
    for name, text in have.items():
        assert text == rendered[name], f"README.md's {name} table differs from the results: run `litellama bench report`"


@pytest.mark.parametrize("nb", report.NOTEBOOKS)
def test_notebook_blocks_are_what_the_results_render(nb, rendered):
    cells = json.loads((ROOT / nb).read_text())["cells"]
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    for name, block in report.blocks(text).items():
        assert block == rendered[name], f"{nb}: the {name} block differs: run `litellama bench report`"


def test_every_measured_number_is_rendered():
    outside = report.BLOCK.sub("", README)
    typed = MEASURED.findall(outside)
    assert not typed, f"numbers with a unit typed into README.md instead of rendered: {typed}"


def test_the_measured_pattern_catches_typed_figures():
    for typed in ("24,581 tok/s", "1.16 ms", "57×", "4.06 TB/s", "97 %", "1.19 GB"):
        assert MEASURED.search(typed), typed
    assert not MEASURED.search("Python 3.10+ and SmolLM2-135M")


def test_front_page_is_short():
    words = len(README.split())
    assert words <= 1000, f"README.md has {words} words (at most 1,000)"


def test_no_commit_hashes():
    hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", README) if re.search(r"\d", h) and re.search(r"[a-f]", h)]
    assert not hashes, f"commit hashes in README.md: {hashes}"


def test_every_relative_link_resolves():
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    local = [u.split("#")[0] for u in links if not re.match(r"[a-z]+://|#|mailto:", u)]
    missing = [u for u in local if u and not (ROOT / u).exists()]
    assert local and not missing, f"broken links in README.md: {missing}"


def test_floors_table_follows_test_layout():
    import ast

    src = (ROOT / "tests" / "test_layout.py").read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "FLOORS")
    floors = ast.literal_eval(node.value)
    table = report.blocks(README)["floors"]
    for name, floor in floors.items():
        row = next(ln for ln in table.splitlines() if f"`{name}" in ln)
        assert row.startswith(f"| {floor} |"), f"{name} is on floor {floor} in tests/test_layout.py: {row}"
