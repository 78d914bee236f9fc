"""LoRA through `litellama serve` and the openai client: a request's `model` names an adapter or the base model, a
mixed batch gives each prompt HF's greedy tokens with its adapter merged by PEFT, and adapters load and unload while
requests run."""

import asyncio
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the server subprocess inherits it: LoRA kernels in the interpreter

pytest.importorskip("fastapi"), pytest.importorskip("uvicorn"), pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("peft")

from server_helpers import KEY, start_server, stop_server  # pytest puts tests/ on the path
from test_lora import MAX_TOKENS, hf_greedy, write_adapters
from transformers import AutoTokenizer

from litellama.engine.detokenizer import IncrementalDetokenizer
from litellama.testing.checkpoints import make_random_checkpoint

AUTH = {"Authorization": f"Bearer {KEY}"}
BASE = "tiny"


def _serve(tmp_path_factory, name, **opts):
    "Serve tiny Qwen3 with the adapters `qv` and `mlp_rs` given at start and engine `opts`; yield (url, base, reqs)."
    tmp = tmp_path_factory.mktemp(name)
    base = make_random_checkpoint("tiny-qwen3", tmp / "base", dtype=torch.float32)
    reqs = write_adapters(base, tmp)
    log = open(tmp / "server.log", "w")
    modules = {"qv": str(reqs["qv"].path), "mlp_rs": str(reqs["mlp_rs"].path)}
    proc, url = start_server(
        base, BASE, log, enable_lora=True, max_loras=2, max_lora_rank=16, block_size=4, lora_modules=modules, **opts
    )
    yield url, base, reqs
    stop_server(proc)
    log.close()


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    "A small pool (preemption), 12-token steps (chunked prefill), three adapters in the CPU cache."
    yield from _serve(tmp_path_factory, "lora-server", num_kv_blocks=14, max_cpu_loras=3, max_num_batched_tokens=12,
                      max_num_seqs=8)  # fmt: skip


def _metric(url, name):
    "The value of the counter `name` on /metrics."
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.split("{")[0].split(" ")[0] in (name, name + "_total"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def _client(url):
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)


async def _complete(c, model, prompt, max_tokens=MAX_TOKENS):
    r = await c.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0)
    return r.choices[0].text


def _want(base, reqs, name, prompt, max_new_tokens=MAX_TOKENS):
    """HF's greedy tokens for `prompt` with adapter `name` merged (the base model for `BASE`), as the server's text:
    detokenized after the prompt's own tokens, as the engine does."""
    toks = hf_greedy(base, None if name == BASE else reqs[name].path, prompt, max_new_tokens)
    d = IncrementalDetokenizer(AutoTokenizer.from_pretrained(base), prompt)
    for t in toks:
        d.add_token(t)
    return d.take_delta(True)


def test_models_lists_the_adapters(lora_server):
    url, _, reqs = lora_server
    data = httpx.get(url + "/v1/models", headers=AUTH, timeout=10).json()["data"]
    assert [(m["id"], m["parent"]) for m in data] == [(BASE, None), ("qv", BASE), ("mlp_rs", BASE)]
    assert data[1]["root"] == str(reqs["qv"].path)


def test_mixed_batch_over_http_equals_merged_hf(lora_server):
    url, base, reqs = lora_server
    g = torch.Generator().manual_seed(11)
    shared = torch.randint(0, 200, (12,), generator=g).tolist()
    names = ["qv", "qv", BASE, "mlp_rs", BASE, "mlp_rs"]
    prompts = [torch.randint(0, 200, (int(n),), generator=g).tolist() for n in torch.randint(5, 19, (len(names),))]
    prompts[0], prompts[1] = shared + [3], shared + [7, 9]
    hits, preempted = _metric(url, "litellama_prefix_cache_hit_tokens"), _metric(url, "litellama_num_preemptions")

    async def main():
        c = _client(url)
        first = await _complete(c, "qv", prompts[0])  # its blocks are cached before the batch
        rest = await asyncio.gather(*(_complete(c, n, p) for n, p in zip(names[1:], prompts[1:])))
        return [first, *rest]

    got = asyncio.run(main())
    want = [_want(base, reqs, n, p) for n, p in zip(names, prompts)]
    assert got == want
    assert sum(w != _want(base, reqs, BASE, p) for n, p, w in zip(names, prompts, want) if n != BASE) >= 2
    assert _metric(url, "litellama_prefix_cache_hit_tokens") > hits
    assert _metric(url, "litellama_num_preemptions") > preempted


