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


EXACT_COMMIT = re.compile(r"[0-9a-f]{40}")
LINKED = re.compile(r"benchmarks_nb/results/([\w.-]+\.json)")
# Current GPU results files recorded before the record asked for an exact commit and each peer's configuration. The
# information is not in them (a short hash, an engine without its options), and this machine has no GPU: the GPU
# issue re-measures them; until then each stays, listed here with what it lacks.
GPU_KNOWN = {
    "gemv8.json": "commit a2ec6e7 (short)",
    "kernels_head_sizes.json": "commit 5ec19d4 (short)",
    "llava_7b.json": "commit e301793 (short)",
    "moe.json": "commit c0c4cc3 (short)",
    "moe_30b_a3b.json": "commit e301793 (short)",
    "moe_decode_path.json": "commit 43c569a (short)",
    "quant8_gemm_sweep.json": "commit cc4af21 (short)",
    "qwen3_vl_4b.json": "commit 84fc491 (short)",
    "serving_structured.json": "commit 55f6f3d (short)",
    "w4.json": "commit a2cdcbe+wgmma (short, and a tree that is not a commit)",
    "w4_sass.json": "commit 2040fbe (short)",
    "w8.json": "commit c90d156 (short)",
    "w8_serving.json": "commit 24c28ba (short)",
    "vs_hf.json": "HF ran without its configuration recorded (its generate as it comes; no static cache + compile row)",
}


def peers(rec: dict) -> set:
    "The engines a results file compares: each row's `engines`, or its per-engine `tok_s`."
    rows = rec.get("rows") if isinstance(rec.get("rows"), list) else []
    out: set = set()
    for row in rows:
        for key in ("engines", "tok_s"):
            if isinstance(row, dict) and isinstance(row.get(key), dict):
                out |= set(row[key])
    return out


def shortfalls(rec: dict) -> list:
    "What a current results file lacks: an exact commit (40 hex), each compared engine's recorded configuration."
    bad = []
    commit = (rec.get("tree") or {}).get("commit") if isinstance(rec.get("tree"), dict) else None
    if not (isinstance(commit, str) and EXACT_COMMIT.fullmatch(commit)):
        bad.append(f"no exact commit (40 hex): {commit!r}")
    configs = rec.get("configs") if isinstance(rec.get("configs"), dict) else {}
    bad += [f"peer {e!r} without its configuration ('configs')" for e in sorted(peers(rec)) if not configs.get(e)]
    return bad


def table_devices(table: str, results: Path = RESULTS) -> set:
    "The devices of the results files a rendered table links to (one per machine: a table of one machine has one)."
    return {json.loads((results / n).read_text()).get("device") for n in set(LINKED.findall(table))}


def test_shortfalls_catch_what_they_should():
    good = dict(tree=dict(commit="0123456789abcdef0123456789abcdef01234567"), rows=[dict(engines=dict(a={}, b={}))])
    good["configs"] = dict(a=dict(env={}), b=dict(env={"X": "1"}))
    assert shortfalls(good) == []
    assert shortfalls(dict(good, tree=dict(commit="0123456"))) == ["no exact commit (40 hex): '0123456'"]
    assert shortfalls(dict(good, configs=dict(a=dict(env={})))) == ["peer 'b' without its configuration ('configs')"]
    assert shortfalls(dict(good, rows=[dict(tok_s=dict(c=1.0))])) == ["peer 'c' without its configuration ('configs')"]


def test_table_devices_catch_a_mixed_table(tmp_path):
    for name, dev in (("a.json", "NVIDIA H100"), ("b.json", "AMD EPYC"), ("c.json", "AMD EPYC")):
        (tmp_path / name).write_text(json.dumps(dict(device=dev)))
    row = "| x | 1 | — | [`{0}`](benchmarks_nb/results/{0}) |"
    assert table_devices("\n".join(row.format(n) for n in ("b.json", "c.json")), tmp_path) == {"AMD EPYC"}
    assert len(table_devices("\n".join(row.format(n) for n in ("a.json", "b.json")), tmp_path)) == 2


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_current_files_name_their_commit_and_peers(path):
    "A current results file names its exact commit and every compared engine's configuration (GPU_KNOWN aside)."
    bad = shortfalls(json.loads(path.read_text()))
    if path.name in GPU_KNOWN:
        assert bad, f"{path.name} is whole now: take it off GPU_KNOWN"
        pytest.xfail(f"{path.name}: {GPU_KNOWN[path.name]} (re-measured by the GPU issue)")
    assert bad == [], f"{path.name}: {bad}"


def test_history_files_say_why_they_moved():
    "A CPU results file that fell short moved to history with a line saying why (`moved_to_history`)."
    for name in ("cpu_peers.json", "cpu_profile.json"):
        rec = json.loads((HISTORY / name).read_text())
        assert isinstance(rec.get("moved_to_history"), str) and rec["moved_to_history"], name


def test_each_rendered_table_is_one_machine():
    from litellama.benchmarks import report

    for name, render in report.RENDERERS.items():
        devices = table_devices(render())
        assert len(devices) <= 1, f"the rendered table {name!r} mixes devices: {sorted(map(str, devices))}"


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
