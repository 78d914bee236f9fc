"""Static instruction counts of the one-row W4A16 kernels, compiled for sm_90 on any machine (triton's NVIDIA backend
with a stand-in driver, no GPU needed): for each Qwen3-8B projection and tile, the machine code of the main loop of
`_w4_gemv_kernel` (three 32-bit instructions per weight) and `_w4_half2_kernel` (two codes per float16 instruction),
its length per weight, registers and the counts of its opcodes. These are counts of compiled code, not timings: the
speed of each is measured by benchmarks_nb/gpu/w4.py on the H200.

  PYTHONPATH=. python benchmarks_nb/gpu/w4_sass.py $OUT      # writes $OUT/w4_sass.json
"""

import datetime, os, re, subprocess, sys, tempfile

os.environ.pop("TRITON_INTERPRET", None)
import torch, triton
from triton.runtime.jit import JITFunction


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import stand_in_driver, write_json

stand_in_driver()
from litellama.kernels import w4a16 as W

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}  # (K, N)
# (BLOCK_N, BLOCK_K, warps)
TILES = [(64, 512, 4), (64, 256, 4), (128, 256, 4), (32, 512, 4), (128, 512, 4), (128, 512, 8), (128, 1024, 8)]


class Dev:  # `_plan` asks the device type
    type = "cuda"


def _tool(args, cubin):
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(BIN, args[0]), *args[1:], f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)


def loop(cubin) -> list[str]:
    "The instructions of the longest loop: from a backward branch's target to the branch."
    lines = [l for l in _tool(["cuobjdump", "-sass"], cubin).splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", l)]
    addr = lambda l: int(re.match(r"\s+/\*([0-9a-f]+)\*/", l).group(1), 16)
    best = []
    for l in lines:
        t = re.search(r"BRA\b.*?0x([0-9a-f]+)", l)
        if t and int(t.group(1), 16) < addr(l):
            body = [x for x in lines if int(t.group(1), 16) <= addr(x) <= addr(l)]
            best = max(best, body, key=len)
    return best


def opcodes(body) -> dict:
    c = {}
    for l in body:
        m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", l)
        if m:
            c[m.group(1)] = c.get(m.group(1), 0) + 1
    return dict(sorted(c.items(), key=lambda kv: -kv[1]))


def compile_one(path, K, N, bn, bk, nw):
    "The compiled kernel of `path` for one row of bf16 `x` and the tile `bn x bk`, launched as `w4a16_linear` would."
    cfg = dict(PATH=path, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=1, SPLIT_K=1)
    _, _, kps, _, consts, opts = W._plan(1, N, K, 128, torch.bfloat16, Dev, cfg)
    kernel = {"gemv": W._w4_gemv_kernel, "half2": W._w4_half2_kernel}[path]
    x = torch.empty(1, K, dtype=torch.bfloat16)
    qw = torch.empty(N, K // 8, dtype=torch.int32)
    s = torch.empty(N, K // 128, dtype=torch.float16)
    out = torch.empty(1, N, dtype=torch.bfloat16)
    args = (x, qw, s, s, out, out, 1, N, K, K // 128, K, kps, 128)
    return JITFunction.run(kernel, *args, HAS_BIAS=False, PARTIAL=False, **consts, **opts, grid=(1,), warmup=True)


res = dict(
    name="w4_sass",
    command="PYTHONPATH=. python benchmarks_nb/gpu/w4_sass.py $OUT",
    note="static counts of sm_90 machine code compiled without a GPU; not timings",
    target="sm_90",
    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    torch=torch.__version__,
    triton=triton.__version__,
    rows=[],
    errors={},
)
try:
    res["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    res["git_commit"] = "unknown"
for name, (K, N) in SHAPES.items():
    for bn, bk, nw in TILES:
        for path in ("gemv", "half2"):
            tag = f"{name} {path} {bn}x{bk} w{nw}"
            try:
                k = compile_one(path, K, N, bn, bk, nw)
                body = loop(k.asm["cubin"])
                regs = re.search(r"REG:(\d+)", _tool(["cuobjdump", "-res-usage"], k.asm["cubin"]))
                weights = bn * bk / (32 * nw)  # per thread and step
                row = dict(shape=name, K=K, N=N, path=path, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw)
                row |= dict(registers=int(regs.group(1)) if regs else None, loop_instructions=len(body))
                row |= dict(per_weight=round(len(body) / weights, 3), opcodes=dict(list(opcodes(body).items())[:14]))
                res["rows"].append(row)
                print(f"{tag}: {row['per_weight']:.2f} instructions per weight, {row['registers']} registers", flush=True)
            except Exception as e:
                res["errors"][tag] = f"{type(e).__name__}: {str(e)[:300]}"
                print(tag, "failed:", res["errors"][tag], flush=True)
print("wrote", write_json(res, sys.argv[1] if len(sys.argv) > 1 else ".", "w4_sass.json"))
