"""Compile every 8-bit GEMM variant that benchmarks_nb/gpu/w8.py launches for sm_90 (triton's NVIDIA backend with a
stand-in driver, no GPU needed) and report, per variant, compile errors and how the weight loads compile
(counts of ld.global.v4 / ld.global.v2 / scalar ld.global lines and cvt lines in the PTX).

  PYTHONPATH=. python benchmarks_nb/gpu/w8_ptx.py /tmp/w8_ptx.json [--dump DIR]     # PARTS=w8a16,ragged,dequant,w8a8 (default: all)
"""

import hashlib, json, os, re, sys

os.environ.pop("TRITON_INTERPRET", None)
import torch, triton


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import stand_in_driver

stand_in_driver()
from triton.runtime.jit import JITFunction

OUT, DUMP = {}, (sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv else None)
orig_run = JITFunction.run
CUR = [""]


def run(self, *args, grid, warmup, **kwargs):
    k = orig_run(self, *args, grid=grid, warmup=True, **kwargs)
    ptx = k.asm["ptx"]
    ptx = ptx[: ptx.find(".section") if ".section" in ptx else len(ptx)]
    lines = [l.strip() for l in ptx.splitlines()]
    cnt = lambda pat: sum(bool(re.match(pat, l)) for l in lines)
    OUT[f"{CUR[0]} | {self.fn.__name__}"] = dict(
        v4=cnt(r"(@\S+ )?ld\.global\S*\.v4"),
        v2=cnt(r"(@\S+ )?ld\.global\S*\.v2"),
        scalar=cnt(r"(@\S+ )?ld\.global(?!\S*\.v[24])"),
        cp_async=cnt(r"(@\S+ )?cp\.async\.\S+\.shared\.global"),
        cvt=cnt(r"cvt\."),
        lines=len(lines),
    )
    if DUMP:
        os.makedirs(DUMP, exist_ok=True)
        name = (
            re.sub(r"[^\w=.-]+", "_", CUR[0].split(" splits=")[0])[:120]
            + "_"
            + hashlib.sha1(CUR[0].encode()).hexdigest()[:8]
        )
        open(os.path.join(DUMP, name + ".ptx"), "w").write(ptx)
    return k


JITFunction.run = run

from litellama.kernels import quant_gemm as qg


class FakeDev:  # the launchers ask the device type and multiprocessor count
    type, index = "cuda", 0


qg._num_sms = lambda device: 132


def launch(x, q, s, blk, cfg, tag):
    "`qg.w8a16_gemm` with cpu tensors but the GPU's plan and kernel arguments."
    M, K = x.shape
    N = q.shape[0]
    fp8 = q.dtype == torch.float8_e4m3fn
    kernel, bm, meta, kps, splits = qg._w8a16_plan(M, N, K, blk, fp8, x.dtype, FakeDev, cfg)
    w = qg._weight_arg(q)
    out = torch.empty(M, N, dtype=x.dtype)
    part = out if splits == 1 else torch.empty(splits, M, N, dtype=torch.float32)
    grid = (
        (triton.cdiv(N, meta["BLOCK_N"]), splits)
        if bm is None
        else (triton.cdiv(M, bm), triton.cdiv(N, meta["BLOCK_N"]), splits)
    )
    CUR[0] = f"{tag} splits={splits} " + ",".join(f"{k}={v}" for k, v in sorted(meta.items()))
    key = (kernel.fn.__name__, splits > 1, tuple(sorted(meta.items())), N % 16 == 0, K % 16 == 0, kps % 16 == 0)
    if key in SEEN:
        return
    SEEN.add(key)
    kernel[grid](
        x,
        w,
        s,
        out,
        part,
        M,
        N,
        K,
        x.stride(0),
        s.stride(0) if blk else 0,
        blk[0] if blk else 1,
        kps,
        HAS_BIAS=False,
        PARTIAL=splits > 1,
        **meta,
        **(dict(GATED=False) if bm is None else {}),
    )


