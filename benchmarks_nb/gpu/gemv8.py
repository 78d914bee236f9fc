"""Tilings of the one-token (M = 1) W8A16 kernel, `_w8a16_gemv_kernel`, on Qwen3-8B's projections, against the
skinny kernel's former one-token tiles (`committed`: 112185c's path, `common.skinny_gemv_config`) and bf16 F.linear in
the same process, under CUDA-graph replay (20 calls per graph, weights rotated over copies beyond L2).
results/gemv8.json was made by this script at a2ec6e7, when it swept a stand-alone copy of the kernel (with `ADDR`:
each step addressed from the loop index, or by incremented pointers; the package kernel increments them).

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
from common import FP8, Budget, copies_for, environment, graph_ms, quant_rows, rel, skinny_gemv_config, write_json
from litellama.kernels import quant_gemm as qg

CUDA = torch.cuda.is_available() and not DRY
DEV, DT = ("cuda" if CUDA else "cpu"), (torch.bfloat16 if CUDA else torch.float32)
RES = environment(DRY)
RES["timing"] = "graph_ms: 20 calls in one CUDA graph, weights rotated over copies of >= 256 MB, median of 5 replays"
B = Budget(float(os.environ.get("GEMV_BUDGET_S", 900 if DRY else 240)), RES)


SHAPES = (
    {"qkv": (48, 96), "lm_head": (80, 64)}
    if DRY
    else {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288), "lm_head": (151936, 4096)}
)
if DRY:
    CANDS = [dict(BLOCK_N=4, BLOCK_K=32, num_warps=1, SPLIT_K=1), dict(BLOCK_N=8, BLOCK_K=16, num_warps=1, SPLIT_K=1)]
else:
    CANDS = [
        dict(BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=1, SPLIT_K=1)
        for bn, bk, nw in [(2, 1024, 2), (2, 2048, 2), (2, 2048, 4), (4, 512, 2), (4, 1024, 2), (4, 1024, 4),
                           (4, 2048, 4), (4, 2048, 8), (8, 512, 4), (8, 1024, 4), (8, 1024, 8), (8, 2048, 8),
                           (16, 512, 4), (16, 1024, 8)]
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
            old = skinny_gemv_config(kind, N, K)
            row["committed"] = graph_ms([lambda q=q, s=s: qg.w8a16_gemm(x, q, s, config=old) for q, s in cps], CUDA)
            row["default"] = graph_ms([lambda q=q, s=s: qg.w8a16_gemm(x, q, s) for q, s in cps], CUDA)
            row["cands"] = []
            for cfg in CANDS:
                r = dict(cfg)
                try:
                    r["rel_err"] = rel(qg.w8a16_gemm(x, q0, s0, config=cfg), ref)
                    r["ms"] = graph_ms([lambda q=q, s=s: qg.w8a16_gemm(x, q, s, config=cfg) for q, s in cps], CUDA)
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
