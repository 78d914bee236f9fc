"""8-bit GEMMs on one GPU: bf16 correctness of every kernel (and of the torch._scaled_mm fast path) against its PyTorch
reference; then, on Qwen3-8B projection shapes, each kernel against bf16 F.linear in the same run, timed both under
CUDA-graph replay (20 calls in one graph, weights rotated through copies larger than L2, so every call reads its weight
from HBM) and eagerly (do_bench); sweeps of launch configs (M = 1 GEMV, M = 4/16 skinny, M = 4096 tiles) with each
variant's correctness, printing the best per shape and a `W8A16_TUNED` / `W8A8_TUNED` table to paste into
kernels_nb/12_quant_gemm.ipynb; the decode-step linear time of a Qwen3-8B stack; weight memory; peak memory while
quantizing at load (when litellama.layers.quant8 is in the tree). Every part is guarded; a global time guard skips what is left.

    PYTHONPATH=. python3 benchmarks_nb/gpu/quant8_gemm.py $OUT            # on the GPU: writes $OUT/quant8_gemm.json
    PYTHONPATH=. python3 benchmarks_nb/gpu/quant8_gemm.py /tmp --dry-run  # on a CPU, tiny shapes, Triton interpreter
"""

import json, math, os, sys, time
from pathlib import Path

DRY = "--dry-run" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--dry-run"]
OUT = Path(ARGS[0] if ARGS else os.environ.get("OUT", "."))
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is defined
T0 = time.time()
BUDGET = float(os.environ.get("I18_BUDGET_S", 600 if DRY else 110))  # seconds for the whole script

import torch
import torch.nn.functional as F
from common import FP8, Budget, copies_for, eager_ms, environment, graph_ms, quant_block, quant_rows, rel, write_json
from litellama.kernels import quant_gemm as qg

DEV = "cpu" if DRY or not torch.cuda.is_available() else "cuda"
CUDA = DEV == "cuda"
DT = torch.float32 if DEV == "cpu" else torch.bfloat16
RES = environment(DRY)
RES["timing"] = (
    "graph_ms: 20 calls captured in one CUDA graph, weights rotated over copies of >= 256 MB, "
    "median of 5 replays / 20; eager_ms: triton.testing.do_bench median (host launch overhead included)"
)
B = Budget(BUDGET, RES, t0=T0)
part, left = B.part, B.left
if DEV == "cuda":
    RES["capability"] = list(torch.cuda.get_device_capability())
RES["defaults"] = {
    "W8A16_CONFIGS": getattr(qg, "W8A16_CONFIGS", None),
    "W8A8_CONFIGS": getattr(qg, "W8A8_CONFIGS", None),
    "FP8_BACKEND": getattr(qg, "FP8_BACKEND", None),
}


def exact_int8_ref(xq, sx, wq, sw, bias=None, out_dtype=torch.float32):
    "scaled_mm_ref with the integer sums done in float64 (exact here; CUDA has no int64 matmul)."
    acc = (xq.double() @ wq.double().T).float()
    y = acc * sx.float().reshape(-1, 1) * sw.float().reshape(1, -1)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


BK = 32 if DRY else 128
BLK = (1, BK)


