"GPU checks: every Triton kernel against the PyTorch reference in bf16 and fp16, and whole models on Triton ops."
import os, random, tempfile
from pathlib import Path
import numpy as np
import pytest, torch
from litellama.kernels import reference as ref

pytestmark = pytest.mark.gpu
DT = [torch.bfloat16, torch.float16]

def rel_err(a, b): return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", [(1, 1024), (4097, 1024), (333, 4096), (64, 16, 128)])
def test_rmsnorm(dtype, shape):
    from litellama.kernels import rmsnorm
    x, r = torch.randn(shape, device="cuda", dtype=dtype), torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(shape[-1], device="cuda", dtype=dtype)
    assert rel_err(rmsnorm.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6)) < 1e-2
    o, res = rmsnorm.fused_add_rms_norm(x, r, w, 1e-6); eo, eres = ref.fused_add_rms_norm(x, r, w, 1e-6)
    assert rel_err(o, eo) < 1e-2 and rel_err(res, eres) < 1e-2

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("T,Hq,Hk,D", [(1, 16, 8, 128), (777, 16, 8, 128), (300, 32, 8, 64)])
def test_rope_silu_store(dtype, T, Hq, Hk, D):
    from litellama.kernels import rope, activation, kv_store
    q, k = torch.randn(T, Hq, D, device="cuda", dtype=dtype), torch.randn(T, Hk, D, device="cuda", dtype=dtype)
    ang = torch.arange(4096, device="cuda")[:, None].float() * torch.rand(D // 2, device="cuda")
    cache = torch.cat([ang.cos(), ang.sin()], -1)
    pos = torch.randint(0, 4096, (T,), device="cuda")
    for a, b in zip(rope.rotary_embedding(pos, q, k, cache), ref.rotary_embedding(pos, q, k, cache)): assert rel_err(a, b) < 1e-2
    x = torch.randn(T, 2 * 3072, device="cuda", dtype=dtype)
    assert rel_err(activation.silu_and_mul(x), ref.silu_and_mul(x)) < 1e-2
    kc = torch.randn(64, 16, Hk, D, device="cuda", dtype=dtype); vc = torch.randn_like(kc)
    kc2, vc2 = kc.clone(), vc.clone()
    slots = torch.randperm(64 * 16, device="cuda")[:T]; slots[::7] = -1
    kv_store.store_kv_cache(k, k * 2, kc, vc, slots); ref.store_kv_cache(k, k * 2, kc2, vc2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)

def paged(seq_lens, Hk, D, dtype, block_size=16):
    nb = sum((s + block_size - 1) // block_size for s in seq_lens) + 4
    kc = torch.randn(nb, block_size, Hk, D, device="cuda", dtype=dtype); vc = torch.randn_like(kc)
    perm = torch.randperm(nb).tolist(); tables, i = [], 0
    for s in seq_lens:
        n = (s + block_size - 1) // block_size; tables.append(perm[i:i + n]); i += n
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device="cuda")
    return kc, vc, bt

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("Hq,Hk,D", [(16, 8, 128), (32, 4, 64), (8, 8, 128)])
def test_prefill_attention(dtype, Hq, Hk, D):
    from litellama.kernels import prefill_attention as pa
    seq_lens, q_lens = [1, 300, 1025, 77], [1, 300, 129, 1]        # fresh prompts and chunks after a prefix
    kc, vc, bt = paged(seq_lens, Hk, D, dtype)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    q = torch.randn(sum(q_lens), Hq, D, device="cuda", dtype=dtype)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    assert rel_err(pa.prefill_attention(q, kc, vc, cu, sl, bt, D ** -0.5), ref.prefill_attention(q, kc, vc, cu, sl, bt, D ** -0.5)) < 2e-2

@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("Hq,Hk,D", [(16, 8, 128), (32, 4, 64), (8, 1, 128)])
def test_decode_attention(dtype, Hq, Hk, D):
    from litellama.kernels import decode_attention as da
    seq_lens = [1, 17, 4096, 1000, 333]
    kc, vc, bt = paged(seq_lens, Hk, D, dtype)
    q = torch.randn(len(seq_lens), Hq, D, device="cuda", dtype=dtype)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    assert rel_err(da.decode_attention(q, kc, vc, sl, bt, D ** -0.5), ref.decode_attention(q, kc, vc, sl, bt, D ** -0.5)) < 2e-2

@pytest.mark.parametrize("dtype", DT)
def test_decode_attention_plans(dtype):
    "Ragged batch of 200: the planner's pieces, whole sequences, a padded plan, and a graph replayed with a new plan."
    from litellama.kernels import decode_attention as da
    g = np.random.default_rng(1)
    lens = g.integers(1, 3000, 200).tolist()
    kc, vc, bt = paged(lens, 8, 128, dtype)
    q = torch.randn(200, 16, 128, device="cuda", dtype=dtype)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    want = ref.decode_attention(q, kc, vc, sl, bt, 128 ** -0.5)
    on_gpu = lambda plan: [torch.from_numpy(a).cuda() for a in plan]
    planner = da.SplitPlanner(8, 128, dtype, "cuda")
    for plan in (planner(lens), da.plan_splits(lens, 4096), planner(lens, pad_to_batch=256)):
        assert rel_err(da.decode_attention(q, kc, vc, sl, bt, 128 ** -0.5, splits=on_gpu(plan)), want) < 2e-2
    rows, cu = on_gpu(planner(lens, pad_to_batch=256))
    q256, sl256 = torch.zeros(256, 16, 128, device="cuda", dtype=dtype), torch.zeros(256, dtype=torch.int32, device="cuda")
    bt256 = torch.zeros(256, bt.shape[1], dtype=bt.dtype, device="cuda")
    graph = torch.cuda.CUDAGraph()
    da.decode_attention(q256, kc, vc, sl256, bt256, 128 ** -0.5, splits=(rows, cu)); torch.cuda.synchronize()
    with torch.cuda.graph(graph): out = da.decode_attention(q256, kc, vc, sl256, bt256, 128 ** -0.5, splits=(rows, cu))
    lens2 = [max(1, n - int(g.integers(0, n))) for n in lens]         # every sequence shorter: a new plan
    sl2 = torch.tensor(lens2, dtype=torch.int32, device="cuda")
    q256[:200].copy_(q); sl256[:200].copy_(sl2); bt256[:200].copy_(bt)
    for buf, a in zip((rows, cu), planner(lens2, pad_to_batch=256)): buf.copy_(torch.from_numpy(a))
    graph.replay(); torch.cuda.synchronize()
    assert rel_err(out[:200], ref.decode_attention(q, kc, vc, sl2, bt, 128 ** -0.5)) < 2e-2
    assert out[200:].abs().sum().item() == 0

def _greedy(path, dtype, backend, prompts, n):
    os.environ["LITELLAMA_BACKEND"] = backend
    from litellama.kernels.registry import ops
    ops.reset()
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    llm = LLM(path, dtype=dtype, device="cuda", num_kv_blocks=512)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)
    del os.environ["LITELLAMA_BACKEND"]; ops.reset()
    return [o.outputs[0].token_ids for o in outs]

