"""Qwen3-MoE batch-1 decode: the decode MoE kernels (routing inside gate|up, the top-k sum inside down, no alignment)
against the aligned path (top-k, alignment, grouped GEMMs, torch's sum) and the per-expert loop, on Qwen3-30B-A3B's expert
shapes; the M = 1 linear shapes of SHAPE_RULES with and without split-K; the engine's batch-1 TPOT with its decode profile,
old path (LITELLAMA_MOE_DECODE_TOKENS=0 and no SHAPE_RULES) against new, on one random-weight model; HF batch 1 in the same run.

    PYTHONPATH=. python3 benchmarks_nb/gpu/moe.py OUT_DIR                                   # on the GPU
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/moe.py OUT_DIR --dry-run      # tiny shapes, CPU

Writes OUT_DIR/moe.json and prints a table. Every part is guarded: a failure is recorded and the next part runs; no part
starts after its time limit, so the whole run stays under 150 s."""
import gc, json, os, subprocess, sys, time, traceback
from datetime import datetime, timezone

DRY = "--dry-run" in sys.argv
if DRY: os.environ.setdefault("TRITON_INTERPRET", "1")
import torch
import triton

T0 = time.perf_counter()
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
SHAPE = dict(E=4, K=2, H=64, I=128) if DRY else dict(E=128, K=8, H=2048, I=768)
TOKENS = (1, 2, 16) if DRY else (1, 2, 4, 16, 64)
out_dir = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
res = dict(name="moe", dry_run=DRY, command=" ".join(["PYTHONPATH=. python3"] + sys.argv), shape=SHAPE, dtype=str(DT),
           parts={}, errors={}, part_seconds={})

def env():
    import transformers
    try: commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except Exception: commit = "unknown"
    return dict(gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (dry run)", torch=torch.__version__,
                triton=triton.__version__, transformers=transformers.__version__,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"), commit=commit)

def sync():
    if DEV == "cuda": torch.cuda.synchronize()

def graph_ms(fn, calls=10):
    "Ms per call of `fn` replayed from one CUDA graph of `calls` calls; on the CPU the median wall time of three calls."
    if DEV == "cuda":
        from litellama.kernels.autotune import graph_ms as g
        return g(fn, calls=calls)
    ts = []
    for _ in range(3):
        t = time.perf_counter(); fn(); ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[1]

def part(name, start_before):
    "Run a part unless the run is already `start_before` seconds old; record its result or its error."
    def deco(fn):
        limit = start_before * (30 if DRY else 1)                 # the CPU dry run checks the code, not the time
        if time.perf_counter() - T0 > limit:
            res["errors"][name] = f"skipped: the run was past {limit} s"; return fn
        t = time.perf_counter()
        try: res["parts"][name] = fn()
        except Exception as e:
            res["errors"][name] = f"{type(e).__name__}: {e}"; traceback.print_exc()
        res["part_seconds"][name] = round(time.perf_counter() - t, 2)
        gc.collect()
        if DEV == "cuda": torch.cuda.empty_cache()
        return fn
    return deco

def rel_err(a, b): return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))

res["environment"] = env()
from litellama.kernels import fused_moe as fm
from litellama.kernels import linear as lin

E, K, H, I = SHAPE["E"], SHAPE["K"], SHAPE["H"], SHAPE["I"]
g = torch.Generator(device=DEV).manual_seed(0)
w13 = (torch.randn(E, 2 * I, H, device=DEV, generator=g) / H ** 0.5).to(DT)
w2 = (torch.randn(E, H, I, device=DEV, generator=g) / I ** 0.5).to(DT)
w13_8, s13 = fm.quantize_blockwise(w13.float())
w2_8, s2 = fm.quantize_blockwise(w2.float())

def inputs(T, seed):
    gg = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(T, H, device=DEV, generator=gg).to(DT), torch.randn(T, E, device=DEV, generator=gg).to(DT)

def old_path(x, logits, *scales):
    "What the model ran before: top-k kernel, then alignment, the grouped GEMMs and torch's sum over the top-k."
    tw, ti = fm.topk_softmax(logits, K, True)
    return fm.fused_moe(x, w13_8 if scales else w13, w2_8 if scales else w2, tw, ti, *scales)

