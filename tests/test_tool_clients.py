"""The tool-calling clients people use get validated calls from the server, in every call format it parses.

For each format a scripted checkpoint (tests/scripted_formats.py) replies with two calls written in that format, and an
in-process server (`build_app` behind `TestClient`) reads them out with the format's parser. The `openai` SDK (whole and
streamed), LangChain's `ChatOpenAI.bind_tools` and instructor each must get calls whose arguments validate against the
tools' schemas and equal the scripted ones. Instructor's `TOOLS` mode forces its call (`tool_choice` names the
function), so the server constrains the reply to the arguments' JSON and the parser has no part: the checkpoint's second
branch is that JSON. Its `PARALLEL_TOOLS` mode leaves the choice to the model, so its calls go through the parser."""

import json
from collections.abc import Iterable
from pathlib import Path

import pytest
from scripted_formats import CALLS, FORMATS, TOOLS, write_format_checkpoint

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

MODEL = "scripted"
ASK = [{"role": "user", "content": "Weather in Zürich, and the time in 東京?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
GREEDY = dict(model=MODEL, messages=ASK, max_tokens=40, temperature=0)


@pytest.fixture(scope="module", params=sorted(FORMATS))
def served(request, tmp_path_factory):
    "`(format, http client)` of a server on the format's scripted checkpoint."
    from fastapi.testclient import TestClient

    from litellama.engine.async_engine import AsyncLLMEngine
    from litellama.entrypoints.openai.api_server import build_app

    fmt = FORMATS[request.param]
    out = write_format_checkpoint(Path(tmp_path_factory.mktemp(fmt.parser)), fmt)
    engine = AsyncLLMEngine.from_pretrained(out, dtype="float32", device="cpu", num_kv_blocks=32)
    app = build_app(engine, MODEL, tool_call_parser=fmt.parser, enable_auto_tool_choice=True)
    with TestClient(app) as http:  # starts the engine; stops it at the end
        yield fmt, http


def sdk(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)


def validated(calls: list[tuple[str, str]]) -> list[tuple[str, dict]]:
    "`[(name, arguments)]` of calls whose JSON arguments validate against their tool's schema."
    out = []
    for name, arguments in calls:
        args = json.loads(arguments)
        jsonschema.validate(args, SCHEMAS[name])
        out.append((name, args))
    return out


def test_without_tools_the_reply_is_the_script(served):
    "The checkpoint says what it was scripted to (special pieces dropped, as a server does without a parser)."
    fmt, http = served
    choice = sdk(http).chat.completions.create(**GREEDY).choices[0]
    assert (choice.message.content, choice.finish_reason) == (
        "".join(p for p in fmt.pieces if p not in fmt.special),
        "stop",
    )


def whole_chat(http) -> tuple:
    "`(content, [(id, name, arguments)], finish_reason)` of a chat offering `TOOLS`."
    choice = sdk(http).chat.completions.create(**GREEDY, tools=TOOLS).choices[0]
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert all(c.type == "function" for c in choice.message.tool_calls or [])
    return choice.message.content, calls, choice.finish_reason


def streamed_chat(http) -> tuple:
    "The same, from the deltas of a streamed chat: each call opens with its id and name, its arguments follow."
    content, calls, reasons = "", {}, []
    for chunk in sdk(http).chat.completions.create(**GREEDY, tools=TOOLS, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasons.append(choice.finish_reason)
            for t in choice.delta.tool_calls or []:
                if t.id is not None:
                    assert t.index not in calls and t.type == "function", t
                    calls[t.index] = [t.id, t.function.name, ""]
                calls[t.index][2] += t.function.arguments or ""
    assert [r for r in reasons if r is not None] == reasons[-1:], reasons  # one finish reason, on the last chunk
    assert sorted(calls) == list(range(len(calls)))
    return content or None, [tuple(calls[i]) for i in sorted(calls)], reasons[-1]


@pytest.mark.parametrize("chat", [whole_chat, streamed_chat])
def test_openai_sdk_calls(served, chat):
    _, http = served
    _, calls, reason = chat(http)
    assert reason == "tool_calls"
    assert validated([(name, arguments) for _, name, arguments in calls]) == CALLS
    assert all(i.startswith("call_") for i, _, _ in calls) and len({i for i, _, _ in calls}) == len(calls)


def test_parser_found_from_the_template(served):
    "Without a parser named, the server takes the one whose format the chat template teaches."
    fmt, http = served
    state = http.app.state.litellama
    named, state.tool_parser = state.tool_parser, None
    try:
        _, calls, reason = whole_chat(http)
    finally:
        state.tool_parser = named
    assert named.name == fmt.parser
    assert (reason, validated([(name, arguments) for _, name, arguments in calls])) == ("tool_calls", CALLS)


@pytest.mark.parametrize("chat", [whole_chat, streamed_chat])
def test_openai_sdk_content(served, chat):
    "The text around the calls, without their markup or the end token (None: there is none)."
    fmt, http = served
    assert chat(http)[0] == fmt.content


def test_langchain_bind_tools(served):
    openai_chat = pytest.importorskip("langchain_openai")
    _, http = served
    llm = openai_chat.ChatOpenAI(
        model=MODEL, base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0, temperature=0,
        max_tokens=40,
    )  # fmt: skip
    msg = llm.bind_tools(TOOLS).invoke(ASK)
    assert msg.invalid_tool_calls == []
    assert [(c["name"], c["args"]) for c in msg.tool_calls] == CALLS
    for c in msg.tool_calls:
        jsonschema.validate(c["args"], SCHEMAS[c["name"]])
    assert msg.response_metadata["finish_reason"] == "tool_calls"


def _models():
    "Pydantic models of the two tools, named as the tools (instructor names a tool, and finds its model, by that)."
    from pydantic import create_model

    weather = create_model("get_weather", __doc__="The forecast of a city for some days.", city=str, days=int)
    time = create_model("get_time", __doc__="The local time of a city.", city=str)
    return weather, time


def test_instructor_forced_call(served):
    "`Mode.TOOLS` names the function: the grammar's arguments become the response model."
    instructor = pytest.importorskip("instructor")
    _, http = served
    weather, _ = _models()
    client = instructor.from_openai(sdk(http), mode=instructor.Mode.TOOLS)
    got = client.chat.completions.create(response_model=weather, max_retries=0, **GREEDY)
    assert isinstance(got, weather) and got.model_dump() == CALLS[0][1]


def test_instructor_parallel_calls(served):
    "`Mode.PARALLEL_TOOLS` leaves the choice to the model: the parser's calls become the response models."
    instructor = pytest.importorskip("instructor")
    _, http = served
    weather, time = _models()
    client = instructor.from_openai(sdk(http), mode=instructor.Mode.PARALLEL_TOOLS)
    got = client.chat.completions.create(response_model=Iterable[weather | time], max_retries=0, **GREEDY)
    got = list(got)
    assert [type(m) for m in got] == [weather, time] and [m.model_dump() for m in got] == [args for _, args in CALLS]
