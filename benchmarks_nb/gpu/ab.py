"""Same-session A/B of two package trees on the GPU, each measurement in a fresh process:
workload 2 (bf16 and fp8 KV cache) and batch-1 TPOT after a 128-token prompt, on the random Qwen3-0.6B shape;
with --kernels also each tree's kernel suite (`bench.kernel_suite()`), once.

    PYTHONPATH=. python3 benchmarks_nb/gpu/ab.py OUT NAME=TREE NAME=TREE [--rounds N] [--kernels]
For trees that have `litellama bench`, `litellama bench ab TREE_A TREE_B --suite offline` does the same for any suite;
this script stays for comparisons with trees from before it.
"""

import json, os, subprocess, sys, time
from pathlib import Path

CHILD = r"""
import importlib, json, sys, torch
def first(*names):  # the module under its name in the tree on the path (the package moved into folders)
    for n in names:
        try: return importlib.import_module("litellama." + n)
        except ModuleNotFoundError: pass
    raise ModuleNotFoundError(names)
LLM = first("entrypoints" + ".llm", "llm").LLM
bench = first("benchmarks" + ".harness", "bench")
kv, path = sys.argv[1], sys.argv[2]
if kv == "kernels":
    print("RESULT " + json.dumps(dict(kv=kv, kernels=bench.kernel_suite())), flush=True); raise SystemExit
llm = LLM(path, dtype="bfloat16", device="cuda", kv_cache_dtype=kv)
out = dict(kv=kv, w2=bench.workload2(llm))
if kv == "auto": out["w3"] = bench.workload3(llm, prompt_lens=(128,), gen=128, repeats=5)
print("RESULT " + json.dumps(out), flush=True)
"""


def run(tree, kv, path):
    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", CHILD, kv, path], env=env, capture_output=True, text=True, timeout=400)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return dict(error=(r.stderr or r.stdout)[-2000:], wall_s=time.time() - t0)
    return dict(json.loads(line[7:]), wall_s=time.time() - t0)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    trees = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 1
    sys.path.insert(0, str(Path(next(iter(trees.values()))).resolve()))
    import importlib

    def first(*names):
        for n in names:
            try:
                return importlib.import_module("litellama." + n)
            except ModuleNotFoundError:
                pass
        raise ModuleNotFoundError(names)

    make_random_checkpoint = first("testing" + ".checkpoints", "checkpoints").make_random_checkpoint
    environment = first("benchmarks" + ".harness", "bench").environment
    path = "/tmp/litellama-bench/qwen3-0.6b"
    if not Path(path, "config.json").exists():
        import torch

        make_random_checkpoint("qwen3-0.6b", path, dtype=torch.bfloat16)
    rows = []
    for rnd in range(rounds):
        order = list(trees.items()) if rnd % 2 == 0 else list(trees.items())[::-1]
        for kv in ("auto", "fp8") + (("kernels",) if "--kernels" in sys.argv and rnd == 0 else ()):
            for name, tree in order:
                res = dict(tree=name, round=rnd, **run(tree, kv, path))
                rows.append(res)
                w2 = res.get("w2", {}).get("tok_s")
                w3 = (res.get("w3") or [{}])[0].get("tpot_ms")
                print(
                    f"{name:>10} kv={kv:<4} round {rnd}: w2 {w2 and round(w2)} tok/s  tpot {w3 and round(w3, 3)} ms  {res.get('error', '')[-300:]}",
                    flush=True,
                )
    payload = dict(
        environment(),
        what="same-session A/B, each run in a fresh process",
        trees=trees,
        commits={t: t for t in trees},
        command="PYTHONPATH=. python3 benchmarks_nb/gpu/ab.py " + " ".join(sys.argv[1:]),
        runs=[dict(tag=r["tree"], **{k: v for k, v in r.items() if k != "tree"}) for r in rows if "w2" in r],
        kernel_runs=[dict(tag=r["tree"], rows=r["kernels"]) for r in rows if "kernels" in r],
        errors=[r for r in rows if "error" in r],
    )
    (out / "ab.json").write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
