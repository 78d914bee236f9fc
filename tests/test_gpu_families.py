"""GPU parity of what was built since the last GPU run: tiny fp32 checkpoints of each newer family (sliding windows,
softcaps, longrope, layers without rotary, sinks with alternating windows and YaRN, MoE) give transformers' greedy
tokens on the GPU with CUDA graphs on and off; the Gated DeltaNet kernels at Qwen3-Next's sizes equal their
references, the decode kernels inside a CUDA graph; n-gram speculation under graphs gives plain greedy's tokens."""
import itertools
import random

import pytest
import torch
from test_parallel_families import FAMILIES  # the tiny configs the tensor-parallel tests use

pytestmark = pytest.mark.gpu


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


GPT_OSS = dict(
    model_type="gpt_oss", hidden_size=64, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, num_hidden_layers=4, vocab_size=320, max_position_embeddings=512, sliding_window=8,
    num_local_experts=4, num_experts_per_tok=2, swiglu_limit=7.0, rope_parameters={
        "rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 64},
)  # fmt: skip  (swiglu_limit: gpt-oss' own 7.0, which transformers 5.17 uses whatever the config says)
GPU_FAMILIES = {
    **FAMILIES,
    "mistral-sliding": ("tiny-llama", dict(model_type="mistral", num_hidden_layers=2, sliding_window=12)),
}


def write_gpt_oss(out, seed=0):
    "A tiny transformers gpt-oss with random sinks, biases and norms, saved with a tokenizer."
    import transformers

    from litellama.testing.tokenizer import make_tokenizer

    torch.manual_seed(seed)
    tok = make_tokenizer()
    cfg = transformers.AutoConfig.for_model(**GPT_OSS, eos_token_id=tok.eos_token_id, bos_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * 0.1)
            elif n.endswith("sinks"):
                p.normal_(0, 1.0)
            elif p.dim() > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
    hf.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def checkpoint(name, out):
    from litellama.testing.checkpoints import make_random_checkpoint

    if name == "gpt-oss":
        return write_gpt_oss(out)
    like, kw = GPU_FAMILIES[name]
    return make_random_checkpoint(like, out, dtype=torch.float32, seed=11, **kw)


@pytest.mark.parametrize("name", [*GPU_FAMILIES, "gpt-oss"])
def test_family_matches_hf_with_and_without_graphs(name, tmp_path):
    import transformers

    from litellama.entrypoints.llm import LLM
    from litellama.kernels.registry import ops
    from litellama.sampling_params import SamplingParams

    path = checkpoint(name, tmp_path / name)
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (1, 7, 40, 130)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    hf = hf.cuda().eval()
    want = [
        hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                    pad_token_id=0)[0, len(p):].tolist() for p in prompts
    ]  # fmt: skip
    ops.reset()
    for eager in (True, False):
        llm = LLM(str(path), dtype="float32", device="cuda", num_kv_blocks=256, max_num_seqs=8, enforce_eager=eager,
                  max_num_batched_tokens=64)  # fmt: skip
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, min_tokens=16), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"{name}, enforce_eager={eager}"
        assert bool(getattr(llm.engine.runner, "graphs", None)) == (not eager), name