@part("correctness", start_before=30)
def _():
    rows = []
    for T in TOKENS:
        x, lg = inputs(T, T)
        r = dict(tokens=T)
        if T <= 4:
            new = fm.fused_moe_decode(x, lg, w13, w2, K, True)
            r["decode_vs_aligned"] = rel_err(new, old_path(x, lg))
            r["decode_vs_loop"] = rel_err(new, fm.routed_moe_reference(x, lg, w13, w2, K, True))
            r["decode_vs_fp32_loop"] = rel_err(new, fm.routed_moe_reference(x.float(), lg.float(), w13.float(), w2.float(), K, True))
            r["aligned_vs_fp32_loop"] = rel_err(old_path(x, lg), fm.routed_moe_reference(x.float(), lg.float(), w13.float(), w2.float(), K, True))
            new8 = fm.fused_moe_decode(x, lg, w13_8, w2_8, K, True, s13, s2)
            w13d, w2d = fm.dequantize_blockwise(w13_8, s13, 128, DT), fm.dequantize_blockwise(w2_8, s2, 128, DT)
            r["decode_fp8_vs_dequantized_loop"] = rel_err(new8, fm.routed_moe_reference(x, lg, w13d, w2d, K, True))
            r["decode_fp8_vs_aligned_fp8"] = rel_err(new8, old_path(x, lg, s13, s2))
        r["routed_vs_loop"] = rel_err(fm.routed_moe(x, lg, w13, w2, K, True), fm.routed_moe_reference(x, lg, w13, w2, K, True))
        tol = 1e-5 if DRY else 2e-2
        r["ok"] = all(v < tol for k, v in r.items() if k.endswith(("vs_loop", "vs_aligned", "vs_aligned_fp8")))
        rows.append(r)
    # the routing the gate|up kernel writes for the down kernel equals the reference top-k (ids exactly, weights to rounding)
    x, lg = inputs(4, 99)
    tw, ti = torch.empty(4, K, dtype=DT, device=DEV), torch.empty(4, K, dtype=torch.int32, device=DEV)
    h = torch.empty(4 * K, I, dtype=DT, device=DEV)
    fm._moe_decode_gate_up_kernel[(4 * K, triton.cdiv(I, 16))](
        x, lg, w13, x, h, tw, ti, E, H, I, x.stride(0), lg.stride(0), w13.stride(0), w13.stride(1), 0, 0, 0, TOP_K=K,
        E_PAD=triton.next_power_of_2(E), RENORM=True, FP8=False, WIDEN=False, SB=128, BLOCK_N=16, BLOCK_K=64 if DRY else 256)
    rw, ri = fm.moe_topk(lg, K, True)
    rows.append(dict(routing_ids_equal=bool((ti == ri).all()), routing_weight_err=rel_err(tw, rw)))
    return rows

