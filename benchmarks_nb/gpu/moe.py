"""Qwen3-MoE on Qwen3-30B-A3B's shapes (random weights): the fused MoE paths (the one-token path, GEMV, and the aligned
path with the top-k sum in the down kernel or in torch) against the per-expert loop, at 1, 2, 4, 8, 16 and 64 tokens;
a few tiles of each path per token count; the top-k kernel; the M = 1 linears of SHAPE_RULES; then the engine's batch-1
TPOT with its decode profile (and again with the aligned path forced at one token), workload 1, workload 2, and HF
transformers batch 1 and workload 1, in the same run. The engine parts run the package's rules; with MOE_INSTALL=1
they run the fastest tiles the sweeps found instead.

    PYTHONPATH=. python3 benchmarks_nb/gpu/moe.py OUT_DIR                                   # on the GPU
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/moe.py OUT_DIR --dry-run      # tiny shapes, CPU

Writes OUT_DIR/moe.json and prints a table. Every part is guarded: a failure is recorded and the next part runs; no part
starts after its time limit, so the whole run stays under 360 s."""

import os, sys, time

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
import triton

T0 = time.perf_counter()
INSTALL = os.environ.get("MOE_INSTALL") == "1"  # install the fastest tiles found, so the engine parts use them
RUN_LIMIT_S = 330  # nothing starts after this (the whole run: under 360 s)
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
import moe_engine
from common import run_info, sync, write_json
from moe_engine import rel_err

SHAPE = moe_engine.expert_shape(DRY)
TOKENS = (1, 3) if DRY else (1, 2, 4, 8, 16, 64)
out_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
res = dict(
    name="moe",
    dry_run=DRY,
    command=" ".join(["PYTHONPATH=. python3"] + sys.argv),
    shape=SHAPE,
    dtype=str(DT),
    parts={},
    errors={},
    part_seconds={},
    installed={},
)


def elapsed():
    return time.perf_counter() - T0


def graph_ms(fn, calls=10):
    "Ms per call of `fn` replayed from one CUDA graph of `calls` calls; on the CPU the median wall time of three calls."
    return moe_engine.graph_ms(fn, DEV, calls)


def part(name, start_before):
    "Run a part unless the run is already `start_before` seconds old; record its result or its error."
    limit = start_before * (30 if DRY else 1)  # the CPU dry run checks the code, not the time
    if elapsed() > limit:
        res["errors"][name] = f"skipped: the run was past {limit} s"
        return lambda fn: fn
    return moe_engine.part(res, name, DEV, then=lambda: print(f"[{elapsed():6.1f} s] {name} done", flush=True))


res["environment"] = run_info(DRY)
from litellama.kernels import autotune
from litellama.kernels import fused_moe as fm
from litellama.kernels import linear as lin

E, K, H, I = SHAPE["E"], SHAPE["K"], SHAPE["H"], SHAPE["I"]
w13, w2 = moe_engine.expert_weights(SHAPE, DEV, DT)
w13_8, s13 = fm.quantize_blockwise(w13.float())
w2_8, s2 = fm.quantize_blockwise(w2.float())


def inputs(T, seed):
    return moe_engine.router_inputs(T, seed, SHAPE, DEV, DT)


def layer(x, logits, fp8=False, **config):
    "The sparse block from the router's logits, as the model runs it: the top-k kernel, then the fused MoE path."
    tw, ti = fm.topk_softmax(logits, K, True)
    if fp8:
        return fm.fused_moe(x, w13_8, w2_8, tw, ti, s13, s2, config=config)
    return fm.fused_moe(x, w13, w2, tw, ti, config=config)


def loop(x, logits, fp8=False, dtype=None):
    "The per-expert loop (the reference), in `dtype` (default the model's); fp8 experts dequantised."
    tw, ti = fm.moe_topk(logits, K, True)
    a, b = (
        (fm.dequantize_blockwise(w13_8, s13, 128, DT), fm.dequantize_blockwise(w2_8, s2, 128, DT)) if fp8 else (w13, w2)
    )
    dt = dtype or DT
    return fm.fused_moe_reference(x.to(dt), a.to(dt), b.to(dt), tw.to(dt), ti)


