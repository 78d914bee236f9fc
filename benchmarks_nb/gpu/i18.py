"""8-bit GEMMs on one GPU: bf16 correctness of every kernel against its PyTorch reference, then a speed sweep on
Qwen3-8B projection shapes (M = 1, 16, 64, 256, 4096) of each kernel against bf16 torch.matmul in the same run,
the decode-step linear time of a Qwen3-8B-shaped stack, weight memory and peak memory while quantizing at load.

    PYTHONPATH=. python3 benchmarks_nb/gpu/i18.py $OUT            # on the GPU: writes $OUT/i18.json
    PYTHONPATH=. python3 benchmarks_nb/gpu/i18.py /tmp --dry-run  # on a CPU, tiny shapes, Triton interpreter
"""
import datetime, json, math, os, subprocess, sys, time, traceback
from pathlib import Path

DRY = "--dry-run" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--dry-run"]
OUT = Path(ARGS[0] if ARGS else os.environ.get("OUT", "."))
if DRY: os.environ["TRITON_INTERPRET"] = "1"          # before any kernel is defined

import torch
import torch.nn.functional as F
import triton
import transformers
from litellama.kernels import quant_gemm as qg

DEV = "cpu" if DRY or not torch.cuda.is_available() else "cuda"
DT = torch.float32 if DEV == "cpu" else torch.bfloat16
FP8 = torch.float8_e4m3fn
T0 = time.time()
RES = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu (dry run)", "torch": torch.__version__,
       "triton": triton.__version__, "transformers": transformers.__version__,
       "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
       "command": " ".join([sys.executable] + sys.argv), "dry_run": DRY, "errors": {}}
