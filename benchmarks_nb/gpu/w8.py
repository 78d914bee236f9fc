"""8-bit GEMMs and the 8-bit schemes through the engine, on one GPU, in one call of about 140 s at most:
(1) the W8A16 decode kernel (int8 bit-trick widening, fp8, fp8 with block scales spanning one or several blocks per step)
    against its reference in bf16, M = 1, 4, 16 and ragged shapes;
(2) a sweep of launch configs of that kernel for M = 1 and 16 on Qwen3-8B's four projections and its LM head under
    CUDA-graph replay (20 calls per graph, weights rotated over copies beyond L2), bf16 F.linear and skinny_linear as peers
    in the same run (tile shapes, num_warps 2/4/8, no split-K / split-K, prefetching the next step); prints the best per
    shape and a suggested `W8A16_TUNED`, and installs it (`set_w8a16_tuned`) before the engines;
(2b) large M (256, 1024, 4096): the tiled kernel against widen-to-bf16-then-cuBLAS, bf16 F.linear as the peer; installs
    the crossover as `DEQUANT_M["cuda"]`;
(3) Qwen3-8B-shape random weights built in GPU memory, per scheme (bf16, int8 W8A16, fp8 W8A16, fp8 W8A8): batch-1 TPOT
    through the engine with CUDA graphs, prefill of one 4,096-token prompt (tok/s), weight memory, KV capacity and a
    profile of a decode step; then the M = 4 sweep with what time is left.
Every kernel variant launched here compiles for sm_90 on a CPU first: benchmarks_nb/gpu/w8_ptx.py.

    PYTHONPATH=. python3 benchmarks_nb/gpu/w8.py $OUT            # on the GPU: writes $OUT/w8.json
    PYTHONPATH=. python3 benchmarks_nb/gpu/w8.py /tmp --dry-run  # on a CPU: tiny shapes, Triton interpreter
    W8_ONLY=engine W8_SCHEMES="bf16,int8 W8A16" ...               # only the parts (name prefixes) and schemes named
"""

import statistics, gc, json, math, os, sys, time
from pathlib import Path

DRY = "--dry-run" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--dry-run"]
OUT = Path(ARGS[0] if ARGS else os.environ.get("OUT", "."))
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
sys.path.insert(0, str(Path(__file__).parent))
import torch
import torch.nn.functional as F
from common import (
    FP8,
    QWEN3_8B,
    SKINNY_GEMV,
    SKINNY_GEMV_TUNED,
    Budget,
    copies_for,
    eager_ms,
    environment,
    graph_ms,
    quant_block,
    quant_rows,
    rel,
    skinny_gemv_config,
    sync,
)
from litellama.kernels import quant_gemm as qg
from litellama.kernels.linear import skinny_linear

CUDA = torch.cuda.is_available() and not DRY
DEV, DT = ("cuda" if CUDA else "cpu"), (torch.bfloat16 if CUDA else torch.float32)
RES = environment(DRY)
RES["timing"] = "graph_ms: 20 calls in one CUDA graph, weights rotated over copies of >= 256 MB, median of 5 replays"
B = Budget(float(os.environ.get("W8_BUDGET_S", 900 if DRY else 135)), RES)
ONLY = [p for p in os.environ.get("W8_ONLY", "").split(",") if p]


def part(name, need):
    "`B.part`, unless `W8_ONLY` names other parts: then the part is listed as skipped."
    if ONLY and not any(name.startswith(p) for p in ONLY):
        return lambda fn: RES["skipped"].append(f"{name} (W8_ONLY)")
    return B.part(name, need)


BK = 32 if DRY else 128
SHAPES = None  # set with the candidates below
MS = (1, 2, 16) if DRY else (1, 4, 16)


def weights(kind, w):
    if kind == "int8":
        return quant_rows(w, torch.int8) + (None,)
    if kind == "fp8":
        return quant_rows(w, FP8) + (None,)
    return quant_block(w, BK) + ((1, BK),)