@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_tiny_models_triton_vs_reference_vs_hf(family, tmp_path):
    import transformers
    from litellama.testing.checkpoints import make_random_checkpoint
    path = make_random_checkpoint(f"tiny-{family}", tmp_path / family, dtype=torch.float32, seed=1)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 60))] for _ in range(8)]
    tri = _greedy(path, "float32", "triton", prompts, 24)
    tor = _greedy(path, "float32", "torch", prompts, 24)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda()
    want = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    assert tor == want
    assert tri == want

def test_qwen3_06b_shape_triton_logits_close(tmp_path):
    "Real shape, bf16: the same forward steps on Triton ops and on the reference ops give close logits."
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.models.loader import load_model
    from litellama.executor.model_input import build_model_input
    from litellama.kernels.registry import ops
    path = make_random_checkpoint("qwen3-0.6b", tmp_path / "q", dtype=torch.bfloat16)
    model, cfg = load_model(path, "bfloat16", "cuda")
    prompts = [list(range(5, 5 + n)) for n in (1, 200, 1500)]
    tables = [list(range(0, 1)), list(range(1, 14)), list(range(14, 108))]
    logits = {}
    for backend in ("torch", "triton"):
        os.environ["LITELLAMA_BACKEND"] = backend; ops.reset()
        model.bind_kv_cache(torch.zeros(cfg.num_hidden_layers, 2, 128, 16, cfg.num_key_value_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda"))
        with torch.inference_mode():
            a = model(build_model_input([(p, 0, t) for p, t in zip(prompts, tables)], 16, "cuda"))
            b = model(build_model_input([([7], len(p), t) for p, t in zip(prompts, tables)], 16, "cuda"))
        logits[backend] = torch.cat([a, b])
    del os.environ["LITELLAMA_BACKEND"]; ops.reset()
    assert rel_err(logits["triton"], logits["torch"]) < 3e-2
    assert (logits["triton"].argmax(-1) == logits["torch"].argmax(-1)).float().mean() >= 0.8

def test_cuda_graphs_same_tokens_as_eager(tmp_path):
    "Decode steps replayed from CUDA graphs give the same greedy tokens as eager steps."
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    path = make_random_checkpoint("tiny-qwen3", tmp_path / "q", dtype=torch.float32, seed=3)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 80))] for _ in range(37)]
    res = []
    for eager, overlap in ((True, False), (False, False), (False, True)):
        llm = LLM(path, dtype="float32", device="cuda", num_kv_blocks=1024, max_num_seqs=48, enforce_eager=eager, async_scheduling=overlap)
        assert bool(getattr(llm.engine.runner, "graphs", None)) == (not eager)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, min_tokens=20), use_tqdm=False)
        res.append([o.outputs[0].token_ids for o in outs])
    assert res[0] == res[1] == res[2]

