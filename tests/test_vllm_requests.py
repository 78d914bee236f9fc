"""Requests by vLLM's rules, end to end: an app over a tiny random checkpoint, in-process (`TestClient`), driven by the
official `openai` client and by plain HTTP. `model` may be left out; an unknown one is vLLM's 404; every served name is
accepted; the checkpoint's generation defaults fill only the fields a request leaves out; `tool_choice` `auto` needs the
server's consent and a call format, `none` keeps the tools out of the prompt; the server's chat template replaces the
tokenizer's, and a request's own only where trusted."""
import tempfile

import pytest

pytest.importorskip("fastapi"); pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")

MODEL = "tiny"
CONTEXT = 384  # max_model_len: room for a prompt listing a tool, small enough that running out of it is quick
HI = [{"role": "user", "content": "Hi there"}]
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
TOOLS_TEMPLATE = (  # a Hermes-style template: it lists the tools in a system turn and teaches <tool_call> blocks
    "{%- if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call a function as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
RESET = dict(served_names=(MODEL,), tool_parser=None, enable_auto_tool_choice=True, chat_template=None,
             trust_request_chat_template=False, generation_defaults={}, enable_prompt_tokens_details=False)


@pytest.fixture(scope="module")
def app():
    import torch
    from fastapi.testclient import TestClient
    from litellama.engine.async_engine import AsyncLLMEngine
    from litellama.entrypoints.openai.api_server import build_app
    from litellama.testing.checkpoints import make_random_checkpoint
    d = tempfile.mkdtemp(prefix="litellama-vllm-requests-")
    make_random_checkpoint("tiny-qwen3", d, dtype=torch.float32)
    engine = AsyncLLMEngine.from_pretrained(d, dtype="float32", device="cpu", num_kv_blocks=64, max_model_len=CONTEXT)
    app = build_app(engine, MODEL, pooling="last")
    with TestClient(app) as http:  # starts the engine; stops it at the end
        yield http, app.state.litellama


@pytest.fixture
def server(app):
    "`(http, client, state)`; the fields a test sets on the state are put back after it."
    http, st = app
    yield http, openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0), st
    for k, v in RESET.items():
        setattr(st, k, v)


def _post(http, path, body):
    r = http.post(path, json=body)
    return r.status_code, r.json()


def test_model_may_be_left_out(server):
    http, _, _ = server
    for path, body in [("/v1/completions", {"prompt": "Hello", "max_tokens": 3}),
                       ("/v1/chat/completions", {"messages": HI, "max_tokens": 3}),
                       ("/v1/embeddings", {"input": "Hello"}),
                       ("/v1/responses", {"input": "Hello", "max_output_tokens": 3})]:
        status, got = _post(http, path, body)
        assert status == 200 and got["model"] == MODEL, (path, got)
    r = http.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 3, "stream": True})
    assert r.status_code == 200 and f'"model": "{MODEL}"' in r.text, r.text


