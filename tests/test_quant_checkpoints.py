"""Quantized checkpoints as the ecosystem writes them, end to end on the CPU: tiny Llama and Qwen3 models with an
untied 16-bit LM head, quantized by the `compressed-tensors` library (and FP8 block by litellama's writer), served by
the engine (batched, chunked prefill, preemption) give transformers' greedy tokens on their dequantized twins."""

import json
import os
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from litellama.engine.llm_engine import ContinuousBatchingEngine
from litellama.models.loader import load_model
from litellama.sampling_params import SamplingParams
from litellama.testing.checkpoints import make_random_checkpoint

DEVICE = os.environ.get("LITELLAMA_TEST_DEVICE", "cpu")  # "cuda": the same checks on a GPU

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

MODELS = ("tiny-llama", "tiny-qwen3")
STEPS = 24


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    return {
        like: make_random_checkpoint(like, root / like, dtype=torch.float32, seed=7, tie_word_embeddings=False)
        for like in MODELS
    }


def int_args(bits, sym, strategy, actorder=None):
    return QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=sym,
        strategy=strategy,
        group_size=32 if strategy == "group" else None,
        actorder=actorder,
    )


FP8_DYNAMIC = (
    QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="channel"),
    QuantizationArgs(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True),
)
CT_CASES = {  # name -> (weights, input activations, format)
    "w4a16-group-sym": (int_args(4, True, "group"), None, "pack-quantized"),
    "w4a16-group-asym": (int_args(4, False, "group"), None, "pack-quantized"),
    "w4a16-channel-sym": (int_args(4, True, "channel"), None, "pack-quantized"),
    "w4a16-channel-asym": (int_args(4, False, "channel"), None, "pack-quantized"),
    "w4a16-group-asym-actorder": (int_args(4, False, "group", "weight"), None, "pack-quantized"),
    "w8a16-channel": (int_args(8, True, "channel"), None, "pack-quantized"),
    "fp8-dynamic": (*FP8_DYNAMIC, "float-quantized"),
}