SEEN = set()
src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "w8.py")).read()
ns = {}
ns = {"DRY": False}
exec(src[src.index("# ---- candidates") : src.index("# ---- end candidates")], ns)
PARTS = os.environ.get("PARTS", "w8a16,ragged,dequant,w8a8").split(",")  # e.g. PARTS=w8a8 for one group
for M in (1, 4, 16, 100, 4096) if "w8a16" in PARTS else ():
    for kind in ("int8", "fp8", "fp8b"):
        blk = (1, 128) if kind == "fp8b" else None
        for pname, (N, K) in ns["SHAPES_GPU"].items():
            x = torch.empty(M, K, dtype=torch.bfloat16)
            q = torch.empty(N, K, dtype=torch.int8 if kind == "int8" else torch.float8_e4m3fn)
            s = torch.empty(N, K // 128, dtype=torch.float32) if blk else torch.empty(N, dtype=torch.float32)
            if M > 16:
                cands = [None]
            else:
                cands = [None] + (ns["CANDS"] if M == 1 else ns["CANDS_DOT"])["block" if blk else "channel"]
            for cfg in cands:
                tag = f"M={M} {kind} {pname} {cfg}"
                try:
                    launch(x, q, s, blk, cfg, tag)
                except Exception as e:
                    OUT["ERROR " + tag] = f"{type(e).__name__}: {str(e)[:300]}"
for M, N, K in (
    ((1, 1000, 600), (5, 33, 4160), (16, 4096, 12288)) if "ragged" in PARTS else ()
):  # w8.py's correctness shapes
    for kind in ("int8", "fp8", "fp8b"):
        blk = (1, 128) if kind == "fp8b" else None
        x = torch.empty(M, K, dtype=torch.bfloat16)
        q = torch.empty(N, K, dtype=torch.int8 if kind == "int8" else torch.float8_e4m3fn)
        s = torch.empty(N, -(-K // 128), dtype=torch.float32) if blk else torch.empty(N, dtype=torch.float32)
        for cfg in (
            None,
            dict(PREFETCH=True),
            dict(PREFETCH=True, SPLIT_K=1),
            dict(MAGIC=False),
            dict(BLOCK_N=16, BLOCK_K=64),
            dict(BLOCK_N=8, BLOCK_K=128, SPLIT_K=1),
        ):
            tag = f"ragged M={M} N={N} K={K} {kind} {cfg}"
            try:
                launch(x, q, s, blk, cfg, tag)
            except Exception as e:
                OUT["ERROR " + tag] = f"{type(e).__name__}: {str(e)[:300]}"
for kind in ("int8", "fp8", "fp8b") if "dequant" in PARTS else ():  # the widening pass of the large-M path
    q = torch.empty(256, 512, dtype=torch.int8 if kind == "int8" else torch.float8_e4m3fn)
    blk = (128, 128) if kind == "fp8b" else None
    s = torch.empty(2, 4, dtype=torch.float32) if blk else torch.empty(256, dtype=torch.float32)
    CUR[0] = f"dequant {kind}"
    try:
        qg._dequant_kernel[(8, 4)](
            qg._weight_arg(q),
            s,
            torch.empty(256, 512, dtype=torch.bfloat16),
            256,
            512,
            s.stride(0) if blk else 0,
            blk[0] if blk else 1,
            FP8=kind != "int8",
            NATIVE=True,
            BLOCKWISE=blk is not None,
            SCALE_K=blk[1] if blk else 1,
            BLOCK_N=32,
            BLOCK_K=128,
            num_warps=4,
        )
    except Exception as e:
        OUT["ERROR dequant " + kind] = f"{type(e).__name__}: {str(e)[:300]}"
for size, cfg in (
    qg.W8A8_CONFIGS.items() if "w8a8" in PARTS else ()
):  # the Triton W8A8 kernel (int8, and the fp8 kinds torch._scaled_mm does not take)
    for kind in ("int8", "fp8", "fp8_block"):
        M, N, K = {"small": 16, "mid": 64, "large": 256}[size], 256, 512
        dt = torch.int8 if kind == "int8" else torch.float8_e4m3fn
        blk = (128, 128) if kind == "fp8_block" else None
        xq, w = torch.empty(M, K, dtype=dt), torch.empty(N, K, dtype=dt)
        sx = torch.empty(M, K // 128 if blk else 1)
        sw = torch.empty(2, 4) if blk else torch.empty(N)
        CUR[0] = f"w8a8 {size} {kind}"
        try:
            qg._w8a8_kernel[(triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))](
                xq,
                sx,
                w,
                sw,
                torch.empty(M, N, dtype=torch.bfloat16),
                torch.empty(M, N, dtype=torch.bfloat16),
                M,
                N,
                K,
                K,
                sx.stride(0),
                sw.stride(0) if blk else 0,
                blk[0] if blk else 1,
                INT8=kind == "int8",
                NATIVE=True,
                BLOCKWISE=blk is not None,
                HAS_BIAS=False,
                BLOCK_M=cfg["BLOCK_M"],
                BLOCK_N=cfg["BLOCK_N"],
                BLOCK_K=cfg["BLOCK_K"],
                num_warps=cfg["num_warps"],
                num_stages=cfg["num_stages"],
            )
        except Exception as e:
            OUT[f"ERROR w8a8 {size} {kind}"] = f"{type(e).__name__}: {str(e)[:300]}"
json.dump(OUT, open(sys.argv[1], "w"), indent=0, sort_keys=True)
errs = [k for k in OUT if k.startswith("ERROR")]
print(len(OUT) - len(errs), "variants compiled,", len(errs), "errors")
for k in errs[:10]:
    print(k, OUT[k][:300])