@pytest.mark.parametrize("dtype", DT)
def test_fp8_kv_cache_kernels(dtype):
    "fp8 stores: the reference's bytes exactly, saturated; both attention kernels over an fp8 cache match the reference."
    from litellama.kernels import kv_store, prefill_attention as pa, decode_attention as da
    fp8 = torch.float8_e4m3fn
    k, v = torch.randn(999, 8, 128, device="cuda").to(dtype) * 3, torch.randn(999, 8, 128, device="cuda").to(dtype) / 30
    k[0, 0, :3] = torch.tensor([1000.0, -1000.0, 448.0])
    slots = torch.randperm(70 * 16, device="cuda")[:999]
    mine = [torch.zeros(70, 16, 8, 128, device="cuda", dtype=fp8) for _ in range(2)]
    want = [c.clone() for c in mine]
    kv_store.store_kv_cache(k, v, *mine, slots); ref.store_kv_cache(k, v, *want, slots)
    for a, b in zip(mine, want): assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert mine[0].float().abs().max().item() == 448.0
    runner_order = [torch.zeros(70, 8, 16, 128, device="cuda", dtype=fp8).transpose(1, 2),        # the model runner's: K head-major,
                    torch.zeros(70, 8, 128, 16, device="cuda", dtype=fp8).permute(0, 3, 1, 2)]    # V key-minor
    kv_store.store_kv_cache(k, v, *runner_order, slots)
    for a, b in zip(runner_order, want): assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    seq_lens = [1, 17, 4096, 1000, 333]
    kc, vc, bt = paged(seq_lens, 8, 128, dtype)
    kc, vc = kc.to(fp8), vc.to(fp8)
    sl = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(seq_lens), 16, 128, device="cuda", dtype=dtype)
    want = ref.decode_attention(q, kc.float(), vc.float(), sl, bt, 128 ** -0.5)
    kh, vk = kc.transpose(1, 2).contiguous().transpose(1, 2), da.v_key_minor(vc)          # the model runner's order
    assert da.fp8_words(q, kh, vk)[2] and not da.fp8_words(q, kc, vc)[2]
    for kk, vv in ((kc, vc), (kh, vk)):                                                  # bytes, then int32 words
        assert rel_err(da.decode_attention(q, kk, vv, sl, bt, 128 ** -0.5), want) < 2e-2
    q_lens = [1, 17, 300, 1000, 1]
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    qp = torch.randn(sum(q_lens), 16, 128, device="cuda", dtype=dtype)
    want = ref.prefill_attention(qp, kc.float(), vc.float(), cu, sl, bt, 128 ** -0.5)
    for kk, vv in ((kc, vc), (kh, vk)):
        assert rel_err(pa.prefill_attention(qp, kk, vv, cu, sl, bt, 128 ** -0.5), want) < 2e-2