# ---------------------------------------------------------------- (1) correctness on the GPU
@part("correctness", need=5)
def _():
    rows = []
    P, D = dict(PREFETCH=True), dict(DEQUANT=True)
    cfgs = {
        "int8": [None, dict(MAGIC=False), P, dict(P, SPLIT_K=1), D],
        "fp8": [None, P, D],  # None: the table's own config
        "fp8b": [None, dict(BLOCK_N=16, BLOCK_K=BK // 2), dict(BLOCK_N=8, BLOCK_K=BK, SPLIT_K=1), P, D],
    }
    shapes = (
        ((1, 48, 100), (2, 40, 96), (16, 33, 130))
        if DRY
        else ((1, 4096, 4096), (4, 6144, 4096), (16, 4096, 12288), (1, 1000, 600), (5, 33, 4160))
    )
    g = torch.Generator(device=DEV).manual_seed(0)
    for M, N, K in shapes:
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        for kind in ("int8", "fp8", "fp8b"):
            q, s, blk = weights(kind, w)
            ref = qg.w8a16_gemm_ref(x, q, s, None, blk)
            for cfg in cfgs[kind]:
                r = dict(kind=kind, M=M, N=N, K=K, config=cfg)
                try:
                    r["rel_err"] = rel(qg.w8a16_gemm(x, q, s, None, blk, cfg), ref)
                    r["ok"] = r["rel_err"] < (1e-5 if DT == torch.float32 else 1e-2)
                except Exception as e:
                    r.update(error=f"{type(e).__name__}: {str(e)[:200]}", ok=False)
                rows.append(r)
        # exact int8: integer activations, unit scales: every float32 partial sum is an integer below 2**24
        qi = torch.randint(-128, 128, (N, K), device=DEV, dtype=torch.int8)
        xi = torch.randint(-4, 5, (M, K), device=DEV).float()
        exact = (xi.double() @ qi.double().T).float()
        y = qg.w8a16_gemm(xi, qi, torch.ones(N, device=DEV))
        rows.append(
            dict(
                kind="int8 exact (fp32)",
                M=M,
                N=N,
                K=K,
                mismatches=int((y != exact).sum()),
                ok=bool(torch.equal(y, exact)),
            )
        )
    from litellama.kernels.activation import silu_and_mul

    for M, N, K in ((1, 2 * 1536, 4096), (4, 2 * 1000, 600), (16, 2 * 768, 4096)) if not DRY else ((1, 48, 100),):
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        for kind in ("int8", "fp8", "fp8b"):
            q, s, blk = weights(kind, w)
            for cfg in (None, dict(SPLIT_K=1)):
                y = qg.w8a16_gemm(x, q, s, None, blk, cfg, gated=True)
                plain = silu_and_mul(qg.w8a16_gemm(x, q, s, None, blk, cfg))
                d = (y.float() - plain.float()).abs()
                rows.append(
                    dict(
                        kind=f"{kind} gated",
                        M=M,
                        N=N,
                        K=K,
                        config=cfg,
                        mismatches=int((d > 0).sum()),
                        max_diff=float(d.max()),
                        ok=bool(rel(y, plain) < 1e-2),
                    )
                )
    RES["correctness"] = rows
    print(f"correctness: {sum(r['ok'] for r in rows)}/{len(rows)} ok", flush=True)
    for r in rows:
        if not r["ok"]:
            print("  FAIL", r)


# ---------------------------------------------------------------- (2) sweep of the decode path
# ---- candidates (benchmarks_nb/gpu/w8_ptx.py compiles each of these for sm_90 on a CPU)
C = dict
SHAPES_GPU = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (24576, 4096),
    "down": (4096, 12288),
    "lm_head": (151936, 4096),
}
if DRY:
    CANDS = {
        "channel": [
            C(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1),
            C(BLOCK_N=16, BLOCK_K=64, num_warps=1, num_stages=1, SPLIT_K=1),
            C(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1, PREFETCH=True),
        ],
        "block": [
            C(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1),
            C(BLOCK_N=8, BLOCK_K=64, num_warps=1, num_stages=1),
        ],
    }
    CANDS_DOT = CANDS
else:  # M = 1: few rows, long K loads (bytes per step = BLOCK_N * BLOCK_K); split-K from the rule unless given
    CANDS = {
        "channel": [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
            for bn, bk, nw, ns in (
                (8, 512, 4, 3),
                (4, 1024, 4, 3),
                (8, 1024, 4, 3),
                (16, 512, 4, 3),
                (4, 2048, 4, 3),
                (4, 2048, 8, 3),
                (2, 4096, 8, 3),
                (8, 1024, 8, 3),
                (4, 1024, 2, 3),
                (8, 512, 2, 4),
                (16, 1024, 8, 4),
                (2, 2048, 4, 4),
            )
        ]
        + [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns, SPLIT_K=1)
            for bn, bk, nw, ns in (
                (8, 512, 4, 3),
                (4, 1024, 4, 3),
                (4, 2048, 8, 3),
                (2, 4096, 8, 3),
                (8, 1024, 8, 3),
                (2, 1024, 4, 4),
                (1, 4096, 4, 3),
            )
        ]
        + [C(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3, SPLIT_K=2) for bn, bk in ((4, 1024), (8, 512))]
        + [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3, PREFETCH=True, **sk)
            for bn, bk, nw in ((8, 512, 4), (4, 1024, 4), (4, 2048, 8), (8, 1024, 8), (4, 512, 2))
            for sk in ({}, dict(SPLIT_K=1))
        ],
        "block": [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3)
            for bn, bk, nw in ((8, 512, 4), (4, 1024, 4), (16, 512, 8), (16, 128, 4), (4, 2048, 8), (8, 1024, 8))
        ]
        + [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3, SPLIT_K=1)
            for bn, bk, nw in ((4, 1024, 4), (4, 2048, 8), (8, 512, 4))
        ]
        + [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3, PREFETCH=True)
            for bn, bk, nw in ((8, 512, 4), (4, 1024, 4), (4, 2048, 8))
        ],
    }
    CANDS_DOT = {
        "channel": [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
            for bn, bk, nw, ns in (
                (16, 256, 4, 3),
                (32, 256, 4, 3),
                (16, 512, 4, 3),
                (32, 512, 4, 4),
                (64, 256, 8, 3),
                (16, 1024, 8, 3),
                (32, 512, 8, 3),
            )
        ]
        + [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3, SPLIT_K=1)
            for bn, bk, nw in ((16, 512, 4), (32, 256, 4), (16, 1024, 8))
        ]
        + [C(BLOCK_N=bn, BLOCK_K=bk, num_warps=4, num_stages=3, PREFETCH=True) for bn, bk in ((32, 256), (16, 512))],
        "block": [
            C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
            for bn, bk, nw, ns in ((16, 256, 4, 3), (32, 256, 4, 3), (16, 512, 4, 3), (32, 128, 4, 3), (16, 1024, 8, 3))
        ]
        + [C(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=3, PREFETCH=True)],
    }
