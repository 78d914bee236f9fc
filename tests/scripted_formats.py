"""Scripted checkpoints that call tools in each format litellama parses.

A scripted checkpoint is a one-layer Llama whose greedy reply is fixed text (as in tests/scripted_checkpoint.py): the
attention and MLP write nothing, so the last hidden state is the current token's embedding; script token k embeds as
unit vector k and the LM head maps direction k to the next token of the script. A script may branch: the start token
(the generation prompt's last, "\\n") leads to each reply's first piece, the first reply with the highest logit, so a
later reply is what a grammar that forbids the earlier ones leaves (a forced call's JSON arguments).

Every piece of a reply is one added token. Where a format's parser reads special-token markup (`special_tokens`),
pieces holding markers are special tokens, so the reply shows them only if the server keeps special tokens."""

import json
from dataclasses import dataclass, field
from pathlib import Path

WEATHER = {"city": "Zürich", "days": 3}
TIME = {"city": "東京"}
CALLS = [("get_weather", WEATHER), ("get_time", TIME)]  # what every format's reply calls, in order
W, T = (json.dumps(a, ensure_ascii=False) for a in (WEATHER, TIME))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast of a city for some days",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]
# A forced call to get_weather (`tool_choice` naming it): the reply is its arguments, as a grammar with `", "` and
# `": "` separators allows them (pieces unlike any format's).
FORCED = ['{"city": "Zürich",', ' "days": 3}']

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def teaching_template(lesson: str) -> str:
    "A ChatML template that, when given tools, opens with a system turn teaching `lesson` (a call format)."
    return "{% if tools %}<|im_start|>system\n" + lesson + "<|im_end|>\n{% endif %}" + CHATML


@dataclass
class Format:
    "A tool-call format: its parser's name, the lesson its template gives, the reply's pieces, and what it holds."

    parser: str
    lesson: str
    pieces: list[str]
    special: set[str] = field(default_factory=set)  # the pieces that are special tokens
    content: str | None = None  # the reply's content once its calls are taken out

    @property
    def reply(self) -> str:
        return "".join(self.pieces)


CB, CE, B, E, SEP = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
HARMONY_CALL = "<|start|>assistant<|channel|>commentary to=functions.{} <|constrain|>json<|message|>"
PYTHON_TAG = "<|python_tag|>"
_LLAMA3 = '{"name": function name, "parameters": dictionary of argument name and its value}'
FORMATS = {
    f.parser: f
    for f in [
        Format(
            "hermes",
            'Call a function as <tool_call>{"name": ..., "arguments": ...}</tool_call>.',
            [
                "Checking.",
                '\n<tool_call>\n{"name": "get_weather", "arguments": ',
                W,
                "}\n</tool_call>",
                f'\n<tool_call>\n{{"name": "get_time", "arguments": {T}}}\n</tool_call>',
            ],
            content="Checking.\n\n",
        ),
        Format(
            "qwen3_coder",
            "Call a function as\n<tool_call>\n<function=NAME>\n<parameter=NAME>\nVALUE\n</parameter>\n"
            "</function>\n</tool_call>",
            [
                "Checking.",
                "\n<tool_call>\n<function=get_weather>\n",
                "<parameter=city>\nZürich\n</parameter>\n",
                "<parameter=days>\n3\n</parameter>\n",
                "</function>\n</tool_call>",
                "\n<tool_call>\n<function=get_time>\n<parameter=city>\n東京\n</parameter>\n</function>\n</tool_call>",
            ],
            content="Checking.\n\n",
        ),
        Format(  # Llama 3's `<|python_tag|>` is special: the server drops it, the parser reads the JSON after it
            "llama3_json",
            f"Reply with a JSON call in the format {_LLAMA3}.",
            [
                PYTHON_TAG,
                '{"name": "get_weather", "parameters": ',
                W + "}",
                "; ",
                f'{{"name": "get_time", "parameters": {T}}}',
            ],
            special={PYTHON_TAG},
        ),
        Format(
            "pythonic",
            "Reply with [func_name1(params_name1=params_value1, ...), func_name2(...)].",
            ["[get_weather(city='Zürich', days=3)", ", get_time(city='東京')]"],
        ),
        Format(
            "mistral",
            "Call functions as [TOOL_CALLS]NAME[ARGS]{arguments}.",
            ["Checking.", "[TOOL_CALLS]get_weather[ARGS]", W, "[TOOL_CALLS]get_time[ARGS]", T],
            special={"[TOOL_CALLS]get_weather[ARGS]", "[TOOL_CALLS]get_time[ARGS]"},
            content="Checking.",
        ),
        Format(
            "deepseek_v3",
            f"Call functions as {CB}{B}function{SEP}NAME\n```json\nARGS\n```{E}{CE}",
            [
                "Checking.",
                f"{CB}{B}function{SEP}get_weather\n```json\n",
                W,
                f"\n```{E}\n{B}function{SEP}get_time\n```json\n",
                T,
                f"\n```{E}{CE}",
            ],
            content="Checking.",
        ),
        Format(
            "deepseek_v31",
            f"Call functions as {CB}{B}NAME{SEP}ARGS{E}{CE}",
            ["Checking.", f"{CB}{B}get_weather{SEP}", W, f"{E}{B}get_time{SEP}", T, f"{E}{CE}"],
            content="Checking.",
        ),
        Format(  # gpt-oss: the analysis channel is reasoning (not content), each message to functions.NAME a call
            "openai",
            "Messages go <|start|>assistant<|channel|>CHANNEL<|message|>TEXT<|end|>; calls to=functions.NAME.",
            [
                "<|channel|>analysis<|message|>",
                "The user wants the weather.",
                "<|end|>" + HARMONY_CALL.format("get_weather"),
                W,
                "<|call|>" + HARMONY_CALL.format("get_time"),
                T,
                "<|call|>",
            ],
            special={"<|channel|>analysis<|message|>", "<|end|>" + HARMONY_CALL.format("get_weather"), "<|call|>"}
            | {"<|call|>" + HARMONY_CALL.format("get_time")},
        ),
    ]
}


