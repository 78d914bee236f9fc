"""Every notebook that plots keeps its figures as saved outputs, and each saved figure is what its cell draws now from
the committed results files.

A figure cell's plotted data (its axes' titles and labels, each line's x and y, each bar's rectangle, categorical tick
labels) is kept in a sidecar, `benchmarks_nb/figures/<folder>/<notebook>.json`, beside the SHA-256 of the images saved
in that cell's outputs. The test draws every figure cell again with the Agg backend, in-process, after the notebook's
cells that import matplotlib (a figure cell reads its own results file; the imports cell sets the one fixed style), and
compares: a results file that changes under a figure, or an image saved without its sidecar, fails it. A lesson
notebook's figure cell sees, besides, the names of the module the notebook exports (as its exported cells define them)
and of its cells that only import: it draws from those, from a committed results file, or from a CPU computation of
its own of a few seconds that counts something (tokens, blocks, bytes), never from a clock.

After changing a results file or a figure cell, re-save a notebook's outputs and its sidecar with

    python tests/test_saved_figures.py --update benchmarks_nb/engine.ipynb [...]

which executes the notebook as the docs build does (cells flagged gpu, slow or notest left out), keeps its outputs but
not what went to stderr, runs `nbdev-clean` on it and writes the sidecar.
"""

import ast
import hashlib
import importlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("nbs", "kernels_nb", "benchmarks_nb")
SIDECARS = ROOT / "benchmarks_nb" / "figures"
IMAGE_TYPES = ("image/png", "image/svg+xml")
MAX_IMAGE_BYTES = 150_000  # base64 text of one saved image: small enough for a diff and a page

# Lesson notebooks that import matplotlib but keep no saved figure yet.
NO_SAVED_FIGURE_YET: set = set()

# Units of wall time or of rates made from it: a figure of a CPU run shows ratios and shares instead.
WALL_TIME = re.compile(r"\b(ms|µs|us|sec|seconds|tok/s|tokens/s|req/s)\b|\(s\)|, s\b")


def notebooks() -> list:
    return sorted(p.relative_to(ROOT).as_posix() for f in FOLDERS for p in (ROOT / f).glob("*.ipynb"))


def cells(nb: str) -> list:
    return json.loads((ROOT / nb).read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def images(cell: dict) -> list:
    "The saved images of a code cell, as stored (base64 PNG or SVG text)."
    out = []
    for o in cell.get("outputs", []):
        for kind in IMAGE_TYPES:
            if kind in o.get("data", {}):
                data = o["data"][kind]
                out.append(data if isinstance(data, str) else "".join(data))
    return out


def figure_cells(nb: str) -> list:
    return [c for c in cells(nb) if c["cell_type"] == "code" and images(c)]


def plots(nb: str) -> bool:
    return any(c["cell_type"] == "code" and "matplotlib" in source(c) for c in cells(nb))


def sidecar_path(nb: str) -> Path:
    folder, name = nb.split("/")
    return SIDECARS / folder / name.replace(".ipynb", ".json")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _value(v):
    "A plotted value as JSON: numbers to six significant digits, anything else (categories, dates) as text."
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return None if math.isnan(f) else float(f"{f:.6g}")


def _values(xs) -> list:
    import numpy as np

    return [_value(v) for v in np.asarray(xs, dtype=object).ravel()]


def _fixed_ticks(axis) -> list:
    "Tick labels that are data (categories, labels set by hand); auto-formatted numbers are left out."
    from matplotlib.category import StrCategoryFormatter
    from matplotlib.ticker import FixedFormatter

    if not isinstance(axis.get_major_formatter(), (FixedFormatter, StrCategoryFormatter)):
        return []
    return [t.get_text() for t in axis.get_ticklabels()]


def plotted(fig) -> dict:
    "What a figure shows, as data: per axes its scales, texts, lines, bars and scatter points."
    from matplotlib.patches import Rectangle

    fig.canvas.draw()
    axes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        axes.append(
            dict(
                title=ax.get_title(),
                xlabel=ax.get_xlabel(),
                ylabel=ax.get_ylabel(),
                scales=[ax.get_xscale(), ax.get_yscale()],
                xticks=_fixed_ticks(ax.xaxis),
                yticks=_fixed_ticks(ax.yaxis),
                lines=[
                    dict(label=ln.get_label(), x=_values(ln.get_xdata()), y=_values(ln.get_ydata())) for ln in ax.lines
                ],
                bars=[
                    _values([p.get_x(), p.get_y(), p.get_width(), p.get_height()])
                    for p in ax.patches
                    if isinstance(p, Rectangle)
                ],
                points=[_values(c.get_offsets()) for c in ax.collections if hasattr(c, "get_offsets")],
                texts=[t.get_text() for t in ax.texts],
                legend=[t.get_text() for t in legend.get_texts()] if legend else [],
            )
        )
    suptitle = fig.get_suptitle() if hasattr(fig, "get_suptitle") else ""
    return dict(suptitle=suptitle, axes=axes)


def only_imports(cell: dict) -> bool:
    "Whether a code cell does nothing but import."
    try:
        body = ast.parse(source(cell)).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in body)


