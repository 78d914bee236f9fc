"""Hybrid models (Qwen3.5, Qwen3.5-MoE, Qwen3-Next: Gated DeltaNet layers beside gated attention) against transformers,
through the engine: chunked prefill, batching, preemption, the state cache's accounting; on the PyTorch references
and with every op on Triton (under the interpreter on a CPU)."""

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import transformers

from litellama.engine.llm_engine import ContinuousBatchingEngine
from litellama.executor.model_input import build_model_input
from litellama.executor.model_runner import kv_layer_count, paged_kv_cache
from litellama.executor.state_cache import GDNStateCache
from litellama.kernels.registry import ops
from litellama.models.loader import load_model
from litellama.sampling_params import SamplingParams
from litellama.testing.tokenizer import make_tokenizer

FAMILIES = {  # transformers config class, model class, extra config
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", {}),
    "qwen3_5_moe": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", dict(num_experts=4, num_experts_per_tok=2)),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM", dict(num_experts=4, num_experts_per_tok=2)),
}
TINY = dict(
    vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
    linear_value_head_dim=8, linear_conv_kernel_dim=4, max_position_embeddings=512, moe_intermediate_size=16,
    shared_expert_intermediate_size=24,
)  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints():
    "Each family's tiny checkpoint (4 layers: three Gated DeltaNet, one attention) written by transformers, in fp32."
    root, out = Path(tempfile.mkdtemp()), {}
    tok = make_tokenizer()
    for name, (cfg_cls, model_cls, extra) in FAMILIES.items():
        torch.manual_seed(0)
        cfg = getattr(transformers, cfg_cls)(**TINY, **extra, eos_token_id=tok.eos_token_id, bos_token_id=None)
        hf = getattr(transformers, model_cls)(cfg).eval()
        with torch.no_grad():  # norms and gates away from their initial values, so that each one matters
            for n, p in hf.named_parameters():
                if "norm" in n or "A_log" in n or "dt_bias" in n:
                    p.normal_(0.0, 0.5)
        hf.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = (root / name, hf)
    return out


def prompts(seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 300, (n,), generator=g).tolist() for n in (70, 5, 1, 23)]


@contextmanager
def backend(name: str | None):
    "Every op forced onto `name` (None: the default choice) while the block runs."
    old = os.environ.get("LITELLAMA_BACKEND")
    if name:
        os.environ["LITELLAMA_BACKEND"] = name
    ops.reset()
    try:
        yield
    finally:
        os.environ.pop("LITELLAMA_BACKEND", None)
        if old is not None:
            os.environ["LITELLAMA_BACKEND"] = old
        ops.reset()


def hf_greedy(hf, ps: list, n: int) -> list:
    with torch.no_grad():
        return [hf.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0, len(p) :].tolist() for p in ps]


def run_engine(eng, ps: list, n: int) -> list:
    rids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)) for p in ps]
    outs: dict = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids)
    return [outs[r] for r in rids]


def assert_whole(eng) -> None:
    "No request left: every block and every state slot is free again."
    s = eng.stats
    assert s.num_free_blocks == s.num_total_blocks, s
    assert s.num_free_state_slots == s.num_total_state_slots > 0, s


def hf_logits(hf, p: list) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([p])).logits[0]


def chunk_ends(n: int, plan: str) -> list:
    "Where the chunks of an `n`-token prompt end: in one step, in two (3 tokens first), in three (the last one token)."
    ends = {"one": [n], "two": [3, n], "three": [3, n - 1, n]}[plan]
    return sorted({min(e, n) for e in ends if e > 0})


