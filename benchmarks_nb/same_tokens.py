"""Greedy token ids of two package trees, side by side, on the CPU: the bundled SmolLM2 and tiny random Llama, Qwen2,
Qwen3 and Qwen3-MoE checkpoints (24 tokens after each of three prompts, fp32). Each tree runs in its own process.

    python benchmarks_nb/same_tokens.py OLD_TREE NEW_TREE    # e.g. a `git archive <commit> litellama | tar x -C DIR`
"""

import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import importlib, json, sys
from pathlib import Path
import torch

def first(*names):  # a module under its name in this tree (the package moved into folders)
    for n in names:
        try:
            return importlib.import_module("litellama." + n)
        except ModuleNotFoundError:
            pass

LLM = first("entrypoints.llm", "llm").LLM
SamplingParams = first("sampling_params", "sampling").SamplingParams
make = first("testing.checkpoints", "checkpoints").make_random_checkpoint
prompts = ["The capital of France is", "Write a haiku about paged attention.", "1, 2, 3, 4,"]
out = {}
for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-qwen3-moe", None):
    path = None
    if name:
        path = Path(sys.argv[1]) / name
        if not (path / "config.json").exists():
            make(name, path, dtype=torch.float32, seed=3)
    llm = LLM(str(path) if path else None, dtype="float32", device="cpu")
    res = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    out[name or "SmolLM2-135M-Instruct"] = [r.outputs[0].token_ids for r in res]
print("RESULT " + json.dumps(out))
"""


def tokens(tree: str, ckpts: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, ckpts], env=dict(os.environ, PYTHONPATH=tree), capture_output=True, text=True
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{tree}: {r.stderr[-2000:]}")
    return json.loads(line[7:])


if __name__ == "__main__":
    old_tree, new_tree = sys.argv[1:3]
    ckpts = tempfile.mkdtemp()  # both trees read the same random checkpoints
    old, new = tokens(old_tree, ckpts), tokens(new_tree, ckpts)
    for model in old:
        same = "same" if old[model] == new.get(model) else "DIFFERENT"
        print(f"{model:>24}: {same} greedy ids ({len(old[model])} prompts)")
    sys.exit(0 if old == new else 1)
