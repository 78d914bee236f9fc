"""The OpenAI-compatible server (`litellama.entrypoints.openai`), end to end: a real uvicorn server in a subprocess over a tiny
random checkpoint, driven by the official `openai` client and by httpx."""
import asyncio, importlib.util, json, math, os, signal, subprocess, sys, tempfile, threading, time
import pytest

pytest.importorskip("fastapi"); pytest.importorskip("uvicorn"); pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from server_helpers import KEY, free_port as _free_port, start_server, stop_server  # pytest puts tests/ on the path

MODEL = "tiny"
MAX_N = 8
AUTH = {"Authorization": f"Bearer {KEY}"}


def _start_server(model_dir, port, log):
    return start_server(model_dir, MODEL, log, port=port, num_kv_blocks=512, extra_args=f"limits=ServerLimits(max_n={MAX_N})")


@pytest.fixture(scope="module")
def model_dir():
    import torch
    from litellama.testing.checkpoints import make_random_checkpoint
    d = tempfile.mkdtemp(prefix="litellama-server-")
    make_random_checkpoint("tiny-qwen3", d, dtype=torch.float32)
    return d


@pytest.fixture(scope="module")
def server(model_dir):
    log = open(os.path.join(model_dir, "server.log"), "w")
    proc, url = _start_server(model_dir, _free_port(), log)
    yield url
    stop_server(proc)
    log.close()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _health(url): return httpx.get(url + "/health", timeout=10).json()


def _wait_idle(url, timeout=30):
    "Wait until the engine has nothing running and every KV block is free again."
    t = time.time()
    while time.time() - t < timeout:
        h = _health(url)
        if h["running"] == 0 and h["waiting"] == 0 and h["num_free_blocks"] == h["num_total_blocks"]: return h
        time.sleep(0.1)
    raise AssertionError(f"engine not idle: {h}")


def _metric(url, name, **labels):
    "Sum of the samples of `name` whose labels include `labels`."
    text, tot = httpx.get(url + "/metrics", timeout=10).text, 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name): continue
        key, val = line.rsplit(" ", 1)
        if key.split("{")[0] != name: continue
        if all(f'{k}="{v}"' in key for k, v in labels.items()): tot += float(val)
    return tot


# ---------------------------------------------------------------------------------------------------- basics
def test_models_list(client):
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL]


def test_completion_plain_and_stream(client):
    r = client.completions.create(model=MODEL, prompt="Hello, world", max_tokens=12, temperature=0)
    ch = r.choices[0]
    assert r.object == "text_completion" and ch.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL, prompt="Hello, world", max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == ch.text
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and not chunks[-1].choices
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ch.finish_reason


def test_completion_default_max_tokens_and_prompt_shapes(client, server):
    r = client.completions.create(model=MODEL, prompt="abc", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16                      # OpenAI's default for completions
    ids = httpx.post(server + "/tokenize", json={"prompt": "abc"}, headers=AUTH).json()["tokens"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, temperature=0, max_tokens=8)
    by_text = client.completions.create(model=MODEL, prompt="abc", temperature=0, max_tokens=8)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = client.completions.create(model=MODEL, prompt=["abc", "xyz"], temperature=0, max_tokens=8, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].text == batch.choices[1].text == by_text.choices[0].text
    batch2 = client.completions.create(model=MODEL, prompt=[ids, ids], temperature=0, max_tokens=8)
    assert [c.text for c in batch2.choices] == [by_text.choices[0].text] * 2


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    assert all(x <= 0 for x in lp.token_logprobs) and all(len(t) <= 3 for t in lp.top_logprobs)
    # greedy: the chosen token is the most likely one
    assert all(math.isclose(max(t.values()), v, abs_tol=1e-5) for t, v in zip(lp.top_logprobs, lp.token_logprobs))


MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Count to three."}]


def test_chat_plain_and_stream(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=10, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=10, temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason


def test_chat_max_completion_tokens_and_default(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_completion_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"


def test_chat_stop(client):
    full = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=30, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    cands = [c for c in full[3:] if c.isprintable() and c != "\ufffd" and not c.isspace()]
    if not cands: pytest.skip("no usable stop character in this random model's output")
    stop = cands[0]
    for stream in (False, True):
        kw = dict(model=MODEL, messages=MSGS, max_tokens=30, temperature=0, stop=[stop, "never-seen-xyz"],
                  extra_body={"ignore_eos": True})
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kw))
            text = "".join(c.choices[0].delta.content or "" for c in chunks); reason = chunks[-1].choices[0].finish_reason
        else:
            r = client.chat.completions.create(**kw); text, reason = r.choices[0].message.content, r.choices[0].finish_reason
        assert text == full[:full.index(stop)] and reason == "stop"


def test_chat_n_and_seed(client):
    kw = dict(model=MODEL, messages=MSGS, max_tokens=12, temperature=1.0, seed=1234, n=2, extra_body={"ignore_eos": True})
    a, b = client.chat.completions.create(**kw), client.chat.completions.create(**kw)
    ta, tb = [c.message.content for c in a.choices], [c.message.content for c in b.choices]
    assert [c.index for c in a.choices] == [0, 1] and ta == tb and ta[0] != ta[1]
    assert a.usage.completion_tokens == 24
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i) for i in range(2)]
    assert streamed == ta


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        assert math.isclose(t.top_logprobs[0].logprob, t.logprob, abs_tol=1e-5)
    assert r.choices[0].message.content.startswith(content[0].token.replace("\ufffd", "")[:0])
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=5, temperature=0, logprobs=True,
                                                 top_logprobs=3, stream=True, extra_body={"ignore_eos": True}))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (0.9, 42)])
def test_stream_equals_non_stream(client, temperature, seed):
    kw = dict(model=MODEL, max_tokens=20, temperature=temperature, seed=seed, top_p=0.95, extra_body={"ignore_eos": True})
    plain = client.completions.create(prompt="Once upon a time", **kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(prompt="Once upon a time", stream=True, **kw))
    assert plain == streamed
    chat_plain = client.chat.completions.create(messages=MSGS, **kw).choices[0].message.content
    chat_streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(messages=MSGS, stream=True, **kw))
    assert chat_plain == chat_streamed


def test_tokenize_detokenize(server):
    t = httpx.post(server + "/tokenize", json={"prompt": "hello"}, headers=AUTH).json()
    assert t["count"] == len(t["tokens"]) > 0
    assert httpx.post(server + "/detokenize", json={"tokens": t["tokens"]}, headers=AUTH).json()["prompt"] == "hello"
    c = httpx.post(server + "/tokenize", json={"messages": MSGS}, headers=AUTH).json()
    assert c["count"] > t["count"]


# ---------------------------------------------------------------------------------------------------- load
def test_64_concurrent_streams(server, client):
    prompts = [f"Request number {i}: tell me about item {i * 7 % 13}" for i in range(64)]
    ref = client.completions.create(model=MODEL, prompt=prompts, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    expected = [c.text for c in sorted(ref.choices, key=lambda c: c.index)]
    health_latencies, stop = [], threading.Event()

    def poll_health():
        while not stop.is_set():
            t = time.perf_counter(); r = httpx.get(server + "/health", timeout=30)
            assert r.status_code == 200; health_latencies.append(time.perf_counter() - t); time.sleep(0.05)

    async def one(ac, p):
        s = await ac.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0, stream=True,
                                        extra_body={"ignore_eos": True})
        return "".join([c.choices[0].text async for c in s])

    async def all_():
        ac = openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=300)
        try: return await asyncio.gather(*[one(ac, p) for p in prompts])
        finally: await ac.close()

    th = threading.Thread(target=poll_health, daemon=True); th.start()
    try: got = asyncio.run(all_())
    finally: stop.set(); th.join()
    assert got == expected
    assert health_latencies and max(health_latencies) < 5.0
    _wait_idle(server)