@pytest.mark.parametrize("dtype", DT)
def test_fp8_decode_wide_batch_words(dtype):
    "A ragged batch of 200 over an fp8 cache in the runner's order reads K/V as int32 words: planned, padded to a graph's 256, and replayed in a graph."
    from litellama.kernels import decode_attention as da
    fp8 = torch.float8_e4m3fn
    g = np.random.default_rng(2)
    lens = (g.integers(100, 1025, 200) + g.integers(0, 513, 200)).tolist()
    kc, vc, bt = paged(lens, 8, 128, dtype)
    kc, vc = kc.to(fp8), vc.to(fp8)
    q = torch.randn(200, 16, 128, device="cuda", dtype=dtype)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    want = ref.decode_attention(q, kc.float(), vc.float(), sl, bt, 128 ** -0.5)
    vt = vc                                                     # token-major V: read as bytes
    vc = da.v_key_minor(vc)                                     # the model runner's order: int32 words
    assert da.fp8_words(q, kc, vc)[2]
    on_gpu = lambda plan: [torch.from_numpy(a).cuda() for a in plan]
    planner = da.SplitPlanner(8, 128, dtype, "cuda", fp8)
    for plan in (planner(lens), planner(lens, pad_to_batch=256)):
        assert rel_err(da.decode_attention(q, kc, vc, sl, bt, 128 ** -0.5, splits=on_gpu(plan)), want) < 2e-2
    assert rel_err(da.decode_attention(q[:100], kc, vt, sl[:100], bt[:100], 128 ** -0.5), want[:100]) < 2e-2  # bytes
    rows, cu = on_gpu(planner(lens, pad_to_batch=256))
    q256, sl256 = torch.zeros(256, 16, 128, device="cuda", dtype=dtype), torch.zeros(256, dtype=torch.int32, device="cuda")
    bt256 = torch.zeros(256, bt.shape[1], dtype=bt.dtype, device="cuda")
    da.decode_attention(q256, kc, vc, sl256, bt256, 128 ** -0.5, splits=(rows, cu)); torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph): out = da.decode_attention(q256, kc, vc, sl256, bt256, 128 ** -0.5, splits=(rows, cu))
    q256[:200].copy_(q); sl256[:200].copy_(sl); bt256[:200].copy_(bt)
    for buf, a in zip((rows, cu), planner(lens, pad_to_batch=256)): buf.copy_(torch.from_numpy(a))
    graph.replay(); torch.cuda.synchronize()
    assert rel_err(out[:200], want) < 2e-2 and out[200:].abs().sum().item() == 0

def test_fp8_kv_cache_graphs_same_tokens_as_eager(tmp_path):
    "With an fp8 cache, decode steps from CUDA graphs give the eager steps' greedy tokens; the cache holds twice the tokens."
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    path = make_random_checkpoint("tiny-qwen3", tmp_path / "q", dtype=torch.bfloat16, seed=3)
    rng = random.Random(1)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 80))] for _ in range(37)]
    res, caps = [], []
    for eager in (True, False):
        llm = LLM(path, dtype="bfloat16", device="cuda", kv_cache_memory=256 << 20, max_num_seqs=48, enforce_eager=eager, kv_cache_dtype="fp8")
        assert llm.engine.runner.kv_cache.dtype == torch.float8_e4m3fn
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, min_tokens=20), use_tqdm=False)
        res.append([o.outputs[0].token_ids for o in outs]); caps.append(llm.engine.runner.capacity_tokens)
    assert res[0] == res[1]
    bf16 = LLM(path, dtype="bfloat16", device="cuda", kv_cache_memory=256 << 20, enforce_eager=True)
    assert caps[0] == 2 * bf16.engine.runner.capacity_tokens

