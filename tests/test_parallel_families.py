"""Tensor parallelism beyond Llama: tiny Qwen3-MoE (experts sharded), Phi-3 (fused checkpoint tensors, longrope with a
switch the prompts cross), Gemma 2, Gemma 3 (one kv head: replicated), SmolLM3 and gpt-oss (a sink per attention head,
experts with biases) give tp = 1's greedy tokens at tp = 2, each rank a gloo process on the CPU."""
import json, os, subprocess, sys
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = '''
import json, sys
from pathlib import Path
from litellama.entrypoints.llm import LLM
from litellama.sampling_params import SamplingParams

PROMPTS = [[1, 2, 3], list(range(5, 25)), list(range(40, 70))]  # 3, 20 (crosses 24 decoding) and 30 tokens

def tokens(path, tp):
    opts = dict(dtype="float32", device="cpu", tensor_parallel_size=tp, max_num_seqs=4, max_num_batched_tokens=32,
                block_size=4, num_kv_blocks=64)
    with LLM(path, **opts) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        return [o.outputs[0].token_ids for o in outs]

if __name__ == "__main__":  # spawned ranks re-import this file: the engines start only in the main process
    out, paths = sys.argv[1], sys.argv[2:]
    Path(out).write_text(json.dumps({Path(p).name: [tokens(p, 1), tokens(p, 2)] for p in paths}))
'''

_BASE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=320)
FAMILIES = {
    "qwen3-moe": ("tiny-qwen3-moe", {}),
    "phi3": ("tiny-llama", dict(_BASE, model_type="phi3", num_hidden_layers=2, tie_word_embeddings=False,
                                original_max_position_embeddings=24, rope_parameters={
                                    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                    "original_max_position_embeddings": 24,
                                    "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                    "long_factor": [2.0 + 0.5 * i for i in range(6)]})),
    "gemma2": ("tiny-llama", dict(_BASE, model_type="gemma2", num_hidden_layers=2, head_dim=16, sliding_window=10,
                                  query_pre_attn_scalar=24, attn_logit_softcapping=2.0, final_logit_softcapping=5.0)),
    "gemma3": ("tiny-llama", dict(_BASE, model_type="gemma3_text", architectures=["Gemma3ForCausalLM"],
                                  num_hidden_layers=3, num_key_value_heads=1, head_dim=16, sliding_window=8,
                                  query_pre_attn_scalar=16, layer_types=["sliding_attention", "sliding_attention",
                                                                         "full_attention"])),
    "smollm3": ("tiny-llama", dict(_BASE, model_type="smollm3", num_hidden_layers=4, no_rope_layer_interval=2)),
    "gpt-oss": ("tiny-llama", dict(_BASE, model_type="gpt_oss", intermediate_size=32, head_dim=16, num_hidden_layers=4,
                                   sliding_window=8, num_local_experts=4, num_experts_per_tok=2, swiglu_limit=1.0,
                                   max_position_embeddings=256, rope_parameters={
                                       "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                                       "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})),
}

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from litellama.testing.checkpoints import make_random_checkpoint
    d = tmp_path_factory.mktemp("tp_families")
    (d / "run.py").write_text(SCRIPT)
    paths = [make_random_checkpoint(like, d / name, dtype=torch.float32, seed=i, **kw)
             for i, (name, (like, kw)) in enumerate(FAMILIES.items())]
    return paths, d / "run.py"

def test_tp2_matches_tp1_for_each_family(checkpoints, tmp_path):
    paths, script = checkpoints
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    out = tmp_path / "tokens.json"
    subprocess.run([sys.executable, str(script), str(out), *map(str, paths)], env=env, check=True, timeout=300)
    results = json.loads(out.read_text())
    assert set(results) == set(FAMILIES)
    for name, (one, two) in results.items():
        assert all(len(t) == 8 for t in one), (name, one)
        assert two == one, name