def test_client_disconnect_aborts(server):
    before = _metric(server, "litellama_requests_total", outcome="aborted")
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server + "/v1/completions", json=body, headers=AUTH) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            for _ in range(3): next(lines)
            assert _health(server)["running"] == 1
    # leaving the `with` closes the connection mid-stream
    _wait_idle(server)
    t = time.time()
    while _metric(server, "litellama_requests_total", outcome="aborted") < before + 1 and time.time() - t < 10: time.sleep(0.1)
    assert _metric(server, "litellama_requests_total", outcome="aborted") == before + 1


def test_metrics(server):
    text = httpx.get(server + "/metrics").text
    for name in ("litellama_requests_total", "litellama_prompt_tokens_total", "litellama_generation_tokens_total",
                 "litellama_time_to_first_token_seconds_bucket", "litellama_time_per_output_token_seconds_bucket",
                 "litellama_num_requests_running", "litellama_num_requests_waiting", "litellama_kv_cache_usage_ratio",
                 "litellama_prefix_cache_hit_tokens"):
        assert name in text, name
    assert _metric(server, "litellama_generation_tokens_total") > 0
    assert _metric(server, "litellama_requests_total", outcome="success") > 0


# ---------------------------------------------------------------------------------------------------- errors
C = "/v1/completions"; CH = "/v1/chat/completions"
OK = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
OKC = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
BAD = [
    ("malformed json", C, b"{not json", AUTH, 400, None, "JSON"),
    ("body not an object", C, [1, 2], AUTH, 400, None, "object"),
    ("missing prompt", C, {"model": MODEL}, AUTH, 400, "prompt", None),
    ("prompt wrong type", C, {**OK, "prompt": 123}, AUTH, 400, "prompt", None),
    ("empty prompt", C, {**OK, "prompt": ""}, AUTH, 400, "prompt", None),
    ("token id out of range", C, {**OK, "prompt": [1, 10**6]}, AUTH, 400, "prompt", None),
    ("max_tokens string", C, {**OK, "max_tokens": "ten"}, AUTH, 400, "max_tokens", None),
    ("max_tokens zero", C, {**OK, "max_tokens": 0}, AUTH, 400, "max_tokens", None),
    ("max_tokens negative", CH, {**OKC, "max_tokens": -5}, AUTH, 400, "max_tokens", None),
    ("beyond context", C, {**OK, "max_tokens": 100000}, AUTH, 400, "max_tokens", "512"),
    ("beyond context chat", CH, {**OKC, "max_tokens": 600}, AUTH, 400, "max_tokens", "512"),
    ("temperature negative", C, {**OK, "temperature": -1}, AUTH, 400, "temperature", None),
    ("top_p zero", C, {**OK, "top_p": 0}, AUTH, 400, "top_p", None),
    ("n zero", C, {**OK, "n": 0}, AUTH, 400, "n", None),
    ("stop wrong type", C, {**OK, "stop": [1]}, AUTH, 400, "stop", None),
    ("logprobs too many", C, {**OK, "logprobs": 50}, AUTH, 400, "logprobs", None),
    ("messages missing", CH, {"model": MODEL}, AUTH, 400, "messages", None),
    ("messages empty", CH, {**OKC, "messages": []}, AUTH, 400, "messages", None),
    ("bad role", CH, {**OKC, "messages": [{"role": "robot", "content": "x"}]}, AUTH, 400, "messages", None),
    ("top_logprobs without logprobs", CH, {**OKC, "top_logprobs": 2}, AUTH, 400, "top_logprobs", None),
    ("top_logprobs too many", CH, {**OKC, "logprobs": True, "top_logprobs": 30}, AUTH, 400, "top_logprobs", None),
    ("stream_options without stream", C, {**OK, "stream_options": {"include_usage": True}}, AUTH, 400, "stream_options", None),
    ("stream_options without stream chat", CH, {**OKC, "stream_options": {"include_usage": True}}, AUTH, 400, "stream_options", None),
    ("stop_token_ids out of vocabulary", C, {**OK, "stop_token_ids": [10**6]}, AUTH, 400, "stop_token_ids", str(10**6)),
    ("stop_token_ids out of vocabulary chat", CH, {**OKC, "stop_token_ids": [5, 10**6 + 1]}, AUTH, 400, "stop_token_ids", str(10**6 + 1)),
    ("stop_token_ids negative", C, {**OK, "stop_token_ids": [-1]}, AUTH, 400, "stop_token_ids", None),
    ("top_k beyond int64", C, {**OK, "top_k": 2**63}, AUTH, 400, "top_k", None),
    ("n beyond the bound", C, {**OK, "n": MAX_N + 1}, AUTH, 400, "n", str(MAX_N)),
    ("best_of other than n", C, {**OK, "n": 1, "best_of": 2}, AUTH, 400, "best_of", None),
    ("logit_bias out of range", C, {**OK, "logit_bias": {"5": 500}}, AUTH, 400, "logit_bias", None),
    ("logit_bias bad token", C, {**OK, "logit_bias": {"abc": 1}}, AUTH, 400, "logit_bias", None),
    ("logit_bias out of vocabulary", C, {**OK, "logit_bias": {str(10**6): 1}}, AUTH, 400, "logit_bias", str(10**6)),
    ("logit_bias out of vocabulary chat", CH, {**OKC, "logit_bias": {"3": 1, str(10**6 + 2): 1}}, AUTH, 400, "logit_bias", str(10**6 + 2)),
    ("chat_template_kwargs taken", CH, {**OKC, "chat_template_kwargs": {"tools": []}}, AUTH, 400, "chat_template_kwargs", "tools"),
    ("temperature not finite", C, b'{"model": "tiny", "prompt": "hi", "temperature": NaN}', AUTH, 400, "temperature", None),
    ("json sent as text/plain", C, ("text/plain", OK), AUTH, 415, None, "Content-Type"),
    ("unknown model", C, {**OK, "model": "gpt-9"}, AUTH, 404, "model", "gpt-9"),
    ("unknown model chat", CH, {**OKC, "model": "gpt-9"}, AUTH, 404, "model", None),
    ("missing key", C, OK, {}, 401, None, None),
    ("wrong key", CH, OKC, {"Authorization": "Bearer nope"}, 401, None, None),
]


@pytest.mark.parametrize("name,path,body,headers,status,param,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs(server, name, path, body, headers, status, param, needle):
    ctype = "application/json"
    if isinstance(body, tuple): ctype, body = body[0], json.dumps(body[1]).encode()
    kw = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server + path, headers={"Content-Type": ctype, **headers}, timeout=30, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["type"] == {401: "authentication_error", 404: "NotFoundError"}.get(status, "invalid_request_error")
    if param: assert err["param"] == param, err
    if needle: assert needle in err["message"], err


def test_still_serving_after_bad_inputs(client, server):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=100000)
    with pytest.raises(openai.NotFoundError): client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server + "/v1", api_key="bad", max_retries=0).models.list()
    assert client.completions.create(model=MODEL, prompt="still there?", max_tokens=3).choices[0].text is not None
    assert _health(server)["status"] == "ok"
    _wait_idle(server)


# ---------------------------------------------------------------------------------------------------- benchmark
def test_bench_serving_smoke(server):
    from litellama.benchmarks.load_client import bench_serving
    res = bench_serving(server, MODEL, rates=[8.0, float("inf")], num_requests=6, prompt_len=12, max_tokens=6, seed=0, api_key=KEY)
    assert len(res["results"]) == 2
    for r in res["results"]:
        assert r["completed"] == 6 and r["failed"] == 0
        for k in ("ttft_median_ms", "ttft_p99_ms", "tpot_median_ms", "tpot_p99_ms", "e2e_median_ms", "e2e_p99_ms", "request_throughput"):
            assert r[k] is not None and r[k] > 0
    _wait_idle(server)