def exported_names(nb: str) -> dict:
    "The names the module a notebook exports to defines (`#| default_exp`), or none for a notebook that exports none."
    code = [c for c in cells(nb) if c["cell_type"] == "code"]
    found = re.search(r"^#\|\s*default_exp\s+(\S+)", source(code[0]), re.M) if code else None
    return dict(vars(importlib.import_module(f"litellama.{found[1]}"))) if found else {}


@contextmanager
def _in_folder(folder: Path):
    here = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def draw(nb: str, cell_id: str, folder: Path | None = None) -> list:
    "Run cell `cell_id` after the notebook's module and its importing cells, from `folder` (the notebook's by default)."
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_cells = [c for c in cells(nb) if c["cell_type"] == "code"]
    ids = [c["id"] for c in all_cells]
    target = all_cells[ids.index(cell_id)]
    setup = [c for c in all_cells[: ids.index(cell_id)] if "import matplotlib" in source(c) or only_imports(c)]
    ns = {**exported_names(nb), "__name__": "__main__", "display": lambda *a, **k: None}
    plt.close("all")
    with plt.rc_context(), _in_folder(folder or (ROOT / nb).parent), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Agg's "cannot show the figure"
        for c in [*setup, target]:
            exec(compile(source(c), f"{nb}:{c['id']}", "exec"), ns)
        figs = [plotted(plt.figure(n)) for n in plt.get_fignums()]
        plt.close("all")
    return figs


def results_read(cell: dict) -> list:
    "The results files a cell names: a name in the notebook's `results/`, or a path from its folder (`../x/y.json`)."
    return re.findall(r"[\"']((?:\.\./)*[\w/]+\.json)[\"']", source(cell))


def from_cpu_run(nb: str, cell: dict) -> bool:
    "Whether a figure cell draws a results file measured on a CPU (no GPU named in the file)."
    folder = (ROOT / nb).parent
    for name in results_read(cell):
        path = folder / "results" / name if (folder / "results" / name).exists() else folder / name
        if path.exists():
            rec = json.loads(path.read_text())
            if "NVIDIA" not in str(rec.get("device", "")) and "gpu" not in rec:
                return True
    return False


# --- the tests -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("nb", [nb for nb in notebooks() if plots(nb)])
def test_a_notebook_that_plots_keeps_its_figures(nb):
    if nb in NO_SAVED_FIGURE_YET:
        assert not figure_cells(nb), f"{nb} saves figures now: take it off NO_SAVED_FIGURE_YET"
        return
    assert figure_cells(nb), f"{nb} imports matplotlib but saves no figure: run its figures and keep the outputs"


def test_the_allow_list_names_plotting_notebooks():
    stale = [nb for nb in NO_SAVED_FIGURE_YET if not (ROOT / nb).exists() or not plots(nb)]
    assert not stale, f"NO_SAVED_FIGURE_YET names notebooks that do not plot: {stale}"


def test_no_sidecar_without_its_notebook():
    orphans = [
        p for p in SIDECARS.glob("*/*.json") if not (ROOT / p.parent.name / p.name).with_suffix(".ipynb").exists()
    ]
    assert not orphans, f"sidecars of notebooks that are gone: {orphans}"


@pytest.mark.parametrize("nb", [nb for nb in notebooks() if figure_cells(nb)])
def test_saved_figures_are_what_their_cells_draw(nb):
    side = sidecar_path(nb)
    hint = f"run `python tests/test_saved_figures.py --update {nb}`"
    assert side.exists(), f"{nb} saves figures but has no sidecar {side.relative_to(ROOT)}: {hint}"
    want = json.loads(side.read_text())["figures"]
    have = {c["id"]: c for c in figure_cells(nb)}
    assert set(have) == set(want), f"{nb}: figure cells {sorted(have)}, sidecar {sorted(want)}: {hint}"
    for cell_id, cell in have.items():
        saved = [sha256(i) for i in images(cell)]
        assert saved == want[cell_id]["images_sha256"], (
            f"{nb}: cell {cell_id}'s saved image is not its sidecar's: {hint}"
        )
        for i in images(cell):
            assert len(i) <= MAX_IMAGE_BYTES, f"{nb}: cell {cell_id} saves a {len(i):,}-byte image"
        drawn = draw(nb, cell_id)
        assert drawn == want[cell_id]["plotted"], f"{nb}: cell {cell_id} draws other data than its saved figure: {hint}"


