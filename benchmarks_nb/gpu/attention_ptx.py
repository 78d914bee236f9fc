"""Compile the attention kernels for sm_90 (triton's NVIDIA backend, no GPU needed: a stand-in driver) and write, per
kernel variant, a hash of its PTX code (debug sections cut off) and a hash of its sorted lines. Run it on two trees and
compare the JSON files: the power-of-two head sizes must compile to the same code before and after a change.

  git archive <commit> litellama | tar -x -C /tmp/old
  PYTHONPATH=/tmp/old python benchmarks_nb/gpu/attention_ptx.py /tmp/old.json ; PYTHONPATH=. python benchmarks_nb/gpu/attention_ptx.py new.json
  DIMS=24,80,96,112,192 PYTHONPATH=. python benchmarks_nb/gpu/attention_ptx.py padded.json      # padded tiles compile
"""

import hashlib, re, sys, os, json

os.environ.pop("TRITON_INTERPRET", None)
import torch, triton


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import stand_in_driver

stand_in_driver()
from triton.runtime.jit import JITFunction

OUT = {}
orig_run = JITFunction.run


def run(self, *args, grid, warmup, **kwargs):
    k = orig_run(self, *args, grid=grid, warmup=True, **kwargs)
    ptx = k.asm["ptx"]
    ptx = ptx[: ptx.find(".section") if ".section" in ptx else len(ptx)]  # the code, without the DWARF sections
    body = "\n".join(
        l
        for l in ptx.splitlines()
        if not l.strip().startswith((".loc", ".file", "//", "$L__", ".section")) and "debug" not in l
    )
    body = re.sub(r"\$L__\w+", "L", body)
    tag = f"{self.fn.__name__} " + ",".join(
        f"{a}={kwargs[a]}" for a in sorted(kwargs) if a not in ("debug", "instrumentation_mode", "BLOCK_D")
    )
    OUT[tag] = (
        hashlib.sha1(body.encode()).hexdigest()[:12]
        + f" ({len(body.splitlines())} lines) sorted "
        + hashlib.sha1("\n".join(sorted(body.splitlines())).encode()).hexdigest()[:12]
    )
    return k


JITFunction.run = run

from litellama.kernels import prefill_attention as pa, decode_attention as da

da._reads_words = lambda q, k, v: (
    k.stride(3) == 1 and v.stride(1) == 1 and k.shape[3] % 4 == 0
)  # the sm_90 fp8 path: int32 words
_pc, _dc = pa._config, da._config
pa._config = lambda dev, *a: _pc("cuda", *a)  # the GPU's tiles, not the interpreter's
da._config = lambda dev, *a, **k: _dc("cuda", *a, **k)


def cases():
    for D in tuple(int(x) for x in os.environ.get("DIMS", "64,128,256").split(",")):
        for dtype in (torch.bfloat16, torch.float32):
            for cache in (None, torch.float8_e4m3fn):
                if cache and dtype == torch.float32:
                    continue
                kc, vc, bt = pa.random_paged_kv([40, 7], 2, D, 16, cache or dtype)
                q = torch.randn(47, 8, D).to(dtype)
                cu = torch.tensor([0, 40, 47], dtype=torch.int32)
                sl = torch.tensor([40, 7], dtype=torch.int32)
                for short in (5, 1000):
                    yield (
                        f"prefill D={D} {dtype} {cache} m={short}",
                        lambda: pa.prefill_attention(q, kc, vc, cu, sl, bt, 0.1, max_seqlen_q=short),
                    )
                if cache:
                    yield (
                        f"prefill keyminor D={D}",
                        lambda: pa.prefill_attention(q, kc, da.v_key_minor(vc), cu, sl, bt, 0.1),
                    )
                qd = torch.randn(2, 8, D).to(dtype)
                plan = [torch.from_numpy(a) for a in da.plan_splits([40, 7], 16)]
                yield f"decode D={D} {dtype} {cache}", lambda: da.decode_attention(qd, kc, vc, sl, bt, 0.1, splits=plan)
                if cache:
                    yield (
                        f"decode keyminor D={D}",
                        lambda: da.decode_attention(
                            qd,
                            kc.transpose(1, 2).contiguous().transpose(1, 2),
                            da.v_key_minor(vc),
                            sl,
                            bt,
                            0.1,
                            splits=plan,
                        ),
                    )


# the launchers pick their configs by device type: pretend to be cuda
for name, fn in cases():
    try:
        fn()
    except Exception as e:
        OUT["ERROR " + name] = f"{type(e).__name__}: {str(e)[:200]}"
json.dump(OUT, open(sys.argv[1], "w"), indent=0, sort_keys=True)
print(len(OUT), "kernels")
