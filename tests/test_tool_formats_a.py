"""Qwen3-Coder's, Llama 3's and pythonic tool calls through the chat endpoint.

End to end: a tiny scripted checkpoint (its greedy reply is fixed, as in tests/scripted_checkpoint.py) whose chat
template teaches Qwen3-Coder's XML calls and whose reply writes two of them, served by `litellama serve`: the server
finds the parser from the template, and the `openai` client gets typed `tool_calls`, whole and streamed. In process:
the chat handler's whole and streamed paths with the Llama 3 JSON and pythonic formats."""

import json
import os
import random
import tempfile
from functools import partial
from pathlib import Path

import pytest
from server_helpers import KEY, start_server, stop_server

from litellama.entrypoints.openai.chat import _chat_message, _ToolStream
from litellama.entrypoints.openai.protocol import Tool
from litellama.entrypoints.openai.tool_parsers import parse_tool_calls, tool_parser

openai = pytest.importorskip("openai")

MODEL = "coder-scripted"
TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTo call a function reply with\n<tool_call>\n<function=NAME>\n"
    "<parameter=NAME>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n' }}{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WHERE = {"near": ["東京", "🙂"], "lake": True}
# The chain of single tokens: the generation prompt's last token ("\n"), then the reply, then the end token.
SCRIPT = [
    "\n",
    "Checking.",
    "\n<tool_call>\n<function=get_weather>\n",
    "<parameter=city>\nZürich\n</parameter>\n",
    "<parameter=days>\n3\n</parameter>\n",
    f"<parameter=where>\n{json.dumps(WHERE, ensure_ascii=False)}\n</parameter>\n",
    "</function>\n</tool_call>",
    "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
    "<|im_end|>",
]
REPLY = "".join(SCRIPT[1:-1])
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "where": {"type": "object"}},
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]
WANT = [("get_weather", {"city": "Zürich", "days": 3, "where": WHERE}), ("get_time", {})]


def make_coder_checkpoint(out: Path) -> Path:
    "A one-layer Llama whose greedy reply is `SCRIPT`: token k embeds as unit vector k, the head maps it to token k+1."
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from litellama.testing.tokenizer import make_tokenizer

    tok = make_tokenizer()
    tok.add_tokens(SCRIPT[1:-1])
    tok.chat_template = TEMPLATE
    ids = [tok.encode("\n")[0]] + tok.convert_tokens_to_ids(SCRIPT[1:-1]) + [tok.eos_token_id]
    assert [tok.decode([i]) for i in ids] == SCRIPT and len(set(ids)) == len(ids), ids
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
        eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=tok.pad_token_id, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for k, (cur, nxt) in enumerate(zip(ids, ids[1:], strict=False)):
            model.model.embed_tokens.weight[cur, k] = 1.0
            model.lm_head.weight[nxt, k] = 10.0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def coder():
    "An `openai` client of a server on the scripted checkpoint."
    out = make_coder_checkpoint(Path(tempfile.mkdtemp(prefix="litellama-coder-")))
    log = open(os.path.join(out, "server.log"), "w")
    proc, url = start_server(out, MODEL, log, num_kv_blocks=64)
    yield openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    stop_server(proc)
    log.close()


def _chat(client, stream: bool, **kw) -> tuple:
    "`(content, [(name, arguments)], finish_reason)` of one greedy chat, whole or streamed."
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Weather?"}], max_tokens=30, temperature=0, **kw)
    if not stream:
        ch = client.chat.completions.create(**kw).choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls or []]
        assert all(t.id.startswith("call_") and t.type == "function" for t in ch.message.tool_calls or [])
        return ch.message.content, calls, ch.finish_reason
    content, parts, reason = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d, reason = chunk.choices[0].delta, chunk.choices[0].finish_reason or reason
        content += d.content or ""
        for t in d.tool_calls or []:
            name, args = parts.get(t.index, ("", ""))
            parts[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
    return content or None, [(n, json.loads(a)) for n, a in (parts[i] for i in sorted(parts))], reason


def test_coder_reply_is_the_script(coder):
    "Without tools the reply is the scripted text itself, markup and all."
    for stream in (False, True):
        assert _chat(coder, stream) == (REPLY, [], "stop")


def test_coder_calls_end_to_end(coder):
    "With tools, the server reads the calls out of that text, typed by the request's schemas, whole and streamed."
    want = ("Checking.\n\n", WANT, "tool_calls")  # the newline before each block is content
    for stream in (False, True):
        assert _chat(coder, stream, tools=TOOLS) == want, stream
    parsed = parse_tool_calls(REPLY, partial(tool_parser("qwen3_coder"), [Tool.model_validate(t) for t in TOOLS]))
    assert (parsed[0], [(c["name"], json.loads(c["arguments"])) for c in parsed[1]]) == want[:2]


# ------------------------------------------------------------------------------------------------------- in process
IN_PROCESS = {  # parser name -> a reply in its format, with the calls of WANT
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Zürich", "days": 3, "where": '
    + json.dumps(WHERE, ensure_ascii=False)
    + '}}; {"name": "get_time", "parameters": {}}',
    "pythonic": f"[get_weather(city='Zürich', days=3, where={WHERE!r}), get_time()]",
}


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_chat_handler_paths(name):
    "The whole reply and the same reply streamed in random pieces give the same typed `tool_calls`."
    types = pytest.importorskip("openai.types.chat")
    parser = partial(tool_parser(name), [Tool.model_validate(t) for t in TOOLS])
    msg, reason = _chat_message(IN_PROCESS[name], "auto", None, parser, "stop")
    typed = types.ChatCompletionMessage.model_validate(msg)
    assert (typed.content, reason) == (None, "tool_calls")
    assert [(t.function.name, json.loads(t.function.arguments)) for t in typed.tool_calls] == WANT
    rng = random.Random(0)
    for _ in range(50):
        ts, deltas, i, text = _ToolStream("auto", None, parser), [], 0, IN_PROCESS[name]
        while i < len(text):
            n = rng.randint(1, 7)
            deltas += ts.feed(text[i : i + n], i + n >= len(text))
            i += n
        delta_call = types.chat_completion_chunk.ChoiceDeltaToolCall
        calls = [delta_call.model_validate(t) for d in deltas for t in d["tool_calls"]]
        assert [d.keys() for d in deltas] == [{"tool_calls"}] * 2 and [c.index for c in calls] == [0, 1]
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == WANT
        assert ts.finish_reason("stop") == "tool_calls"