def test_overlapped_sampling_same_as_step_by_step(tmp_path):
    "Seeded sampling, penalties and logprobs give the same tokens with and without overlapped steps."
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    path = make_random_checkpoint("tiny-qwen3", tmp_path / "q", dtype=torch.float32, seed=4)
    rng = random.Random(2)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randint(1, 40))] for _ in range(12)]
    kinds = [SamplingParams(temperature=0.8, seed=5, max_tokens=16, ignore_eos=True),
             SamplingParams(temperature=0.7, top_p=0.9, seed=6, max_tokens=16, ignore_eos=True),
             SamplingParams(temperature=0, repetition_penalty=1.3, max_tokens=16, ignore_eos=True),
             SamplingParams(temperature=0, logprobs=3, max_tokens=16, ignore_eos=True)]
    res = []
    for overlap in (False, True):
        llm = LLM(path, dtype="float32", device="cuda", num_kv_blocks=512, async_scheduling=overlap)
        outs = llm.generate(prompts, [kinds[i % 4] for i in range(len(prompts))], use_tqdm=False)
        res.append([o.outputs[0].token_ids for o in outs])
    assert res[0] == res[1]

def test_gumbel_argmax_matches_reference():
    from litellama.kernels import gumbel
    from litellama.kernels.reference import uniform_noise
    for S in (1, 7, 256):
        logits = torch.randn(S, 151936, device="cuda") * 4
        args = (torch.rand(S, device="cuda") + 0.3, torch.randint(0, 2**62, (S,), device="cuda"), torch.randint(0, 2**20, (S,), device="cuda"))
        assert (gumbel.gumbel_argmax(logits, *args) == ref.gumbel_argmax(logits, *args)).float().mean() >= 0.99
    seeds, steps = torch.randint(0, 2**62, (64,), device="cuda"), torch.randint(0, 2**20, (64,), device="cuda")
    u = uniform_noise(seeds, steps, 5000)             # the kernel's uniforms are the sampler's, bit for bit
    assert torch.equal(gumbel.gumbel_argmax(torch.zeros(64, 5000, device="cuda"), torch.ones(64, device="cuda"), seeds, steps), u.argmax(-1))

@pytest.mark.parametrize("dtype", DT)
def test_skinny_linear(dtype):
    import torch.nn.functional as F
    from litellama.kernels.linear import skinny_linear
    for N, K in [(4096, 1024), (1024, 3072), (16384, 2048), (151936, 1024)]:
        w, b = torch.randn(N, K, device="cuda", dtype=dtype) / K ** 0.5, torch.randn(N, device="cuda", dtype=dtype)
        for M in (1, 3, 16, 32):
            x = torch.randn(M, K, device="cuda", dtype=dtype)
            assert rel_err(skinny_linear(x, w, b), F.linear(x.float(), w.float(), b.float())) < 1e-2

def test_qwen3_06b_shape_close_to_hf_by_vllm_rule(tmp_path):
    "bf16, real shape: greedy tokens equal HF's until they first differ; there each side's token is in the other's top 5."
    import transformers
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    path = make_random_checkpoint("qwen3-0.6b", tmp_path / "q", dtype=torch.bfloat16)
    rng = random.Random(3)
    prompts = [[rng.randrange(10000) for _ in range(rng.randint(16, 200))] for _ in range(8)]
    llm = LLM(path, dtype="bfloat16", device="cuda", num_kv_blocks=2048)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=5), use_tqdm=False)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    for p, o in zip(prompts, outs):
        g = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0,
                        output_logits=True, return_dict_in_generate=True)
        theirs, ours = g.sequences[0, len(p):].tolist(), o.outputs[0].token_ids
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        if diff is None: continue
        assert ours[diff] in g.logits[diff][0].float().topk(5).indices.tolist()
        assert theirs[diff] in o.outputs[0].logprobs[diff]