@part("correctness", start_before=25)
def _():
    """Both paths (the aligned one with both sums), 16-bit and fp8 experts, against the loop; the fused sum and the
    one-token path once more under CUDA graph replay."""
    rows, tol = [], (1e-5 if DRY else 2e-2)
    for T in TOKENS:
        x, lg = inputs(T, T)
        ref, ref32, ref8 = loop(x, lg), loop(x, lg, dtype=torch.float32), loop(x, lg, fp8=True)
        r = dict(tokens=T)
        paths = dict(fused_sum=dict(SUM_TOPK=True, GEMV=False), torch_sum=dict(SUM_TOPK=False, GEMV=False))
        paths["gemv"] = dict(GEMV=True)
        for tag, c in paths.items():
            out = layer(x, lg, **c)
            r[f"{tag}_vs_loop"] = rel_err(out, ref)
            r[f"{tag}_vs_fp32_loop"] = rel_err(out, ref32)
            r[f"{tag}_fp8_vs_dequantized_loop"] = rel_err(layer(x, lg, fp8=True, **c), ref8)
        r["fused_vs_torch_sum"] = rel_err(layer(x, lg, **paths["fused_sum"]), layer(x, lg, **paths["torch_sum"]))
        for tag in ("fused_sum", "gemv"):  # the zeroing and the atomics, or the one-token path, replayed from a graph
            if DEV != "cuda":
                break
            static = layer(x, lg, **paths[tag])
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                static = layer(x, lg, **paths[tag])
            for _ in range(3):
                gr.replay()
            sync()
            r[f"{tag}_graph_replay_vs_loop"] = rel_err(static, ref)
        r["ok"] = all(v < tol for k, v in r.items() if k.endswith(("vs_loop", "vs_torch_sum")))
        rows.append(r)
    return rows


# the one-token path's tiles, each half tried with the other half at the rule: (BLOCK_N, BLOCK_K, warps)
GEMV_GATE_UP = [(1, 2048, 4), (4, 2048, 4), (4, 1024, 4), (2, 2048, 2), (1, 2048, 2), (2, 1024, 2), (4, 512, 2)]
GEMV_GATE_UP += [(4, 256, 1), (2, 512, 1), (8, 256, 4)]
GEMV_DOWN = [(1, 1024, 4), (2, 1024, 4), (1, 256, 2), (4, 256, 4), (1, 256, 1), (2, 256, 2), (1, 1024, 2)]
GEMV_DOWN += [(4, 256, 2), (8, 256, 4), (2, 512, 2), (1, 512, 1)]
GEMV_TILES = [("gemv gate|up {}/{}/w{}", dict(zip(("BLOCK_N", "BLOCK_K", "num_warps"), t))) for t in GEMV_GATE_UP]
GEMV_TILES += [("gemv down {}/{}/w{}", dict(zip(("DOWN_BLOCK_N", "DOWN_BLOCK_K", "DOWN_WARPS"), t))) for t in GEMV_DOWN]
DECODE_TILES = [
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, DOWN_BLOCK_N=64, num_warps=4, num_stages=4),  # the decode rule
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, DOWN_BLOCK_N=64, num_warps=4, num_stages=4),
    dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, DOWN_BLOCK_N=32, num_warps=4, num_stages=3),
    dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, DOWN_BLOCK_N=128, num_warps=4, num_stages=4),
]
WIDE_TILES = [
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, DOWN_BLOCK_N=128, num_warps=4, num_stages=3),  # the prefill rule
    dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, DOWN_BLOCK_N=64, num_warps=4, num_stages=4),
]


GEMV_HALVES = ("gemv gate|up", "gemv down")
GEMV_KEYS = (("BLOCK_N", "BLOCK_K", "num_warps"), ("DOWN_BLOCK_N", "DOWN_BLOCK_K", "DOWN_WARPS"))


