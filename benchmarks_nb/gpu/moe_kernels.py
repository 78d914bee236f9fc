"""Qwen3-MoE on one GPU: the fused MoE kernels against the per-expert loop and `torch._grouped_mm` on Qwen3-30B-A3B's
expert shapes (128 experts, top-8, hidden 2048, intermediate 768), bf16 and fp8 experts; then batch-1 TPOT of the whole
random-weight 30B-A3B model through the engine with CUDA graphs, and HF transformers' batch-1 output tok/s on the same shape.

    PYTHONPATH=. python3 benchmarks_nb/gpu/moe_kernels.py OUT_DIR            # on the GPU
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/moe_kernels.py OUT_DIR --dry-run   # tiny shapes, CPU

Writes OUT_DIR/moe_kernels.json and prints a table. Every part is guarded: a failure is recorded and the next part runs."""

import os, sys, time

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
import torch.nn.functional as F
import triton

T0 = time.perf_counter()
BUDGET_S = 80  # no part starts after this many seconds, unless it says (the whole run: under 150 s)
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
import moe_engine
import timing
from common import run_info, sync, write_json
from moe_engine import rel_err

SHAPE = moe_engine.expert_shape(DRY)
TOKENS = (1, 3) if DRY else (1, 16, 64, 4096)
out_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
res = dict(
    name="moe_kernels",
    dry_run=DRY,
    command=" ".join([sys.executable] + sys.argv),
    shape=SHAPE,
    dtype=str(DT),
    parts={},
    errors={},
)


def bench_ms(fn, reps=None):
    "Median ms: triton's do_bench on a GPU; wall clock of a few calls on the CPU."
    return timing.median_ms(fn, DEV == "cuda", rep=reps or 60)


def graph_ms(fn, calls=10):
    "Ms per call of `fn` recorded `calls` times in one CUDA graph (no launch overhead); None on the CPU."
    return moe_engine.graph_ms(fn, DEV, calls) if DEV == "cuda" else None


def part(name, start_before=None):
    "Run a part unless it would start after `start_before` seconds (default `BUDGET_S`); record its result or its error."
    limit = (start_before or BUDGET_S) * (20 if DRY else 1)  # the CPU dry run is slow: it checks the code, not the time
    if time.perf_counter() - T0 > limit:
        res["errors"][name] = f"skipped: started after {limit} s of the run"
        return lambda fn: fn
    return moe_engine.part(res, name, DEV)


res["environment"] = run_info(DRY)
from litellama.kernels import fused_moe as fm

E, K, H, I = SHAPE["E"], SHAPE["K"], SHAPE["H"], SHAPE["I"]
w13, w2 = moe_engine.expert_weights(SHAPE, DEV, DT)


def routing(T, seed):
    x, logits = moe_engine.router_inputs(T, seed, SHAPE, DEV, DT)
    tw, ti = fm.moe_topk(logits, K, True)
    return x, tw, ti