def test_graph_timer_and_linear_sweep():
    "The CUDA-graph timer gives the GPU time of short kernels; the skinny-linear sweep runs on it and every variant is correct."
    from litellama.kernels import autotune, linear
    x = torch.randn(4096, 4096, device="cuda")
    assert 0 < autotune.graph_ms(lambda: x * 2) < 1
    rows = linear.sweep(shapes=((4096, 1024),), ms=(1, 4), configs=[dict(BLOCK_N=8), dict(USE_DOT=True, BLOCK_N=32, BLOCK_K=128)])
    assert rows and all(r["ok"] and r["ms"] > 0 for r in rows)

@pytest.mark.parametrize("dtype", DT + [torch.float8_e4m3fn])
@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("T,Hq,Hk,D", [(1, 16, 8, 128), (777, 16, 8, 128), (300, 14, 2, 64)])
@pytest.mark.parametrize("layout", ["token-major", "head-major", "runner"])
def test_rope_and_store_kv(dtype, norm, T, Hq, Hk, D, layout):
    "The fused norms + rotation + store: q close to the reference's, the cache's bytes the reference's (fp8: a bf16 model over an fp8 cache)."
    from litellama.kernels import rope
    act = torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device="cuda", dtype=act) * (60 if dtype == torch.float8_e4m3fn and not norm else 1)
    q, k, v = qkv[:, :Hq * D].view(T, Hq, D), qkv[:, Hq * D:(Hq + Hk) * D].view(T, Hk, D), qkv[:, (Hq + Hk) * D:].view(T, Hk, D)
    ang = torch.arange(4096, device="cuda")[:, None].float() * torch.rand(D // 2, device="cuda")
    cache, pos = torch.cat([ang.cos(), ang.sin()], -1), torch.randint(0, 4096, (T,), device="cuda")
    w = (torch.rand(D, device="cuda", dtype=act) + 0.5, torch.rand(D, device="cuda", dtype=act) + 0.5) if norm else ()
    slots = torch.randperm(64 * 16, device="cuda")[:T]; slots[::7] = -1
    kc = torch.randn(64, 16, Hk, D, device="cuda").to(dtype); vc = torch.randn(64, 16, Hk, D, device="cuda").to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    if layout != "token-major": kc, vc = (c.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for c in (kc, vc))
    if layout == "runner": vc = vc.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)   # an fp8 cache's V: key-minor
    got, want = rope.rope_and_store_kv(pos, q, k, v, cache, kc, vc, slots, *w), ref.rope_and_store_kv(pos, q, k, v, cache, kc2, vc2, slots, *w)
    assert rel_err(got, want) < 1e-2
    bits = lambda x: x.view(torch.uint8) if x.dtype.itemsize == 1 else x.view(torch.int16)
    assert torch.equal(bits(vc), bits(vc2))                          # v is copied: exactly the same bytes
    assert rel_err(kc.float(), kc2.float()) < 1e-2                  # k: float32 arithmetic, fused multiply-adds on the GPU

# Checkpoints of the variants users bring: each shape a tiny model, fp32, greedy tokens identical to HF's, with and
# without CUDA graphs. Head sizes the attention kernels decline (12) run those two ops on the reference.
VARIANTS = {
    "mqa-llama3-rope": ("tiny-llama", dict(num_key_value_heads=1, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 128})),
    "gqa-qkv-bias-hd80": ("tiny-qwen2", dict(hidden_size=320, num_attention_heads=4, num_key_value_heads=2)),
    "qk-norm-hd64": ("tiny-qwen3", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=64)),
    "hd12-fallback": ("tiny-qwen2", dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2)),
}

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_checkpoints_match_hf_with_and_without_graphs(variant, tmp_path):
    import transformers
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.kernels.registry import ops, selection
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    like, shape = VARIANTS[variant]
    path = make_random_checkpoint(like, tmp_path / variant, dtype=torch.float32, seed=5, **shape)
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 300) for _ in range(n)] for n in (1, 7, 40, 130)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    want = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                        pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    ops.reset()
    for eager in (True, False):
        llm = LLM(path, dtype="float32", device="cuda", num_kv_blocks=256, max_num_seqs=8, enforce_eager=eager)
        attn = {op: selection("cuda")[op][0] for op in ("prefill_attention", "decode_attention")}
        fallback = variant == "hd12-fallback"
        assert attn == ({"prefill_attention": "torch", "decode_attention": "torch"} if fallback else
                        {"prefill_attention": "triton", "decode_attention": "triton"}), attn
        assert bool(getattr(llm.engine.runner, "graphs", None)) == (not eager and not fallback)  # the reference is not graph-safe
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, min_tokens=16), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == want, f"{variant}, enforce_eager={eager}"

