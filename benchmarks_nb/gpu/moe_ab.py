"""Batch-1 TPOT of the Qwen3-30B-A3B shape (random bf16 weights) through the engine, with its decode profile: one tree
per process, for an A/B of two commits each in a fresh process.

    PYTHONPATH=<tree> python3 benchmarks_nb/gpu/moe_ab.py OUT.json LABEL                          # on the GPU
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/moe_ab.py OUT.json LABEL --dry-run   # tiny, CPU"""

import json
import os
import sys

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ.setdefault("TRITON_INTERPRET", "1")
import moe_engine
import torch
from common import run_info

import litellama

out_path, label = [a for a in sys.argv[1:] if not a.startswith("--")][:2]
dev, dt = ("cpu", torch.float32) if DRY else ("cuda", torch.bfloat16)
res, _, _ = moe_engine.random_model_tpot(moe_engine.model_like(DRY), dev, dt, 16, 8 if DRY else 64)
prof = res.pop("decode_profile")
res.update(
    label=label,
    package=os.path.dirname(litellama.__file__),
    command=" ".join(["PYTHONPATH=" + os.environ.get("PYTHONPATH", ""), "python3"] + sys.argv),
    environment=run_info(DRY),
    us_per_step_by_group=prof["us_per_step_by_group"] if isinstance(prof, dict) else prof,
    kernels_per_step=prof["kernels_per_step"] if isinstance(prof, dict) else None,
    top=prof["top"][:12] if isinstance(prof, dict) else None,
)
with open(out_path, "w") as f:
    json.dump(res, f, indent=1)
print(label, f"TPOT {res['tpot_ms']:.3f} ms", res["runs_ms"])