def write_scripted_checkpoint(out: Path, chat_template: str, replies: list[list[str]], special: set[str]) -> Path:
    """Write a checkpoint whose greedy reply is `replies[0]` (then the end token), or where a grammar forbids that,
    the first of `replies` it allows; pieces in `special` are special tokens. Return `out`."""
    import torch
    from tokenizers import AddedToken
    from transformers import LlamaConfig, LlamaForCausalLM

    from litellama.testing.tokenizer import make_tokenizer

    pieces = [p for r in replies for p in r]
    assert len(set(pieces)) == len(pieces), f"a piece appears twice: {pieces}"
    tok = make_tokenizer()
    tok.add_tokens([AddedToken(p, special=p in special, normalized=False) for p in pieces])
    tok.chat_template = chat_template
    start, end = tok.encode("\n")[0], tok.eos_token_id
    ids = {p: tok.convert_tokens_to_ids(p) for p in pieces}
    assert all(tok.decode([ids[p]]) == p for p in pieces), [tok.decode([ids[p]]) for p in pieces]
    hidden = max(32, -(-(len(pieces) + 1) // 16) * 16)
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, head_dim=hidden // 2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=end, bos_token_id=None, pad_token_id=tok.pad_token_id, torch_dtype="float32",
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb.zero_()
        head.zero_()
        emb[start, 0] = 1.0
        direction = {start: 0} | {ids[p]: k + 1 for k, p in enumerate(pieces)}
        for token, k in direction.items():
            if token != start:
                emb[token, k] = 1.0
        for rank, reply in enumerate(replies):
            chain = [start] + [ids[p] for p in reply] + [end]
            head[chain[1], 0] = 10.0 - rank  # the start token leads to every reply, the first most strongly
            for cur, nxt in zip(chain[1:], chain[2:], strict=False):
                head[nxt, direction[cur]] = 10.0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def write_format_checkpoint(out: Path, fmt: Format) -> Path:
    "The scripted checkpoint of `fmt`: its template teaches the format; its reply calls `CALLS`, forced: `FORCED`."
    return write_scripted_checkpoint(out, teaching_template(fmt.lesson), [fmt.pieces, FORCED], fmt.special)