@part("moe_layer", start_before=55)
def _():
    "The sparse block from the router's logits, graph replay: old path, new path (routed_moe), decode configs, the loop."
    rows, e = [], torch.finfo(DT).bits // 8
    for T in TOKENS:
        x, lg = inputs(T, T)
        touched = int(torch.unique(fm.moe_topk(lg, K, True)[1]).numel())
        wbytes = touched * 3 * H * I * e
        cands = {"old": lambda: old_path(x, lg), "new": lambda: fm.routed_moe(x, lg, w13, w2, K, True),
                 "old_fp8": lambda: old_path(x, lg, s13, s2), "new_fp8": lambda: fm.routed_moe(x, lg, w13_8, w2_8, K, True, s13, s2)}
        if T <= 4 and not DRY:                                     # a few decode tiles beside the rule
            for bn, bk, dbn, dbk, nw in ((16, 256, 16, 256, 4), (8, 256, 8, 256, 4), (16, 512, 8, 512, 4), (32, 128, 16, 128, 4),
                                         (16, 256, 8, 256, 8), (8, 512, 4, 512, 4)):
                c = dict(BLOCK_N=bn, BLOCK_K=bk, DOWN_BLOCK_N=dbn, DOWN_BLOCK_K=dbk, num_warps=nw, num_stages=3)
                cands[f"decode {bn}/{bk}/{dbn}/{dbk}/w{nw}"] = (lambda c=c: fm.fused_moe_decode(x, lg, w13, w2, K, True, config=c))
        if T <= 16: cands["loop"] = lambda: fm.routed_moe_reference(x, lg, w13, w2, K, True)
        ref = fm.routed_moe_reference(x, lg, w13, w2, K, True)
        for name, fn in cands.items():
            if time.perf_counter() - T0 > (50 if not DRY else 1e9): break
            r = dict(tokens=T, impl=name, experts_touched=touched)
            try:
                out = fn(); sync()
                if "fp8" not in name: r["rel_err_vs_loop"] = rel_err(out, ref)
                r["ms"] = graph_ms(fn) if name != "loop" or DRY else triton.testing.do_bench(fn, warmup=3, rep=30, return_mode="median")
                r["gbps"] = wbytes / (2 if "fp8" in name else 1) / r["ms"] / 1e6
            except Exception as ex: r["error"] = f"{type(ex).__name__}: {ex}"
            rows.append(r)
        by = {r["impl"]: r for r in rows if r["tokens"] == T and r.get("ms")}
        for r in by.values():
            if "old" in by: r["speedup_vs_old"] = by["old"]["ms"] / r["ms"]
            if "loop" in by: r["speedup_vs_loop"] = by["loop"]["ms"] / r["ms"]
    return rows

MOE_LINEARS = {(5120, 2048): [dict(BLOCK_N=16, BLOCK_K=512, SPLIT_K=1), dict(BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1),
                              dict(BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, num_warps=8)],             # qkv
               (2048, 4096): [dict(BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1), dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=1),
                              dict(BLOCK_N=4, BLOCK_K=512, SPLIT_K=1, num_warps=8)],              # o_proj
               (128, 2048): [dict(BLOCK_N=2, BLOCK_K=1024, SPLIT_K=1), dict(BLOCK_N=1, BLOCK_K=2048, SPLIT_K=1),
                             dict(BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1), dict(BLOCK_N=1, BLOCK_K=1024, SPLIT_K=2)]}   # router

