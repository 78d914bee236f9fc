"""The benchmark record: every results file carries what ran, on which tree, where and when, and its raw runs; nothing
under benchmarks_nb/ is named after an issue or a commit; every suite is listed and its quick mode runs."""
import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from litellama.benchmarks import suites

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks_nb" / "results"
HISTORY = RESULTS / "history"
COMMIT_OR_ISSUE = re.compile(r"(^|_)(i\d{1,3}|vl\d+|srv\d+|[0-9a-f]{7,40})(?=[._])")


def result_files() -> list:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file())


@pytest.mark.parametrize("path", result_files(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_results_file_carries_the_record(path):
    assert path.suffix == ".json", f"{path.relative_to(ROOT)}: results files are JSON records"
    rec = json.loads(path.read_text())
    assert suites.check_record(rec, str(path.relative_to(ROOT))) == []


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_current_figures_are_reproducible(path):
    "A current figure (not history) comes from a command in the tree, on the real shapes (never a quick run)."
    rec = json.loads(path.read_text())
    assert rec.get("quick") is not True, f"{path.name}: a --quick run is not a figure"
    assert rec.get("command_in_tree", True) is not False, f"{path.name}: its command is not in the tree: {rec['command']}"
    script = rec.get("script_now") or rec.get("script")
    if script:
        assert (ROOT / script).exists(), f"{path.name}: {script} is not in the tree"


def test_nothing_is_named_after_an_issue_or_a_commit():
    named = [p for p in (ROOT / "benchmarks_nb").rglob("*") if COMMIT_OR_ISSUE.search(p.name)]
    assert not named, f"named after an issue or a commit (the commit belongs inside the file): {named}"


def test_the_pattern_catches_what_it_should():
    for bad in ("i16.py", "ab_c929f48_4a498fd.json", "w8_engine_dd64738.json", "vl24.py", "srv25.py"):
        assert COMMIT_OR_ISSUE.search(bad), bad
    for good in ("head_sizes.py", "w8_engine_2.json", "qwen3_vl_4b.json", "moe_30b_a3b.json", "offline.json"):
        assert not COMMIT_OR_ISSUE.search(good), good


def test_history_is_apart():
    "A/Bs, sweeps and probes live under results/history, not beside the current figures."
    mixed = [p.name for p in RESULTS.glob("*.json") if re.search(r"(_ab\b|_ab_|^ab_|_probe|_check)", p.stem)]
    assert not mixed, f"history among the current figures: {mixed}"
    assert HISTORY.is_dir()


def test_list_names_every_suite():
    from litellama.entrypoints.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["bench", "--list"])
    listed = {ln.split()[0] for ln in buf.getvalue().splitlines() if ln.strip()}
    assert set(suites.suite_names()) | {"ab", "report"} == listed
    assert {"vs-hf", "offline", "latency", "serving", "kernels", "quant", "moe", "vision", "parallel", "cpu"} <= listed


# The in-process suites run their quick mode here in seconds; the GPU scripts' dry runs and the server take longer.
QUICK = {
    "vs-hf": [],
    "offline": [],
    "latency": [],
    "kernels": [],
    "cpu": ["--engines", "litellama,hf", "--dtypes", "float32", "--threads", "1"],
    "spec": [],
}
SLOW = [n for n in suites.suite_names() if n not in QUICK]


def _quick(name: str, extra: list, tmp_path) -> dict:
    cmd = [sys.executable, "-c", suites.CLI_CHILD, "bench", name, "--quick", "--out", str(tmp_path), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    path = Path(r.stdout.strip().splitlines()[-1])
    assert path.parent == tmp_path and path.name == f"{suites.SUITES[name].results}.json"
    rec = json.loads(path.read_text())
    assert suites.check_record(rec, name) == [] and rec["quick"] is True and rec["suite"] == name
    assert rec["command"].startswith(f"litellama bench {name} --quick")
    return rec


@pytest.mark.parametrize("name", list(QUICK))
def test_quick_mode(name, tmp_path):
    rec = _quick(name, QUICK[name], tmp_path)
    if name == "cpu":
        row = rec["rows"][0]
        assert set(row["engines"]) == {"litellama", "hf"} and row["ratio"]["hf"] > 0
        assert row["same_tokens_as_hf"]["litellama"]["identical"] == row["batch"]  # fp32 greedy: the same tokens
    if name == "spec":
        assert rec["identical"] == rec["prompts"] and [r["method"] for r in rec["rows"]] == ["none", "ngram"]
    if name == "vs-hf":
        assert all(r["same_tokens"]["identical"] == r["batch"] for r in rec["rows"])


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_quick_mode_slow(name, tmp_path):
    _quick(name, [], tmp_path)