def measure(rows, T, x, lg, ref, touched, wbytes, name, c):
    "One row of the layer table: config `c` (None: the loop) checked against the loop and timed."
    cfg = None if c is None else fm._config(T, E, H, I, K, DT, bool(c.get("fp8")), DEV, c)
    r = dict(tokens=T, impl=name, experts_touched=touched, config=cfg and {**cfg, "fp8": bool(c.get("fp8"))})
    fn = (lambda: loop(x, lg)) if c is None else (lambda c=c: layer(x, lg, **c))
    try:
        out = fn()
        sync()
        if c is None or not c.get("fp8"):
            r["rel_err_vs_loop"] = rel_err(out, ref)
        if c is None:
            r["ms"] = triton.testing.do_bench(fn, warmup=2, rep=20, return_mode="median") if not DRY else graph_ms(fn)
        else:
            r["ms"] = graph_ms(fn)
        r["gbps"] = wbytes / (2 if c and c.get("fp8") else 1) / r["ms"] / 1e6
    except Exception as ex:
        r["error"] = f"{type(ex).__name__}: {ex}"
    rows.append(r)


@part("moe_layer", start_before=40)
def _():
    """The sparse block from the router's logits, graph replay: the rule, the aligned path with the top-k summed in the
    down kernel and in torch, fp8 experts, a few tiles of each path; the loop. With MOE_INSTALL=1 the best 16-bit config per token count is
    installed into this run's autotune table."""
    rows, nbytes = [], torch.finfo(DT).bits // 8
    for T in TOKENS:
        x, lg = inputs(T, T)
        touched = int(torch.unique(fm.moe_topk(lg, K, True)[1]).numel())
        wbytes = touched * 3 * H * I * nbytes
        ref = loop(x, lg)
        aligned = dict(GEMV=False)
        cands = {"rule": {}, "rule fp8": dict(fp8=True)}
        cands["aligned fused_sum"] = dict(aligned, SUM_TOPK=True)
        cands["aligned torch_sum"] = dict(aligned, SUM_TOPK=False)
        cands["aligned fp8 fused_sum"] = dict(aligned, fp8=True, SUM_TOPK=True)
        cands["gemv"], cands["gemv fp8"] = dict(GEMV=True), dict(GEMV=True, fp8=True)
        tiles = [] if DRY else (DECODE_TILES[1:] + (WIDE_TILES if T >= 64 else []))
        for c in tiles if T in (1, 16, 64) else []:
            for fuse in (True, False):
                cands[
                    "aligned {BLOCK_M}/{BLOCK_N}/{BLOCK_K}/{DOWN_BLOCK_N}/w{num_warps}/s{num_stages} ".format(**c)
                    + ("fused_sum" if fuse else "torch_sum")
                ] = dict(c, GEMV=False, SUM_TOPK=fuse)
        for name, c in (GEMV_TILES if not DRY else GEMV_TILES[:: len(GEMV_GATE_UP)]) if T <= 8 else []:
            cands[name.format(*c.values())] = dict(c, GEMV=True)
        cands["loop"] = None
        for name, c in cands.items():
            if elapsed() > (80 if not DRY else 1e9) and name != "loop":
                continue
            measure(rows, T, x, lg, ref, touched, wbytes, name, c)
        halves = [
            [r for r in rows if r["tokens"] == T and r["impl"].startswith(h) and r.get("ms")] for h in GEMV_HALVES
        ]
        if all(halves):  # the one-token path with each half's fastest tile
            best = [
                min(h + [r for r in rows if r["tokens"] == T and r["impl"] == "gemv"], key=lambda r: r["ms"])
                for h in halves
            ]
            c = dict(GEMV=True)
            for h, b in zip(GEMV_KEYS, best):
                c.update({k: b["config"][k] for k in h})
            measure(rows, T, x, lg, ref, touched, wbytes, "gemv best halves", c)
        by = {r["impl"]: r for r in rows if r["tokens"] == T and r.get("ms")}
        for r in by.values():
            if "aligned fused_sum" in by:
                r["speedup_vs_aligned"] = by["aligned fused_sum"]["ms"] / r["ms"]
            if "loop" in by:
                r["speedup_vs_loop"] = by["loop"]["ms"] / r["ms"]
        ok16 = [r for r in by.values() if r["config"] and not r["config"]["fp8"] and r.get("rel_err_vs_loop", 1) < 2e-2]
        if ok16 and DEV == "cuda" and INSTALL:  # install the fastest correct 16-bit config for this bucket
            best = min(ok16, key=lambda r: r["ms"])
            key = fm.tuned_key(T, E, H, I, K, DT, False)
            cfg = {k: v for k, v in best["config"].items() if k != "fp8"}
            autotune.load().setdefault("fused_moe", {})[autotune._key(key)] = cfg
            res["installed"][f"fused_moe {autotune._key(key)}"] = dict(impl=best["impl"], ms=best["ms"], config=cfg)
    return rows