@pytest.mark.parametrize("impl", [None, "triton"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_prefill_logits_in_chunks(checkpoints, family, impl):
    """Every position's logits within 1e-4 of transformers', the prompts packed in one step and again split in chunks
    that carry the state across steps: 3 tokens (less than the convolution's width), then the rest, then one token
    (a decode)."""
    d, hf = checkpoints[family]
    ps = prompts(1)[:3] if impl is None else prompts(1)[:2]  # the interpreter is slow: fewer prompts and plans
    plans = ("one", "two", "three") if impl is None else ("three",)
    with backend(impl):
        model, config = load_model(d, torch.float32, "cpu")
        model.bind_kv_cache(paged_kv_cache(kv_layer_count(config), 64, 4, 2, 16, torch.float32, "cpu"))
        model.bind_state_cache(GDNStateCache.for_model(model, len(ps), "cpu"))
        tables = [list(range(20 * i, 20 * i + 20)) for i in range(len(ps))]
        want = [hf_logits(hf, p) for p in ps]
        for plan in plans:
            ends = [chunk_ends(len(p), plan) for p in ps]
            got: list = [[] for _ in ps]
            for k in range(max(map(len, ends))):
                rows = [i for i in range(len(ps)) if k < len(ends[i])]
                span = {i: (ends[i][k - 1] if k else 0, ends[i][k]) for i in rows}
                rows.sort(key=lambda i: span[i][0] > 0 and span[i][1] - span[i][0] == 1)  # prefill chunks first
                chunks = [(ps[i][slice(*span[i])], span[i][0], tables[i]) for i in rows]
                mi = build_model_input(chunks, 4, "cpu", [span[i][1] - span[i][0] for i in rows])
                mi.state_slots = torch.tensor(rows, dtype=torch.int32)
                with torch.no_grad():
                    out = model(mi)
                for i, part in zip(rows, out.split([span[i][1] - span[i][0] for i in rows]), strict=True):
                    got[i].append(part)
            for g, w in zip(got, want, strict=True):
                torch.testing.assert_close(torch.cat(g), w, atol=1e-4, rtol=0)


def engine(d, chunk: int, blocks: int = 24, **kw) -> ContinuousBatchingEngine:
    return ContinuousBatchingEngine.from_pretrained(
        d, dtype="float32", device="cpu", num_kv_blocks=blocks, block_size=4, max_num_batched_tokens=chunk, **kw
    )


@pytest.mark.parametrize("chunk", [3, 80])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_greedy(checkpoints, family, chunk):
    """transformers' greedy tokens, four prompts batched (one shares a prefix with another), prefills mixed with
    decodes, chunks of 3 tokens (less than the convolution's width) or 80 (more than a kernel chunk), a KV cache
    small enough to preempt; prefix caching is declared off, and every block and slot comes back."""
    d, hf = checkpoints[family]
    ps = prompts(2)
    ps[3] = ps[0][:40] + ps[3][:9]
    if chunk < 64:  # many small steps: shorter prompts, and a smaller cache to still preempt
        ps = [p[:20] for p in ps]
    want = hf_greedy(hf, ps, 8)
    eng = engine(d, chunk, blocks=24 if chunk >= 64 else 8)
    assert not eng.block_manager.enable_prefix_caching
    assert run_engine(eng, ps, 8) == want
    s = eng.stats
    assert s.num_preemptions and s.num_chunked_prefills and not s.prefix_cache_hit_tokens, s
    assert_whole(eng)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_greedy_triton(checkpoints, family):
    "The same on Triton's kernels (the interpreter on a CPU): two short prompts in chunks of 3 tokens."
    d, hf = checkpoints[family]
    ps = [p[:7] for p in prompts(3)[:2]]  # short: the interpreter runs each kernel program in Python
    want = hf_greedy(hf, ps, 3)
    with backend("triton"):
        eng = engine(d, 3, blocks=20)
        assert run_engine(eng, ps, 3) == want
    assert eng.stats.num_chunked_prefills
    assert_whole(eng)


def test_state_bytes_fixed_kv_blocks_grow(checkpoints):
    """A sequence holds one state slot, of the same bytes at its first token and its last, while its KV blocks grow
    with it — and the KV cache has a layer only for the full-attention layer (one of four)."""
    d, _ = checkpoints["qwen3_5"]
    eng = engine(d, 64, blocks=40)
    runner, bm = eng.runner, eng.block_manager
    assert runner.kv_cache.k.shape[0] == 1 and runner.state_cache.num_layers == 3
    rid = eng.add_request(prompts(4)[1], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    seen = []
    while eng.has_unfinished_requests():
        eng.step()
        held = [s for s in eng.scheduler.running if s.state_slot >= 0]
        if held:
            (seq,) = held
            slots_held = bm.state_slots.num_total - bm.state_slots.num_free
            seen.append((seq.num_tokens, slots_held * runner.state_cache.bytes_per_slot, len(seq.block_table)))
    assert rid and len(seen) > 50
    (n1, state1, blocks1), (nN, stateN, blocksN) = seen[0], seen[-1]
    shapes = runner.state_cache.conv.shape, runner.state_cache.recurrent.shape
    per_slot = 3 * (shapes[0][2] * shapes[0][3] + shapes[1][2] * shapes[1][3] * shapes[1][4]) * 4  # fp32, 3 layers
    assert state1 == stateN == per_slot and nN > n1 + 50
    assert blocksN > blocks1 and blocksN == -(-nN // 4)
    assert_whole(eng)


def test_refusals(checkpoints, caplog):
    """Prefix caching is turned off with one line in the log; speculation, tensor parallelism and the multimodal
    checkpoint are refused in one line."""
    d, _ = checkpoints["qwen3_next"]
    with caplog.at_level("WARNING", logger="litellama"):
        eng = engine(d, 16)
    assert not eng.block_manager.enable_prefix_caching
    said = [r.getMessage() for r in caplog.records if "prefix caching is off" in r.getMessage()]
    assert len(said) == 1, caplog.records
    with pytest.raises(ValueError, match="speculative decoding is not supported for hybrid models"):
        engine(d, 16, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    from litellama.layers.parallel import rank_config
    from litellama.models.decoder import model_class
    from litellama.models.loader import load_config

    config = load_config(d)
    cls = model_class(config)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported for hybrid models"):
        cls.check_config(rank_config(config, 2))
    mm = transformers.Qwen3_5Config(architectures=["Qwen3_5ForConditionalGeneration"])
    with pytest.raises(ValueError, match="multimodal Qwen3.5 checkpoint is not served"):
        model_class(mm)


def test_state_pool_counted_in_memory_budget(checkpoints):
    """The state cache (`max_num_seqs` slots) is paid out of the KV cache's memory budget, before the blocks; a pool
    larger than the budget is a one-line error naming `max_num_seqs`."""
    d, _ = checkpoints["qwen3_5"]
    for seqs in (4, 256):
        eng = engine(d, 16, blocks=None, kv_cache_memory=1 << 20, max_num_seqs=seqs)
        r = eng.runner
        block_bytes = r.kv_cache.nbytes // r.num_blocks
        per_slot = 3 * (3 * 32 + 2 * 8 * 8) * 4  # 3 layers: a [3, 32] window and a [2, 8, 8] state, fp32
        assert r.state_cache.bytes_per_slot == per_slot and r.state_cache.num_slots == seqs
        assert r.num_blocks == ((1 << 20) - seqs * per_slot) // block_bytes
        assert eng.stats.num_total_state_slots == seqs
    with pytest.raises(ValueError, match="the state cache of 256 sequences takes .* lower max_num_seqs"):
        engine(d, 16, blocks=None, kv_cache_memory=1 << 16, max_num_seqs=256)