# ---- end candidates
SHAPES = {"qkv": (48, 64), "down": (40, 96), "lm_head": (80, 64)} if DRY else SHAPES_GPU
SUGGEST, BEST = {}, {}
RES["sweep"] = []


def path_of(M, kind):
    return qg._w8a16_path(M, kind == "fp8b")


def sweep(M, kind, need=6):
    tag = f"M={M} {kind}"
    cands = (CANDS if M == 1 else CANDS_DOT)["block" if kind == "fp8b" else "channel"]
    for pname, (N, K) in SHAPES.items():
        if B.left() < need:
            RES["skipped"].append(f"sweep {tag} {pname}")
            continue
        if CUDA:
            torch.cuda.empty_cache()
        g = torch.Generator(device=DEV).manual_seed(N + K)
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        q0, s0, blk = weights(kind, w)
        n = copies_for(N * K, CUDA)
        cps = [(q0, s0)] + [(q0.clone(), s0.clone()) for _ in range(n - 1)]
        ref = qg.w8a16_gemm_ref(x, q0, s0, None, blk)
        peers = {}
        if kind == "int8":  # the bf16 peers once per shape and M
            wb = [w.to(DT)] + [w.to(DT) for _ in range(copies_for(2 * N * K, CUDA) - 1)]
            for name, fn in (("bf16 F.linear", F.linear), ("bf16 skinny_linear", skinny_linear)):
                try:
                    peers[name] = graph_ms([lambda w_=w_: fn(x, w_) for w_ in wb], CUDA)
                except Exception as e:
                    peers[name] = f"{type(e).__name__}: {str(e)[:120]}"
            del wb
            RES.setdefault("peers", {})[f"M={M} {pname}"] = peers
        del w
        best = None
        for cfg in [None] + cands:
            if B.left() < need:
                RES["skipped"].append(f"sweep {tag} {pname} {cfg}")
                break
            r = dict(M=M, kind=kind, proj=pname, N=N, K=K, config=cfg or "table")
            try:
                fns = [lambda q=q, s=s: qg.w8a16_gemm(x, q, s, None, blk, cfg) for q, s in cps]
                r["rel_err"] = rel(fns[0](), ref)
                r["ok"] = r["rel_err"] < (1e-5 if DT == torch.float32 else 1e-2)
                r["graph_ms"] = graph_ms(fns, CUDA)
                r["weight_tbps"] = N * K / r["graph_ms"] / 1e9
            except Exception as e:
                r.update(error=f"{type(e).__name__}: {str(e)[:160]}", ok=False)
            RES["sweep"].append(r)
            if r["ok"] and cfg is not None and (best is None or r["graph_ms"] < best["graph_ms"]):
                best = r
        del cps
        if CUDA:
            torch.cuda.empty_cache()
        if best:
            bf = RES.get("peers", {}).get(f"M={M} {pname}", {}).get("bf16 F.linear")
            best = dict(best, time_vs_bf16=best["graph_ms"] / bf if isinstance(bf, float) else None)
            BEST[f"{tag} {pname}"] = best
            SUGGEST[(path_of(M, kind), "fp8" if kind != "int8" else "int8", N, K)] = dict(best["config"])
            print(
                f"  {tag:<12}{pname:<8} best {best['graph_ms']:.4f} ms {best['weight_tbps']:.2f} TB/s "
                f"x bf16 {best['time_vs_bf16'] or float('nan'):.2f}  {best['config']}",
                flush=True,
            )