@part("routing", start_before=90)
def _():
    "The top-k kernel alone, graph replay: its rule and other rows per program and warps, at 1, 4 and 64 tokens."
    rows = []
    for T in (1, 4, 64) if not DRY else (1, 3):
        _, lg = inputs(T, T)
        ref = fm.moe_topk(lg, K, True)
        for c in [None, dict(ROWS=16, num_warps=4), dict(ROWS=1, num_warps=1), dict(ROWS=1, num_warps=2)]:
            r = dict(tokens=T, config=c or "rule")
            w, ids = fm.topk_softmax(lg, K, True, c)
            r["same_experts"] = bool(torch.equal(ids, ref[1]))
            r["ms"] = graph_ms(lambda c=c: fm.topk_softmax(lg, K, True, c))
            rows.append(r)
    return rows


MOE_LINEARS = {
    (5120, 2048): [dict(BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1)],  # qkv
    (2048, 4096): [
        dict(BLOCK_N=4, BLOCK_K=512, SPLIT_K=1),
        dict(BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1),
        dict(BLOCK_N=4, BLOCK_K=2048, SPLIT_K=1),
    ],  # o_proj
    (128, 2048): [
        dict(BLOCK_N=2, BLOCK_K=2048, SPLIT_K=1),
        dict(BLOCK_N=1, BLOCK_K=1024, SPLIT_K=1),
        dict(BLOCK_N=1, BLOCK_K=2048, SPLIT_K=1, num_warps=8),
    ],
}  # router