@part("linear_moe_shapes", start_before=60)
def _():
    "Qwen3-30B-A3B's M = 1 projections: the rule, the SHAPE_RULES entry (o_proj, router) and a few candidates, graph replay."
    rows = []
    for (N, Kf), variants in MOE_LINEARS.items():
        n, k = (N, Kf) if not DRY else (N // 16, Kf // 16)
        w = torch.randn(n, k, device=DEV, dtype=DT) / k ** 0.5
        x = torch.randn(1, k, device=DEV, dtype=DT)
        rule = lin._rule(1, n, k, DEV, lin.autotune.num_sms(torch.device(DEV)))
        cands = [("rule", rule)] + ([("shape_rule", {**rule, **lin.SHAPE_RULES[N, Kf]})] if (N, Kf) in lin.SHAPE_RULES else [])
        cands += [("candidate", {**rule, **v}) for v in (variants if not DRY else variants[:1])] + [("torch", None)]
        for name, cfg in cands:
            fn = (lambda cfg=cfg: lin.skinny_linear(x, w, None, cfg)) if cfg else (lambda: torch.nn.functional.linear(x, w))
            r = dict(shape=f"1x{N}x{Kf}", impl=name, config=cfg)
            try:
                r["rel_err"] = rel_err(fn(), x.float() @ w.float().T)
                r["ms"] = graph_ms(fn)
                r["gbps"] = n * k * torch.finfo(DT).bits / 8 / r["ms"] / 1e6
            except Exception as ex: r["error"] = f"{type(ex).__name__}: {ex}"
            rows.append(r)
    return rows

del w13, w2, w13_8, w2_8, s13, s2
gc.collect()
if DEV == "cuda": torch.cuda.empty_cache()

from litellama.checkpoints import SHAPES, make_tokenizer
like = "tiny-qwen3-moe" if DRY else "qwen3-30b-a3b"
PROMPT, GEN = 16, (8 if DRY else 64)
MODEL = {}
GROUPS = {"dense linears (qkv, o, router) + split sums": ("_skinny_linear", "_split_sum", "nvjet", "gemv", "gemm"),
          "expert GEMMs": ("_moe_gate_up", "_moe_down", "_moe_decode_gate_up", "_moe_decode_down"),
          "MoE glue (routing, alignment, top-k sum)": ("_moe_align", "_topk_softmax", "reduce_kernel", "bfloat16_copy"),
          "attention and rope": ("_decode_", "_rope"), "norms": ("_rms_norm",)}

def engine_tpot(model, cfg, label):
    "Batch-1 TPOT over two timed requests after a warm-up, and the kernels of 8 decode steps."
    from litellama.engine import ContinuousBatchingEngine
    from litellama.sampling import SamplingParams
    t = time.perf_counter()
    eng = ContinuousBatchingEngine(model, cfg, make_tokenizer(), device=DEV, dtype=DT, max_num_seqs=1, max_model_len=256,
                                   max_num_batched_tokens=256, num_kv_blocks=64, enable_prefix_caching=False)
    sync(); setup_s = time.perf_counter() - t
    runs, outs_tokens = [], []
    for seed in range(3):                                          # the first warms up
        prompt = torch.randint(0, min(10000, cfg.vocab_size), (PROMPT,), generator=torch.Generator().manual_seed(seed)).tolist()
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=GEN, ignore_eos=True))
        times, toks = [], []
        while eng.has_unfinished_requests():
            outs = eng.step()
            for o in outs: toks += list(o.token_ids)
            times += [time.perf_counter()] * sum(len(o.token_ids) for o in outs)
        runs.append((times[-1] - times[0]) / (len(times) - 1) * 1e3)
        outs_tokens.append(toks)
    profile = None
    try:
        from torch.profiler import profile as tprof, ProfilerActivity
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
        eng.step(); sync()                                         # the prefill, outside the profile
        with tprof(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])) as prof:
            while eng.has_unfinished_requests(): eng.step()
            sync()
        avg = prof.key_averages()
        key = next(k for k in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total")
                   if hasattr(avg[0], k) and (DEV == "cuda" or k == "self_cpu_time_total"))
        kern = [e for e in avg if getattr(e, key) > 0 and not e.key.startswith(("aten::", "cuda", "Activity"))]
        kern.sort(key=lambda e: -getattr(e, key))
        profile = dict(steps=8, metric=key, top=[dict(name=e.key[:90], us_per_step=getattr(e, key) / 8, calls_per_step=e.count / 8) for e in kern[:18]],
                       us_per_step_by_group={g_: sum(getattr(e, key) for e in kern if any(p in e.key for p in pats)) / 8 for g_, pats in GROUPS.items()},
                       us_per_step_all_kernels=sum(getattr(e, key) for e in kern) / 8, kernels_per_step=sum(e.count for e in kern) / 8)
    except Exception as e: profile = f"{type(e).__name__}: {e}"
    del eng
    gc.collect()
    return dict(label=label, tpot_ms=sorted(runs[1:])[len(runs[1:]) // 2], runs_ms=runs, engine_setup_s=setup_s,
                prompt=PROMPT, generated=GEN, decode_profile=profile, tokens=outs_tokens[1][:16])

@part("engine_tpot_batch1", start_before=70)
def _():
    from transformers import AutoConfig
    from litellama.models.qwen3_moe import random_model
    cfg = AutoConfig.for_model(**SHAPES[like])
    model = random_model(cfg, DT, DEV, seed=0)
    sync()
    out = {}
    saved_tokens, saved_rules = fm.DECODE_MAX_TOKENS, dict(lin.SHAPE_RULES)
    try:
        fm.DECODE_MAX_TOKENS = 0; lin.SHAPE_RULES.clear()              # the old path, captured into its own graphs
        try: out["old"] = engine_tpot(model, cfg, "old: topk + align + grouped GEMMs + torch sum; split-K o_proj and router")
        except Exception as e: out["old"] = f"{type(e).__name__}: {e}"; traceback.print_exc()
    finally:
        fm.DECODE_MAX_TOKENS = saved_tokens; lin.SHAPE_RULES.update(saved_rules)
    if time.perf_counter() - T0 < (100 if not DRY else 1e9):
        out["new"] = engine_tpot(model, cfg, f"new: decode kernels up to {fm.DECODE_MAX_TOKENS} tokens; SHAPE_RULES")
    if isinstance(out.get("old"), dict) and isinstance(out.get("new"), dict):
        out["same_greedy_tokens"] = out["old"]["tokens"] == out["new"]["tokens"]
        out["tpot_speedup"] = out["old"]["tpot_ms"] / out["new"]["tpot_ms"]
    out["params"] = sum(p.numel() for p in model.parameters())
    del model
    return out

gc.collect()
if DEV == "cuda": torch.cuda.empty_cache()

@part("hf_batch1", start_before=112)
def _():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model(**SHAPES[like])
    with torch.device(DEV): hf = AutoModelForCausalLM.from_config(cfg, dtype=DT)
    hf.eval()
    ids = torch.randint(0, min(10000, cfg.vocab_size), (1, PROMPT), device=DEV)
    n = 4 if DRY else 12
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0)   # warm up
        sync(); t = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync(); s = time.perf_counter() - t
    impl = getattr(hf.config, "_experts_implementation", None)
    del hf
    return dict(output_tok_s=(out.shape[1] - PROMPT) / s, seconds=s, generated=n, experts_implementation=impl)

