"""The one timing module of the GPU scripts: synchronised wall time, triton's do_bench, and CUDA-graph replay (one call
or many calls cycling over weight copies larger than L2); on a CPU (the scripts' dry runs) each falls back to a few
wall-clock calls, which check the code, not the speed."""

import statistics
import time

import torch
import triton

def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps: int = 5, warmup: int = 1) -> float:
    "Median wall seconds of `fn()` (synchronised), after `warmup` calls."
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def eager_ms(fn, cuda: bool = True) -> float:
    "Median milliseconds of `fn` by do_bench (host launch overhead included); one timed call on the CPU."
    if not cuda:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=3, rep=10, return_mode="median")


def graph_ms(fns, cuda: bool = True, calls: int = 20, replays: int = 5, cpu_warmup: bool = True) -> float:
    """Milliseconds per call: `calls` calls cycling over `fns` (one per weight copy) in one CUDA graph, median over
    `replays`; on the CPU one timed call (after an untimed one, unless `cpu_warmup` is false)."""
    if not cuda:
        if cpu_warmup:
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


def cpu_ms(fn) -> float:
    "The median wall ms of three calls: the CPU dry run's stand-in for the GPU timers."
    ts = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[1]


def median_ms(fn, cuda: bool = True, warmup: int = 10, rep: int = 40) -> float:
    "Median ms of `fn`: triton's do_bench on a GPU (host launch overhead included); `cpu_ms` on the CPU."
    if not cuda:
        return cpu_ms(fn)
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def graph_call_ms(fn, cuda: bool = True, calls: int = 10) -> float:
    "Ms per call of `fn` replayed from one CUDA graph of `calls` calls (no launch overhead); `cpu_ms` on the CPU."
    if not cuda:
        return cpu_ms(fn)
    from litellama.kernels.tuned import graph_ms as g

    return g(fn, calls=calls)