def gdn_inputs(lens, Hk, Hv, Dk, Dv, dtype, seed=0):
    from litellama.kernels.gated_delta import gdn_gating

    g0 = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    r = lambda *s: torch.randn(*s, generator=g0, device="cuda")  # noqa: E731
    q, k, v = r(T, Hk, Dk).to(dtype), r(T, Hk, Dk).to(dtype), r(T, Hv, Dv).to(dtype)
    g, beta = gdn_gating(r(Hv), r(T, Hv), r(Hv), r(T, Hv))
    cu = torch.tensor([0, *itertools.accumulate(lens)], device="cuda", dtype=torch.int32)
    return q, k, v, g, beta.to(dtype), cu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_prefill_at_qwen3_next_sizes(dtype):
    "Packed sequences across 64-token chunk edges, some continuing a saved state; 16 key and 32 value heads of 128."
    from litellama.kernels import gated_delta as gd

    lens = [1, 63, 64, 65, 300]
    q, k, v, g, beta, cu = gdn_inputs(lens, 16, 32, 128, 128, dtype)
    state = torch.randn(8, 32, 128, 128, device="cuda") * 0.05
    slots = torch.tensor([5, 0, 2, 7, 3], device="cuda", dtype=torch.int32)
    has = torch.tensor([1, 0, 1, 0, 1], device="cuda", dtype=torch.bool)
    s_ref, s_tri = state.clone(), state.clone()
    o_ref = gd.gated_delta_prefill_ref(q, k, v, g, beta, cu, s_ref, slots, has)
    o_tri = gd.gated_delta_prefill(q, k, v, g, beta, cu, s_tri, slots, has)
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    assert rel_err(o_tri, o_ref) < tol
    assert rel_err(s_tri, s_ref) < tol
    assert torch.equal(s_tri[[1, 4, 6]], state[[1, 4, 6]])  # slots no sequence named are untouched


def test_gated_delta_and_conv_decode_in_a_cuda_graph():
    "One bf16 decode token per sequence, padding rows (slot -1) among them, recorded once and replayed."
    from litellama.kernels import gated_delta as gd

    B, D, K = 6, 2 * 16 * 128 + 32 * 128, 4
    q, k, v, g, beta, _ = gdn_inputs([1] * B, 16, 32, 128, 128, torch.bfloat16, seed=1)
    x, w = torch.randn(B, D, device="cuda", dtype=torch.bfloat16), torch.randn(D, K, device="cuda") * 0.3
    slots = torch.tensor([3, -1, 0, 5, -1, 1], device="cuda", dtype=torch.int32)
    state, conv = torch.randn(6, 32, 128, 128, device="cuda") * 0.05, torch.randn(6, K - 1, D, device="cuda")
    conv = conv.to(torch.bfloat16)
    want_o = gd.gated_delta_decode_ref(q, k, v, g, beta, s_ref := state.clone(), slots)
    want_y = gd.causal_conv1d_decode_ref(x, w, None, c_ref := conv.clone(), slots)
    s_tri, c_tri = state.clone(), conv.clone()
    graph = torch.cuda.CUDAGraph()
    gd.gated_delta_decode(q, k, v, g, beta, state.clone(), slots)  # compile outside the capture
    gd.causal_conv1d_decode(x, w, None, conv.clone(), slots)
    with torch.cuda.graph(graph):
        o = gd.gated_delta_decode(q, k, v, g, beta, s_tri, slots)
        y = gd.causal_conv1d_decode(x, w, None, c_tri, slots)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(o, want_o) < 2e-2 and rel_err(y, want_y) < 2e-2
    assert rel_err(s_tri, s_ref) < 2e-2 and rel_err(c_tri, c_ref) < 2e-2
    assert o[[1, 4]].abs().sum().item() == 0


def test_ngram_speculation_under_graphs_equals_greedy(tmp_path):
    "Prompts that repeat themselves: n-gram drafts are accepted, and the tokens are plain greedy's."
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    from litellama.testing.checkpoints import make_random_checkpoint

    path = make_random_checkpoint("tiny-qwen3", tmp_path / "q", dtype=torch.float32, seed=2)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, 300) for _ in range(12)] * 4 for _ in range(6)]
    sp = SamplingParams(temperature=0, max_tokens=32, min_tokens=32)
    plain = LLM(str(path), dtype="float32", device="cuda", num_kv_blocks=256, max_num_seqs=8)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, sp, use_tqdm=False)]
    spec = LLM(str(path), dtype="float32", device="cuda", num_kv_blocks=256, max_num_seqs=8,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4})  # fmt: skip
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, sp, use_tqdm=False)] == want