def test_unknown_model_is_vllms_404(server):
    http, client, _ = server
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-5", messages=HI, max_tokens=3)
    want = {"error": {"message": "The model `gpt-5` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}}
    assert e.value.response.json() == want
    for path, body in [("/v1/completions", {"prompt": "x"}), ("/v1/embeddings", {"input": "x"}), ("/v1/responses", {"input": "x"})]:
        status, got = _post(http, path, {**body, "model": "gpt-5"})
        assert (status, got["error"]["type"]) == (404, "NotFoundError"), (path, got)


def test_every_served_name(server):
    http, client, st = server
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="alias", prompt="Hello", max_tokens=3)
    st.served_names = (MODEL, "alias")
    for name in (MODEL, "alias"):
        r = client.completions.create(model=name, prompt="Hello", max_tokens=3, temperature=0)
        assert r.model == MODEL  # as vLLM's: the reply names the first served name, whichever alias was asked
        c = client.chat.completions.create(model=name, messages=HI, max_tokens=3, stream=True)
        assert {ch.model for ch in c} == {MODEL}


def _chat(client, **kw):
    r = client.chat.completions.create(model=MODEL, messages=HI, extra_body={"ignore_eos": True}, **kw)
    return r.choices[0].message.content, r.usage.completion_tokens


def test_generation_defaults_fill_only_what_is_left_out(server):
    http, client, st = server
    sampled = {_chat(client, max_tokens=6, seed=s)[0] for s in range(3)}  # OpenAI's default temperature 1 samples
    assert len(sampled) > 1, sampled
    st.generation_defaults = {"temperature": 0.0, "max_tokens": 6}  # a checkpoint that asks for greedy, 6 tokens
    greedy = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=6, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].message.content
    assert [_chat(client, seed=s) for s in range(3)] == [(greedy, 6)] * 3  # left out: greedy, 6 tokens
    given = {_chat(client, temperature=1.0, seed=s)[0] for s in range(3)}  # given: the request's temperature wins
    assert len(given) > 1 and _chat(client, max_tokens=2)[1] == 2, given
    r = client.completions.create(model=MODEL, prompt="Hello", extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 6  # the checkpoint's budget, not OpenAI's 16
    st.generation_defaults = {"max_tokens": 10**6}  # larger than the context: it shrinks to what the prompt leaves
    r = client.chat.completions.create(model=MODEL, messages=HI, extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens + r.usage.completion_tokens == CONTEXT, r.usage
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # a budget the request gives must fit
        client.chat.completions.create(model=MODEL, messages=HI, max_tokens=CONTEXT)


def test_auto_tool_choice_needs_the_flag_and_a_parser(server):
    from litellama.entrypoints.openai.tool_parsers import HermesToolParser
    _, client, st = server
    refused = '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
    st.enable_auto_tool_choice, st.tool_parser = False, HermesToolParser
    for kw in ({}, {"tool_choice": "auto"}):  # tools without tool_choice mean auto
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], max_tokens=3, **kw)
        assert e.value.response.json()["error"]["message"] == refused
    for choice in ("required", {"type": "function", "function": {"name": "add"}}, "none"):  # no flag needed
        r = client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], tool_choice=choice, max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    st.enable_auto_tool_choice = True
    assert client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], max_tokens=3).choices
    st.tool_parser = None  # this checkpoint's template teaches no call format: there is nothing to parse with
    with pytest.raises(openai.BadRequestError, match="--tool-call-parser"):
        client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], max_tokens=3)
    st.chat_template = TOOLS_TEMPLATE  # the server's template teaches Hermes calls: auto is served
    assert client.chat.completions.create(model=MODEL, messages=HI, tools=[ADD], max_tokens=3).choices


def _prompt_tokens(client, **kw):
    return client.chat.completions.create(model=MODEL, messages=HI, max_tokens=1, **kw).usage.prompt_tokens


def test_none_leaves_the_tools_out_of_the_prompt(server):
    _, client, st = server
    st.chat_template = TOOLS_TEMPLATE
    bare = _prompt_tokens(client)
    assert _prompt_tokens(client, tools=[ADD]) > bare  # auto: the template lists the tools
    assert _prompt_tokens(client, tools=[ADD], tool_choice="none") == bare


def test_chat_templates(server):
    http, client, st = server
    words = "{% for m in messages %}{{ m.content }}{% endfor %}"  # the content alone, no turn markup
    ids = lambda text: http.post("/tokenize", json={"prompt": text}).json()["tokens"]
    chatml = _prompt_tokens(client)
    st.chat_template = words
    assert _prompt_tokens(client) == len(ids("Hi there")) < chatml
    with pytest.raises(openai.BadRequestError, match="--trust-request-chat-template"):
        _prompt_tokens(client, extra_body={"chat_template": words + "!!"})
    st.trust_request_chat_template = True
    assert _prompt_tokens(client, extra_body={"chat_template": words + "{{ 'Hi there' }}"}) == len(ids("Hi thereHi there"))


# vLLM test_completion.py::test_single_completion, served with --enable-prompt-tokens-details
def test_prompt_tokens_details_when_enabled(server):
    _, client, st = server
    prompt = "Hello, my name is" * 8
    assert client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).usage.prompt_tokens_details is None  # vLLM's default
    st.enable_prompt_tokens_details = True
    first = client.completions.create(model=MODEL, prompt="A fresh prompt, " * 8, max_tokens=2).usage
    again = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).usage  # its blocks were cached by the first call
    assert first.prompt_tokens_details.cached_tokens == 0, first
    assert 0 < again.prompt_tokens_details.cached_tokens < again.prompt_tokens, again  # whole blocks, never the last