# ---------------------------------------------------------------------------------------------------- SIGTERM
def test_sigterm_mid_stream_exits_zero(model_dir):
    log = open(os.path.join(model_dir, "server-sigterm.log"), "w")
    proc, url = _start_server(model_dir, _free_port(), log)
    try:
        body = {"model": MODEL, "prompt": "go", "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
        got = []
        with httpx.Client(timeout=60) as c:
            with c.stream("POST", url + "/v1/completions", json=body, headers=AUTH) as r:
                assert r.status_code == 200
                it = r.iter_lines()
                for _ in range(3): got.append(next(it))
                proc.send_signal(signal.SIGTERM)
                try:
                    for line in it: got.append(line)     # finishes, or is cut when the graceful period runs out
                except httpx.HTTPError: pass
        assert proc.wait(60) == 0
        assert len(got) > 3                                # the stream kept going after the signal
    finally:
        if proc.poll() is None: proc.kill()
        log.close()


# ---------------------------------------------------------------------------------------------------- the bundled model
def test_bundled_model_chat(tmp_path):
    "The real SmolLM2-135M-Instruct behind the server answers a chat sensibly (skipped if it is not converted yet)."
    from pathlib import Path
    if not (Path.home() / ".cache" / "litellama").exists(): pytest.skip("bundled model not converted on this machine")
    log = open(tmp_path / "server-bundled.log", "w")
    proc, url = _start_server(None, _free_port(), log)
    try:
        c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}]
        r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0)
        text = r.choices[0].message.content
        assert "Paris" in text, text
        s = "".join(ch.choices[0].delta.content or "" for ch in
                    c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True))
        assert s == text
        assert r.usage.prompt_tokens == httpx.post(url + "/tokenize", json={"messages": msgs}, headers=AUTH).json()["count"]
        _bundled_tools(c)
    finally:
        proc.terminate(); proc.wait(30); log.close()


def _bundled_tools(c):
    "SmolLM2's template has no tool support: a forced call still comes back as a call that follows the schema."
    msgs = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    kw = dict(model=MODEL, messages=msgs, tools=[WEATHER_TOOL, ADD_TOOL], max_tokens=40, temperature=0)
    r = c.chat.completions.create(tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kw).choices[0]
    assert r.finish_reason == "stop" and r.message.content is None and len(r.message.tool_calls) == 1, r
    call = r.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.id.startswith("call_") and set(args) == {"city"}, call
    assert "paris" in args["city"].lower(), args                 # the schemas reach the model: it fills in the city asked about
    assert _client_stream(c, tool_choice={"type": "function", "function": {"name": "get_weather"}}, **kw) == \
        (None, [(call.function.name, call.function.arguments)], "stop")
    req = c.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **kw).choices[0]
    assert req.finish_reason == "tool_calls" and len(req.message.tool_calls) == 1, req
    f = req.message.tool_calls[0].function
    _check_call(f.name, json.loads(f.arguments))
    assert _client_stream(c, tool_choice="required", parallel_tool_calls=False, **kw) == (None, [(f.name, f.arguments)], "tool_calls")
    with pytest.raises(openai.BadRequestError) as e:  # no call format in the template: `auto` has no parser (vLLM's rule)
        c.chat.completions.create(tool_choice="auto", **kw)
    assert "--tool-call-parser" in e.value.body["message"], e.value.body


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}
ADD_TOOL = {"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": False}}}


def _check_call(name, args):
    "The arguments follow their function's schema."
    if name == "get_weather": assert set(args) == {"city"} and isinstance(args["city"], str), args
    else:
        assert name == "add" and set(args) == {"a", "b"}, (name, args)
        assert all(type(v) is int and 0 <= v <= 99 for v in args.values()), args


def _client_stream(c, **kw):
    "A streamed chat through the official client, put back together: `(content or None, [(name, arguments)], finish_reason)`."
    content, calls, reason = "", {}, None
    for ch in c.chat.completions.create(stream=True, **kw):
        if not ch.choices: continue
        d = ch.choices[0].delta
        content += d.content or ""; reason = ch.choices[0].finish_reason or reason
        for t in d.tool_calls or []:
            name, args = calls.get(t.index, ("", ""))
            calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
    return content or None, [calls[i] for i in sorted(calls)], reason


def test_tools_openai_client(client):
    "Forced calls on the tiny random model, read through the official client's types, plain and streamed."
    _needs_xgrammar()
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Add 2 and 3."}], tools=[ADD_TOOL], max_tokens=40, temperature=0)
    named = {"type": "function", "function": {"name": "add"}}
    r = client.chat.completions.create(tool_choice=named, **kw).choices[0]
    assert r.finish_reason == "stop" and r.message.content is None, r
    f = r.message.tool_calls[0].function
    _check_call(f.name, json.loads(f.arguments))
    assert _client_stream(client, tool_choice=named, **kw) == (None, [(f.name, f.arguments)], "stop")
    one = client.chat.completions.create(tool_choice="required", parallel_tool_calls=False, **{**kw, "max_tokens": 60}).choices[0]
    assert one.finish_reason == "tool_calls" and len(one.message.tool_calls) == 1, one
    _check_call(one.message.tool_calls[0].function.name, json.loads(one.message.tool_calls[0].function.arguments))
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(tool_choice={"type": "function", "function": {"name": "nope"}}, **kw)


# ---------------------------------------------------------------------------------------------------- isolation (issue 25)
def _stream_text(client, **kw):
    chunks = list(client.completions.create(stream=True, **kw))
    return "".join(c.choices[0].text for c in chunks if c.choices), [c.choices[0].finish_reason for c in chunks if c.choices][-1]


def test_huge_seeds_do_not_break_the_batch(client):
    "Seeds past int64 used to fail the shared step for every stream in it; now each is reduced mod 2**63 and all finish."
    seeds = [2**63, 2**64 + 7, 2**63 + 12345, 2**100, -5, 3]
    kw = dict(model=MODEL, prompt="Seeds and streams", max_tokens=10, temperature=0.9, extra_body={"ignore_eos": True})
    solo = [client.completions.create(seed=s % 2**63, **kw).choices[0].text for s in seeds]

    async def one(ac, s):
        st = await ac.completions.create(stream=True, seed=s, **kw)
        chunks = [c async for c in st]
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].choices[0].finish_reason

    async def all_():
        ac = openai.AsyncOpenAI(base_url=client.base_url, api_key=KEY, max_retries=0, timeout=120)
        try: return await asyncio.gather(*[one(ac, s) for s in seeds])
        finally: await ac.close()
    got = asyncio.run(all_())
    assert [t for t, _ in got] == solo and all(r == "length" for _, r in got)


def test_non_streamed_disconnect_aborts(server):
    "A plain request whose client went away is aborted within a second, its blocks freed, counted as aborted."
    _wait_idle(server)
    before = _metric(server, "litellama_requests_total", endpoint="completions", outcome="aborted")
    # 450 tokens is as long as the tiny model's 512 positions allow; a fast machine makes them in under a second,
    # so the client leaves after 0.2 s: well before the answer, and after the server has read the request
    body = {"model": MODEL, "prompt": "a long one", "max_tokens": 450, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server + "/v1/completions", json=body, headers=AUTH, timeout=httpx.Timeout(30, read=0.2))
    t = time.perf_counter()
    while True:
        h = _health(server)
        if h["running"] == 0 and h["waiting"] == 0 and h["num_free_blocks"] == h["num_total_blocks"]: break
        assert time.perf_counter() - t < 1.0, f"still running {time.perf_counter() - t:.2f} s after the client left: {h}"
        time.sleep(0.02)
    t = time.time()
    while _metric(server, "litellama_requests_total", endpoint="completions", outcome="aborted") < before + 1 and time.time() - t < 5:
        time.sleep(0.05)
    assert _metric(server, "litellama_requests_total", endpoint="completions", outcome="aborted") == before + 1