try: RES["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
except Exception: RES["commit"] = "unknown"
if DEV == "cuda": RES["capability"] = list(torch.cuda.get_device_capability())

def part(name):
    "Run one part; record its error and go on."
    def deco(fn):
        t = time.time()
        try: fn()
        except Exception as e:
            RES["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        RES.setdefault("part_seconds", {})[name] = round(time.time() - t, 2)
        return fn
    return deco

def bench(fn):
    "Median milliseconds of `fn`."
    if DEV == "cpu":
        fn(); t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3
    return triton.testing.do_bench(fn, warmup=5, rep=20, return_mode="median")

def quant_rows(w, dtype):
    s = w.float().abs().amax(1).clamp_min(1e-10) / qg.QMAX[dtype]
    q = w.float() / s[:, None]
    return (q.round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else q.clamp(-448, 448).to(dtype)), s

def quant_block(w, bk=128):
    "fp8 weight with one scale per row and `bk` columns (what the block method keeps after load)."
    N, K = w.shape
    kb = -(-K // bk)
    pad = F.pad(w.float(), (0, kb * bk - K)).view(N, kb, bk)
    s = pad.abs().amax(-1).clamp_min(1e-10) / 448
    return (pad / s[..., None]).view(N, kb * bk)[:, :K].to(FP8), s.contiguous()

def rel(a, b): return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()

# ---------------------------------------------------------------- correctness
@part("correctness")
def _():
    rows = []
    shapes = ((1, 24, 100), (5, 40, 72), (37, 33, 65)) if DRY else ((1, 4096, 4096), (7, 1000, 600), (37, 6144, 4096), (300, 1000, 600), (4096, 4096, 4096))
    g = torch.Generator(device=DEV).manual_seed(0)
    for M, N, K in shapes:
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        b = torch.randn(N, device=DEV, generator=g).to(DT)
        wq, sq = quant_rows(w, torch.int8); wf, sf = quant_rows(w, FP8); wb, sb = quant_block(w, 32 if DRY else 128)
        blk = (1, 32 if DRY else 128)
        cases = {
            "w8a16_int8": lambda: (qg.w8a16_gemm(x, wq, sq, b), qg.w8a16_gemm_ref(x, wq, sq, b)),
            "w8a16_fp8": lambda: (qg.w8a16_gemm(x, wf, sf, b), qg.w8a16_gemm_ref(x, wf, sf, b)),
            "w8a16_fp8_block": lambda: (qg.w8a16_gemm(x, wb, sb, b, blk), qg.w8a16_gemm_ref(x, wb, sb, b, blk)),
        }
        xq, sx = qg.per_token_quant(x, torch.int8); xf, sxf = qg.per_token_quant(x, FP8); xg, sxg = qg.per_token_quant(x, FP8, blk[1])
        cases["scaled_mm_int8"] = lambda: (qg.scaled_mm(xq, sx, wq, sq, b, DT), qg.scaled_mm_ref(xq, sx, wq, sq, b, DT))
        cases["scaled_mm_fp8"] = lambda: (qg.scaled_mm(xf, sxf, wf, sf, b, DT), qg.scaled_mm_ref(xf, sxf, wf, sf, b, DT))
        cases["block_scaled_mm_fp8"] = lambda: (qg.block_scaled_mm(xg, sxg, wb, sb, blk, b, DT), qg.block_scaled_mm_ref(xg, sxg, wb, sb, blk, b, DT))
        for name, fn in cases.items():
            try:
                y, r = fn()
                e = rel(y, r)
                rows.append(dict(kernel=name, M=M, N=N, K=K, rel_err=e, ok=e < (1e-5 if DT == torch.float32 else 1e-2)))
            except Exception as ex:
                rows.append(dict(kernel=name, M=M, N=N, K=K, error=f"{type(ex).__name__}: {ex}", ok=False))
        # the int8 GEMM's integer sums are exact: compare against the reference with the same float epilogue, in float32
        try:
            y, r = qg.scaled_mm(xq, sx, wq, sq), qg.scaled_mm_ref(xq, sx, wq, sq)
            rows.append(dict(kernel="scaled_mm_int8_exact", M=M, N=N, K=K, mismatches=int((y != r).sum()), ok=bool(torch.equal(y, r))))
        except Exception as ex: rows.append(dict(kernel="scaled_mm_int8_exact", M=M, N=N, K=K, error=str(ex), ok=False))
        for dt in (torch.int8, FP8):
            q1, s1 = qg.per_token_quant(x, dt); q2, s2 = qg.per_token_quant_ref(x, dt)
            mism = (q1.view(torch.int8) != q2.view(torch.int8)).float().mean().item()
            rows.append(dict(kernel=f"per_token_quant_{'int8' if dt == torch.int8 else 'fp8'}", M=M, N=N, K=K,
                             code_mismatch_frac=mism, scale_rel_err=rel(s1, s2), ok=mism < 1e-3))
    RES["correctness"] = rows
    print(f"correctness: {sum(r['ok'] for r in rows)}/{len(rows)} ok")
    for r in rows:
        if not r["ok"]: print("  FAIL", r)

# ---------------------------------------------------------------- speed sweep
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}   # Qwen3-8B [N, K]
MS = (1, 16, 64, 256, 4096)
if DRY: SHAPES, MS = {"qkv": (48, 64), "down": (64, 96)}, (1, 16, 40)

@part("sweep")
def _():
    rows = []
    for pname, (N, K) in SHAPES.items():
        w = torch.randn(N, K, device=DEV) / math.sqrt(K)
        w16 = w.to(DT)
        wq, sq = quant_rows(w, torch.int8); wf, sf = quant_rows(w, FP8); wb, sb = quant_block(w, 32 if DRY else 128)
        blk = (1, 32 if DRY else 128)
        del w
        for M in MS:
            x = torch.randn(M, K, device=DEV).to(DT)
            xq, sx = qg.per_token_quant(x, torch.int8); xf, sxf = qg.per_token_quant(x, FP8); xg, sxg = qg.per_token_quant(x, FP8, blk[1])
            v = {"bf16_matmul": (lambda: F.linear(x, w16), 2),
                 "w8a16_int8": (lambda: qg.w8a16_gemm(x, wq, sq), 1),
                 "w8a16_fp8": (lambda: qg.w8a16_gemm(x, wf, sf), 1),
                 "w8a16_fp8_block": (lambda: qg.w8a16_gemm(x, wb, sb, None, blk), 1),
                 "scaled_mm_int8": (lambda: qg.scaled_mm(xq, sx, wq, sq, None, DT), 1),
                 "quant+scaled_mm_int8": (lambda: qg.scaled_mm(*qg.per_token_quant(x, torch.int8), wq, sq, None, DT), 1),
                 "scaled_mm_fp8": (lambda: qg.scaled_mm(xf, sxf, wf, sf, None, DT), 1),
                 "quant+scaled_mm_fp8": (lambda: qg.scaled_mm(*qg.per_token_quant(x, FP8), wf, sf, None, DT), 1),
                 "quant+block_scaled_mm_fp8": (lambda: qg.block_scaled_mm(*qg.per_token_quant(x, FP8, blk[1]), wb, sb, blk, None, DT), 1),
                 "per_token_quant_fp8": (lambda: qg.per_token_quant(x, FP8), 0)}
            if DEV == "cuda":
                wfT = wf.t()
                if M > 16: v["torch._int_mm (peer)"] = (lambda: torch._int_mm(xq, wq.t()), 1)
                v["torch._scaled_mm fp8 rowwise (peer)"] = (lambda: torch._scaled_mm(xf, wfT, scale_a=sxf[:, None], scale_b=sf[None, :], out_dtype=DT), 1)
            for name, (fn, wbytes) in v.items():
                try:
                    ms = bench(fn)
                    moved = N * K * wbytes + M * K * 2 + M * N * 2
                    rows.append(dict(proj=pname, M=M, N=N, K=K, variant=name, ms=ms,
                                     tflops=2 * M * N * K / ms / 1e9 if wbytes else None, gbps=moved / ms / 1e6))
                except Exception as ex:
                    rows.append(dict(proj=pname, M=M, N=N, K=K, variant=name, error=f"{type(ex).__name__}: {str(ex)[:200]}"))
        del w16, wq, wf, wb
        if DEV == "cuda": torch.cuda.empty_cache()
    RES["sweep"] = rows
    base = {(r["proj"], r["M"]): r["ms"] for r in rows if r["variant"] == "bf16_matmul" and "ms" in r}
    for r in rows:
        if "ms" in r and (r["proj"], r["M"]) in base: r["speedup_vs_bf16"] = base[(r["proj"], r["M"])] / r["ms"]
    print(f"\n{'proj':<8}{'M':>6}  {'variant':<36}{'ms':>9}{'TFLOP/s':>9}{'GB/s':>8}{'x bf16':>8}")
    for r in rows:
        if "ms" in r: print(f"{r['proj']:<8}{r['M']:>6}  {r['variant']:<36}{r['ms']:>9.4f}{(r['tflops'] or 0):>9.1f}{r['gbps']:>8.0f}{r.get('speedup_vs_bf16', 0):>8.2f}")
        else: print(f"{r['proj']:<8}{r['M']:>6}  {r['variant']:<36} error: {r['error'][:60]}")

# ---------------------------------------------------------------- decode-step linear time, weight memory
@part("decode_stack")
def _():
    "Time of one decode token's projections over the 36 layers of Qwen3-8B (M = 1 and M = 64), per scheme, from the sweep."
    layers = 2 if DRY else 36
    out = {}
    for M in (1, 64) if not DRY else (1, 16):
        for scheme, var in (("bf16", "bf16_matmul"), ("int8 W8A16", "w8a16_int8"), ("fp8 W8A16", "w8a16_fp8"),
                            ("fp8-block W8A16", "w8a16_fp8_block"), ("int8 W8A8", "quant+scaled_mm_int8"),
                            ("fp8 W8A8", "quant+scaled_mm_fp8"), ("fp8-block W8A8", "quant+block_scaled_mm_fp8")):
            ts = [r["ms"] for r in RES["sweep"] if r["M"] == M and r["variant"] == var and "ms" in r]
            if len(ts) == len(SHAPES): out[f"M={M} {scheme}"] = layers * sum(ts)
    RES["decode_stack_linear_ms"] = out
    b1 = out.get("M=1 bf16")
    print("\nlinear time of one step, all layers (ms):")
    for k, t in out.items(): print(f"  {k:<24}{t:8.3f}" + (f"   {t / b1:.2f}x bf16" if b1 and k.startswith("M=1") else ""))
    # weight bytes of the Qwen3-8B projections (36 layers), exact from the shapes
    per_layer = sum(N * K for N, K in {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}.values())
    chan = sum(N for N, K in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)))
    blocks = sum(N * -(-K // 128) for N, K in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)))
    emb = 151936 * 4096 * 2
    RES["weight_bytes_qwen3_8b"] = {"bf16": 36 * per_layer * 2 + 2 * emb, "int8/fp8 per-channel": 36 * (per_layer + 4 * chan) + 2 * emb,
                                    "fp8 block (row scales)": 36 * (per_layer + 4 * blocks) + 2 * emb,
                                    "note": "36 layers of projections plus the 16-bit embedding and LM head (untied, kept 16-bit)"}
    wb = RES["weight_bytes_qwen3_8b"]
    RES["weight_bytes_ratio"] = {k: wb[k] / wb["bf16"] for k in wb if k not in ("bf16", "note")}
    RES["projection_bytes_ratio"] = {"per-channel": (per_layer + 4 * chan) / (per_layer * 2), "block": (per_layer + 4 * blocks) / (per_layer * 2)}
    print("weight memory vs bf16:", {k: round(v, 3) for k, v in RES["weight_bytes_ratio"].items()},
          "projections only:", {k: round(v, 3) for k, v in RES["projection_bytes_ratio"].items()})

@part("load_peak_memory")
def _():
    "Quantize four Qwen3-8B layers' projections at load, tensor by tensor: peak allocated vs quantized size + one tensor."
    if DEV != "cuda": RES["load_peak_memory"] = "skipped on the CPU"; return
    from litellama.layers import Linear
    from litellama.quant8 import RuntimeW8
    torch.cuda.synchronize(); torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    lins, biggest = [], 0
    for _ in range(4):
        for out_f, in_f in (({"q": 4096, "k": 1024, "v": 1024}, 4096), (4096, 4096), ({"gate": 12288, "up": 12288}, 4096), (4096, 12288)):
            lins.append(Linear(in_f, out_f, False, DT, DEV, method=RuntimeW8(torch.int8)))
    quantized = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    for lin in lins:
        for shard, (off, size) in lin.shards.items():
            t = torch.randn(size, lin.in_features, device=DEV, dtype=DT); biggest = max(biggest, t.numel() * 2)
            lin.load_weight("weight", t, shard); del t
    peak = torch.cuda.max_memory_allocated() - base
    RES["load_peak_memory"] = dict(quantized_bytes=quantized, largest_checkpoint_tensor_bytes=biggest, peak_bytes=peak,
                                   bf16_bytes=sum(l.out_features * l.in_features * 2 for l in lins),
                                   peak_over_quantized_plus_one=peak / (quantized + biggest))
    print("\nload peak memory:", RES["load_peak_memory"])

RES["total_seconds"] = round(time.time() - T0, 1)
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "i18.json").write_text(json.dumps(RES, indent=1, default=str))
print(f"\nwrote {OUT / 'i18.json'} in {RES['total_seconds']} s; errors: {list(RES['errors']) or 'none'}")
