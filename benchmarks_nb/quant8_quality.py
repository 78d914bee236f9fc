"""Quality of the 8-bit schemes on real weights, on this CPU: perplexity of the bundled SmolLM2-135M-Instruct (float32)
on the held-out text, and greedy-token agreement with float32 over 64 tokens on 16 chat prompts, for fp32, int8 W8A16,
fp8 W8A16, plain W8A8 int8 and SmoothQuant W8A8 int8 (calibrated on a different text). Writes
benchmarks_nb/results/quant8_quality.json.

    PYTHONPATH=. python benchmarks_nb/quant8_quality.py [--alpha 0.5] [--out benchmarks_nb/results/quant8_quality.json]
"""

import argparse
import datetime
import json
import math
import subprocess
import tempfile
import time
from pathlib import Path

import torch

PROMPTS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Name three prime numbers greater than 50.",
    "What causes the seasons on Earth?",
    "Give me a recipe for pancakes.",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Summarise the plot of Romeo and Juliet.",
    "What is the difference between a virus and a bacterium?",
    "Suggest a name for a small bakery.",
    "How many minutes are in a week? Show the steps.",
    "What is a black hole?",
    "List four healthy breakfast ideas.",
    "Describe the water cycle for a child.",
]


def perplexity(model, ids, seq_len=512, block_size=16):
    "`(exp(mean NLL), argmax at every position)` of `ids`, in independent chunks of `seq_len` tokens."
    from litellama.executor.model_input import build_model_input

    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    nll, n, top1 = 0.0, 0, []
    for i in range(0, len(ids) - 1, seq_len):
        chunk = ids[i : i + seq_len + 1]
        if len(chunk) < 2:
            break
        inp, tgt = chunk[:-1], torch.tensor(chunk[1:])
        nb = -(-len(inp) // block_size)
        model.bind_kv_cache(torch.zeros(c.num_hidden_layers, 2, nb, block_size, c.num_key_value_heads, hd))
        mi = build_model_input([(inp, 0, list(range(nb)))], block_size)
        mi.logits_indices = torch.arange(len(inp))
        with torch.no_grad():
            logp = torch.log_softmax(model(mi).float(), -1)
        nll -= logp[torch.arange(len(tgt)), tgt].sum().item()
        n += len(tgt)
        top1.append(logp.argmax(-1))
    return math.exp(nll / n), torch.cat(top1)


def greedy(model, prompt_ids, max_tokens=64, block_size=16):
    "Greedy continuations of all prompts at once (one packed prefill, then batched decode steps), never stopping early."
    from litellama.executor.model_input import build_model_input

    c = model.config
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per = -(-(max(map(len, prompt_ids)) + max_tokens) // block_size)
    model.bind_kv_cache(
        torch.zeros(c.num_hidden_layers, 2, per * len(prompt_ids), block_size, c.num_key_value_heads, hd)
    )
    seqs, tables = [list(p) for p in prompt_ids], [list(range(i * per, (i + 1) * per)) for i in range(len(prompt_ids))]
    chunks = [(s, 0, t) for s, t in zip(seqs, tables)]
    for _ in range(max_tokens):
        with torch.no_grad():
            nxt = model(build_model_input(chunks, block_size)).argmax(-1).tolist()
        for s, t in zip(seqs, nxt):
            s.append(t)
        chunks = [([s[-1]], len(s) - 1, t) for s, t in zip(seqs, tables)]
    return [s[len(p) :] for s, p in zip(seqs, prompt_ids)]


def agreement(a, b):
    "Fraction of the positions where the two token lists agree, and the length of their common prefix."
    same = sum(x == y for x, y in zip(a, b)) / max(len(a), 1)
    prefix = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return same, prefix


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "quant8_quality.json"))
    ap.add_argument("--max-eval-tokens", type=int, default=513)
    ap.add_argument("--greedy-tokens", type=int, default=64, help="greedy tokens per chat prompt (0 skips it)")
    ap.add_argument(
        "--keep-perplexity",
        action="store_true",
        help="take the perplexities from the existing --out file and run only the greedy agreement",
    )
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from litellama.models.model_dir import default_model_dir
    from litellama.models.loader import load_model
    from litellama.quantization.smoothquant import write_w8a8_int8_checkpoint
    from litellama.quantization.smoothquant import quantize_smoothquant

    data = Path(__import__("litellama").__file__).parent / "data"
    src = default_model_dir()
    tok = AutoTokenizer.from_pretrained(str(src))
    ids = tok((data / "heldout.txt").read_text())["input_ids"][: a.max_eval_tokens]
    chat_ids = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
        for p in PROMPTS
    ]
    chat_ids = [list(c["input_ids"]) if isinstance(c, dict) or hasattr(c, "keys") else list(c) for c in chat_ids]
    tmp = Path(tempfile.mkdtemp())
    t0 = time.time()
    w8a8 = write_w8a8_int8_checkpoint(src, tmp / "w8a8")
    sq = quantize_smoothquant(src, tmp / "sq", alpha=a.alpha, calibration=data / "calibration.txt", max_tokens=1024)
    schemes = {
        "fp32": (src, None),
        "int8 W8A16": (src, "int8"),
        "fp8 W8A16": (src, "fp8"),
        "W8A8 int8 (plain)": (w8a8, None),
        f"SmoothQuant W8A8 int8 (alpha {a.alpha})": (sq, None),
    }
    old = {r["scheme"]: r for r in json.loads(Path(a.out).read_text())["rows"]} if a.keep_perplexity else {}
    rows, ref_tokens, ref_top1 = [], None, None
    for name, (d, q) in schemes.items():
        t = time.time()
        m, _ = load_model(d, dtype=torch.float32, device="cpu", quantization=q)
        if a.keep_perplexity:
            row = {k: old[name][k] for k in ("scheme", "perplexity", "top1_agreement")}
        else:
            ppl, top1 = perplexity(m, ids)
            if ref_top1 is None:
                ref_top1 = top1
            row = dict(scheme=name, perplexity=ppl, top1_agreement=(top1 == ref_top1).float().mean().item())
        if a.greedy_tokens:
            toks = greedy(m, chat_ids, a.greedy_tokens)
            if ref_tokens is None:
                ref_tokens = toks
            ag = [agreement(x, r) for x, r in zip(toks, ref_tokens)]
            row.update(
                token_agreement=sum(s for s, _ in ag) / len(ag),
                mean_common_prefix=sum(p for _, p in ag) / len(ag),
                prompts_identical=sum(p == a.greedy_tokens for _, p in ag),
            )
        del m
        rows.append(dict(**row, seconds=round(time.time() - t, 1)))
        print(rows[-1], flush=True)
    base = rows[0]["perplexity"]
    for r in rows:
        r["ppl_change_pct"] = 100 * (r["perplexity"] / base - 1)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        commit = "unknown"
    res = dict(
        model="SmolLM2-135M-Instruct (bundled), float32 on the CPU",
        eval_text="litellama/data/heldout.txt",
        eval_tokens=len(ids),
        seq_len=512,
        calibration_text="litellama/data/calibration.txt",
        alpha=a.alpha,
        greedy=dict(prompts=len(PROMPTS), tokens=a.greedy_tokens, chat_template=True, stops_early=False)
        if a.greedy_tokens
        else "not run (--greedy-tokens 0): top1_agreement is the teacher-forced next-token argmax agreement with fp32 on the held-out text",
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit,
        torch=torch.__version__,
        total_seconds=round(time.time() - t0, 1),
        rows=rows,
    )
    if a.keep_perplexity:
        prev = json.loads(Path(a.out).read_text())
        res["perplexity_from"] = dict(
            commit=prev.get("commit"), date=prev.get("date"), seconds=prev.get("total_seconds")
        )
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