def write_ct(src, out, weights, acts, fmt):
    """Quantize the float32 checkpoint `src` with the compressed-tensors library (min-max scales from its own
    `calculate_qparams`, its compressor, its config writer) into `out`; the twin `out-plain` holds the library's own
    decompression of the same tensors as a plain float32 checkpoint."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    scheme = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=acts)
    apply_quantization_config(
        hf, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]), show_progress=False
    )
    with torch.no_grad():
        for m in hf.modules():
            if getattr(m, "quantization_scheme", None) is None:
                continue
            a, w = m.quantization_scheme.weights, m.weight.data
            wg = w.reshape(w.shape[0], -1, a.group_size) if a.strategy == "group" else w[:, None]
            s, z = calculate_qparams(wg.amin(-1), wg.amax(-1), a)
            m.weight_scale.data.copy_(s.reshape(m.weight_scale.shape))
            if hasattr(m, "weight_zero_point"):
                m.weight_zero_point.data.copy_(z.reshape(m.weight_zero_point.shape))
    comp = ModelCompressor.from_pretrained_model(hf, fmt)
    comp.compress_model(hf)
    hf.save_pretrained(out)
    comp.update_config(out)
    shutil.copy(src / "tokenizer.json", out)
    for f in src.glob("tokenizer*"):
        shutil.copy(f, out)
    comp.decompress_model(hf)
    plain = out.parent / (out.name + "-plain")
    plain.mkdir()
    sd = {k: v.contiguous() for k, v in hf.state_dict().items() if not k.endswith(("_scale", "_zero_point", "_g_idx"))}
    save_file(sd, str(plain / "model.safetensors"))
    shutil.copy(src / "config.json", plain)
    return out, plain


def write_fp8_block(src, out, with_list):
    "An FP8 block checkpoint with a bf16 LM head; `with_list`: the config lists it in modules_to_not_convert."
    from litellama.quantization.smoothquant import write_fp8_block_checkpoint

    write_fp8_block_checkpoint(src, out, (32, 32), torch.bfloat16, ["lm_head"])
    t = load_file(str(out / "model.safetensors"))
    t["lm_head.weight"] = t["lm_head.weight"].to(torch.bfloat16)
    save_file(t, str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    if not with_list:
        del cfg["quantization_config"]["modules_to_not_convert"]
    (out / "config.json").write_text(json.dumps(cfg))
    plain = out.parent / (out.name + "-plain")
    plain.mkdir()
    res = {}
    for n, v in t.items():
        if n.endswith("weight_scale_inv"):
            continue
        s = t.get(n.removesuffix("weight") + "weight_scale_inv")
        if s is not None:
            s = s.float().repeat_interleave(32, 0)[: v.shape[0]].repeat_interleave(32, 1)[:, : v.shape[1]]
        res[n] = v.float() if s is None else v.float() * s
    save_file(res, str(plain / "model.safetensors"))
    shutil.copy(src / "config.json", plain)
    return out, plain


def engine_greedy(d, prompts, n=STEPS):
    eng = ContinuousBatchingEngine.from_pretrained(
        d, dtype="float32", device=DEVICE, num_kv_blocks=12, block_size=8, max_num_batched_tokens=16
    )
    rids = [eng.add_request(p, SamplingParams(temperature=0, max_tokens=n, min_tokens=n)) for p in prompts]
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.token_ids)
    assert eng.stats.num_preemptions > 0 and eng.stats.num_chunked_prefills > 0
    return eng, [outs[r] for r in rids]


def hf_greedy(hf, prompts, n=STEPS):
    return [
        hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)[
            0, len(p) :
        ].tolist()
        for p in prompts
    ]


PROMPTS = [torch.randint(3, 300, (k,), generator=torch.Generator().manual_seed(50 + k)).tolist() for k in (21, 5, 30)]


def check(qdir, plain, method):
    "The layers are quantized as the checkpoint says (the LM head 16-bit), and the engine gives the twin's tokens."
    m, _ = load_model(qdir, dtype="float32", device=DEVICE)
    assert type(m.model.layers[0].self_attn.qkv_proj.method).__name__ == method
    assert type(m.model.layers[1].mlp.down_proj.method).__name__ == method
    assert type(m.lm_head.method).__name__ == "Unquantized" and m.lm_head.weight.dtype == torch.float32
    _, got = engine_greedy(qdir, PROMPTS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    assert got == hf_greedy(hf, PROMPTS)


@pytest.mark.parametrize("like", MODELS)
@pytest.mark.parametrize("case", list(CT_CASES))
def test_compressed_tensors(sources, tmp_path, like, case):
    qdir, plain = write_ct(sources[like], tmp_path / case, *CT_CASES[case])
    check(qdir, plain, {"w4": "PackedW4", "w8": "PackedW8"}.get(case[:2], "CheckpointW8"))


@pytest.mark.parametrize("like", MODELS)
@pytest.mark.parametrize("with_list", (True, False))
def test_fp8_block_bf16_head(sources, tmp_path, like, with_list):
    qdir, plain = write_fp8_block(sources[like], tmp_path / "fp8", with_list)
    check(qdir, plain, "CheckpointW8")


@pytest.mark.parametrize("case", ("w4a16-group-asym", "w8a16-channel"))
def test_transformers_loader_agrees(sources, tmp_path, case):
    "transformers' own compressed-tensors loader (decompressing on load) gives the engine's tokens too."
    qdir, _ = write_ct(sources["tiny-qwen3"], tmp_path / case, *CT_CASES[case])
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        qdir, dtype=torch.float32, quantization_config=transformers.CompressedTensorsConfig(run_compressed=False)
    ).eval()
    _, got = engine_greedy(qdir, PROMPTS)
    assert got == hf_greedy(hf, PROMPTS)
