"""The chat handler's tool paths with Mistral's and DeepSeek's call formats, in process: a whole reply becomes one
message with `tool_calls`, and the same reply streamed in pieces becomes OpenAI `tool_calls` deltas that add up to the
same calls, which the `openai` client's own types accept."""

import json
import random
from functools import partial

import pytest

from litellama.entrypoints.openai.chat import _chat_message, _ToolStream
from litellama.entrypoints.openai.protocol import Tool
from litellama.entrypoints.openai.tool_parsers import tool_parser

openai_types = pytest.importorskip("openai.types.chat")

TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}})
    for n in ("get_weather", "search")
]
WEATHER = {"city": "Zürich", "days": [1, 2], "units": {"temp": "°C", "wind": ["km/h"]}}
SEARCH = {"q": "東京 🍣 {menu} [open]", "note": 'a "quoted" } ]'}
WANT = [
    {"name": "get_weather", "arguments": json.dumps(WEATHER, ensure_ascii=False)},
    {"name": "search", "arguments": json.dumps(SEARCH, ensure_ascii=False)},
]
W, S = (json.dumps(a, ensure_ascii=False) for a in (WEATHER, SEARCH))
CB, CE, B, E, SEP = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
REPLIES = {  # parser name -> (reply as the model writes it, its content)
    "mistral": (
        f"Checking both.[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{S}</s>",
        "Checking both.",
    ),
    "mistral-list": (
        "Checking both.[TOOL_CALLS] "
        + json.dumps(
            [{"name": "get_weather", "arguments": WEATHER}, {"name": "search", "arguments": SEARCH}], ensure_ascii=False
        ),
        "Checking both.",
    ),
    "deepseek_v3": (
        f"Checking both.{CB}{B}function{SEP}get_weather\n```json\n{W}\n```{E}\n"
        f"{B}function{SEP}search\n```json\n{S}\n```{E}{CE}",
        "Checking both.",
    ),
    "deepseek_v31": (f"Checking both.{CB}{B}get_weather{SEP}{W}{E}{B}search{SEP}{S}{E}{CE}", "Checking both."),
}


def parser_of(label: str):
    return partial(tool_parser(label.split("-")[0]), TOOLS)


@pytest.mark.parametrize("label", sorted(REPLIES))
def test_whole_reply_becomes_tool_calls(label):
    reply, content = REPLIES[label]
    msg, reason = _chat_message(reply, "auto", None, parser_of(label), "stop")
    assert reason == "tool_calls"
    assert msg["content"] == content
    assert [c["function"] for c in msg["tool_calls"]] == WANT
    assert len({c["id"] for c in msg["tool_calls"]}) == 2
    openai_types.ChatCompletionMessage.model_validate(msg)  # the shape the official client reads


@pytest.mark.parametrize("label", sorted(REPLIES))
def test_streamed_reply_becomes_tool_call_deltas(label):
    reply, content = REPLIES[label]
    rng = random.Random(label)
    for _ in range(50):
        ts, deltas, start = _ToolStream("auto", None, parser_of(label)), [], 0
        while start < len(reply):
            end = min(start + rng.randint(1, 7), len(reply))
            deltas += ts.feed(reply[start:end], end == len(reply))
            start = end
        for d in deltas:  # every delta is one the client's chunk type takes
            openai_types.ChatCompletionChunk.model_validate(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "m",
                    "choices": [{"index": 0, "delta": d, "finish_reason": None}],
                }
            )
        assert "".join(d.get("content", "") for d in deltas) == content
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert [c["index"] for c in calls] == [0, 1]
        assert [c["function"] for c in calls] == WANT
        assert (ts.finish_reason("stop"), ts.finish_reason("length")) == ("tool_calls", "length")


@pytest.mark.parametrize("label", ["mistral", "deepseek_v3", "deepseek_v31"])
def test_reply_without_calls_stays_content(label):
    text = "No tools needed: 2 < 3 and [brackets] {braces} <｜ stay."
    msg, reason = _chat_message(text, "auto", None, parser_of(label), "stop")
    assert (msg, reason) == ({"role": "assistant", "content": text}, "stop")
    ts = _ToolStream("auto", None, parser_of(label))
    deltas = [d for i in range(0, len(text), 3) for d in ts.feed(text[i : i + 3], i + 3 >= len(text))]
    assert "".join(d["content"] for d in deltas) == text and ts.finish_reason("stop") == "stop"


def test_cut_short_call_is_content():
    "`max_tokens` ran out inside the second call: the first is a call, the rest is content, the reason `length`."
    reply = REPLIES["mistral"][0]
    cut = reply[: reply.index("[TOOL_CALLS]search") + 30]
    msg, reason = _chat_message(cut, "auto", None, parser_of("mistral"), "length")
    assert reason == "length"
    assert [c["function"] for c in msg["tool_calls"]] == WANT[:1]
    assert msg["content"] == "Checking both." + cut[cut.index("[TOOL_CALLS]search") :]
