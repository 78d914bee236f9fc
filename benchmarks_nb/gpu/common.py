"""Small helpers shared by the GPU scripts: the run's environment, a guarded part under a global time budget, and
timers (CUDA-graph replay over weight copies larger than L2, do_bench). Import after setting TRITON_INTERPRET for a dry run."""

import datetime, math, subprocess, sys, time, traceback
import torch
import triton


def environment(dry: bool) -> dict:
    "GPU name, versions, date, git commit and the command line of this run."
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except Exception:
        commit = "unknown"
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and not dry else "cpu (dry run)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "command": " ".join([sys.executable] + sys.argv),
        "dry_run": dry,
    }


class Budget:
    "A global time guard: `part(name, need)` runs a function unless fewer than `need` seconds are left, recording errors in `res`."

    def __init__(self, seconds: float, res: dict):
        self.t0, self.seconds, self.res = time.time(), seconds, res
        res.setdefault("errors", {})
        res.setdefault("skipped", [])
        res.setdefault("part_seconds", {})

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)

    def part(self, name: str, need: float = 5.0):
        def deco(fn):
            if self.left() < need:
                self.res["skipped"].append(name)
                print(f"SKIP {name}: time budget spent", flush=True)
                return fn
            t = time.time()
            try:
                fn()
            except Exception as e:
                self.res["errors"][name] = f"{type(e).__name__}: {str(e)[:500]}"
                traceback.print_exc()
            self.res["part_seconds"][name] = round(time.time() - t, 2)
            return fn

        return deco


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def eager_ms(fn, cuda: bool = True) -> float:
    "Median milliseconds of `fn` by do_bench (host launch overhead included); one timed call on the CPU."
    if not cuda:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=3, rep=10, return_mode="median")


def graph_ms(fns, cuda: bool = True, calls: int = 20, replays: int = 5) -> float:
    "Milliseconds per call: `calls` calls cycling over `fns` (one per weight copy) in one CUDA graph, median over `replays`."
    if not cuda:
        fns[0]()
        t = time.perf_counter()
        fns[0]()
        return (time.perf_counter() - t) * 1e3
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]:
            f()
    torch.cuda.current_stream().wait_stream(s)
    sync()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fns[i % len(fns)]()
    g.replay()
    sync()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / calls)
    del g
    return sorted(ts)[len(ts) // 2]


def copies_for(nbytes: int, cuda: bool = True, total: int = 256 << 20) -> int:
    "How many copies of an `nbytes` weight together exceed `total` bytes (far more than L2), so each call reads HBM."
    return 1 if not cuda else max(1, min(16, math.ceil(total / max(nbytes, 1))))


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