LONG = 400  # tokens of the request that runs while adapters change: enough to outlast both changes


@pytest.fixture(scope="module")
def roomy_lora_server(tmp_path_factory):
    "A cache that holds a long request: it runs while adapters come and go."
    yield from _serve(tmp_path_factory, "lora-server-roomy", num_kv_blocks=128)


def test_load_and_unload_while_requests_run(roomy_lora_server):
    url, base, reqs = roomy_lora_server
    long_prompt = torch.randint(0, 200, (9,), generator=torch.Generator().manual_seed(5)).tolist()
    post = lambda path, body: httpx.post(url + path, json=body, headers=AUTH, timeout=60)

    async def main():
        c = _client(url)
        running = asyncio.create_task(_complete(c, "mlp_rs", long_prompt, LONG))  # runs through both changes
        await asyncio.sleep(0.5)
        r = await asyncio.to_thread(post, "/v1/load_lora_adapter", {"lora_name": "ko", "lora_path": str(reqs["ko"].path)})
        assert r.status_code == 200, r.text
        assert not running.done()  # the long request is still generating through its adapter
        r = await asyncio.to_thread(post, "/v1/unload_lora_adapter", {"lora_name": "mlp_rs"})
        assert r.status_code == 200, r.text
        assert not running.done()  # its adapter unloaded while it runs
        ko = await _complete(c, "ko", long_prompt)
        with pytest.raises(openai.NotFoundError, match="The model `mlp_rs` does not exist"):
            await _complete(c, "mlp_rs", long_prompt)
        return await running, ko

    long_text, ko = asyncio.run(main())
    assert long_text == _want(base, reqs, "mlp_rs", long_prompt, LONG)
    assert ko == _want(base, reqs, "ko", long_prompt)
    ids = [m["id"] for m in httpx.get(url + "/v1/models", headers=AUTH, timeout=10).json()["data"]]
    assert ids == [BASE, "qv", "ko"]
    r = post("/v1/load_lora_adapter", {"lora_name": "mlp_rs", "lora_path": str(reqs["mlp_rs"].path)})
    assert r.status_code == 200  # loaded again under a new id, it serves as before
    assert asyncio.run(_complete(_client(url), "mlp_rs", long_prompt)) == _want(base, reqs, "mlp_rs", long_prompt)


def test_adapter_errors_in_one_line(lora_server, tmp_path):
    url, _, reqs = lora_server
    post = lambda path, body: httpx.post(url + path, json=body, headers=AUTH, timeout=60)
    r = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path / "nowhere")})
    assert r.status_code == 400 and "no adapter_config.json in" in r.json()["error"]["message"]
    r = post("/v1/load_lora_adapter", {"lora_name": "qv", "lora_path": str(reqs["qv"].path)})
    assert r.status_code == 400 and r.json()["error"]["message"] == "the model `qv` is already served"
    r = post("/v1/unload_lora_adapter", {"lora_name": "zz"})
    assert r.status_code == 404 and r.json()["error"]["message"] == "no LoRA adapter named `zz` is loaded"
    r = post("/v1/load_lora_adapter", {"lora_name": "x"})
    assert r.status_code == 400
    assert httpx.get(url + "/health", timeout=10).json()["status"] == "ok"
