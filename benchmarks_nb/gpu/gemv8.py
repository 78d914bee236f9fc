"""One-token (M = 1) W8A16 kernel layouts on Qwen3-8B's projections, against the committed kernel and bf16 F.linear in
the same process, under CUDA-graph replay (20 calls per graph, weights rotated over copies beyond L2).

The candidate reads the weight in 8-byte vectors along K (its pointer's contiguity is capped at 8, so the weight tile and
the bf16 activations get the same per-thread layout and nothing goes through shared memory), sums each thread's 8
products before adding them to a `[BLOCK_N, BLOCK_K / 8]` accumulator (fewer registers), and addresses each step from
the loop index (`ADDR`) or by incrementing pointers.

    PYTHONPATH=. python3 benchmarks_nb/gpu/gemv8.py $OUT            # on the GPU: writes $OUT/gemv8.json
    PYTHONPATH=. python3 benchmarks_nb/gpu/gemv8.py /tmp --dry-run  # on a CPU: tiny shapes, Triton interpreter
"""

import math, os, sys
from pathlib import Path

DRY = "--dry-run" in sys.argv
ARGS = [a for a in sys.argv[1:] if a != "--dry-run"]
OUT = Path(ARGS[0] if ARGS else os.environ.get("OUT", "."))
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).parent))
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from common import FP8, Budget, copies_for, environment, graph_ms, quant_rows, rel, write_json
from litellama.kernels import quant_gemm as qg

CUDA = torch.cuda.is_available() and not DRY
DEV, DT = ("cuda" if CUDA else "cpu"), (torch.bfloat16 if CUDA else torch.float32)
RES = environment(DRY)
RES["timing"] = "graph_ms: 20 calls in one CUDA graph, weights rotated over copies of >= 256 MB, median of 5 replays"
B = Budget(float(os.environ.get("GEMV_BUDGET_S", 900 if DRY else 240)), RES)