# ---------------------------------------------------------------- correctness
@part("correctness")
def _():
    rows = []
    shapes = (
        ((1, 24, 100), (5, 40, 72), (37, 33, 64))
        if DRY
        else ((1, 4096, 4096), (4, 1000, 608), (16, 6144, 4096), (300, 1000, 600), (1024, 4096, 4096))
    )
    g = torch.Generator(device=DEV).manual_seed(0)
    for M, N, K in shapes:
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        b = torch.randn(N, device=DEV, generator=g).to(DT)
        wq, sq = quant_rows(w, torch.int8)
        wf, sf = quant_rows(w, FP8)
        wb, sb = quant_block(w, BK)
        xq, sx = qg.per_token_quant(x, torch.int8)
        xf, sxf = qg.per_token_quant(x, FP8)
        xg, sxg = qg.per_token_quant(x, FP8, BK)
        cases = {
            "w8a16_int8": lambda: (qg.w8a16_gemm(x, wq, sq, b), qg.w8a16_gemm_ref(x, wq, sq, b)),
            "w8a16_fp8": lambda: (qg.w8a16_gemm(x, wf, sf, b), qg.w8a16_gemm_ref(x, wf, sf, b)),
            "w8a16_fp8_block": lambda: (qg.w8a16_gemm(x, wb, sb, b, BLK), qg.w8a16_gemm_ref(x, wb, sb, b, BLK)),
            "scaled_mm_int8": lambda: (qg.scaled_mm(xq, sx, wq, sq, b, DT), exact_int8_ref(xq, sx, wq, sq, b, DT)),
            "scaled_mm_fp8 (default path)": lambda: (
                qg.scaled_mm(xf, sxf, wf, sf, b, DT),
                qg.scaled_mm_ref(xf, sxf, wf, sf, b, DT),
            ),
            "scaled_mm_fp8 (triton)": lambda: (
                qg.scaled_mm(xf, sxf, wf, sf, b, DT, config=qg._w8a8_rule(M, N, K, None, xf.device, "fp8")),
                qg.scaled_mm_ref(xf, sxf, wf, sf, b, DT),
            ),
            "block_scaled_mm_fp8": lambda: (
                qg.block_scaled_mm(xg, sxg, wb, sb, BLK, b, DT),
                qg.block_scaled_mm_ref(xg, sxg, wb, sb, BLK, b, DT),
            ),
        }
        for name, fn in cases.items():
            try:
                y, r = fn()
                e = rel(y, r)
                rows.append(dict(kernel=name, M=M, N=N, K=K, rel_err=e, ok=e < (1e-5 if DT == torch.float32 else 1e-2)))
            except Exception as ex:
                rows.append(dict(kernel=name, M=M, N=N, K=K, error=f"{type(ex).__name__}: {str(ex)[:300]}", ok=False))
        try:  # int8 integer sums are exact: equal to the float64 sums with the same float32 epilogue
            y, r = qg.scaled_mm(xq, sx, wq, sq), exact_int8_ref(xq, sx, wq, sq)
            rows.append(
                dict(
                    kernel="scaled_mm_int8_exact",
                    M=M,
                    N=N,
                    K=K,
                    mismatches=int((y != r).sum()),
                    ok=bool(torch.equal(y, r)),
                )
            )
        except Exception as ex:
            rows.append(dict(kernel="scaled_mm_int8_exact", M=M, N=N, K=K, error=str(ex)[:300], ok=False))
        for dt in (torch.int8, FP8):
            try:
                q1, s1 = qg.per_token_quant(x, dt)
                q2, s2 = qg.per_token_quant_ref(x, dt)
                mism = (q1.view(torch.int8) != q2.view(torch.int8)).float().mean().item()
                rows.append(
                    dict(
                        kernel=f"per_token_quant_{'int8' if dt == torch.int8 else 'fp8'}",
                        M=M,
                        N=N,
                        K=K,
                        code_mismatch_frac=mism,
                        scale_rel_err=rel(s1, s2),
                        ok=mism == 0.0,
                    )
                )
            except Exception as ex:
                rows.append(dict(kernel=f"per_token_quant_{dt}", M=M, error=str(ex)[:300], ok=False))
    RES["correctness"] = rows
    print(f"correctness: {sum(r['ok'] for r in rows)}/{len(rows)} ok")
    for r in rows:
        if not r["ok"]:
            print("  FAIL", r)


# ---------------------------------------------------------------- shapes, weights
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}  # Qwen3-8B [N, K]
MS = (1, 4096, 16, 4, 64, 256)  # the two targets first, in case the time guard cuts the rest
if DRY:
    SHAPES, MS = {"qkv": (48, 64)}, (1, 40, 4)
LAYERS = 2 if DRY else 36


def make_weights(N, K):
    "Copies (enough to exceed L2 together) of the bf16, int8, fp8 and fp8-block weights of one projection, with scales."
    g = torch.Generator(device=DEV).manual_seed(N + K)
    w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
    ws = {
        "bf16": [w.to(DT)],
        "int8": [quant_rows(w, torch.int8)],
        "fp8": [quant_rows(w, FP8)],
        "fp8b": [quant_block(w, BK)],
    }
    del w
    for k, nb in (("bf16", 2), ("int8", 1), ("fp8", 1), ("fp8b", 1)):
        for _ in range(copies_for(N * K * nb, CUDA) - 1):
            src = ws[k][0]
            ws[k].append(src.clone() if k == "bf16" else tuple(t.clone() for t in src))
    return ws


