"""Where a decode step of the bundled model goes on a CPU: per-phase timers and the PyTorch profiler's operator table.

Before and after a change, each tree in its own process, alternating (one thread keeps a shared machine's
scheduling out of the shares; drop OMP_NUM_THREADS on a quiet one):

    OMP_NUM_THREADS=1 PYTHONPATH=/path/to/before python benchmarks_nb/cpu_profile.py --label before \\
        --out benchmarks_nb/results/cpu_profile.json
    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks_nb/cpu_profile.py --label after \\
        --out benchmarks_nb/results/cpu_profile.json

Each (dtype, batch) runs `batch` random 128-token prompts to `--gen` greedy tokens (`ignore_eos`) after a short
warm-up; the timers count the decode steps only (from the step after every prompt has its first token), and the
profiler records `--profile-steps` of them, untimed. Phases nest: `step` holds `schedule`, `forward` (`build inputs`
and the model's parts), `sample` and `detokenize`; what a phase holds that no inner phase names is its `other`.
"""

import argparse
import collections
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch


class Timers:
    "Inclusive seconds and call counts per phase; `stack` names the phases open now."

    def __init__(self):
        self.t, self.n, self.on = collections.defaultdict(float), collections.Counter(), False

    @contextmanager
    def phase(self, name):
        if not self.on:
            yield
            return
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.t[name] += time.perf_counter() - t0
            self.n[name] += 1

    def wrap(self, obj, attr, name):
        fn = getattr(obj, attr)

        def timed(*a, **k):
            with self.phase(name):
                return fn(*a, **k)

        setattr(obj, attr, timed)


LAYER_PARTS = {  # phase -> (path inside a decoder layer, attribute)
    "qkv projection": ("self_attn.qkv_proj", "forward"),
    "attention": ("self_attn.attn", "attend"),
    "o projection": ("self_attn.o_proj", "forward"),
    "gate_up projection + silu": ("mlp.gate_up_proj", "forward"),
    "down projection": ("mlp.down_proj", "forward"),
    "norms": ("input_layernorm", "forward"),
    "norms ": ("post_attention_layernorm", "forward"),
}


def instrument(llm, timers):
    "Put timers around the phases of one engine step and the parts of the model."
    eng = llm.engine
    runner, model = eng.runner, eng.runner.model
    timers.wrap(eng, "step", "step")
    timers.wrap(eng.scheduler, "schedule", "schedule")
    timers.wrap(eng.executor, "execute_model", "forward")
    timers.wrap(runner, "prepare", "build inputs")
    timers.wrap(eng.executor, "sample_tokens", "sample")
    for layer in model.model.layers:
        for name, (path, attr) in LAYER_PARTS.items():
            timers.wrap(layer.get_submodule(path), attr, name.strip())
    timers.wrap(model.model.norm, "forward", "norms")
    timers.wrap(model.lm_head, "forward", "lm head")
    import litellama.engine.detokenizer as dt

    cls = dt.IncrementalDetokenizer if hasattr(dt, "IncrementalDetokenizer") else None
    if cls is not None:
        for attr in ("add_token", "take_delta"):
            orig = getattr(cls, attr)

            def timed(self, *a, _orig=orig, **k):
                with timers.phase("detokenize"):
                    return _orig(self, *a, **k)

            setattr(cls, attr, timed)


def shares(timers, tokens):
    "Per-phase seconds, share of the step, ms per step and call counts; `other` is what the nested phases leave."
    t, n = dict(timers.t), dict(timers.n)
    steps = n.get("step", 1)
    layer = [k.strip() for k in LAYER_PARTS] + ["lm head"]
    model = sum(t.get(k, 0) for k in set(layer))
    t["forward: other (rope+store, embedding, glue)"] = t.get("forward", 0) - t.get("build inputs", 0) - model
    t["step: other (engine bookkeeping)"] = t.get("step", 0) - sum(
        t.get(k, 0) for k in ("schedule", "forward", "sample", "detokenize")
    )
    total = t.get("step", 1e-9)
    return {
        "steps": steps,
        "output_tokens": tokens,
        "step_ms": 1e3 * total / steps,
        "phases": {
            k: {"ms_per_step": 1e3 * v / steps, "share": v / total, "calls": n.get(k, 0)}
            for k, v in sorted(t.items(), key=lambda kv: -kv[1])
        },
    }


