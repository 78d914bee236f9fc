"""DeepSeek-V3 (nbs/04e_deepseek_v3) through the engine, for the variants the lesson does not serve end to end: queries
without compression (`q_lora_rank` null), rotary halves instead of interleaved pairs, YaRN with `mscale_all_dim`, each
giving transformers' greedy tokens in fp32 through chunked prefill, a prefix-cache hit and a preemption; the
uncompressed-query variant again with every op forced onto Triton (the interpreter on a CPU); and a random checkpoint
of Moonlight's shape, shrunk, written by `make_random_checkpoint` (transformers' parameters only: no correction bias)."""
import os

import pytest
import torch
import transformers

from litellama.engine.llm_engine import ContinuousBatchingEngine
from litellama.kernels.registry import ops
from litellama.sampling_params import SamplingParams
from litellama.testing.tokenizer import make_tokenizer

TINY = dict(
    model_type="deepseek_v3", vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
    num_experts_per_tok=3, n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1,
    q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=24,
    max_position_embeddings=256, rms_norm_eps=1e-6,
)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}
VARIANTS = {"no-q-lora": dict(q_lora_rank=None), "halves": dict(rope_interleave=False), "yarn": dict(rope_parameters=YARN)}


def write(path, seed=0, **kw):
    "A random tiny transformers DeepSeek-V3 saved with a tokenizer under `path`; returns the model."
    tok = make_tokenizer()
    torch.manual_seed(seed)
    cfg = transformers.AutoConfig.for_model(**{**TINY, **kw}, eos_token_id=tok.eos_token_id, bos_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for n, t in hf.state_dict().items():
            if "norm" in n:
                t.add_(torch.randn_like(t) * 0.1)
            elif n.endswith("e_score_correction_bias"):
                t.normal_(0, 0.1)
            elif t.dim() > 1:
                t.normal_(0, t.shape[-1] ** -0.5)
    hf.save_pretrained(path)
    tok.save_pretrained(path)
    return hf


def prompts_sharing_a_prefix(lens, shared):
    "Prompts of `lens` tokens; the third starts with the first's first `shared` tokens (a prefix-cache hit)."
    g = torch.Generator().manual_seed(7)
    ps = [torch.randint(3, 300, (n,), generator=g).tolist() for n in lens]
    ps[2][:shared] = ps[0][:shared]
    return ps


def engine_greedy(path, prompts, n, blocks, chunk):
    eng = ContinuousBatchingEngine.from_pretrained(
        path, dtype="float32", device="cpu", num_kv_blocks=blocks, block_size=4, max_num_batched_tokens=chunk
    )
    outs, rids = {}, []
    for i, p in enumerate(prompts):
        rids.append(eng.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)))
        for _ in range(3 if i == 0 else 0):  # the first prompt's blocks are cached before the third arrives
            for o in eng.step():
                outs.setdefault(o.request_id, []).extend(o.token_ids)
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids)
    return [outs[r] for r in rids], eng.stats


def check(path, hf, prompts, n, blocks, chunk):
    want = [hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p):].tolist() for p in prompts]
    got, s = engine_greedy(path, prompts, n, blocks, chunk)
    assert [o[: len(w)] for o, w in zip(got, want)] == want
    assert s.num_preemptions and s.prefix_cache_hit_tokens and s.num_chunked_prefills, s


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_through_the_engine(tmp_path, variant):
    hf = write(tmp_path, **VARIANTS[variant])
    check(tmp_path, hf, prompts_sharing_a_prefix((90, 5, 49, 23), 40), 12, 40, 32)


@pytest.fixture
def triton_backend():
    os.environ["LITELLAMA_BACKEND"] = "triton"
    ops.reset()
    yield
    del os.environ["LITELLAMA_BACKEND"]
    ops.reset()


def test_uncompressed_queries_on_triton(tmp_path, triton_backend):
    hf = write(tmp_path, q_lora_rank=None, rope_interleave=False, num_hidden_layers=2, num_experts_per_tok=2)
    check(tmp_path, hf, prompts_sharing_a_prefix((21, 5, 20), 12), 6, 8, 16)


def test_random_checkpoint_of_moonlights_shape(tmp_path):
    "Moonlight's architecture (no query compression, one group, two shared experts), shrunk; no correction bias."
    from litellama.testing.checkpoints import make_random_checkpoint

    small = dict(vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
                 qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, max_position_embeddings=256)
    path = make_random_checkpoint("moonlight-16b-a3b", tmp_path, dtype=torch.float32, **small)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert hf.config.q_lora_rank is None and hf.config.n_shared_experts == 2
    check(path, hf, prompts_sharing_a_prefix((90, 5, 49, 23), 40), 12, 40, 32)


def test_tp2_matches_tp1(tmp_path):
    """tensor_parallel_size=2 (two gloo ranks on the CPU) gives tp = 1's greedy tokens: Moonlight's layout and one with
    compressed queries and grouped routing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from test_parallel_families import ROOT, SCRIPT

    from litellama.testing.checkpoints import make_random_checkpoint

    small = dict(vocab_size=320, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
                 qk_rope_head_dim=16, v_head_dim=16, n_routed_experts=8, max_position_embeddings=256)
    paths = [
        make_random_checkpoint("moonlight-16b-a3b", tmp_path / "moonlight", dtype=torch.float32, **small),
        make_random_checkpoint("moonlight-16b-a3b", tmp_path / "v3", dtype=torch.float32, seed=1, q_lora_rank=24,
                               n_group=4, topk_group=2, rope_interleave=True, **small),
    ]
    (tmp_path / "run.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    out = tmp_path / "tokens.json"
    subprocess.run([sys.executable, str(tmp_path / "run.py"), str(out), *map(str, paths)], env=env, check=True,
                   timeout=300)
    results = json.loads(out.read_text())
    for name, (one, two) in results.items():
        assert all(len(t) == 8 for t in one), (name, one)
        assert two == one, name
    assert set(results) == {Path(p).name for p in paths}