def variants(ws, x, M):
    "name -> (list of closures, one per weight copy; weight bytes per element or 0)."
    xq, sx = qg.per_token_quant(x, torch.int8)
    xf, sxf = qg.per_token_quant(x, FP8)
    xg, sxg = qg.per_token_quant(x, FP8, BK)
    N, K = ws["bf16"][0].shape
    trit = qg._w8a8_rule(M, N, K, None, x.device, "fp8")
    v = {
        "bf16_linear": ([lambda w=w: F.linear(x, w) for w in ws["bf16"]], 2),
        "w8a16_int8": ([lambda q=q, s=s: qg.w8a16_gemm(x, q, s) for q, s in ws["int8"]], 1),
        "w8a16_fp8": ([lambda q=q, s=s: qg.w8a16_gemm(x, q, s) for q, s in ws["fp8"]], 1),
        "w8a16_fp8_block": ([lambda q=q, s=s: qg.w8a16_gemm(x, q, s, None, BLK) for q, s in ws["fp8b"]], 1),
        "scaled_mm_int8": ([lambda q=q, s=s: qg.scaled_mm(xq, sx, q, s, None, DT) for q, s in ws["int8"]], 1),
        "quant+scaled_mm_int8": (
            [lambda q=q, s=s: qg.scaled_mm(*qg.per_token_quant(x, torch.int8), q, s, None, DT) for q, s in ws["int8"]],
            1,
        ),
        "scaled_mm_fp8": ([lambda q=q, s=s: qg.scaled_mm(xf, sxf, q, s, None, DT) for q, s in ws["fp8"]], 1),
        "scaled_mm_fp8_triton": (
            [lambda q=q, s=s: qg.scaled_mm(xf, sxf, q, s, None, DT, config=trit) for q, s in ws["fp8"]],
            1,
        ),
        "quant+scaled_mm_fp8": (
            [lambda q=q, s=s: qg.scaled_mm(*qg.per_token_quant(x, FP8), q, s, None, DT) for q, s in ws["fp8"]],
            1,
        ),
        "quant+block_scaled_mm_fp8": (
            [
                lambda q=q, s=s: qg.block_scaled_mm(*qg.per_token_quant(x, FP8, BK), q, s, BLK, None, DT)
                for q, s in ws["fp8b"]
            ],
            1,
        ),
        "per_token_quant_fp8": ([lambda: qg.per_token_quant(x, FP8)], 0),
    }
    if DEV == "cuda":
        if M > 16:
            v["torch._int_mm (peer)"] = ([lambda q=q: torch._int_mm(xq, q.t()) for q, s in ws["int8"]], 1)
        v["torch._scaled_mm rowwise (peer)"] = (
            [
                lambda q=q, s=s: torch._scaled_mm(xf, q.t(), scale_a=sxf[:, None], scale_b=s[None, :], out_dtype=DT)
                for q, s in ws["fp8"]
            ],
            1,
        )
    return v


def print_table(rows):
    print(
        f"\n{'proj':<8}{'M':>5}  {'variant':<32}{'graph ms':>9}{'eager ms':>9}{'TB/s w':>7}{'TFLOP/s':>8}{'t/bf16 g':>9}{'t/bf16 e':>9}"
    )
    for r in rows:
        if "graph_ms" in r:
            print(
                f"{r['proj']:<8}{r['M']:>5}  {r['variant']:<32}{r['graph_ms']:>9.4f}{r['eager_ms']:>9.4f}{(r['weight_tbps'] or 0):>7.2f}"
                f"{(r['tflops'] or 0):>8.0f}{r.get('time_vs_bf16_graph', 0):>9.2f}{r.get('time_vs_bf16_eager', 0):>9.2f}"
            )
        else:
            print(f"{r['proj']:<8}{r['M']:>5}  {r['variant']:<32} error: {r.get('error', '')[:70]}")