@pytest.mark.parametrize("nb", [nb for nb in notebooks() if figure_cells(nb)])
def test_figures_of_cpu_runs_plot_no_wall_times(nb):
    for cell in figure_cells(nb):
        if not from_cpu_run(nb, cell):
            continue
        for fig in json.loads(sidecar_path(nb).read_text())["figures"][cell["id"]]["plotted"]:
            for ax in fig["axes"]:
                for label in (ax["xlabel"], ax["ylabel"]):
                    assert not WALL_TIME.search(label), (
                        f"{nb}: cell {cell['id']} plots a CPU run's wall time: {label!r}"
                    )


def test_a_changed_results_file_changes_the_figure(tmp_path):
    "Draw engine.ipynb's first figure from a copy of the results, as committed and with one number changed."
    nb = "benchmarks_nb/engine.ipynb"
    cell = figure_cells(nb)[0]
    name = results_read(cell)[0]
    want = json.loads(sidecar_path(nb).read_text())["figures"][cell["id"]]["plotted"]
    shutil.copytree(ROOT / "benchmarks_nb" / "results", tmp_path / "results", ignore=shutil.ignore_patterns("history"))
    assert draw(nb, cell["id"], tmp_path) == want  # the copy as committed draws the saved figure
    rec = json.loads((tmp_path / "results" / name).read_text())
    rec["rows"][0]["tok_s"]["litellama"] *= 1.01
    (tmp_path / "results" / name).write_text(json.dumps(rec))
    assert draw(nb, cell["id"], tmp_path) != want


def test_the_wall_time_pattern():
    for label in ("output tok/s", "median TPOT, ms", "µs per call", "time (s)", "step, s", "seconds"):
        assert WALL_TIME.search(label), label
    for label in ("speed relative to HF's", "perplexity change vs float32 (%)", "decoder layer", "head size"):
        assert not WALL_TIME.search(label), label


# --- re-saving a notebook's figures -----------------------------------------------------------------------------------


def update(nb: str) -> None:
    "Execute `nb` as the docs build does, keep its outputs, clean it with nbdev, and write its sidecar."
    from execnb.shell import CaptureShell
    from fastcore.nbio import read_nb, write_nb
    from nbdev.config import get_config
    from nbdev.process import NBProcessor
    from nbdev.test import _skip_cell

    path = ROOT / nb
    book = read_nb(path)
    flags = get_config().tst_flags
    flagged = NBProcessor(path, rm_directives=False, process=True).nb  # its cells know their `#|` flags
    skip = _skip_cell(flagged, flags.split() if isinstance(flags, str) else flags, None)
    skipped = {c.id for c in flagged.cells if skip(c)}  # markdown, and code flagged gpu, slow or notest
    shell = CaptureShell(path, mpl_format="png")  # one image per figure, at the style's dpi
    with _in_folder(path.parent):
        shell.run_all(book, exc_stop=True, preproc=lambda cell: cell.id in skipped)
    for cell in book.cells:  # progress bars and warnings are not part of the lesson
        if cell.get("outputs"):
            cell["outputs"] = [o for o in cell["outputs"] if o.get("name") != "stderr"]
    write_nb(book, path)
    subprocess.run([Path(sys.executable).parent / "nbdev-clean", "--fname", str(path)], check=True, cwd=ROOT)
    figures = {
        c["id"]: dict(images_sha256=[sha256(i) for i in images(c)], plotted=draw(nb, c["id"])) for c in figure_cells(nb)
    }
    side = sidecar_path(nb)
    if not figures:
        side.unlink(missing_ok=True)
        return
    side.parent.mkdir(parents=True, exist_ok=True)
    side.write_text(json.dumps(dict(notebook=nb, figures=figures), indent=1, ensure_ascii=False) + "\n")
    print(f"{nb}: {len(figures)} figure cell(s) saved, sidecar {side.relative_to(ROOT)}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "--update":
        sys.exit("usage: python tests/test_saved_figures.py --update NOTEBOOK [NOTEBOOK ...]")
    for arg in sys.argv[2:]:
        update(Path(arg).resolve().relative_to(ROOT).as_posix())