@part("linear_moe_shapes", start_before=95)
def _():
    "Qwen3-30B-A3B's M = 1 projections: the rule, the SHAPE_RULES entry and a few candidates, graph replay; the best installed."
    rows = []
    for (N, Kf), variants in MOE_LINEARS.items():
        n, k = (N, Kf) if not DRY else (N // 16, Kf // 16)
        w = torch.randn(n, k, device=DEV, dtype=DT) / k**0.5
        x = torch.randn(1, k, device=DEV, dtype=DT)
        rule = lin._rule(1, n, k, DEV, autotune.num_sms(torch.device(DEV)))
        cands = [("rule", rule)] + (
            [("shape_rule", {**rule, **lin.SHAPE_RULES[N, Kf]})] if (N, Kf) in lin.SHAPE_RULES else []
        )
        cands += [("candidate", {**rule, **v}) for v in (variants if not DRY else variants[:1])] + [("torch", None)]
        mine = []
        for name, cfg in cands:
            fn = (
                (lambda cfg=cfg: lin.skinny_linear(x, w, None, cfg))
                if cfg
                else (lambda: torch.nn.functional.linear(x, w))
            )
            r = dict(shape=f"1x{N}x{Kf}", impl=name, config=cfg)
            try:
                r["rel_err"] = rel_err(fn(), x.float() @ w.float().T)
                r["ms"] = graph_ms(fn)
                r["gbps"] = n * k * torch.finfo(DT).bits / 8 / r["ms"] / 1e6
                if cfg and r["rel_err"] < 2e-2:
                    mine.append(r)
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {ex}"
            rows.append(r)
        if mine and DEV == "cuda" and INSTALL:
            best = min(mine, key=lambda r: r["ms"])
            if best["impl"] == "rule":
                lin.SHAPE_RULES.pop((N, Kf), None)
            else:
                lin.SHAPE_RULES[N, Kf] = {
                    k_: best["config"][k_] for k_ in ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")
                }
            res["installed"][f"linear 1x{N}x{Kf}"] = dict(
                impl=best["impl"], ms=best["ms"], shape_rule=lin.SHAPE_RULES.get((N, Kf))
            )
    return rows


del w13, w2, w13_8, w2_8, s13, s2
moe_engine.free(DEV)

from litellama.benchmarks.harness import W1_ROWS

like = moe_engine.model_like(DRY)
PROMPT, GEN = 16, (8 if DRY else 64)
W1 = [(1, 8, 4), (3, 5, 3)] if DRY else W1_ROWS  # (batch, prompt, generated), BENCHMARKS.md's workload 1
HF_W1_TOKENS, HF_W1_SECONDS = (
    (2 if DRY else 16),
    (20 if DRY else 60),
)  # HF is slow: its tokens per row and its time are capped
MODEL = {}


def shared_model():
    "The random-weight model and config the TPOT part built, for the parts after it."
    if "ours" not in MODEL:
        raise RuntimeError("no model: the TPOT part failed or was skipped")
    return MODEL["ours"]


@part("engine_tpot_batch1", start_before=110)
def _():
    out, model, cfg = moe_engine.random_model_tpot(like, DEV, DT, PROMPT, GEN)
    out["installed"] = dict(res["installed"])
    MODEL["ours"] = (model, cfg)  # workload 1 reuses it, then frees it before HF
    return out


@part("engine_tpot_batch1_aligned", start_before=125)
def _():
    "The same model and engine with the aligned path forced at one token: the one-token path's A/B in this process."
    from litellama.kernels import tuned

    model, cfg = shared_model()
    key = fm.tuned_key(1, E, H, I, K, DT, False)
    with tuned.forcing("fused_moe", key, dict(GEMV=False)):
        return moe_engine.engine_tpot(model, cfg, DEV, DT, PROMPT, GEN)


@part("workload1_litellama", start_before=145)
def _():
    "Workload 1 through the engine (CUDA graphs) on the random-weight model of the TPOT part."
    model, cfg = shared_model()
    return moe_engine.workload1_ours(model, cfg, DEV, DT, W1, 64 if DRY else 4096, lambda b: DRY or elapsed() <= 165)


@part("workload2_litellama", start_before=170)
def _():
    "Workload 2 (256 requests, 100-1024 tokens in and out) through the engine on the same model; no HF peer (too slow)."
    model, cfg = shared_model()
    if DRY:
        return dict(skipped="the tiny model's 512 positions and 320-token vocabulary cannot hold workload 2")
    return moe_engine.workload2_ours(model, cfg, DEV, DT, 256, 24000)


MODEL.clear()
moe_engine.free(DEV)


@part("hf_batch1", start_before=260)
def _():
    t_w1 = time.perf_counter()

    def time_left(b):
        est = 5 + 0.04 * b  # seconds a 16-token row and its warm-up take HF (batch 256: about 15 s)
        return time.perf_counter() - t_w1 + est <= HF_W1_SECONDS and (DRY or elapsed() + est <= RUN_LIMIT_S)

    cfg = moe_engine.model_config(like)
    return moe_engine.hf_speed(cfg, DEV, DT, PROMPT, 4 if DRY else 24, W1, HF_W1_TOKENS, time_left)


p = res["parts"]
eng = p.get("engine_tpot_batch1", {})
for name in ("engine_tpot_batch1", "engine_tpot_batch1_aligned"):
    e_ = p.get(name, {})
    if "hf_batch1" in p and isinstance(e_, dict) and "tpot_ms" in e_:
        e_["speedup_vs_hf_batch1"] = (1e3 / e_["tpot_ms"]) / p["hf_batch1"]["output_tok_s"]
if "workload1_litellama" in p:
    p["workload1"] = moe_engine.side_by_side(p)
res["total_seconds"] = round(elapsed(), 1)
path = write_json(res, out_dir, "moe.json")

for r in p.get("correctness", []):
    print("correctness", " ".join(f"{a}={b:.2e}" if isinstance(b, float) else f"{a}={b}" for a, b in r.items()))
print(f"\n{'tokens':>6} {'impl':<40} {'ms':>8} {'GB/s':>7} {'x aligned':>11} {'x loop':>7} {'err':>8}")
for r in p.get("moe_layer", []):
    f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"
    print(
        f"{r['tokens']:>6} {r['impl']:<40} {f('ms', '8.4f')} {f('gbps', '7.0f')} {f('speedup_vs_aligned', '11.3f')} {f('speedup_vs_loop', '7.1f')} {f('rel_err_vs_loop', '8.1e')} {r.get('error', '')}"
    )
for T in TOKENS:  # the issue's figure: the fused path against the loop
    rs = [
        r
        for r in p.get("moe_layer", [])
        if r["tokens"] == T and r.get("speedup_vs_loop") and r["impl"] in ("rule", "aligned fused_sum", "gemv")
    ]
    for r in rs:
        print(f"{T} tokens: {r['impl']} {r['speedup_vs_loop']:.1f}x the per-expert loop")
for r in p.get("routing", []):
    print(f"routing {r['tokens']:>3} tokens {str(r['config']):<32} {r['ms'] * 1e3:7.2f} us same={r['same_experts']}")
for r in p.get("linear_moe_shapes", []):
    cf = {k: v for k, v in (r["config"] or {}).items() if k in ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")}
    print(
        f"linear {r['shape']:<12} {r['impl']:<10} {str(cf):<60} {r.get('ms', float('nan')):8.4f} ms {r.get('gbps', float('nan')):7.0f} GB/s {r.get('error', '')}"
    )
for k, v in res["installed"].items():
    print(f"installed {k}: {v}")
if isinstance(eng, dict) and "tpot_ms" in eng:
    print(f"engine batch-1 TPOT {eng['tpot_ms']:.3f} ms  x HF {eng.get('speedup_vs_hf_batch1', float('nan')):.1f}")
    al = p.get("engine_tpot_batch1_aligned", {})
    if isinstance(al, dict) and "tpot_ms" in al:
        print(f"  aligned path forced: {al['tpot_ms']:.3f} ms  x HF {al.get('speedup_vs_hf_batch1', float('nan')):.1f}")
    prof = eng["decode_profile"]
    if isinstance(prof, dict):
        print(
            f"  all kernels {prof['us_per_step_all_kernels']:.0f} us per step, {prof['kernels_per_step']:.0f} kernels"
        )
        for g_, us in prof["us_per_step_by_group"].items():
            print(f"  {g_:<46} {us:8.1f} us")
        for t_ in prof["top"][:12]:
            print(
                f"    {t_['name'][:60]:<60} {t_['group'][:22]:<22} {t_['us_per_step']:8.1f} us {t_['calls_per_step']:5.0f} calls"
            )
    else:
        print(f"  profile: {prof}")
if "tok_s" in p.get("workload2_litellama", {}):
    print(f"workload 2: {p['workload2_litellama']['tok_s']:.0f} tok/s ({p['workload2_litellama']['seconds']:.1f} s)")
if "hf_batch1" in p:
    print(f"HF batch-1 {p['hf_batch1']['output_tok_s']:.2f} tok/s ({p['hf_batch1']['experts_implementation']})")
moe_engine.print_end(res, path)