SWEEP_NEED = 1 if DRY else 60  # seconds the M = 1 sweeps leave for the prefill paths and the engines


def sweeps(ms):
    for M in ms:
        for kind in ("int8", "fp8", "fp8b"):
            part(f"sweep M={M} {kind}", need=SWEEP_NEED)(lambda M=M, kind=kind: sweep(M, kind, need=SWEEP_NEED))


sweeps((1,))  # batch-1 decode first: the engines' TPOT uses it; M = 16 and 4 after the engines
part("install table", need=0)(
    lambda: qg.set_w8a16_tuned({**qg.W8A16_TUNED, **SUGGEST})
)  # the engines use what was measured

# ---------------------------------------------------------------- (2b) large M: the tiled kernel or widen-then-cuBLAS
PRE_MS = (32, 64) if DRY else (256, 1024, 4096)
PRE_SHAPES = {k: SHAPES[k] for k in (("qkv", "down") if DRY else ("qkv", "gate_up", "down"))}


@part("prefill paths", need=1 if DRY else 45)
def _():
    rows, tot = [], {}
    for M in PRE_MS:
        for pname, (N, K) in PRE_SHAPES.items():
            if B.left() < (1 if DRY else 38):
                RES["skipped"].append(f"prefill paths M={M} {pname}")
                continue  # the engines' time
            if CUDA:
                torch.cuda.empty_cache()
            g = torch.Generator(device=DEV).manual_seed(M + N)
            w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
            x = torch.randn(M, K, device=DEV, generator=g).to(DT)
            wb = w.to(DT)
            r = dict(M=M, proj=pname, N=N, K=K)
            try:
                r["bf16 F.linear"] = eager_ms(lambda: F.linear(x, wb), CUDA)
            except Exception as e:
                r["bf16 error"] = str(e)[:160]
            del wb
            for kind in ("int8", "fp8", "fp8b"):
                q, s, blk = weights(kind, w)
                ref = qg.w8a16_gemm_ref(x, q, s, None, blk)
                for way, cfg in (("tiled", dict(DEQUANT=False)), ("dequant", dict(DEQUANT=True))):
                    try:
                        e = rel(qg.w8a16_gemm(x, q, s, None, blk, cfg), ref)
                        if e > (1e-5 if DT == torch.float32 else 1e-2):
                            raise ValueError(f"rel_err {e:.3g}")
                        r[f"{kind} {way}"] = t = eager_ms(lambda: qg.w8a16_gemm(x, q, s, None, blk, cfg), CUDA)
                        tot[(M, kind, way)] = tot.get((M, kind, way), 0) + t
                    except Exception as ex:
                        r[f"{kind} {way} error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                del q, s
            del w, x, ref
            rows.append(r)
            print(
                f"  prefill M={M:<5}{pname:<8}"
                + "  ".join(f"{k} {v:.3f}" for k, v in r.items() if isinstance(v, float)),
                flush=True,
            )
    RES["prefill_paths"] = rows
    # the crossover: the smallest M from which widening wins for every kind measured there (and at every larger M)
    kinds = ("int8", "fp8", "fp8b")
    measured = [M for M in PRE_MS if all((M, k, w) in tot for k in kinds for w in ("tiled", "dequant"))]
    wins = [M for M in measured if all(tot[(M, k, "dequant")] <= tot[(M, k, "tiled")] for k in kinds)]
    good = [M for M in wins if all(m in wins for m in measured if m >= M)]
    dev = "cuda" if CUDA else "cpu"
    if not measured:
        return  # nothing complete: keep the default
    new = min(good) if good else (1 << 62)
    RES["dequant_m"] = dict(
        before=qg.DEQUANT_M.get(dev), installed=new, measured_ms={str(k): v for k, v in tot.items()}
    )
    qg.DEQUANT_M[dev] = new
    print(f"  DEQUANT_M[{dev}] = {new}", flush=True)


RES["best"] = BEST
RES["suggested_W8A16_TUNED"] = {str(k): v for k, v in SUGGEST.items()}


def decode_stack():
    "Projection time of one decode step over 36 layers, per kind and M, from the best configs (and the bf16 peer)."
    out = {}
    for M in MS:
        for kind in ("bf16", "int8", "fp8", "fp8b"):
            ts = []
            for p in SHAPES:
                if kind == "bf16":
                    t = RES.get("peers", {}).get(f"M={M} {p}", {}).get("bf16 F.linear")
                else:
                    t = BEST.get(f"M={M} {kind} {p}", {}).get("graph_ms")
                ts.append((t if isinstance(t, float) else None, p))
            if all(t is not None for t, _ in ts):  # 36 layers of four projections, and the LM head once
                out[f"M={M} {kind}"] = sum(t * (1 if p == "lm_head" else 36) for t, p in ts)
    for k, v in list(out.items()):
        b = out.get(k.split(" ")[0] + " bf16")
        if b and not k.endswith("bf16"):
            out[k + " / bf16"] = v / b
    return out


try:
    RES["decode_step_projection_ms"] = decode_stack()
except Exception as e:
    RES["errors"]["decode_stack"] = str(e)


@part("w8a8 fast accum", need=1 if DRY else 10)
def _():
    "fp8 x fp8 at prefill sizes through torch._scaled_mm, with and without fast accumulation, against bf16 F.linear."
    if not CUDA:
        return
    rows = []
    for M in (4096,):
        for pname, (N, K) in {k: SHAPES_GPU[k] for k in ("qkv", "o", "gate_up", "down")}.items():
            g = torch.Generator(device=DEV).manual_seed(M + N + K)
            w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
            x = torch.randn(M, K, device=DEV, generator=g).to(DT)
            q, s = quant_rows(w, FP8)
            xq, sx = qg.per_token_quant(x, FP8)
            ref = (xq.float() * sx.reshape(-1, 1)) @ (q.float() * s[:, None]).T
            wb = w.to(DT)
            r = dict(M=M, proj=pname, N=N, K=K, bf16_ms=eager_ms(lambda: F.linear(x, wb), CUDA))
            r["quant_ms"] = eager_ms(lambda: qg.per_token_quant(x, FP8), CUDA)
            for fast in (False, True):
                qg.FP8_FAST_ACCUM = fast
                fn = lambda: qg.scaled_mm(xq, sx, q, s, None, DT)
                r[f"fast={fast} ms"], r[f"fast={fast} rel_err"] = eager_ms(fn, CUDA), rel(fn(), ref)
            qg.FP8_FAST_ACCUM = False
            rows.append(r)
            print(
                f"  fast accum {pname:<8}" + "  ".join(f"{k} {v:.4g}" for k, v in r.items() if isinstance(v, float)),
                flush=True,
            )
            del w, x, q, xq, ref, wb
    RES["w8a8_fast_accum"] = rows


# ---------------------------------------------------------------- (3) the engine, per scheme


def scheme_quant(name):
    from litellama.layers.linear import get_quant_config

    if name == "bf16":
        return None
    if name == "fp8 W8A16":
        from litellama.layers.quant8 import Fp8Config, RuntimeW8

        class Fp8W8A16(Fp8Config):
            def method_for(self, layer, prefix):
                return RuntimeW8(FP8, w8a8=False)

        return Fp8W8A16()
    return get_quant_config({"int8 W8A16": "int8", "fp8 W8A8": "fp8"}[name])


def build(cfg, quant, seed=0):
    "A model of `cfg` on the device with random 16-bit weights, each quantized linear loaded shard by shard as from a checkpoint."
    from litellama.models.decoder import model_class
    from litellama.layers.linear import Linear

    with torch.device(DEV):
        model = model_class(cfg)(cfg, dtype=DT, device=DEV, quant=quant)
    g = torch.Generator(device=DEV).manual_seed(seed)
    for name, p in model.named_parameters():
        if not p.is_floating_point() or p.element_size() == 1 or name.endswith(("weight_scale", "weight_scale_inv")):
            continue
        if "norm" in name:
            p.data.normal_(1.0, 0.1, generator=g)
        elif p.dim() == 1:
            p.data.normal_(0.0, 0.1, generator=g)
        else:
            p.data.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
    for mod in model.modules():
        if isinstance(mod, Linear) and mod.weight.element_size() == 1:
            for shard, (off, size) in mod.shards.items():
                w = torch.empty(size, mod.in_features, device=DEV, dtype=DT).normal_(
                    0.0, mod.in_features**-0.5, generator=g
                )
                mod.load_weight("weight", w, shard)
                del w
            mod.process_after_loading()
    return model


def weight_bytes(model):
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        n += t.numel() * t.element_size()
    return n


def top_kernels(eng, per: int = 1) -> dict:
    "Run `eng` until its requests finish, under the profiler: the top kernels, microseconds (divided by `per`)."
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])) as prof:
        while eng.has_unfinished_requests():
            eng.step()
        sync()
    ev = prof.key_averages()
    key = next(
        (k for k in ("self_device_time_total", "self_cuda_time_total") if CUDA and hasattr(ev[0], k)),
        "self_cpu_time_total",
    )
    top = sorted(ev, key=lambda e: -getattr(e, key))[:12]
    return dict(metric=key, top=[dict(name=e.key[:80], us_per_step=getattr(e, key) / per, calls=e.count) for e in top])


