"""LoRA through the engine: one batch mixing several PEFT adapters and the base model gives, prompt by prompt, HF's
greedy tokens with that adapter merged by PEFT, through chunked prefill, prefix-cache hits and a preemption."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the batched LoRA kernels run in the interpreter on a CPU

import pytest
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from litellama.entrypoints.llm import LLM
from litellama.models.lora import AdapterError, LoRARequest
from litellama.sampling_params import SamplingParams
from litellama.testing.checkpoints import make_random_checkpoint

DEVICE = os.environ.get("LITELLAMA_TEST_DEVICE", "cpu")  # "cuda": the same checks on a GPU

ADAPTERS = {  # different ranks, alphas and target sets, rsLoRA among them
    "qv": dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    "mlp_rs": dict(r=8, lora_alpha=16, use_rslora=True, target_modules=["gate_proj", "up_proj", "down_proj"]),
    "all": dict(r=2, lora_alpha=7, target_modules="all-linear"),
    "ko": dict(r=16, lora_alpha=4, target_modules=["k_proj", "o_proj"]),
}
MAX_TOKENS = 8


def write_adapters(base, out):
    "Each adapter of `ADAPTERS` written by PEFT on `base` with random A and B: `{name: LoRARequest}`."
    reqs = {}
    for i, (name, kw) in enumerate(ADAPTERS.items()):
        torch.manual_seed(i)
        hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        get_peft_model(hf, LoraConfig(init_lora_weights=False, **kw)).save_pretrained(out / name)
        reqs[name] = LoRARequest(name, i + 1, str(out / name))
    return reqs


def hf_greedy(base, adapter, prompt, max_new_tokens=MAX_TOKENS):
    "HF's greedy tokens with `adapter` merged by PEFT (None: the base model), up to and with its EOS."
    hf = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    hf = (PeftModel.from_pretrained(hf, adapter).merge_and_unload() if adapter else hf).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    toks = out[0, len(prompt) :].tolist()
    eos = hf.config.eos_token_id
    return toks[: toks.index(eos) + 1] if eos in toks else toks


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen3"])
def lora_setup(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    base = make_random_checkpoint(request.param, tmp / "base", dtype=torch.float32)
    reqs = write_adapters(base, tmp)
    llm = LLM(
        str(base), dtype="float32", device=DEVICE, enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=3,
        block_size=4, num_kv_blocks=14, max_num_batched_tokens=12, max_num_seqs=8,
    )  # fmt: skip
    yield base, reqs, llm
    llm.shutdown()


def pool_full(llm):
    bm = llm.engine.block_manager
    return bm.num_free_blocks == bm.num_total_blocks


def test_mixed_batch_equals_merged_hf(lora_setup):
    base, reqs, llm = lora_setup
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(0, 200, (12,), generator=g).tolist()  # a prefix two prompts of one adapter share
    names = ["qv", "qv", None, "mlp_rs", "all", "ko", None, "mlp_rs"]
    prompts = [torch.randint(0, 200, (int(n),), generator=g).tolist() for n in torch.randint(5, 19, (len(names),))]
    prompts[0], prompts[1] = shared + [3], shared + [7, 9]  # the second is admitted once the first's blocks are cached
    loras = [reqs[n] if n else None for n in names]
    eng = llm.engine
    before = eng.stats
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), False, lora_request=loras)
    after = eng.stats
    differ = 0
    for p, n, o in zip(prompts, names, outs, strict=True):
        want = hf_greedy(base, reqs[n].path if n else None, p)
        differ += n is not None and want != hf_greedy(base, None, p)
        assert o.outputs[0].token_ids[: len(want)] == want, (n, o.outputs[0].token_ids, want)
        assert len(o.outputs[0].token_ids) == len(want) or len(want) == MAX_TOKENS
    assert differ >= 3  # the comparison can fail: the adapters change the tokens
    assert after.num_chunked_prefills > before.num_chunked_prefills
    assert after.prefix_cache_hit_tokens > before.prefix_cache_hit_tokens
    assert after.num_preemptions > before.num_preemptions
    assert pool_full(llm)


def test_prefix_cache_keys_hold_the_adapter(lora_setup):
    _, reqs, llm = lora_setup
    prompt = torch.randint(0, 200, (13,), generator=torch.Generator().manual_seed(3)).tolist()
    sp = SamplingParams(temperature=0, max_tokens=1)
    hits = lambda: llm.engine.stats.prefix_cache_hit_tokens
    llm.generate([prompt], sp, False, lora_request=reqs["qv"])
    h0 = hits()
    llm.generate([prompt], sp, False, lora_request=reqs["all"])  # another adapter: no block of "qv" is shared
    llm.generate([prompt], sp, False)  # the base model: none either
    assert hits() == h0
    llm.generate([prompt], sp, False, lora_request=reqs["qv"])  # the same adapter: its cached blocks
    assert hits() == h0 + 12
    assert pool_full(llm)


def test_step_holds_at_most_max_loras(lora_setup):
    _, reqs, llm = lora_setup
    eng, seen = llm.engine, []
    step = eng.scheduler.schedule

    def spy():
        out = step()
        seen.append({s.lora_id for s, _ in out.scheduled if s.lora_id})
        return out

    eng.scheduler.schedule = spy
    try:
        prompts = [[5 + i, 6, 7, 8, 9] for i in range(4)]
        llm.generate(prompts, SamplingParams(temperature=0, max_tokens=3), False, lora_request=list(reqs.values()))
    finally:
        del eng.scheduler.schedule
    assert max(len(s) for s in seen) == 2 and set().union(*seen) == {1, 2, 3, 4}
    assert pool_full(llm)


def test_errors_in_one_line(lora_setup, tmp_path):
    base, reqs, llm = lora_setup
    sp = SamplingParams(max_tokens=2)
    with pytest.raises(AdapterError, match="adapter 'nowhere': no adapter_config.json in"):
        llm.generate([[1, 2, 3]], sp, False, lora_request=LoRARequest("nowhere", 50, str(tmp_path / "nowhere")))
    small = LLM(str(base), dtype="float32", device=DEVICE, enable_lora=True, max_lora_rank=8, num_kv_blocks=16)
    with pytest.raises(AdapterError, match="adapter 'ko': rank r=16 is over max_lora_rank=8"):
        small.generate([[1, 2, 3]], sp, False, lora_request=reqs["ko"])
    off = LLM(str(base), dtype="float32", device=DEVICE, num_kv_blocks=16)
    with pytest.raises(ValueError, match="LoRA request for adapter 'qv' but this engine was built without enable_lora"):
        off.generate([[1, 2, 3]], sp, False, lora_request=reqs["qv"])
    with pytest.raises(ValueError, match="2 prompts but 1 LoRA requests"):
        llm.generate([[1, 2], [3, 4]], sp, False, lora_request=[reqs["qv"]])
    assert pool_full(llm) and pool_full(small) and pool_full(off)
