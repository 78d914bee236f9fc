"""gpt-oss's harmony format through the chat handler, in process: the `openai` tool parser and the `openai_gptoss`
reasoning parser, whole and streamed, on replies whose expected messages are written out by hand."""

import asyncio
import json
import random
import subprocess
import sys
from functools import partial

import pytest

from litellama.entrypoints.openai.chat import (
    _chat_choices,
    _chat_chunks,
    _chat_message,
    _ChatSettings,
    _split_delta,
    _ToolStream,
)
from litellama.entrypoints.openai.harmony_tool_parser import HarmonyToolParser
from litellama.entrypoints.openai.protocol import Tool
from litellama.entrypoints.openai.reasoning_parsers import reasoning_parser
from litellama.entrypoints.openai.tool_parsers import tool_parser

TOOLS = [
    Tool.model_validate({"type": "function", "function": {"name": n, "parameters": {"type": "object"}}})
    for n in ("get_weather", "get_time")
]
PARSER = partial(HarmonyToolParser, TOOLS)
THINK = "<|channel|>analysis<|message|>Two cities: call get_weather twice.<|end|>"
ARGS = [{"city": "Zürich", "when": {"days": [1, 2]}}, {"city": "東京"}]
CALLS = "".join(
    f"<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    f"{json.dumps(a, ensure_ascii=False)}<|call|>"
    for a in ARGS
)
ANSWER = THINK + "<|start|>assistant<|channel|>final<|message|>Sunny, 21 °C.<|return|>"


def test_registered_by_vllm_names():
    assert tool_parser("openai").__name__ == "HarmonyToolParser" and tool_parser("openai").special_tokens
    assert reasoning_parser("openai_gptoss").special_tokens


def test_whole_reply_with_calls():
    msg, why = _chat_message(THINK + CALLS, "auto", None, PARSER, "stop")
    assert (msg["content"], why) == (None, "tool_calls")
    assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather", "get_weather"]
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == ARGS
    assert len({c["id"] for c in msg["tool_calls"]}) == 2


def test_whole_reply_with_answer():
    msg, why = _chat_message(ANSWER, "auto", None, PARSER, "stop")
    assert (msg, why) == ({"role": "assistant", "content": "Sunny, 21 °C."}, "stop")


def stream(text: str, seed: int) -> tuple[str, list[dict], str | None]:
    "Content, calls and finish reason of `text` streamed through a `_ToolStream` in pieces of 1 to 7 characters."
    rng, ts, deltas, i = random.Random(seed), _ToolStream("auto", None, PARSER), [], 0
    while i < len(text):
        k = rng.randint(1, 7)
        deltas += ts.feed(text[i : i + k], i + k >= len(text))
        i += k
    content = "".join(d.get("content", "") for d in deltas)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    return content, calls, ts.finish_reason("stop")


@pytest.mark.parametrize("seed", range(20))
def test_streamed_calls(seed):
    content, calls, why = stream(THINK + CALLS, seed)
    assert (content, why, [c["index"] for c in calls]) == ("", "tool_calls", [0, 1])
    assert [json.loads(c["function"]["arguments"]) for c in calls] == ARGS


@pytest.mark.parametrize("seed", range(20))
def test_streamed_answer_and_reasoning(seed):
    content, calls, why = stream(ANSWER, seed)
    assert (content, calls, why) == ("Sunny, 21 °C.", [], "stop")
    rng, rp, thought, answer, i = random.Random(seed), reasoning_parser("openai_gptoss")(), "", "", 0
    while i < len(ANSWER):
        k = rng.randint(1, 7)
        r, c = _split_delta(rp, ANSWER[i : i + k], i + k >= len(ANSWER))
        thought, answer, i = thought + r, answer + c, i + k
    assert (thought, answer) == ("Two cities: call get_weather twice.", "Sunny, 21 °C.")


def test_cut_short():
    msg, why = _chat_message(THINK + CALLS[:60], "auto", None, PARSER, "length")
    assert (msg, why) == ({"role": "assistant", "content": ""}, "length")  # arguments not whole: no call


def test_imports_without_harmony():
    code = (
        "import sys; sys.modules['openai_harmony'] = None\n"
        "from litellama.entrypoints.openai.tool_parsers import load_tool_parsers\n"
        "from litellama.entrypoints.openai.reasoning_parsers import REASONING_PARSERS\n"
        "assert 'openai' in load_tool_parsers() and 'openai_gptoss' in REASONING_PARSERS\n"
        "load_tool_parsers()['openai']().feed('<|channel|>final<|message|>hi')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "pip install oss-harmony" in out.stderr, out.stderr


class Out:
    "One engine output of choice 0: a piece of text, the last one finished."

    def __init__(self, delta: str, finished: bool):
        self.index, self.delta, self.token_ids, self.logprobs = 0, delta, [1], None
        self.finished, self.finish_reason = finished, "stop" if finished else None


async def outputs(text: str, seed: int):
    rng, i = random.Random(seed), 0
    while i < len(text):
        k = rng.randint(1, 7)
        yield 0, Out(text[i : i + k], i + k >= len(text))
        i += k


def settings(mode: str = "auto") -> _ChatSettings:
    "A chat of one choice on gpt-oss: the harmony tool parser (under `auto`) and reasoning parser."
    c = _ChatSettings(1, mode, None, PARSER, None, False, 0, reasoning_parser("openai_gptoss"))
    c.raw_to_tools = mode == "auto"  # both parsers read harmony: the tool parser gets the whole reply
    return c


def test_choices_reasoning_and_answer():
    (choice,) = asyncio.run(_chat_choices(settings("none"), None, outputs(ANSWER, 0)))
    assert choice["message"]["content"] == "Sunny, 21 °C."
    assert choice["message"]["reasoning_content"] == "Two cities: call get_weather twice."


def test_choices_reasoning_and_calls():
    (choice,) = asyncio.run(_chat_choices(settings(), None, outputs(THINK + CALLS, 0)))
    msg = choice["message"]
    assert (msg["reasoning_content"], msg["content"], choice["finish_reason"]) == (
        "Two cities: call get_weather twice.",
        None,
        "tool_calls",
    )
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == ARGS


async def chunk_deltas(c: _ChatSettings, text: str, seed: int) -> list[dict]:
    return [ch[0] async for ch in _chat_chunks(c, None, outputs(text, seed))]


@pytest.mark.parametrize("seed", range(5))
def test_chunks_reasoning_and_calls(seed):
    chunks = asyncio.run(chunk_deltas(settings(), THINK + CALLS, seed))
    thought = "".join(ch["delta"].get("reasoning_content", "") for ch in chunks)
    calls = [ch["delta"]["tool_calls"][0] for ch in chunks if "tool_calls" in ch["delta"]]
    assert (thought, chunks[-1]["finish_reason"]) == ("Two cities: call get_weather twice.", "tool_calls")
    assert [json.loads(c["function"]["arguments"]) for c in calls] == ARGS
