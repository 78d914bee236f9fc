"""The 8-bit schemes on the random Qwen3-0.6B shape, each in a fresh process through `LLM(..., quantization=...)`:
batch-1 TPOT after a 128-token prompt (workload 3), batch-64 output tok/s (64 prompts of 128 tokens, 256 generated),
workload 2 (256 requests, 100-1024 tokens in and out); and HF transformers bf16 at batch 1 in its own process.

    PYTHONPATH=. python3 benchmarks_nb/gpu/w8_serving.py $OUT     # on the GPU: writes $OUT/w8_serving.json
    W8S_DEVICE=cpu W8S_LIKE=tiny-qwen3 W8S_VOCAB=10240 W8S_W2=4 W8S_GEN=8 ...  # a smoke test on the CPU
"""

import json, os, subprocess, sys, time
from pathlib import Path

CHILD = r"""
import json, os, sys, torch
from litellama.benchmarks import harness as bench
path, scheme = sys.argv[1], sys.argv[2]
dev = os.environ.get("W8S_DEVICE", "cuda")
n_w2, gen = int(os.environ.get("W8S_W2", 256)), int(os.environ.get("W8S_GEN", 256))
if scheme == "hf":
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(dev).eval()
    prompts = bench.random_prompts(1, 128, seed=1)
    bench.hf_generate(hf, prompts, 2, 1)
    n, t = bench.hf_generate(hf, prompts, 64, 1)
    print("RESULT " + json.dumps(dict(batch1_tok_s=n / t, generated=n)), flush=True); raise SystemExit
from litellama.entrypoints.llm import LLM
llm = LLM(path, dtype="bfloat16" if dev == "cuda" else "float32", device=dev, quantization=None if scheme == "bf16" else scheme)
out = dict(tpot=bench.workload3(llm, prompt_lens=(128,), gen=128, repeats=5)[0])
prompts = bench.random_prompts(64, 128, seed=64)
bench.ours_generate(llm, prompts[:1], 4)
n, t = bench.ours_generate(llm, prompts, gen)
out["batch64_tok_s"] = n / t
out["w2"] = bench.workload2(llm, num_requests=n_w2)
out.pop("runs", None)
print("RESULT " + json.dumps(out), flush=True)
"""


def run(path, scheme):
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", CHILD, path, scheme], capture_output=True, text=True, timeout=300)
    line = next((l for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        return dict(error=(r.stderr or r.stdout)[-1500:], wall_s=time.time() - t0)
    return dict(json.loads(line[7:]), wall_s=time.time() - t0)


def main():
    import torch
    from litellama.benchmarks.harness import environment
    from litellama.testing.checkpoints import make_random_checkpoint

    out = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    like = os.environ.get("W8S_LIKE", "qwen3-0.6b")  # a smaller shape for a smoke test on the CPU
    path = f"/tmp/litellama-bench/{like}"
    if not Path(path, "config.json").exists():
        smoke = "W8S_VOCAB" in os.environ  # a tiny shape that still takes the workloads' token ids and lengths
        extra = dict(vocab_size=int(os.environ["W8S_VOCAB"]), max_position_embeddings=4096) if smoke else {}
        make_random_checkpoint(like, path, dtype=torch.bfloat16, **extra)
    rows = {}
    for scheme in ("bf16", "int8", "fp8", "hf"):
        rows[scheme] = r = run(path, scheme)
        for k in ("tpot", "w2"):
            if isinstance(r.get(k), dict):
                r[k] = {a: b for a, b in r[k].items() if a != "runs"}
        print(scheme, json.dumps(r)[:400], flush=True)
    bf = rows["bf16"]
    vs = {}
    for s in ("int8", "fp8"):
        if "error" not in rows[s] and "error" not in bf:
            vs[s] = dict(
                tpot=rows[s]["tpot"]["tpot_ms"] / bf["tpot"]["tpot_ms"],
                batch64=rows[s]["batch64_tok_s"] / bf["batch64_tok_s"],
                workload2=rows[s]["w2"]["tok_s"] / bf["w2"]["tok_s"],
            )
        if "error" not in rows[s] and "error" not in rows["hf"]:
            vs.setdefault(s, {})["batch1_vs_hf_bf16"] = 1e3 / rows[s]["tpot"]["tpot_ms"] / rows["hf"]["batch1_tok_s"]
    payload = dict(
        environment(),
        command="PYTHONPATH=. python3 benchmarks_nb/gpu/w8_serving.py " + " ".join(sys.argv[1:]),
        model="random Qwen3-0.6B shape (make_random_checkpoint), bf16 checkpoint; int8/fp8 quantized at load",
        rows=rows,
        vs_bf16=vs,
    )
    (out / "w8_serving.json").write_text(json.dumps(payload, indent=1))
    print(json.dumps(vs, indent=1))


if __name__ == "__main__":
    main()