def decode_profile(eng, steps=8):
    "Where a batch-1 decode step's GPU time goes: the top kernels over `steps` steps, microseconds per step."
    from litellama.sampling_params import SamplingParams

    eng.add_request(list(range(1, 17)), SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    eng.step()
    sync()  # the prefill, outside the profile
    return dict(top_kernels(eng, steps), steps=steps)


def prefill_profile(eng, n):
    "Where one prefill of `n` tokens spends its GPU time: the top kernels, microseconds (the step is one)."
    from litellama.sampling_params import SamplingParams

    eng.add_request(list(range(1, n + 1)), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    return top_kernels(eng)


PROMPT, GEN, PREFILL = (8, 6, 64) if DRY else (128, 64, 4096)
ENG = {}


def model_config():
    "The engine rows' model: Qwen3-8B's shape, or the tiny Qwen3 in a dry run."
    from transformers import AutoConfig
    from litellama.testing.checkpoints import SHAPES as CK

    return AutoConfig.for_model(**(CK["tiny-qwen3"] if DRY else QWEN3_8B))


def batch1_engine(model, cfg, max_tokens: int):
    "A one-sequence engine over `model` (CUDA graphs on a GPU), prompts up to `max_tokens`, no prefix caching."
    from litellama.engine.llm_engine import ContinuousBatchingEngine
    from litellama.testing.tokenizer import make_tokenizer

    kw = dict(num_kv_blocks=64) if DRY else {}
    return ContinuousBatchingEngine(
        model,
        cfg,
        make_tokenizer(),
        device=DEV,
        dtype=DT,
        max_num_seqs=1,
        max_model_len=max_tokens + 64,
        max_num_batched_tokens=max_tokens,
        enable_prefix_caching=False,
        **kw,
    )


def engine_part(scheme, key=None):
    from litellama.sampling_params import SamplingParams

    cfg = model_config()
    if CUDA:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    model = build(cfg, scheme_quant(scheme))
    sync()
    r = dict(build_s=time.perf_counter() - t, weight_bytes=weight_bytes(model))
    if CUDA:
        r["peak_allocated_while_building"] = torch.cuda.max_memory_allocated()
    t = time.perf_counter()
    eng = batch1_engine(model, cfg, PREFILL)
    sync()
    r["engine_setup_s"] = time.perf_counter() - t
    st = eng.stats
    r["kv_capacity_tokens"] = (st() if callable(st) else st).kv_capacity_tokens
    runs = []
    for seed in range(2 if DRY else 5):  # the first warms up; the median of the others
        prompt = torch.randint(
            0, 10000 if not DRY else 300, (PROMPT,), generator=torch.Generator().manual_seed(seed)
        ).tolist()
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=GEN, ignore_eos=True))
        times = []
        while eng.has_unfinished_requests():
            outs = eng.step()
            times += [time.perf_counter()] * sum(len(o.token_ids) for o in outs)
        runs.append((times[-1] - times[0]) / (len(times) - 1) * 1e3)
    r["tpot_ms"], r["tpot_runs_ms"] = statistics.median(runs[1:]), runs
    pre = []
    for seed in range(3):  # one prompt of PREFILL tokens, one step; the first warms up
        prompt = torch.randint(
            0, 10000 if not DRY else 300, (PREFILL,), generator=torch.Generator().manual_seed(10 + seed)
        ).tolist()
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
        sync()
        t = time.perf_counter()
        while eng.has_unfinished_requests():
            eng.step()
        sync()
        pre.append(time.perf_counter() - t)
    r["prefill_s_runs"] = pre
    r["prefill_tok_s"] = PREFILL / sorted(pre[1:])[len(pre[1:]) // 2]
    for name, fn in (
        ("decode_profile", lambda: decode_profile(eng)),
        ("prefill_profile", lambda: prefill_profile(eng, PREFILL)),
    ):
        try:
            r[name] = fn()
        except Exception as e:
            r[name] = f"{type(e).__name__}: {str(e)[:200]}"
    r["graphs"] = sorted(eng.runner.graphs) if hasattr(eng.runner, "graphs") else None
    del eng, model
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    ENG[key or scheme] = r
    print(
        f"  engine {key or scheme:<12} TPOT {r['tpot_ms']:.3f} ms  prefill {r['prefill_tok_s']:.0f} tok/s  weights {r['weight_bytes'] / 1e9:.2f} GB  "
        f"KV {r['kv_capacity_tokens']} tokens",
        flush=True,
    )


VARIANTS = {  # suffixes of a scheme's name that switch one change off for that row (an A/B inside one process)
    " -gated": "silu(gate) * up after the GEMM, not inside it",
    " -fast": "fp8 W8A8 without fast accumulation",
    " -gemv": "one token through the skinny kernel and its former tiles, not _w8a16_gemv_kernel",
}
def skinny_gemv_table():
    "W8A16_TUNED with the one-token entries of the skinny kernel in place of the current ones."
    table = {k: v for k, v in qg.W8A16_TUNED.items() if k[0] != "gemv"}
    for kind, N, K in SKINNY_GEMV_TUNED:
        table[("gemv", kind, N, K)] = skinny_gemv_config(kind, N, K)
    return table


def engine_scheme(name):
    "One engine row; each suffix of `VARIANTS` undoes its change for this row only (a parent tree has none of them)."
    from litellama.layers import base, quant8

    scheme, fused = name, {c: getattr(c, "apply_silu_mul", None) for c in (quant8.RuntimeW8, quant8.CheckpointW8)}
    for v in VARIANTS:
        scheme = scheme.replace(v, "")
    if " -gated" in name:
        for c in fused:
            c.apply_silu_mul = base.LinearMethod.apply_silu_mul
    fast = getattr(qg, "FP8_FAST_ACCUM", None)
    if " -fast" in name:
        qg.FP8_FAST_ACCUM = False
    table, gemv = dict(qg.W8A16_TUNED), dict(qg.W8A16_CONFIGS["gemv"])
    if " -gemv" in name:
        qg.W8A16_CONFIGS["gemv"] = dict(SKINNY_GEMV)
        qg.set_w8a16_tuned(skinny_gemv_table())
    try:
        engine_part(scheme, name)
    finally:
        for c, f in fused.items():
            if f is not None:
                c.apply_silu_mul = f
        if fast is not None:
            qg.FP8_FAST_ACCUM = fast
        if " -gemv" in name:
            qg.W8A16_CONFIGS["gemv"] = gemv
            qg.set_w8a16_tuned(table)


RES["engine"] = ENG


def engine_calls(scheme):
    "The W8A16 calls of one batch-1 decode step as the engine makes them (its warm-up, outside graph capture)."
    from litellama.layers import quant8

    cfg = model_config()
    model, calls, orig = build(cfg, scheme_quant(scheme)), [], quant8.RuntimeW8.apply

    def rec(self, layer, x, bias=None, gated=False):
        capturing = CUDA and torch.cuda.is_current_stream_capturing()
        if not capturing and x.reshape(-1, x.shape[-1]).shape[0] == 1:
            calls.append((layer, x, bias, gated))
        return orig(self, layer, x, bias, gated)

    quant8.RuntimeW8.apply = rec
    try:
        eng = batch1_engine(model, cfg, 192)
        if not calls:  # no warm-up outside capture (the CPU): one eager decode step
            from litellama.sampling_params import SamplingParams

            eng.add_request([1, 2, 3, 4], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
            while eng.has_unfinished_requests():
                eng.step()
    finally:
        quant8.RuntimeW8.apply = orig
    return model, eng, calls


@part("gemv calls", need=1 if DRY else 40)
def gemv_calls():
    """Each projection's one-token W8A16 call as the engine makes it, timed over all layers' weights (HBM, not L2):
    the one-token kernel against the skinny kernel's former tiles, with the engine's activations and a fresh copy."""
    out = RES["gemv_calls"] = {}
    for scheme in ("int8 W8A16", "fp8 W8A16"):
        model, eng, calls = engine_calls(scheme)
        groups = {}
        for layer, x, bias, gated in calls:
            groups.setdefault((tuple(layer.weight.shape), gated), []).append((layer, x, bias))
        kind = "fp8" if scheme.startswith("fp8") else "int8"
        for (shape, gated), cs in groups.items():
            x = cs[0][1].reshape(-1, cs[0][1].shape[-1])
            old = skinny_gemv_config(kind, *shape)
            row = dict(shape=list(shape), gated=gated, calls=len(cs), x_stride=list(x.stride()),
                       x_ptr_mod16=x.data_ptr() % 16, w_ptr_mod16=cs[0][0].weight.data_ptr() % 16)  # fmt: skip
            for name, cfg, fresh in (("gemv", None, False), ("skinny", old, False), ("gemv fresh x", None, True)):
                fns = []
                for layer, xi, bias in cs:
                    xi = xi.reshape(-1, xi.shape[-1])
                    xi = xi.clone() if fresh else xi
                    fns.append(lambda l=layer, xi=xi, b=bias: qg.w8a16_gemm(xi, l.weight, l.weight_scale, b, None, cfg, gated))
                row[name] = graph_ms(fns, CUDA, calls=max(20, len(fns)))
            out[f"{kind} {shape[0]}x{shape[1]}{' gated' if gated else ''}"] = row
            print(f"  gemv calls {kind} {shape} gated={gated}: {row}", flush=True)
        del eng, model, calls, groups
        gc.collect()
        if CUDA:
            torch.cuda.empty_cache()

SCHEMES = os.environ.get("W8_SCHEMES", "bf16,int8 W8A16,fp8 W8A16,fp8 W8A8").split(",")
for scheme in SCHEMES:
    part(f"engine {scheme}", need=12 if not DRY else 1)(lambda scheme=scheme: engine_scheme(scheme))
if "bf16" in ENG:
    b = ENG["bf16"]
    RES["engine_vs_bf16"] = {
        s: dict(
            tpot=r["tpot_ms"] / b["tpot_ms"],
            prefill_speed=r["prefill_tok_s"] / b["prefill_tok_s"],
            weight_memory=r["weight_bytes"] / b["weight_bytes"],
            kv_capacity=r["kv_capacity_tokens"] / b["kv_capacity_tokens"],
        )
        for s, r in ENG.items()
        if s != "bf16"
    }

# ---------------------------------------------------------------- the M = 16 and 4 sweeps, for the table only, with what is left
SWEEP_NEED = 1 if DRY else 6
sweeps((16, 2) if DRY else (16, 4))
RES["best"] = BEST
RES["suggested_W8A16_TUNED"] = {str(k): v for k, v in SUGGEST.items()}
try:
    RES["decode_step_projection_ms"] = decode_stack()
except Exception as e:
    RES["errors"]["decode_stack"] = str(e)
RES["total_seconds"] = round(time.time() - B.t0, 1)
OUT.mkdir(parents=True, exist_ok=True)
(OUT / "w8.json").write_text(json.dumps(RES, indent=1, default=str))
print("\ndecode-step projections (36 layers, ms):", json.dumps(RES.get("decode_step_projection_ms", {}), indent=1))
print("engine vs bf16:", json.dumps(RES.get("engine_vs_bf16", {}), indent=1))
print("\nsuggested W8A16_TUNED for kernels_nb/12_quant_gemm.ipynb:")
for k, v in SUGGEST.items():
    print(f"    {k}: {v},")
print(
    f"\nwrote {OUT / 'w8.json'} in {RES['total_seconds']} s; errors: {list(RES['errors']) or 'none'}; skipped: {len(RES['skipped'])}"
)