def grouped_mm_moe(x, w13, w2, tw, ti):
    "The same block on `torch._grouped_mm`: slots sorted by expert, one grouped GEMM each for gate|up and down."
    T = x.shape[0]
    flat = ti.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32)
    )
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    gu = torch._grouped_mm(x[order // K], w13.transpose(1, 2), offs=offs)
    h = F.silu(gu[:, :I]) * gu[:, I:]
    y = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs) * tw.flatten()[order, None]
    out = torch.empty_like(y)
    out[order] = y
    return out.view(T, K, H).sum(1, dtype=torch.float32).to(x.dtype)


@part("correctness_bf16")
def _():
    rows = []
    for T in TOKENS:
        x, tw, ti = routing(T, T)
        ref = fm.fused_moe_reference(x, w13, w2, tw, ti)
        r = dict(tokens=T, fused_vs_loop=rel_err(fm.fused_moe(x, w13, w2, tw, ti), ref))
        r["fused_vs_fp32_loop"] = rel_err(
            fm.fused_moe(x, w13, w2, tw, ti), fm.fused_moe_reference(x.float(), w13.float(), w2.float(), tw.float(), ti)
        )
        r["loop_vs_fp32_loop"] = rel_err(
            ref, fm.fused_moe_reference(x.float(), w13.float(), w2.float(), tw.float(), ti)
        )
        if hasattr(torch, "_grouped_mm") and not DRY:
            try:
                r["grouped_mm_vs_loop"] = rel_err(grouped_mm_moe(x, w13, w2, tw, ti), ref)
            except Exception as e:
                r["grouped_mm_error"] = f"{type(e).__name__}: {e}"
        r["ok"] = r["fused_vs_loop"] < (1e-5 if DRY else 2e-2)
        rows.append(r)
    return rows


w13_8 = s13 = w2_8 = s2 = None


@part("correctness_fp8")
def _():
    global w13_8, s13, w2_8, s2
    w13_8, s13 = fm.quantize_blockwise(w13.float())
    w2_8, s2 = fm.quantize_blockwise(w2.float())
    w13d, w2d = fm.dequantize_blockwise(w13_8, s13, 128, DT), fm.dequantize_blockwise(w2_8, s2, 128, DT)
    rows = []
    for T in TOKENS:
        x, tw, ti = routing(T, 100 + T)
        e = rel_err(fm.fused_moe(x, w13_8, w2_8, tw, ti, s13, s2), fm.fused_moe_reference(x, w13d, w2d, tw, ti))
        rows.append(dict(tokens=T, fused_fp8_vs_dequantized_loop=e, ok=e < (1e-5 if DRY else 2e-2)))
    return rows


@part("kernels")
def _():
    rows, e = [], torch.finfo(DT).bits // 8
    for T in TOKENS:
        x, tw, ti = routing(T, T)
        touched = int(torch.unique(ti).numel())
        flops = 2 * T * K * 3 * H * I
        act_bytes = (T * H * 2 + T * K * (2 * I + 2 * H)) * e  # x in, out, the [S, I] and [S, H] rows written and read
        cands = {
            "fused": lambda: fm.fused_moe(x, w13, w2, tw, ti),
            "loop": lambda: fm.fused_moe_reference(x, w13, w2, tw, ti),
        }
        if hasattr(torch, "_grouped_mm") and not DRY:
            cands["grouped_mm"] = lambda: grouped_mm_moe(x, w13, w2, tw, ti)
        if w13_8 is not None:
            cands["fused_fp8"] = lambda: fm.fused_moe(x, w13_8, w2_8, tw, ti, s13, s2)
        for name, fn in cands.items():
            r = dict(tokens=T, impl=name, experts_touched=touched)
            try:
                fn()
                sync()
                r["ms"] = bench_ms(fn)
                if name != "loop":
                    try:
                        r["graph_ms"] = graph_ms(fn)
                    except Exception as ex:
                        r["graph_error"] = f"{type(ex).__name__}: {ex}"
                wb = touched * 3 * H * I * (1 if name == "fused_fp8" else e)
                t = min(v for v in (r["ms"], r.get("graph_ms")) if v)
                r.update(tflops=flops / t / 1e9, gbps=(wb + act_bytes) / t / 1e6, best_ms=t)
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {ex}"
            rows.append(r)
    for T in TOKENS:  # routing: one kernel against five torch ops
        logits = torch.randn(T, E, device=DEV, dtype=DT)
        for name, fn in (
            ("route_fused", lambda: fm.topk_softmax(logits, K, True)),
            ("route_torch", lambda: fm.moe_topk(logits, K, True)),
        ):
            r = dict(tokens=T, impl=name)
            try:
                fn()
                sync()
                r["ms"] = bench_ms(fn)
                r["graph_ms"] = graph_ms(fn)
                r["same_experts"] = bool((fm.topk_softmax(logits, K, True)[1] == fm.moe_topk(logits, K, True)[1]).all())
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {ex}"
            rows.append(r)
    for T in TOKENS:  # speed-ups over the loop
        by = {r["impl"]: r for r in rows if r["tokens"] == T and "best_ms" in r}
        if "loop" in by:
            for r in by.values():
                r["speedup_vs_loop"] = by["loop"]["best_ms"] / r["best_ms"]
    return rows


@part("copy_bandwidth_gbps")
def _():
    if DRY:
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / triton.testing.do_bench(lambda: b.copy_(a), warmup=10, rep=50, return_mode="median") / 1e6


del w13, w2, w13_8, w2_8
if DEV == "cuda":
    torch.cuda.empty_cache()

like = moe_engine.model_like(DRY)
PROMPT, GEN = 16, (8 if DRY else 64)
from litellama.benchmarks.harness import W1_ROWS

W1 = [(1, 8, 4), (3, 5, 3)] if DRY else W1_ROWS  # (batch, prompt, generated), BENCHMARKS.md's workload 1
HF_W1_TOKENS, HF_W1_SECONDS = (
    (2 if DRY else 32),
    (20 if DRY else 40),
)  # HF is slow: its tokens per row and its total time are capped
RUN_LIMIT_S = 145  # HF's workload-1 rows stop starting after this (the whole run: under 150 s)
MODEL = {}


@part("engine_tpot_batch1", start_before=45)
def _():
    out, model, cfg = moe_engine.random_model_tpot(like, DEV, DT, PROMPT, GEN)
    MODEL["ours"] = (model, cfg)  # workload 1 reuses it, then frees it before HF
    return out


@part("workload1_litellama", start_before=60)
def _():
    "Workload 1 through the engine (CUDA graphs up to batch 256) on the random-weight model of the TPOT part."
    if "ours" not in MODEL:
        raise RuntimeError("no model: the TPOT part failed or was skipped")
    model, cfg = MODEL.pop("ours")
    return moe_engine.workload1_ours(model, cfg, DEV, DT, W1, 64 if DRY else 4096)


MODEL.clear()
moe_engine.free(DEV)


@part("hf_batch1", start_before=100)
def _():
    t_w1 = time.perf_counter()
    time_left = lambda b: (
        time.perf_counter() - t_w1 <= HF_W1_SECONDS and (DRY or time.perf_counter() - T0 <= RUN_LIMIT_S - 8)
    )
    cfg = moe_engine.model_config(like)
    return moe_engine.hf_speed(cfg, DEV, DT, PROMPT, 4 if DRY else 16, W1, HF_W1_TOKENS, time_left)


p = res["parts"]
if "engine_tpot_batch1" in p and "hf_batch1" in p:
    p["batch1_speedup_vs_hf"] = (1e3 / p["engine_tpot_batch1"]["tpot_ms"]) / p["hf_batch1"]["output_tok_s"]
if "workload1_litellama" in p:
    p["workload1"] = moe_engine.side_by_side(p)
res["total_seconds"] = round(time.perf_counter() - T0, 1)
path = write_json(res, out_dir, "moe_kernels.json")

print(f"\n{'part':<22} {'tokens':>6} {'impl':<11} {'ms':>9} {'graph ms':>9} {'TFLOP/s':>8} {'GB/s':>8} {'x loop':>7}")
for r in p.get("kernels", []):
    f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"
    print(
        f"{'kernels':<22} {r['tokens']:>6} {r['impl']:<11} {f('ms', '9.4f')} {f('graph_ms', '9.4f')} {f('tflops', '8.2f')} {f('gbps', '8.0f')} {f('speedup_vs_loop', '7.1f')}"
    )
for k in ("correctness_bf16", "correctness_fp8"):
    for r in p.get(k, []):
        print(
            f"{k:<22} {r['tokens']:>6} ok={r['ok']}  "
            + " ".join(f"{a}={b:.2e}" for a, b in r.items() if isinstance(b, float))
        )
if "engine_tpot_batch1" in p:
    print(f"engine batch-1 TPOT {p['engine_tpot_batch1']['tpot_ms']:.2f} ms ({like})")
if isinstance(p.get("engine_tpot_batch1", {}).get("decode_profile"), dict):
    for g_, us in p["engine_tpot_batch1"]["decode_profile"].get("us_per_step_by_group", {}).items():
        print(f"  decode step {g_:<42} {us:8.1f} us")
if "hf_batch1" in p:
    print(
        f"HF batch-1 {p['hf_batch1']['output_tok_s']:.2f} tok/s; speed-up {p.get('batch1_speedup_vs_hf', float('nan')):.1f}x"
    )
moe_engine.print_end(res, path)
