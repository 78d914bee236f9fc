"""A vLLM user's offline script runs unchanged on litellama: prompt logprobs (checked against a plain HF forward pass),
structured outputs, chat with tools through the chat template, embeddings, and the checkpoint's generation config."""

import json
import re

import jsonschema
import pytest
import torch
from transformers import AutoModelForCausalLM

from litellama import (
    LLM,
    EmbeddingRequestOutput,
    LoRARequest,
    PoolingParams,
    RequestOutput,
    SamplingParams,
    StructuredOutputsParams,
)
from litellama.testing.checkpoints import make_random_checkpoint

PROMPTS = ["The quick brown fox jumps over", "Paris is the capital of"]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Rome", "Tokyo"]}, "capital": {"type": "boolean"}},
    "required": ["city", "capital"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_TEMPLATE = (  # renders the offered tools, as tool-calling models' templates do
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def declare_last_pooling(path):
    "Mark a checkpoint as a sentence-transformers embedder with last-token pooling (as Qwen3-Embedding is)."
    (path / "modules.json").write_text(
        json.dumps([{"idx": 0, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    )
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_lasttoken": True}))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_random_checkpoint("tiny-llama", tmp_path_factory.mktemp("tiny"), dtype=torch.float32)
    declare_last_pooling(path)
    return str(path)


@pytest.fixture(scope="module")
def hf(model):
    return AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()


def test_vllm_script(model, hf):
    "The script as a vLLM user writes it, then each result checked."
    llm = LLM(model)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, prompt_logprobs=2))
    constrained = [
        StructuredOutputsParams(json=SCHEMA),
        StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
        StructuredOutputsParams(choice=["yes", "no", "maybe"]),
    ]
    structured = [
        llm.generate(PROMPTS[0], SamplingParams(seed=s, max_tokens=40, structured_outputs=so))[0]
        for s, so in enumerate(constrained)
    ]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    chat = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4), tools=TOOLS, chat_template=TOOL_TEMPLATE)
    embedded = llm.embed(["text"])
    vector = embedded[0].outputs.embedding

    assert all(isinstance(o, RequestOutput) for o in outs)
    for o in outs:
        ids = o.prompt_token_ids
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].log_softmax(-1)  # row j: what follows token j
        assert o.prompt_logprobs[0] is None and len(o.prompt_logprobs) == len(ids)
        for j, d in enumerate(o.prompt_logprobs[1:]):
            top = ref[j].topk(2)
            assert list(d)[0] == ids[j + 1]
            assert abs(d[ids[j + 1]].logprob - ref[j, ids[j + 1]].item()) < 1e-4
            assert sorted((x.rank, t) for t, x in d.items() if x.rank) == [
                (1, top.indices[0].item()),
                (2, top.indices[1].item()),
            ]
            assert torch.allclose(torch.tensor([d[t].logprob for t in top.indices.tolist()]), top.values, atol=1e-4)
        greedy = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
        assert o.outputs[0].token_ids == greedy[: len(o.outputs[0].token_ids)]

    jsonschema.validate(json.loads(structured[0].outputs[0].text), SCHEMA)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", structured[1].outputs[0].text), structured[1].outputs[0].text
    assert structured[2].outputs[0].text in ("yes", "no", "maybe")

    want = llm.tokenizer.apply_chat_template(
        messages, tools=TOOLS, chat_template=TOOL_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert "Tools: get_weather" in want and chat[0].prompt == want

    assert isinstance(embedded[0], EmbeddingRequestOutput) and embedded[0].prompt_token_ids == llm.engine.tokenize(
        "text"
    )
    with torch.no_grad():
        last = hf.model(torch.tensor([embedded[0].prompt_token_ids])).last_hidden_state[0, -1]
    assert torch.allclose(torch.tensor(vector), last / last.norm(), atol=1e-4)
    half = llm.embed("text", PoolingParams(dimensions=32, normalize=False))[0].outputs.embedding
    assert torch.allclose(torch.tensor(half), last[:32], atol=1e-4)
    with pytest.raises(ValueError, match="PoolingParams.softmax is for classify"):
        PoolingParams(softmax=True)
    assert LoRARequest("sql", 1, "/nowhere").id == 1
    llm.shutdown()


def test_generation_config(tmp_path):
    "No SamplingParams: the checkpoint's generation_config.json; 'vllm': neutral; a folder: its file."
    path = make_random_checkpoint("tiny-llama", tmp_path / "m", dtype=torch.float32)
    (path / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "top_k": 1, "max_new_tokens": 3, "bos_token_id": 0})
    )
    with LLM(path) as llm:
        assert llm.get_default_sampling_params() == SamplingParams(top_k=1, max_tokens=3)
        default = llm.generate(PROMPTS[0], use_tqdm=False)[0].outputs[0].token_ids
        assert (
            default
            == llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0]
            .outputs[0]
            .token_ids
        )
        assert (
            len(
                llm.generate(PROMPTS[0], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)[0]
                .outputs[0]
                .token_ids
            )
            == 5
        )
    with LLM(path, generation_config="vllm") as llm:
        assert llm.get_default_sampling_params() == SamplingParams()
    with pytest.raises(ValueError, match="no generation_config.json in"):
        LLM(path, generation_config=str(tmp_path / "elsewhere"))
