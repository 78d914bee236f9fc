"""`litellama serve` with vLLM's habits: a `vllm serve` line parses into the engine's and the server's options, a flag
litellama refuses is one stderr line and status 2, and a server started from the command line answers to every name
`--served-model-name` gives it."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from litellama.config import EngineArgs
from litellama.entrypoints.cli import build_parser, serve_kwargs
from litellama.testing.checkpoints import make_random_checkpoint
from litellama.testing.hf_cache import write_hf_cache

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi"), pytest.importorskip("uvicorn")

LITELLAMA = str(Path(sys.executable).parent / "litellama")


def test_vllm_line_parses_into_engine_args_and_serve_kwargs():
    line = (
        "serve Qwen/Qwen3-8B --enable-auto-tool-choice --tool-call-parser hermes --served-model-name a b "
        "--no-enable-prefix-caching --max-model-len 512"
    )
    args = build_parser().parse_args(line.split())
    assert EngineArgs.from_cli_args(args) == EngineArgs(model=None, enable_prefix_caching=False, max_model_len=512)
    kw = serve_kwargs(args)
    assert kw["model_dir"] == "Qwen/Qwen3-8B"  # passed through as typed: the engine resolves hub ids
    assert kw["served_model_name"] == ["a", "b"]
    assert (kw["enable_auto_tool_choice"], kw["tool_call_parser"]) == (True, "hermes")
    assert (kw["enable_prefix_caching"], kw["max_model_len"]) == (False, 512)
    assert "model" not in kw
    plain = serve_kwargs(build_parser().parse_args(["serve"]))
    assert (plain["model_dir"], plain["enable_auto_tool_choice"], plain["generation_config"]) == (None, False, "auto")


def test_unsupported_vllm_flag_is_one_line_and_status_2():
    r = subprocess.run([LITELLAMA, "serve", "Qwen/Qwen3-8B", "--trust-remote-code"], capture_output=True, text=True)
    assert r.returncode == 2, r
    assert r.stderr.splitlines() == [
        "litellama: error: --trust-remote-code: litellama runs no checkpoint code; the architectures it serves are "
        "built in"
    ], r.stderr
    r = subprocess.run([LITELLAMA, "serve", "--pipeline-parallel-size", "2"], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "-tp" in r.stderr, r.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def two_name_server(tmp_path_factory):
    """A vLLM user's line, unchanged: `litellama serve org/tiny --enable-auto-tool-choice --tool-call-parser qwen3_coder
    --served-model-name a b`, the hub id read from a Hugging Face cache with the network off (a tiny random Qwen3)."""
    tmp = tmp_path_factory.mktemp("vllm_cli")
    ckpt = make_random_checkpoint("tiny-qwen3", tmp / "ckpt", dtype=torch.float32)
    write_hf_cache(ckpt, tmp / "cache", "org/tiny")
    port = _free_port()
    cmd = [LITELLAMA, "serve", "org/tiny", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
    cmd += ["--served-model-name", "a", "b", "--port", str(port)]
    cmd += ["--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "64", "--enable-chunked-prefill"]
    log = open(tmp / "server.log", "w")
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp / "cache")}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {(tmp / 'server.log').read_text()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        else:
            raise RuntimeError("server did not start within 60 s")
        yield url, tmp / "server.log"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_served_model_names(two_name_server):
    url, log = two_name_server
    models = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["a"]
    body = {"prompt": "Hello", "max_tokens": 3, "temperature": 0}
    by_b = httpx.post(url + "/v1/completions", json={**body, "model": "b"}, timeout=60)
    assert by_b.status_code == 200, by_b.text
    by_a = httpx.post(url + "/v1/completions", json={**body, "model": "a"}, timeout=60).json()
    assert by_b.json()["choices"][0]["text"] == by_a["choices"][0]["text"]
    assert httpx.post(url + "/v1/completions", json={**body, "model": "c"}, timeout=60).status_code == 404
    assert "note: --enable-chunked-prefill is ignored" in log.read_text()
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    chat = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "max_tokens": 3}
    r = httpx.post(url + "/v1/chat/completions", json=chat, timeout=60)  # `auto`: the flag and the parser are given
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant", r.text