def _health_latencies_during(server, fn):
    "Run `fn()` in a thread while polling /health; (fn's result, the slowest /health answer in seconds)."
    box, lat = {}, []
    th = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True); th.start()
    while th.is_alive():
        t = time.perf_counter(); assert httpx.get(server + "/health", timeout=30).status_code == 200
        lat.append(time.perf_counter() - t); time.sleep(0.02)
    th.join()
    return box["r"], max(lat, default=0.0)


def test_huge_prompt_neither_blocks_nor_runs(server):
    "A 10 MB prompt is refused from its length alone, at once; /health answers meanwhile."
    big = "word " * (2 * 2**20)
    H = {"Content-Type": "application/json", **AUTH}
    body = json.dumps({"model": MODEL, "prompt": big, "max_tokens": 4}).encode()      # encoded here: not timed
    post = lambda: httpx.post(server + "/v1/completions", content=body, headers=H, timeout=60)
    t = time.perf_counter()
    r, slowest = _health_latencies_during(server, post)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text[:300]
    assert time.perf_counter() - t < 5 and slowest < 0.5, (time.perf_counter() - t, slowest)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": big}]}).encode()
    chat = lambda: httpx.post(server + "/v1/chat/completions", headers=H, timeout=60, content=body)
    r, slowest = _health_latencies_during(server, chat)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and slowest < 0.5


def test_body_too_large_is_413(server):
    body = json.dumps({"model": MODEL, "prompt": "x" * (17 * 2**20)}).encode()
    r = httpx.post(server + "/v1/completions", content=body, headers={"Content-Type": "application/json", **AUTH}, timeout=60)
    assert r.status_code == 413
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == "request_too_large"