def test_forced_triton_declined_head_size_fails_at_load(tmp_path):
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.kernels.registry import ops
    from litellama.entrypoints.llm import LLM
    like, shape = VARIANTS["hd12-fallback"]
    path = make_random_checkpoint(like, tmp_path / "hd12", dtype=torch.float32, **shape)
    os.environ["LITELLAMA_BACKEND"] = "triton"; ops.reset()
    try:
        with pytest.raises(ValueError, match="prefill_attention kernel cannot take this model: head_dim 12"):
            LLM(path, dtype="float32", device="cuda", num_kv_blocks=64)
    finally:
        del os.environ["LITELLAMA_BACKEND"]; ops.reset()

def _shapes():
    from litellama.testing.checkpoints import SHAPES
    return list(SHAPES)

@pytest.mark.parametrize("like", _shapes())
def test_every_checkpoint_shape_generates_bf16(like, tmp_path):
    "Every `make-random-checkpoint --like` shape loads and generates in bf16 (two layers of the real ones: the shape is what matters)."
    from litellama.testing.checkpoints import make_random_checkpoint
    from litellama.entrypoints.llm import LLM
    from litellama.sampling_params import SamplingParams
    fewer = {} if like.startswith("tiny-") else dict(num_hidden_layers=2)
    path = make_random_checkpoint(like, tmp_path / like, dtype=torch.bfloat16, **fewer)
    llm = LLM(path, dtype="bfloat16", device="cuda", num_kv_blocks=256, max_num_seqs=4)
    vocab = llm.engine.config.vocab_size
    outs = llm.generate([[5, 6, 7], list(range(10, 90))], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for o in outs:
        ids = o.outputs[0].token_ids
        assert len(ids) == 8 and all(0 <= t < vocab for t in ids)

@pytest.mark.parametrize("fp8", [False, True])
def test_fused_moe_both_paths_and_graph_replay(fp8):
    "Qwen3-30B-A3B's expert shape: the one-token path and the aligned path against the per-expert loop, eager and replayed from a CUDA graph."
    from litellama.kernels import fused_moe as fm
    E, K, H, I, dt = 128, 8, 2048, 768, torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(E, 2 * I, H, device="cuda", generator=g) / H ** 0.5).to(dt)
    w2 = (torch.randn(E, H, I, device="cuda", generator=g) / I ** 0.5).to(dt)
    scales = ()
    if fp8:
        (w13, s13), (w2, s2) = fm.quantize_blockwise(w13.float()), fm.quantize_blockwise(w2.float())
        scales = (s13, s2)
    a, b = (fm.dequantize_blockwise(w13, s13, 128, dt), fm.dequantize_blockwise(w2, s2, 128, dt)) if fp8 else (w13, w2)
    for T in (1, 2, 5):
        x = torch.randn(T, H, device="cuda", dtype=dt)
        tw, ti = fm.topk_softmax(torch.randn(T, E, device="cuda", dtype=dt), K, True)
        for gemv in (True, False):
            ref = fm.fused_moe_reference(x.float(), a.float(), b.float(), tw.float(), ti)
            run = lambda: fm.fused_moe(x, w13, w2, tw, ti, *scales, config=dict(GEMV=gemv))
            assert rel_err(run(), ref) < 1e-2, (T, gemv)
            out = run()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = run()
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert rel_err(out, fm.fused_moe_reference(x.float(), a.float(), b.float(), tw.float(), ti)) < 1e-2, (T, gemv)