# ---------------------------------------------------------------- main table: every variant, graph and eager
@part("table", need=20)
def _():
    rows = []
    RES["table"] = rows
    W = {p: make_weights(N, K) for p, (N, K) in SHAPES.items()}  # a few GB: every shape's copies, kept for all M
    for M in MS:
        for pname, (N, K) in SHAPES.items():
            if left() < max(25, 0.45 * BUDGET):
                RES["skipped"].append(f"table M={M} {pname}")
                continue  # leave time for the sweeps
            ws = W[pname]
            x = torch.randn(M, K, device=DEV).to(DT)
            for name, (fns, wbytes) in variants(ws, x, M).items():
                if M >= 1024 and name == "w8a16_fp8_block" and left() < 40:
                    continue
                r = dict(proj=pname, M=M, N=N, K=K, variant=name)
                try:
                    r["graph_ms"] = graph_ms(fns, CUDA)
                    r["eager_ms"] = eager_ms(fns[0], CUDA)
                    moved = N * K * wbytes + M * K * 2 + M * N * 2
                    r["graph_gbps"] = moved / r["graph_ms"] / 1e6
                    r["weight_tbps"] = N * K * wbytes / r["graph_ms"] / 1e9 if wbytes else None
                    r["tflops"] = 2 * M * N * K / r["graph_ms"] / 1e9 if wbytes else None
                except Exception as ex:
                    r["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
                rows.append(r)
    del W, ws
    if DEV == "cuda":
        torch.cuda.empty_cache()
    base = {(r["proj"], r["M"]): r for r in rows if r["variant"] == "bf16_linear" and "graph_ms" in r}
    for r in rows:
        b = base.get((r["proj"], r["M"]))
        if b and "graph_ms" in r:
            r["time_vs_bf16_graph"] = r["graph_ms"] / b["graph_ms"]
            r["time_vs_bf16_eager"] = r["eager_ms"] / b["eager_ms"]
    print_table(rows)


# ---------------------------------------------------------------- decode-step linear time, weight memory
@part("decode_stack", need=1)
def _():
    "Time of one decode step's projections over the 36 layers of Qwen3-8B, per scheme, from the table (graph and eager)."
    out = {}
    for M in (1, 16, 64) if not DRY else (1, 4):
        for scheme, var in (
            ("bf16", "bf16_linear"),
            ("int8 W8A16", "w8a16_int8"),
            ("fp8 W8A16", "w8a16_fp8"),
            ("fp8-block W8A16", "w8a16_fp8_block"),
            ("int8 W8A8", "quant+scaled_mm_int8"),
            ("fp8 W8A8", "quant+scaled_mm_fp8"),
            ("fp8-block W8A8", "quant+block_scaled_mm_fp8"),
        ):
            rs = [r for r in RES.get("table", []) if r["M"] == M and r["variant"] == var and "graph_ms" in r]
            if len(rs) == len(SHAPES):
                out[f"M={M} {scheme}"] = {
                    "graph_ms": LAYERS * sum(r["graph_ms"] for r in rs),
                    "eager_ms": LAYERS * sum(r["eager_ms"] for r in rs),
                }
    for k, v in out.items():
        b = out.get(k.split(" ")[0] + " bf16")
        if b:
            v["graph_vs_bf16"], v["eager_vs_bf16"] = v["graph_ms"] / b["graph_ms"], v["eager_ms"] / b["eager_ms"]
    RES["decode_stack_linear_ms"] = out
    print("\nprojection time of one decode step, all layers (ms)   graph   eager   graph/bf16  eager/bf16:")
    for k, v in out.items():
        print(
            f"  {k:<24}{v['graph_ms']:8.3f}{v['eager_ms']:8.3f}{v.get('graph_vs_bf16', 0):10.2f}{v.get('eager_vs_bf16', 0):10.2f}"
        )
    per_layer = sum(
        N * K
        for N, K in {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}.values()
    )
    chan = sum(N for N, K in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)))
    blocks = sum(N * -(-K // 128) for N, K in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)))
    emb = 151936 * 4096 * 2
    wb = {
        "bf16": 36 * per_layer * 2 + 2 * emb,
        "int8/fp8 per-channel": 36 * (per_layer + 4 * chan) + 2 * emb,
        "fp8 block (row scales)": 36 * (per_layer + 4 * blocks) + 2 * emb,
    }
    RES["weight_bytes_qwen3_8b"] = {
        **wb,
        "note": "36 layers of projections plus the 16-bit embedding and LM head (untied, kept 16-bit)",
    }
    RES["weight_bytes_ratio"] = {k: wb[k] / wb["bf16"] for k in wb if k != "bf16"}
    RES["projection_bytes_ratio"] = {
        "per-channel": (per_layer + 4 * chan) / (per_layer * 2),
        "block": (per_layer + 4 * blocks) / (per_layer * 2),
    }
    print("weight memory vs bf16:", {k: round(v, 3) for k, v in RES["weight_bytes_ratio"].items()})


@part("targets", need=0)
def _():
    "The issue's targets from the table: W8A16 time at M = 1 per projection vs bf16 (<= 0.6), fp8 W8A8 speed at the largest M (>= 1.3x)."
    t, out = RES.get("table", []), {}
    big = max(MS)
    for r in t:
        if "time_vs_bf16_graph" not in r:
            continue
        if r["M"] == 1 and r["variant"].startswith("w8a16"):
            out[f"M=1 {r['proj']} {r['variant']} time/bf16 (graph, target <= 0.6)"] = round(r["time_vs_bf16_graph"], 3)
        if r["M"] == big and r["variant"] in (
            "scaled_mm_fp8",
            "quant+scaled_mm_fp8",
            "scaled_mm_fp8_triton",
            "scaled_mm_int8",
            "quant+scaled_mm_int8",
        ):
            out[f"M={big} {r['proj']} {r['variant']} speed/bf16 (graph, target >= 1.3)"] = round(
                1 / r["time_vs_bf16_graph"], 3
            )
    ds = RES.get("decode_stack_linear_ms", {})
    for k in ("int8 W8A16", "fp8 W8A16", "fp8-block W8A16"):
        if f"M=1 {k}" in ds:
            out[f"decode step projections M=1 {k} time/bf16 (graph)"] = round(ds[f"M=1 {k}"].get("graph_vs_bf16", 0), 3)
    RES["targets"] = out
    print("\ntargets:")
    for k, v in out.items():
        print(f"  {k:<80}{v:8.3f}")


# ---------------------------------------------------------------- sweeps of launch configs
def sweep(tag, M, kind, cfgs, need=8):
    "Time each config of `kind` ('int8', 'fp8', 'fp8b' for W8A16; 'mm_int8', 'mm_fp8' for the Triton W8A8) at `M` on every shape."
    rows, best = [], {}
    for pname, (N, K) in SHAPES.items():
        if left() < need:
            RES["skipped"].append(f"sweep {tag} {pname}")
            continue
        g = torch.Generator(device=DEV).manual_seed(1)
        w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
        x = torch.randn(M, K, device=DEV, generator=g).to(DT)
        wkind = {"int8": "int8", "fp8": "fp8", "fp8b": "fp8b", "mm_int8": "int8", "mm_fp8": "fp8"}[kind]
        q0, s0 = quant_block(w, BK) if wkind == "fp8b" else quant_rows(w, torch.int8 if wkind == "int8" else FP8)
        del w
        cps = [(q0, s0)] + [(q0.clone(), s0.clone()) for _ in range(copies_for(N * K, CUDA) - 1)]
        if kind.startswith("mm"):
            xq, sx = qg.per_token_quant(x, torch.int8 if kind == "mm_int8" else FP8)
            ref = (
                qg.scaled_mm_ref(xq, sx, q0, s0, None, torch.float32)
                if kind == "mm_fp8"
                else exact_int8_ref(xq, sx, q0, s0)
            )
            mk = lambda cfg: [lambda q=q, s=s: qg.scaled_mm(xq, sx, q, s, None, DT, config=cfg) for q, s in cps]
        else:
            blk = BLK if kind == "fp8b" else None
            ref = qg.w8a16_gemm_ref(x, q0, s0, None, blk).float()
            mk = lambda cfg: [lambda q=q, s=s: qg.w8a16_gemm(x, q, s, None, blk, cfg) for q, s in cps]
        for cfg in cfgs:
            if left() < need:
                RES["skipped"].append(f"sweep {tag} {pname} {cfg}")
                break
            r = dict(sweep=tag, proj=pname, M=M, N=N, K=K, kind=kind, config=cfg)
            try:
                fns = mk(cfg)
                r["rel_err"] = rel(fns[0](), ref)
                r["ok"] = r["rel_err"] < (1e-5 if DT == torch.float32 else 1e-2)
                r["graph_ms"] = graph_ms(fns, CUDA)
                r["weight_tbps"] = N * K / r["graph_ms"] / 1e9
            except Exception as ex:
                r["error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                r["ok"] = False
            rows.append(r)
            if r["ok"] and (pname not in best or r["graph_ms"] < best[pname]["graph_ms"]):
                best[pname] = r
        del cps
        if DEV == "cuda":
            torch.cuda.empty_cache()
    RES.setdefault("sweeps", []).extend(rows)
    print(f"\nsweep {tag} (M={M}, {kind}): best per shape under graph replay")
    for pname, r in best.items():
        print(f"  {pname:<8} {r['graph_ms']:.4f} ms  {r['weight_tbps']:.2f} TB/s  {r['config']}")
        RES.setdefault("best", {})[f"{tag} {pname}"] = {
            k: r[k] for k in ("M", "N", "K", "kind", "config", "graph_ms", "weight_tbps")
        }
    return best


def C(**kw):
    return kw


if DRY:
    GEMV = [
        C(BLOCK_N=8, BLOCK_K=32, num_warps=1, num_stages=1),
        C(BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1, SPLIT_K=1),
    ]
    GEMV_B = GEMV
    SKINNY = [
        C(BLOCK_N=16, BLOCK_K=32, num_warps=1, num_stages=1),
        C(BLOCK_N=16, BLOCK_K=16, num_warps=1, num_stages=1, SPLIT_K=2),
    ]
    SKINNY_B = SKINNY
    MM = [C(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_warps=1, num_stages=1)]
    M_BIG = 40
else:
    GEMV = [
        C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=3)
        for bn, bk, nw in (
            (16, 512, 4),
            (8, 512, 4),
            (8, 1024, 4),
            (16, 1024, 8),
            (32, 512, 8),
            (16, 256, 4),
            (32, 256, 4),
            (64, 128, 4),
            (4, 1024, 4),
        )
    ]
    GEMV += [
        C(BLOCK_N=16, BLOCK_K=512, num_warps=4, num_stages=3, SPLIT_K=1),
        C(BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=3, SPLIT_K=2),
    ]
    GEMV_B = [
        C(BLOCK_N=bn, BLOCK_K=128, num_warps=nw, num_stages=3)
        for bn, nw in ((16, 4), (32, 4), (64, 4), (64, 8), (128, 8))
    ]
    SKINNY = [
        C(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
        for bn, bk, nw, ns in (
            (32, 256, 4, 3),
            (16, 256, 4, 3),
            (16, 512, 4, 3),
            (64, 128, 4, 3),
            (32, 512, 4, 4),
            (64, 256, 4, 4),
            (64, 256, 8, 3),
            (128, 128, 8, 3),
        )
    ]
    SKINNY_B = [
        C(BLOCK_N=bn, BLOCK_K=128, num_warps=nw, num_stages=ns)
        for bn, nw, ns in ((16, 4, 3), (32, 4, 3), (64, 4, 3), (64, 4, 4), (128, 8, 3))
    ]
    MM = [
        C(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
        for bm, bn, bk, nw, ns in (
            (128, 128, 128, 8, 3),
            (128, 128, 64, 4, 4),
            (128, 128, 64, 8, 4),
            (128, 256, 64, 8, 3),
            (128, 256, 128, 8, 3),
            (256, 128, 64, 8, 3),
            (128, 128, 128, 4, 3),
            (64, 128, 128, 4, 4),
        )
    ]
    M_BIG = 4096

SUGGEST = {"W8A16_TUNED": {}, "W8A8_TUNED": {}}


def suggest(table, key_of, best):
    for pname, r in best.items():
        N, K = r["N"], r["K"]
        SUGGEST[table][str(key_of(N, K))] = {k: v for k, v in r["config"].items()}


@part("sweep_gemv_int8", need=10)
def _():
    suggest("W8A16_TUNED", lambda N, K: ("gemv", "int8", N, K), sweep("gemv_int8", 1, "int8", GEMV))


@part("sweep_mm_fp8_4096", need=10)
def _():
    suggest("W8A8_TUNED", lambda N, K: ("large", "fp8", N, K), sweep("mm_fp8_big", M_BIG, "mm_fp8", MM))


@part("sweep_gemv_fp8", need=10)
def _():
    suggest("W8A16_TUNED", lambda N, K: ("gemv", "fp8", N, K), sweep("gemv_fp8", 1, "fp8", GEMV))


@part("sweep_skinny16_int8", need=10)
def _():
    suggest(
        "W8A16_TUNED", lambda N, K: ("skinny", "int8", N, K), sweep("skinny16_int8", 4 if DRY else 16, "int8", SKINNY)
    )


@part("sweep_mm_int8_4096", need=10)
def _():
    suggest("W8A8_TUNED", lambda N, K: ("large", "int8", N, K), sweep("mm_int8_big", M_BIG, "mm_int8", MM))


@part("sweep_gemv_fp8_block", need=10)
def _():
    suggest("W8A16_TUNED", lambda N, K: ("gemv_block", "fp8", N, K), sweep("gemv_fp8_block", 1, "fp8b", GEMV_B))


@part("sweep_skinny16_fp8", need=10)
def _():
    suggest("W8A16_TUNED", lambda N, K: ("skinny", "fp8", N, K), sweep("skinny16_fp8", 4 if DRY else 16, "fp8", SKINNY))


@part("sweep_skinny4_int8", need=10)
def _():
    sweep("skinny4_int8", 2 if DRY else 4, "int8", SKINNY)  # M = 4 shares the skinny entry: for information


@part("sweep_skinny16_fp8_block", need=10)
def _():
    suggest(
        "W8A16_TUNED",
        lambda N, K: ("skinny_block", "fp8", N, K),
        sweep("skinny16_fp8_block", 4 if DRY else 16, "fp8b", SKINNY_B),
    )


RES["suggested_tables"] = SUGGEST


# ---------------------------------------------------------------- peak memory while quantizing at load
@part("load_peak_memory", need=5)
def _():
    "Quantize four Qwen3-8B layers' projections at load, tensor by tensor: peak allocated vs quantized size + one tensor."
    if DEV != "cuda":
        RES["load_peak_memory"] = "skipped on the CPU"
        return
    try:
        from litellama.layers.linear import Linear
        from litellama.layers.quant8 import RuntimeW8
    except ImportError as e:
        RES["load_peak_memory"] = f"skipped: {e} (this tree has no exported 8-bit linear methods)"
        print(RES["load_peak_memory"])
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    lins, biggest = [], 0
    for _ in range(4):
        for out_f, in_f in (
            ({"q": 4096, "k": 1024, "v": 1024}, 4096),
            (4096, 4096),
            ({"gate": 12288, "up": 12288}, 4096),
            (4096, 12288),
        ):
            lins.append(Linear(in_f, out_f, False, DT, DEV, method=RuntimeW8(torch.int8)))
    quantized = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    for lin in lins:
        for shard, (off, size) in lin.shards.items():
            t = torch.randn(size, lin.in_features, device=DEV, dtype=DT)
            biggest = max(biggest, t.numel() * 2)
            lin.load_weight("weight", t, shard)
            del t
        lin.process_after_loading()
    peak = torch.cuda.max_memory_allocated() - base
    RES["load_peak_memory"] = dict(
        quantized_bytes=quantized,
        largest_checkpoint_tensor_bytes=biggest,
        peak_bytes=peak,
        bf16_bytes=sum(l.out_features * l.in_features * 2 for l in lins),
        peak_over_quantized_plus_one=peak / (quantized + biggest),
    )
    print("\nload peak memory:", RES["load_peak_memory"])


RES["total_seconds"] = round(time.time() - T0, 1)
write_json(RES, OUT, "quant8_gemm.json")
print("\nsuggested tables for kernels_nb/12_quant_gemm.ipynb (W8A16_TUNED / W8A8_TUNED):")
print(json.dumps(SUGGEST, indent=1))
print(
    f"\nwrote {OUT / 'quant8_gemm.json'} in {RES['total_seconds']} s; errors: {list(RES['errors']) or 'none'}; skipped: {len(RES['skipped'])}"
)