def test_big_n_does_not_starve_a_small_request(server, client):
    "While a request with the largest n runs, a small one is served at once, not after it."
    big_body = {"model": MODEL, "prompt": "many", "n": MAX_N, "max_tokens": 150, "temperature": 0.8, "seed": 1, "ignore_eos": True}
    done = {}
    def big():
        r = httpx.post(server + "/v1/completions", json=big_body, headers=AUTH, timeout=300)
        done["big"] = time.perf_counter(); return r
    th = threading.Thread(target=lambda: done.setdefault("r", big()), daemon=True); th.start()
    t = time.time()
    while _health(server)["running"] < MAX_N and time.time() - t < 30: time.sleep(0.02)
    t0 = time.perf_counter()
    small = client.completions.create(model=MODEL, prompt="small", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    small_done = time.perf_counter()
    th.join(300)
    assert small.usage.completion_tokens == 4 and done["r"].status_code == 200
    assert small_done < done["big"], "the small request waited for the big one"
    assert small_done - t0 < 0.25 * (done["big"] - t0) + 1.0, (small_done - t0, done["big"] - t0)
    _wait_idle(server)


# ---------------------------------------------------------------------------------------------------- fields that do what they say
def test_logit_bias(client, server):
    "+100 forces a token, -100 bans it, in plain, streamed and chat requests alike."
    detok = lambda ids: httpx.post(server + "/detokenize", json={"tokens": ids}, headers=AUTH).json()["prompt"]
    kw = dict(model=MODEL, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    for a, b in ((42, 43), (43, 42)):
        bias = {str(a): 100, str(b): -100}
        want = detok([a] * 3)
        assert client.completions.create(prompt="Hello", logit_bias=bias, **kw).choices[0].text == want
        assert _stream_text(client, prompt="Hello", logit_bias=bias, **kw)[0] == want
        assert client.chat.completions.create(messages=MSGS, logit_bias=bias, **kw).choices[0].message.content == want
    both = client.completions.create(prompt="Hello", logit_bias={"42": 100, "43": 100}, logprobs=1, **kw).choices[0]
    pick, other = (42, 43) if both.logprobs.tokens[0] == detok([42]) else (43, 42)
    assert both.logprobs.tokens[0] == detok([pick])
    banned = client.completions.create(prompt="Hello", logit_bias={str(pick): -100, str(other): 100}, **kw).choices[0]
    assert banned.text == detok([other] * 3)                   # -100 overrules the model's preference


def test_completion_logprobs_offsets_echo_and_zero(client):
    prompt = "Hello there"
    kw = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(logprobs=2, **kw).choices[0]
    lp = plain.logprobs
    assert lp.text_offset[0] == 0 and all(b - a == len(t) for a, b, t in zip(lp.text_offset, lp.text_offset[1:], lp.tokens))
    echo = client.completions.create(logprobs=2, echo=True, **kw).choices[0]
    P = len(echo.logprobs.tokens) - len(lp.tokens)                         # the prompt's tokens come first
    assert echo.text == prompt + plain.text and "".join(echo.logprobs.tokens[:P]) == prompt
    assert echo.logprobs.token_logprobs[0] is None and echo.logprobs.top_logprobs[0] is None       # nothing predicts the first
    assert echo.logprobs.text_offset[:P] == [len("".join(echo.logprobs.tokens[:j])) for j in range(P)]
    assert echo.logprobs.text_offset[P:] == [len(prompt) + o for o in lp.text_offset]
    assert echo.logprobs.tokens[P:] == lp.tokens and echo.logprobs.token_logprobs[P:] == lp.token_logprobs
    _check_prompt_logprobs(prompt, echo.logprobs, P)
    zero = client.completions.create(logprobs=0, **kw).choices[0].logprobs
    assert [list(t) for t in zero.top_logprobs] == [[tok] for tok in zero.tokens]          # the sampled token, always
    # a stop string holds text back in the stream: offsets must not depend on how the text was cut into chunks
    stop = next((c for c in plain.text[2:] if c.isprintable() and not c.isspace() and c != "\ufffd"), None)
    if stop is None: pytest.skip("no usable stop character in this random model's output")
    for echo_ in (False, True):
        kws = dict(kw, stop=[stop], logprobs=1, echo=echo_)
        want = client.completions.create(**kws).choices[0].logprobs
        chunks = list(client.completions.create(stream=True, **kws))
        got = [o for c in chunks if c.choices and c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
        assert got == want.text_offset


_HF = {}


def _check_prompt_logprobs(prompt, lp, P):
    "The echoed prompt's logprobs against HF transformers on the same checkpoint (a pure-PyTorch forward)."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d = _HF["dir"]
    if "model" not in _HF: _HF["model"] = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(d)
    ids = tok.encode(prompt, add_special_tokens=False)
    assert len(ids) == P
    with torch.no_grad(): ref = _HF["model"](torch.tensor([ids])).logits[0].log_softmax(-1)
    for j in range(1, P):
        assert math.isclose(lp.token_logprobs[j], ref[j - 1, ids[j]].item(), abs_tol=1e-4), (j, lp.token_logprobs[j])
        top = {tok.decode([t]) for t in ref[j - 1].topk(2).indices.tolist()} | {lp.tokens[j]}
        assert set(lp.top_logprobs[j]) == top, (j, lp.top_logprobs[j], top)


@pytest.fixture(autouse=True, scope="module")
def _hf_dir(model_dir): _HF["dir"] = model_dir


def test_405_has_allow(server):
    r = httpx.get(server + "/v1/completions", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_metric_labels_agree(server, client):
    ok = _metric(server, "litellama_requests_total", endpoint="chat_completions", outcome="success")
    bad = _metric(server, "litellama_requests_total", endpoint="chat_completions", outcome="error")
    client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2)
    with pytest.raises(openai.BadRequestError): client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=10**6)
    assert _metric(server, "litellama_requests_total", endpoint="chat_completions", outcome="success") == ok + 1
    assert _metric(server, "litellama_requests_total", endpoint="chat_completions", outcome="error") == bad + 1
    assert _metric(server, "litellama_requests_total", endpoint="chat") == 0


# ---------------------------------------------------------------------------------------------------- the schema is real
def test_schemathesis_over_openapi(server):
    """schemathesis fuzzes every operation of the served /openapi.json (all checks, a bounded number of examples): no
    server error, and every response — errors and streams included — matches what the schema declares. (The check that
    every schema-valid request is accepted is left out: whether a prompt plus max_tokens fits the context depends on the
    prompt's token count, which no JSON schema can state.)"""
    import importlib.util
    if importlib.util.find_spec("schemathesis") is None: pytest.skip("schemathesis is not installed (pip install 'litellama[dev]')")
    code = ("import sys; from schemathesis.cli import schemathesis; sys.argv = ['st'] + sys.argv[1:]; sys.exit(schemathesis())")
    args = ["run", server + "/openapi.json", "--checks", "all", "--exclude-checks", "positive_data_acceptance",
            "--phases", "examples,fuzzing", "--max-examples", "10", "--seed", "1", "-H", f"Authorization: Bearer {KEY}",
            "--no-color", "--request-timeout", "60"]
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, cwd=tempfile.mkdtemp())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "generated" in r.stdout
    _wait_idle(server)


# ---------------------------------------------------------------------------------------------------- soak
_POLLER = r"""
import json, sys, time, httpx
url, stop_file, out = sys.argv[1:4]
import os
lat = []
with httpx.Client(timeout=30) as c:
    while not os.path.exists(stop_file):
        t = time.perf_counter(); r = c.get(url + "/health"); lat.append([time.perf_counter() - t, r.status_code])
        time.sleep(0.02)
open(out, "w").write(json.dumps(lat))
"""


def _soak(tmp_path, num_clients: int, rounds: int = 1):
    """`num_clients` concurrent clients (`rounds` times) on the bundled SmolLM2: plain and streamed completions and chats,
    structured outputs (json_schema), forced tool calls, bad requests, clients that disconnect (streamed and not). Every
    good request's output equals its solo run (temperature 0), the bad ones get 4xx with OpenAI's error body, no block is
    leaked, and /health answers within 100 ms throughout. /health is polled from a process of its own, so that what is
    measured is the server, not this test's 64 clients competing with the poller for one interpreter."""
    from pathlib import Path
    if not (Path.home() / ".cache" / "litellama").exists(): pytest.skip("bundled model not converted on this machine")
    import random
    structured = importlib.util.find_spec("xgrammar") is not None
    log = open(tmp_path / "server-soak.log", "w")
    proc, url = _start_server(None, _free_port(), log)
    try:
        topics = ["rivers", "cats", "the moon", "bread", "trains", "music", "snow", "tea"]
        comp = lambda i, **kw: {"model": MODEL, "prompt": f"A short fact about {topics[i]}:", "max_tokens": 6, "temperature": 0, **kw}
        chat = lambda i, **kw: {"model": MODEL, "messages": [{"role": "user", "content": f"One word about {topics[i]}?"}],
                                "max_tokens": 6, "temperature": 0, **kw}
        rf = {"type": "json_schema", "json_schema": {"name": "fact", "strict": True, "schema": {"type": "object", "properties": {
              "ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}}}
        js = lambda i, **kw: chat(i, response_format=rf, max_tokens=12, **kw)
        tool = lambda i, **kw: chat(i, tools=[ADD_TOOL], tool_choice={"type": "function", "function": {"name": "add"}}, max_tokens=40, **kw)
        bad = [{"model": MODEL, "prompt": "x", "max_tokens": 0}, {"model": MODEL, "prompt": "x", "top_k": 2**63},
               {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}}, {"model": MODEL, "prompt": [10**9]},
               {"model": MODEL, "messages": []}, {"model": MODEL, "prompt": "x", "n": MAX_N + 100},
               {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}]
        kinds = {"plain": (C, comp), "stream": (C, comp), "chat": (CH, chat), "chat-stream": (CH, chat)}
        if structured: kinds.update({"json": (CH, js), "tool": (CH, tool), "tool-stream": (CH, tool)})
        reply = lambda kind, r: (r["choices"][0]["text"] if kinds[kind][0] == C else
                                 r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] if kind.startswith("tool")
                                 else r["choices"][0]["message"]["content"])
        t = time.perf_counter()
        with httpx.Client(timeout=120, headers=AUTH) as c:
            solo = {(k.removesuffix("-stream"), i): reply(k, c.post(url + kinds[k][0], json=kinds[k][1](i)).json())
                    for k in kinds if not k.endswith("stream") for i in range(8)}
        for (k, i), v in solo.items():
            if k == "json": assert isinstance(json.loads(v)["ok"], bool), v
            if k == "tool": _check_call("add", json.loads(v))
        t_solo = time.perf_counter() - t
        rng = random.Random(25)
        plan = [rng.choice([*kinds, "bad", "leave", "leave-stream"]) for _ in range(num_clients * rounds)]

        async def client(ac, k, kind):
            i = k % 8
            await asyncio.sleep(rng.random() * 0.5)
            if kind in ("plain", "chat", "json", "tool"):
                path, body = kinds[kind]
                return (kind, i), reply(kind, (await ac.post(url + path, json=body(i))).json())
            if kind.endswith("stream") and not kind.startswith("leave"):
                path, body = kinds[kind]
                text = ""
                async with ac.stream("POST", url + path, json=body(i, stream=True)) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]": continue
                        ch = json.loads(line[6:])["choices"][0]
                        d = ch.get("delta") or {}
                        text += ch.get("text") or d.get("content") or "".join(tc["function"].get("arguments", "") for tc in d.get("tool_calls") or [])
                return ("plain" if kind == "stream" else kind.removesuffix("-stream"), i), text
            if kind == "bad":
                body = bad[k % len(bad)]
                r = await ac.post(url + (CH if "messages" in body else C), json=body)
                return "bad", (r.status_code, set(r.json()["error"]))
            long = comp(i, max_tokens=200, ignore_eos=True, stream=kind == "leave-stream")
            try:
                if kind == "leave": await ac.post(url + C, json=long, timeout=httpx.Timeout(60, read=0.5))
                else:
                    async with ac.stream("POST", url + C, json=long) as r:
                        async for _ in r.aiter_lines(): break
            except httpx.ReadTimeout: pass
            return "left", None

        async def main(part):
            async with httpx.AsyncClient(headers=AUTH, timeout=120, limits=httpx.Limits(max_connections=None)) as ac:
                return await asyncio.gather(*[client(ac, k, kind) for k, kind in part])
        stop_file, lat_file = tmp_path / "stop", tmp_path / "health.json"
        poller = subprocess.Popen([sys.executable, "-c", _POLLER, url, str(stop_file), str(lat_file)])
        t = time.perf_counter()
        try:
            results = []
            for r in range(rounds): results += asyncio.run(main(list(enumerate(plan))[r * num_clients:(r + 1) * num_clients]))
        finally:
            t_run = time.perf_counter() - t
            stop_file.touch(); poller.wait(60)
        health = json.loads(lat_file.read_text())
        for key, got in results:
            if key == "bad": assert got[0] in (400, 404) and got[1] == {"message", "type", "param", "code"}, got
            elif key != "left": assert got == solo[key], (key, got, solo[key])
        lat = sorted(l for l, _ in health)
        print(f"\nsoak: {num_clients} x {rounds} clients in {t_run:.1f} s (solo runs {t_solo:.1f} s); {len(lat)} /health polls: "
              f"median {1000 * lat[len(lat) // 2]:.1f} ms, p99 {1000 * lat[int(len(lat) * 0.99)]:.1f} ms, max {1000 * lat[-1]:.1f} ms")
        assert all(s == 200 for _, s in health) and len(health) > 10
        assert lat[-1] < 0.1, lat[-5:]
        _wait_idle(url)                                      # every block back in the pool
        return t_run
    finally:
        proc.terminate(); proc.wait(30); log.close()


def test_soak_64_clients_bundled_model(tmp_path):
    "The soak of `make test`: 64 clients at once, bounded in time."
    assert _soak(tmp_path, 64) < 60


@pytest.mark.slow      # `make soak`: the long variant, 4 rounds of 64 clients
def test_soak_long_bundled_model(tmp_path):
    assert _soak(tmp_path, 64, rounds=4) < 240


# ---------------------------------------------------------------------------------------------------- structured outputs
def _needs_xgrammar():
    import importlib.util
    if importlib.util.find_spec("xgrammar") is None: pytest.skip("xgrammar is not installed (pip install 'litellama[structured]')")


SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}, "sunny": {"type": "boolean"},
                                           "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "sunny", "rank"], "additionalProperties": False}


def _valid(obj):
    assert set(obj) == {"city", "sunny", "rank"} and obj["city"] in ("Paris", "Rome", "Oslo"), obj
    assert isinstance(obj["sunny"], bool) and isinstance(obj["rank"], int) and 1 <= obj["rank"] <= 9, obj


def test_response_format_json_schema(client):
    "The random model's answers, plain, streamed and batched with free requests, parse and follow the schema."
    _needs_xgrammar()
    rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    kw = dict(model=MODEL, max_tokens=60, temperature=0.9, seed=5)
    r = client.chat.completions.create(messages=MSGS, response_format=rf, n=2, **kw)
    for ch in r.choices: assert ch.finish_reason == "stop"; _valid(json.loads(ch.message.content))
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       client.chat.completions.create(messages=MSGS, response_format=rf, stream=True, **kw) if c.choices)
    _valid(json.loads(streamed))
    c = client.completions.create(prompt="Weather:", extra_body={"response_format": rf}, **kw).choices[0]
    _valid(json.loads(c.text))
    free = client.completions.create(model=MODEL, prompt="Weather:", max_tokens=8, temperature=0).choices[0].text

    async def mixed():
        ac = openai.AsyncOpenAI(base_url=client.base_url, api_key=KEY, max_retries=0, timeout=120)
        try:
            return await asyncio.gather(*[ac.chat.completions.create(messages=MSGS, response_format=rf, **kw) for _ in range(3)],
                                        ac.completions.create(model=MODEL, prompt="Weather:", max_tokens=8, temperature=0))
        finally: await ac.close()
    *structured, plain = asyncio.run(mixed())
    for s in structured: _valid(json.loads(s.choices[0].message.content))
    assert plain.choices[0].text == free                       # requests without a grammar are untouched