@pytest.mark.parametrize("group", [128, 32, 16])
def test_w4a16_every_path_against_reference(group):
    "Every W4A16 path, forced and by the rule, bf16 and fp16, against the float32 reference (the GPU's bit tricks)."
    from litellama.kernels import w4a16 as W

    g = torch.Generator().manual_seed(group)
    for M, K, N in ((1, 4096, 4096), (1, 1056, 520), (4, 4096, 6144), (16, 2048, 4096), (64, 1024, 2048)):
        if K % group:
            continue
        codes = torch.randint(0, 16, (K, N), generator=g)
        zeros = torch.randint(0, 16, (K // group, N), generator=g)
        scales = (torch.rand(K // group, N, generator=g) * 0.004 + 0.001).half()
        qw, s, z, grp, _ = W.to_kernel_layout(
            codes.cuda(), zeros.cuda(), scales.cuda(), torch.arange(K, device="cuda") // group
        )
        cfgs = [None, dict(PATH="gemv", BLOCK_N=64, BLOCK_K=256, SPLIT_K=3, num_warps=4, num_stages=1)]
        cfgs += [dict(PATH="gemv", BLOCK_N=64, BLOCK_K=512, SPLIT_K=2, PREFETCH=True, num_warps=4, num_stages=1)]
        cfgs += [dict(PATH="dequant", BLOCK_N=16, BLOCK_W=64, num_warps=4)]
        if group % 32 == 0:  # the float16-pair kernel: a row per program, split K
            cfgs += [dict(PATH="half2", BLOCK_N=64, BLOCK_K=512, SPLIT_K=2, num_warps=4, num_stages=1)]
            cfgs += [dict(PATH="half2", BLOCK_N=128, BLOCK_K=256, SPLIT_K=1, num_warps=4, num_stages=1)]
        cfgs += [dict(PATH="dot", BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=2)]
        if group % 128 == 0:
            cfgs += [dict(PATH="pair", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=3)]
        if group % 128 == 0 and K % 256 == 0 and M <= 16 and W._is_hopper(torch.device("cuda")):
            cfgs += [dict(PATH="wgmma", BLOCK_N=128, K_SPLIT=K // 2, num_warps=8)]
            cfgs += [dict(PATH="wgmma", BLOCK_N=64, K_SPLIT=K, num_warps=4)]
        for dtype in (torch.bfloat16, torch.float16):
            x = torch.randn(M, K, device="cuda").to(dtype)
            want = W.w4a16_linear_ref(x.float(), qw, s.float(), z.float(), grp)
            for cfg in cfgs:
                got = W.w4a16_linear(x, qw, s, z, grp, config=cfg).float()
                assert rel_err(got, want) < (1e-2 if dtype == torch.bfloat16 else 2e-3), (M, K, N, dtype, cfg)


def test_w4a16_wgmma_in_a_graph():
    "The sm_90 path by the rule, split K: CUDA-graph replays on fresh x give the reference, and leave its counters at zero."
    from litellama.kernels import w4a16 as W
    from litellama.kernels import w4a16_hopper as H

    if not W._is_hopper(torch.device("cuda")):
        pytest.skip("the wgmma path needs an sm_90 GPU")
    g = torch.Generator().manual_seed(7)
    K, N = 4096, 1000
    codes, zeros = torch.randint(0, 16, (K, N), generator=g), torch.randint(0, 16, (K // 128, N), generator=g)
    scales = (torch.rand(K // 128, N, generator=g) * 0.004 + 0.001).half()
    qw, s, z, grp, _ = W.to_kernel_layout(codes.cuda(), zeros.cuda(), scales.cuda(), torch.arange(K, device="cuda") // 128)
    x = torch.randn(8, K, device="cuda").bfloat16()
    b = torch.randn(N, device="cuda").bfloat16()
    assert W._config(8, N, K, grp, "cuda", W._num_sms(x.device), x.dtype, True)["PATH"] == "wgmma"
    run = lambda: W.w4a16_linear(x, qw, s, z, grp, bias=b)
    out = run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        want = W.w4a16_linear_ref(x.float(), qw, s.float(), z.float(), grp, bias=b.float())
        assert rel_err(out.float(), want) < 1e-2
    torch.cuda.synchronize()
    assert int(H._COUNTERS[x.device].abs().sum()) == 0