@triton.jit
def gemv8(
    x_ptr, w_ptr, s_ptr, out_ptr, N, K,
    FP8: tl.constexpr, NATIVE: tl.constexpr, ADDR: tl.constexpr, VEC: tl.constexpr, EVEN: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rn_in = tl.minimum(rn, N - 1)
    rk = tl.arange(0, BLOCK_K)
    rk = (rk // VEC) * VEC + rk % VEC  # contiguity VEC: the weight's vector matches the activations'
    w_ptrs = w_ptr + rn_in.to(tl.int64)[:, None] * K + rk[None, :]
    x_ptrs = x_ptr + rk[None, :] + 0 * rn[:, None]  # the weight tile's shape: same layout, no shared memory
    acc = tl.zeros([BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + rk < K)[None, :]
        if ADDR:  # each step addressed from the loop index
            wp, xp = w_ptrs + k0, x_ptrs + k0
        else:
            wp, xp = w_ptrs, x_ptrs
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
        if EVEN:  # every step whole: no masks
            wb = tl.load(wp, eviction_policy="evict_first")
            x = tl.load(xp).to(tl.float32)
        else:
            wb = tl.load(wp, mask=k_mask, other=0, eviction_policy="evict_first")
            x = tl.load(xp, mask=k_mask, other=0.0).to(tl.float32)
        if FP8 and NATIVE:
            w = wb.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        elif FP8:
            w = qg._widen_e4m3(wb)
        else:
            w = qg._widen_int8(wb)
        acc += tl.sum(tl.reshape(w * x, [BLOCK_N, BLOCK_K // VEC, VEC]), axis=2)
    res = tl.sum(acc, axis=1) * tl.load(s_ptr + rn_in)
    tl.store(out_ptr + rn, res.to(out_ptr.dtype.element_ty), mask=rn < N)


def run_gemv8(x, q, s, cfg):
    N, K = q.shape
    out = torch.empty(1, N, device=x.device, dtype=x.dtype)
    meta = {k: v for k, v in cfg.items() if k in ("ADDR", "VEC", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")}
    meta["EVEN"] = K % cfg["BLOCK_K"] == 0
    gemv8[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x, q.view(torch.uint8) if q.dtype == FP8 else q, s, out, N, K,
        FP8=q.dtype == FP8, NATIVE=x.is_cuda, **meta,
    )  # fmt: skip
    return out


SHAPES = (
    {"qkv": (48, 96), "lm_head": (80, 64)}
    if DRY
    else {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288), "lm_head": (151936, 4096)}
)
if DRY:
    CANDS = [dict(BLOCK_N=4, BLOCK_K=32, VEC=8, ADDR=a, num_warps=1) for a in (0, 1)]
else:
    CANDS = [
        dict(BLOCK_N=bn, BLOCK_K=bk, VEC=8, ADDR=a, num_warps=nw, num_stages=1)
        for bn, bk, nw in [(2, 1024, 2), (2, 2048, 2), (2, 2048, 4), (4, 512, 2), (4, 1024, 2), (4, 1024, 4),
                           (4, 2048, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 4), (8, 1024, 8), (8, 2048, 8),
                           (16, 512, 4), (16, 1024, 8)]
        for a in (0, 1)
    ]  # fmt: skip
RES["candidates"] = CANDS
RES["rows"] = []


@B.part("sweep", need=5)
def sweep():
    for kind in ("int8", "fp8"):
        for pname, (N, K) in SHAPES.items():
            if B.left() < 8:
                RES["skipped"].append(f"{kind} {pname}")
                continue
            g = torch.Generator(device=DEV).manual_seed(N + K)
            w = torch.randn(N, K, device=DEV, generator=g) / math.sqrt(K)
            x = torch.randn(1, K, device=DEV, generator=g).to(DT)
            q0, s0 = quant_rows(w, torch.int8 if kind == "int8" else FP8)
            cps = [(q0, s0)] + [(q0.clone(), s0.clone()) for _ in range(copies_for(N * K, CUDA) - 1)]
            ref = qg.w8a16_gemm_ref(x, q0, s0)
            row = dict(kind=kind, proj=pname, N=N, K=K)
            if kind == "int8":
                wb = [w.to(DT) for _ in range(copies_for(2 * N * K, CUDA))]
                row["bf16 F.linear"] = graph_ms([lambda w_=w_: F.linear(x, w_) for w_ in wb], CUDA)
                del wb
            del w
            row["committed"] = graph_ms([lambda q=q, s=s: qg.w8a16_gemm(x, q, s) for q, s in cps], CUDA)
            row["cands"] = []
            for cfg in CANDS:
                r = dict(cfg)
                try:
                    r["rel_err"] = rel(run_gemv8(x, q0, s0, cfg), ref)
                    r["ms"] = graph_ms([lambda q=q, s=s: run_gemv8(x, q, s, cfg) for q, s in cps], CUDA)
                except Exception as e:
                    r["error"] = f"{type(e).__name__}: {str(e)[:160]}"
                row["cands"].append(r)
            ok = [r for r in row["cands"] if "ms" in r and r["rel_err"] < (1e-5 if DT == torch.float32 else 1e-2)]
            best = min(ok, key=lambda r: r["ms"]) if ok else None
            row["best"] = best
            RES["rows"].append(row)
            tb = lambda ms: N * K / ms / 1e9
            print(
                f"{kind} {pname:8} committed {row['committed'] * 1e3:7.1f} us {tb(row['committed']):.2f} TB/s | best "
                + (f"{best['ms'] * 1e3:7.1f} us {tb(best['ms']):.2f} TB/s {best}" if best else "none")
                + (f" | bf16 {row['bf16 F.linear'] * 1e3:.1f} us" if "bf16 F.linear" in row else ""),
                flush=True,
            )
            del cps


print("wrote", write_json(RES, OUT, "gemv8.json"))