def test_response_format_json_object_choice_regex(client, server):
    _needs_xgrammar()
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=80, temperature=0.7, seed=2,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop": assert isinstance(json.loads(r.choices[0].message.content), dict)
    else: assert r.choices[0].message.content.startswith("{")   # cut by max_tokens: still the start of an object
    pick = client.completions.create(model=MODEL, prompt="Pick:", max_tokens=10, temperature=1.0, seed=3,
                                     extra_body={"guided_choice": ["alpha", "beta"]}).choices[0]
    assert pick.text in ("alpha", "beta") and pick.finish_reason == "stop"
    import re
    rx = client.completions.create(model=MODEL, prompt="Code:", max_tokens=10, temperature=1.0, seed=4,
                                   extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"}).choices[0].text
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", rx), rx
    for body in ({"response_format": {"type": "json_schema"}}, {"response_format": {"type": "json_schema", "json_schema":
                  {"name": "x", "schema": {"type": "no-such-type"}}}}, {"guided_choice": ["a"], "guided_regex": "a"}):
        e = httpx.post(server + C, json={**OK, **body}, headers=AUTH, timeout=60)
        assert e.status_code == 400 and e.json()["error"]["param"] == "response_format", e.text
    _wait_idle(server)


def test_json_schema_keeps_the_property_order(client):
    "A `json_schema` answer lists the properties in the schema's order (not alphabetically), through the SDK's `.parse()`."
    _needs_xgrammar()
    from typing import Literal
    from pydantic import BaseModel

    class Verdict(BaseModel):                                   # deliberately not alphabetical
        reasoning: Literal["short", "long"]
        answer: Literal["yes", "no"]
        confidence: bool
        alpha: Literal[1, 2, 3]

    r = client.chat.completions.parse(model=MODEL, messages=MSGS, response_format=Verdict, max_tokens=80, temperature=0)
    text = r.choices[0].message.content
    assert isinstance(r.choices[0].message.parsed, Verdict), text
    assert list(json.loads(text)) == ["reasoning", "answer", "confidence", "alpha"], text


# ---------------------------------------------------------------------------------------------------- reasoning
@pytest.fixture(scope="module")
def thinking_server(model_dir):
    log = open(os.path.join(model_dir, "thinking.log"), "w")
    proc, url = start_server(model_dir, MODEL, log, reasoning_parser="qwen3")
    yield url
    stop_server(proc)
    log.close()


def test_reasoning_content_openai_client(thinking_server):
    """With `--reasoning-parser qwen3` the `<think>` block comes back as `reasoning_content`, plain and streamed, and
    `content` holds the answer only (the tiny model's reply is scripted by a grammar); `enable_thinking` reaches the template."""
    _needs_xgrammar()
    c = openai.OpenAI(base_url=thinking_server + "/v1", api_key=KEY, max_retries=0, timeout=120)
    script = {"guided_regex": "<think>\n(Four|It is 4)\n</think>\n\n(yes|no)"}
    kw = dict(model=MODEL, messages=MSGS, max_tokens=40, temperature=0, extra_body=script)
    m = c.chat.completions.create(**kw).choices[0].message
    assert m.model_extra["reasoning_content"] in ("Four\n", "It is 4\n") and m.content in ("yes", "no"), m
    thought, answer = "", ""
    for ch in c.chat.completions.create(stream=True, **kw):
        d = ch.choices[0].delta if ch.choices else None
        thought += (d.model_extra or {}).get("reasoning_content") or "" if d else ""
        answer += d.content or "" if d else ""
    assert (thought, answer) == (m.model_extra["reasoning_content"], m.content)
    plain = c.chat.completions.create(**{**kw, "extra_body": {"guided_regex": "(yes|no)", "chat_template_kwargs": {"enable_thinking": False}}})
    assert plain.choices[0].message.model_extra["reasoning_content"] is None and plain.choices[0].message.content in ("yes", "no")


# ---------------------------------------------------------------------------------------------------- responses
def _events(stream):
    "The streamed events, checked for order: numbered 0, 1, …, created and in_progress first, a final response last."
    evs = list(stream)
    assert [e.sequence_number for e in evs] == list(range(len(evs)))
    assert [e.type for e in evs[:2]] == ["response.created", "response.in_progress"], [e.type for e in evs]
    assert evs[-1].type in ("response.completed", "response.incomplete"), evs[-1]
    return evs


def test_responses_openai_client(client):
    """`responses.create` answers what the same chat answers (instructions as the system message), plain and streamed,
    with the Responses events in order and the token counts of the chat."""
    kw = dict(model=MODEL, input="What is the capital of France?", instructions="Be brief.", max_output_tokens=12, temperature=0)
    chat = client.chat.completions.create(model=MODEL, max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}])
    r = client.responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.output_text == chat.choices[0].message.content
    assert (r.usage.input_tokens, r.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed"), r.status
    assert [o.type for o in r.output] == ["message"] and r.store is False
    evs = _events(client.responses.create(stream=True, **kw))
    types = [e.type for e in evs]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"], types
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"], types
    assert "".join(e.delta for e in evs if e.type == "response.output_text.delta") == r.output_text
    final = evs[-1].response
    assert final.output_text == r.output_text and final.usage.output_tokens == r.usage.output_tokens
    items = [e for e in evs if e.type == "response.output_text.done"]
    assert items[0].text == r.output_text and items[0].item_id == final.output[0].id


def test_responses_input_items_match_chat(client):
    "Message items (with parts), an earlier call and its output become the chat the template renders."
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]
    msgs = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                   "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    r = client.responses.create(model=MODEL, input=items, max_output_tokens=6, temperature=0)
    c = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=6, temperature=0)
    assert r.output_text == c.choices[0].message.content and r.usage.input_tokens == c.usage.prompt_tokens