p = res["parts"]
eng = p.get("engine_tpot_batch1", {})
if "hf_batch1" in p:
    for k in ("old", "new"):
        if isinstance(eng.get(k), dict): eng[k]["speedup_vs_hf_batch1"] = (1e3 / eng[k]["tpot_ms"]) / p["hf_batch1"]["output_tok_s"]
res["total_seconds"] = round(time.perf_counter() - T0, 1)
os.makedirs(out_dir, exist_ok=True)
path = os.path.join(out_dir, "moe.json")
with open(path, "w") as f: json.dump(res, f, indent=1, default=str)

for r in p.get("correctness", []): print("correctness", " ".join(f"{a}={b:.2e}" if isinstance(b, float) else f"{a}={b}" for a, b in r.items()))
print(f"\n{'tokens':>6} {'impl':<28} {'ms':>8} {'GB/s':>7} {'x old':>6} {'x loop':>7} {'err':>8}")
for r in p.get("moe_layer", []):
    f = lambda k, fmt: format(r[k], fmt) if r.get(k) is not None else "-"
    print(f"{r['tokens']:>6} {r['impl']:<28} {f('ms', '8.4f')} {f('gbps', '7.0f')} {f('speedup_vs_old', '6.2f')} {f('speedup_vs_loop', '7.1f')} {f('rel_err_vs_loop', '8.1e')} {r.get('error', '')}")
for r in p.get("linear_moe_shapes", []):
    cf = {k: v for k, v in (r["config"] or {}).items() if k in ("BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps")}
    print(f"linear {r['shape']:<12} {r['impl']:<10} {str(cf):<60} {r.get('ms', float('nan')):8.4f} ms {r.get('gbps', float('nan')):7.0f} GB/s {r.get('error', '')}")
for k in ("old", "new"):
    v = eng.get(k)
    if isinstance(v, dict):
        prof = v["decode_profile"]
        print(f"engine batch-1 TPOT {k}: {v['tpot_ms']:.3f} ms  x HF {v.get('speedup_vs_hf_batch1', float('nan')):.1f}")
        if isinstance(prof, dict):
            print(f"  all kernels {prof['us_per_step_all_kernels']:.0f} us per step, {prof['kernels_per_step']:.0f} kernels")
            for g_, us in prof["us_per_step_by_group"].items(): print(f"  {g_:<46} {us:8.1f} us")
    elif v: print(f"engine {k}: {v}")
if "same_greedy_tokens" in eng: print(f"old and new give the same greedy tokens: {eng['same_greedy_tokens']}; TPOT speed-up {eng['tpot_speedup']:.3f}")
if "hf_batch1" in p: print(f"HF batch-1 {p['hf_batch1']['output_tok_s']:.2f} tok/s ({p['hf_batch1']['experts_implementation']})")
for k, v in res["errors"].items(): print(f"ERROR {k}: {v}")
print(f"wrote {path} in {res['total_seconds']} s")