def decode(llm, prompts, params, timers=None, prof_steps=0):
    "Run `prompts` to the end; timers and profiler on only once every prompt is prefilled (decode steps alone)."
    eng, started, table = llm.engine, set(), None
    rids = {eng.add_request(p, params) for p in prompts}
    t0 = steps = 0
    while eng.has_unfinished_requests():
        if timers is not None and not timers.on and started == rids:
            timers.on, t0 = True, time.perf_counter()
        if prof_steps and timers is not None and timers.on and steps == 2:
            timers.on, tp = False, time.perf_counter()
            table = profile_ops(eng, prof_steps)
            timers.on, t0 = True, t0 + time.perf_counter() - tp  # the profiled steps are not timed
        started |= {o.request_id for o in eng.step()}
        steps += timers is not None and timers.on
    if timers is not None:
        timers.on = False
        return time.perf_counter() - t0, table
    return None, None


def profile_ops(eng, steps):
    "The profiler's operator table over `steps` decode steps: self CPU time and call counts per step."
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            eng.step()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows) or 1
    return {
        "ops_per_step": sum(e.count for e in rows) / steps,
        "calls_per_step": {e.key: e.count / steps for e in rows},
        "top": [
            {
                "op": e.key,
                "calls_per_step": e.count / steps,
                "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
                "share": e.self_cpu_time_total / total,
            }
            for e in rows[:20]
        ],
    }


def run(dtype, batch, gen, prof_steps, seed=0):
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams

    llm = LLM(dtype=dtype, device="cpu")
    g = torch.Generator().manual_seed(seed)
    V = llm.engine.config.vocab_size
    prompts = [torch.randint(100, V - 100, (128,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True)
    decode(llm, prompts[:2], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    timers = Timers()
    instrument(llm, timers)
    wall, table = decode(llm, prompts, params, timers, prof_steps)
    res = shares(timers, timers.n.get("step", 0) * batch)
    res["decode_tok_per_s"] = batch * timers.n.get("step", 0) / wall
    res["ops"] = table
    return res


def cpu_name() -> str:
    "The CPU's model name from /proc/cpuinfo (Linux), else the machine type."
    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")]
    return names[0] if names else platform.machine()


def environment(argv):
    import transformers

    import litellama

    root = Path(litellama.__file__).resolve().parents[1]  # the tree measured (PYTHONPATH), not this script's
    git = lambda *a: subprocess.run(["git", *a], cwd=root, capture_output=True, text=True).stdout.strip()

    try:
        from litellama.executor import cpu
    except ImportError:
        cpu = None  # a tree from before nbs/11b_cpu
    return {
        "command": "python " + " ".join(argv),
        "tree": git("rev-parse", "HEAD") + ("+dirty" if git("status", "--porcelain", "litellama") else ""),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": f"{cpu_name()}, {os.cpu_count()} cores, "
        f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}",
        "threads": torch.get_num_threads(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "cpu_path": cpu.describe() if cpu is not None else None,
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--batch", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--label", default="", help="what this tree is (before, after, ...), kept with each run")
    ap.add_argument("--out", default=None, help="a results JSON; its runs are extended when it exists")
    a = ap.parse_args()
    env = environment(sys.argv)
    runs = []
    for dt in a.dtype:
        for b in a.batch:
            r = run(dt, b, a.gen, a.profile_steps)
            r.update(label=a.label, tree=env["tree"], dtype=dt, batch=b, prompt_len=128, gen=a.gen)
            runs.append(r)
            print(f"{a.label} {dt} batch {b}: {r['step_ms']:.1f} ms per decode step, {r['decode_tok_per_s']:.1f} tok/s")
            for k, v in list(r["phases"].items())[:10]:
                print(f"    {k:48s} {v['ms_per_step']:7.2f} ms {100 * v['share']:5.1f}%  x{v['calls']}")
            for o in (r["ops"] or {"top": []})["top"][:10]:
                ms, share, n = o["self_ms_per_step"], 100 * o["share"], o["calls_per_step"]
                print(f"    op {o['op']:40s} {ms:7.2f} ms {share:5.1f}%  x{n:.0f}")
            sys.stdout.flush()
    if a.out:
        out = Path(a.out)
        doc = json.loads(out.read_text()) if out.exists() else {"runs": []}
        doc.setdefault("environments", []).append(env)
        doc["runs"] += runs
        out.write_text(json.dumps(doc, indent=1) + "\n")