def test_responses_json_schema_and_tools(client):
    "`text.format` json_schema holds plain and streamed; a named function comes back as a `function_call` item."
    _needs_xgrammar()
    fmt = {"format": {"type": "json_schema", "name": "weather", "schema": SCHEMA, "strict": True}}
    r = client.responses.create(model=MODEL, input="Weather?", text=fmt, max_output_tokens=60, temperature=0)
    assert r.status == "completed", r
    _valid(json.loads(r.output_text))
    evs = _events(client.responses.create(model=MODEL, input="Weather?", text=fmt, max_output_tokens=60, temperature=0.8, stream=True))
    _valid(json.loads("".join(e.delta for e in evs if e.type == "response.output_text.delta")))
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Rome"]}},
                                                                     "required": ["city"], "additionalProperties": False}}
    kw = dict(model=MODEL, input="Weather in Oslo?", tools=[tool], tool_choice={"type": "function", "name": "get_weather"},
              max_output_tokens=40, temperature=0)
    call = client.responses.create(**kw).output[-1]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_"), call
    assert json.loads(call.arguments)["city"] in ("Oslo", "Rome")
    evs = _events(client.responses.create(stream=True, **kw))
    done = [e for e in evs if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments and done[0].name == "get_weather"
    assert "".join(e.delta for e in evs if e.type == "response.function_call_arguments.delta") == call.arguments


def test_responses_refusals(client, server):
    "No server-side state: `store: true` and `previous_response_id` are refused in one line; bad fields are 400s naming them."
    for kw, param, needle in ((dict(store=True), "store", "keeps no responses"),
                              (dict(previous_response_id="resp_x"), "previous_response_id", "'resp_x'"),
                              (dict(max_output_tokens=0), "max_output_tokens", "max_output_tokens must be at least 1"),
                              (dict(temperature=-1.0), "temperature", "temperature"),
                              (dict(text={"format": {"type": "json_schema", "name": "x"}}), "text", "needs a schema")):
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model=MODEL, input="hi", **kw)
        err = e.value.body
        assert err["param"] == param and needle in err["message"] and "\n" not in err["message"], err
    e = httpx.post(server + "/v1/responses", json={"model": MODEL, "input": []}, headers=AUTH, timeout=60)
    assert e.status_code == 400 and e.json()["error"]["param"] == "input", e.text
    e = httpx.post(server + "/v1/responses", json={"model": "nope", "input": "x"}, headers=AUTH, timeout=60)
    assert e.status_code == 404 and e.json()["error"]["code"] == 404, e.text  # vLLM's shape
    _wait_idle(server)


def test_responses_reasoning_items(thinking_server):
    "With a reasoning parser, the chat's `reasoning_content` and `content` are the response's reasoning and message items."
    c = openai.OpenAI(base_url=thinking_server + "/v1", api_key=KEY, max_retries=0, timeout=120)
    for prompt in ("Think about 2+2.", "Why is the sky blue?"):
        m = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=16, temperature=0).choices[0].message
        r = c.responses.create(model=MODEL, input=prompt, max_output_tokens=16, temperature=0)
        thought = [o.content[0].text for o in r.output if o.type == "reasoning"]
        assert thought == ([m.model_extra["reasoning_content"]] if m.model_extra.get("reasoning_content") else []), r.output
        assert r.output_text == (m.content or "")
        evs = _events(c.responses.create(model=MODEL, input=prompt, max_output_tokens=16, temperature=0, stream=True))
        assert [o.type for o in evs[-1].response.output] == [o.type for o in r.output]
        assert "".join(e.delta for e in evs if e.type == "response.reasoning_text.delta") == "".join(thought)


# ---------------------------------------------------------------------------------------------------- embeddings
@pytest.fixture(scope="module")
def pooling_server(model_dir):
    log = open(os.path.join(model_dir, "pooling.log"), "w")
    proc, url = start_server(model_dir, MODEL, log, pooling="mean")
    yield url
    stop_server(proc)
    log.close()


def test_embeddings_openai_client(pooling_server, model_dir):
    """`embeddings.create` (strings and token ids, batched, float and base64, `dimensions`, unnormalized) equals HF
    transformers' mean-pooled last hidden states, also while a generation streams on the same server."""
    import base64
    import numpy as np, torch
    from transformers import AutoModel, AutoTokenizer
    c = openai.OpenAI(base_url=pooling_server + "/v1", api_key=KEY, max_retries=0, timeout=120)
    texts, ids = ["Once upon a time", "The capital of France is Paris, the capital of Italy is Rome."], [5, 17, 300, 2]
    hf, tok = AutoModel.from_pretrained(model_dir, torch_dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(model_dir)
    with torch.no_grad():
        ref = torch.stack([hf(torch.tensor([p])).last_hidden_state[0].mean(0) for p in [tok(t)["input_ids"] for t in texts] + [ids]])
    r = c.embeddings.create(model=MODEL, input=texts, extra_body={"normalize": False})
    got = torch.tensor([d.embedding for d in r.data])
    torch.testing.assert_close(got, ref[:2], atol=1e-5, rtol=1e-5)
    assert r.usage.prompt_tokens == sum(len(tok(t)["input_ids"]) for t in texts)
    one = c.embeddings.create(model=MODEL, input=ids, dimensions=8, encoding_format="base64")
    v = torch.tensor(np.frombuffer(base64.b64decode(one.data[0].embedding), "<f4").copy())
    torch.testing.assert_close(v, ref[2, :8] / ref[2, :8].norm(), atol=1e-5, rtol=1e-5)

    async def mixed():
        ac = openai.AsyncOpenAI(base_url=pooling_server + "/v1", api_key=KEY, max_retries=0, timeout=120)
        try:
            gen = ac.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=32, temperature=0)
            return await asyncio.gather(gen, *[ac.embeddings.create(model=MODEL, input=[t], extra_body={"normalize": False}) for t in texts])
        finally: await ac.close()
    chat, *embs = asyncio.run(mixed())
    assert chat.choices[0].message.content is not None
    torch.testing.assert_close(torch.tensor([e.data[0].embedding for e in embs]), ref[:2], atol=1e-5, rtol=1e-5)
    for body, param, needle in (({"input": []}, "input", "at least one"), ({"input": "x", "dimensions": 0}, "dimensions", "got 0"),
                                ({"input": [10**9]}, "input", "token ids")):
        e = httpx.post(pooling_server + "/v1/embeddings", json={"model": MODEL, **body}, headers=AUTH, timeout=60)
        assert e.status_code == 400 and e.json()["error"]["param"] == param and needle in e.json()["error"]["message"], e.text


def test_embeddings_refused_without_pooling(client):
    "A model without a pooling config, served without `pooling`, refuses embeddings in one line."
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="hi")
    assert "declares no pooling" in e.value.body["message"] and "\n" not in e.value.body["message"]


# ---------------------------------------------------------------------------------------------------- a scripted reasoner
# A tiny Llama whose greedy reply is fixed (tests/scripted_checkpoint.py): `<think>Paris is the capital</think>`, then
# `{"city": "Rome"}`. The `open_think` template kwarg ends the prompt with `<think>`: the reply then holds only the closing tag.
from scripted_checkpoint import ANSWER, REASONING, SCRIPT, THINK_OPENED, make_scripted_checkpoint

Q = [{"role": "user", "content": "Which city?"}]


@pytest.fixture(scope="module")
def scripted_dir():
    return make_scripted_checkpoint(tempfile.mkdtemp(prefix="litellama-scripted-"))


def test_scripted_checkpoint_is_what_hf_says(scripted_dir):
    "HF transformers' greedy reply on the scripted checkpoint is the script, from either end of the template."
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(scripted_dir)
    hf = AutoModelForCausalLM.from_pretrained(scripted_dir, dtype=torch.float32).eval()
    for kw, skip in (({}, 1), ({THINK_OPENED: True}, 2)):
        ids = tok.apply_chat_template(Q, add_generation_prompt=True, tokenize=False, **kw)
        ids = tok(ids, add_special_tokens=False)["input_ids"]
        out = hf.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False)[0, len(ids):]
        assert [tok.decode([t]) for t in out] == SCRIPT[skip:], out


@pytest.fixture(scope="module", params=["qwen3", "deepseek_r1"])
def scripted(request, scripted_dir):
    "A server on the scripted checkpoint with each reasoning parser: `(parser name, openai client)`."
    log = open(os.path.join(scripted_dir, f"{request.param}.log"), "w")
    proc, url = start_server(scripted_dir, MODEL, log, reasoning_parser=request.param, num_kv_blocks=64)
    yield request.param, openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    stop_server(proc)
    log.close()


def _reasoned(c, stream=False, **kw):
    "One chat on the scripted server: `(reasoning_content, content, [(name, arguments)], finish_reason)`, plain or streamed."
    kw = dict(model=MODEL, messages=Q, max_tokens=30, temperature=0, **kw)
    if not stream:
        ch = c.chat.completions.create(**kw).choices[0]
        m = ch.message
        return m.model_extra["reasoning_content"], m.content, [(t.function.name, t.function.arguments) for t in m.tool_calls or []], ch.finish_reason
    thought, answer, calls, reason = "", "", {}, None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices: continue
        d, reason = chunk.choices[0].delta, chunk.choices[0].finish_reason or reason
        thought += (d.model_extra or {}).get("reasoning_content") or ""
        answer += d.content or ""
        for t in d.tool_calls or []:
            name, args = calls.get(t.index, ("", ""))
            calls[t.index] = (name + (t.function.name or ""), args + (t.function.arguments or ""))
    return thought or None, answer or None, [calls[i] for i in sorted(calls)], reason


OPENED = {"chat_template_kwargs": {THINK_OPENED: True}}


@pytest.mark.parametrize("opened", [False, True], ids=["reply-opens", "prompt-opens"])
def test_scripted_reasoning_content(scripted, opened):
    "`reasoning_content` and `content` are exactly the script's, plain and streamed, whoever opened the block."
    _, c = scripted
    for stream in (False, True):
        got = _reasoned(c, stream, extra_body=OPENED if opened else {})
        assert got == (REASONING, ANSWER, [], "stop"), (stream, got)


@pytest.mark.parametrize("opened", [False, True], ids=["reply-opens", "prompt-opens"])
def test_scripted_json_schema_after_reasoning(scripted, opened):
    """The grammar starts after `</think>`: the reasoning is the script's (a grammar from the start would forbid `<think>`
    and the words), and the answer follows the schema even where the model wants otherwise (Oslo, not Rome)."""
    _needs_xgrammar()
    _, c = scripted
    extra = OPENED if opened else {}
    for city, answer in (({"type": "string"}, ANSWER), ({"enum": ["Oslo"]}, '{"city": "Oslo"}')):
        schema = {"type": "object", "properties": {"city": city}, "required": ["city"], "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
        for stream in (False, True):
            got = _reasoned(c, stream, response_format=rf, extra_body=extra)
            assert got == (REASONING, answer, [], "stop"), (stream, got)
            assert json.loads(got[1])["city"] in ("Rome", "Oslo")


def test_scripted_tool_call_after_reasoning(scripted):
    "A named tool's grammar also waits for `</think>`: the reasoning comes back whole and the answer parses into `tool_calls`."
    _needs_xgrammar()
    _, c = scripted
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}
    kw = dict(tools=[tool], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for stream in (False, True):
        thought, content, calls, reason = _reasoned(c, stream, **kw)
        assert (thought, content, calls) == (REASONING, None, [("get_weather", ANSWER)]), (stream, thought, content, calls)
        assert json.loads(calls[0][1]) == {"city": "Rome"} and reason == "stop"


# ---------------------------------------------------------------------------------------------------- embeddings beside generation
@pytest.fixture(scope="module")
def llama_dir():
    import torch
    from litellama.testing.checkpoints import make_random_checkpoint
    d = tempfile.mkdtemp(prefix="litellama-llama-")
    make_random_checkpoint("tiny-llama", d, dtype=torch.float32)
    return d


@pytest.fixture(scope="module", params=[("tiny-qwen3", "last"), ("tiny-llama", "last"), ("tiny-llama", "mean")],
                ids=lambda p: "-".join(p))
def pooled(request, model_dir, llama_dir):
    "A server of each (model, pooling) the mean-pooled Qwen3 server above does not cover: `(checkpoint dir, pooling, url)`."
    like, how = request.param
    d = model_dir if like == "tiny-qwen3" else llama_dir
    log = open(os.path.join(d, f"pooled-{how}.log"), "w")
    proc, url = start_server(d, MODEL, log, pooling=how, num_kv_blocks=128)
    yield d, how, url
    stop_server(proc)
    log.close()


def test_embeddings_beside_generation(pooled):
    """Embeddings requested while chats and completions stream on the same server equal HF transformers' pooled last
    hidden states (fp32, 1e-5), and the generations are what they are alone."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    d, how, url = pooled
    texts = ["Once upon a time", "The capital of France is Paris.", "a", "Continuous batching lets requests join."]
    hf, tok = AutoModel.from_pretrained(d, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(d)
    with torch.no_grad():
        hs = [hf(torch.tensor([tok(t)["input_ids"]])).last_hidden_state[0] for t in texts]
    ref = torch.stack([h[-1] if how == "last" else h.mean(0) for h in hs])
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    gen = dict(max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    alone_chat = c.chat.completions.create(model=MODEL, messages=MSGS, **gen).choices[0].message.content
    alone_text = c.completions.create(model=MODEL, prompt="Hello, world", **gen).choices[0].text

    async def mixed():
        ac = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)

        async def streamed_chat():
            return "".join([ch.choices[0].delta.content or "" async for ch in
                            await ac.chat.completions.create(model=MODEL, messages=MSGS, stream=True, **gen) if ch.choices])

        async def embed(i):
            await asyncio.sleep(0.05 * i)                       # spread over the generations' steps
            return await ac.embeddings.create(model=MODEL, input=texts[i % 2:][:3] if i % 2 else texts, extra_body={"normalize": False})
        try:
            return await asyncio.gather(streamed_chat(), ac.completions.create(model=MODEL, prompt="Hello, world", **gen),
                                        *[embed(i) for i in range(4)])
        finally: await ac.close()
    chat, text, *embs = asyncio.run(mixed())
    assert chat == alone_chat and text.choices[0].text == alone_text
    for i, e in enumerate(embs):
        want = ref[1:4] if i % 2 else ref
        torch.testing.assert_close(torch.tensor([v.embedding for v in e.data]), want, atol=1e-5, rtol=1e-5)
