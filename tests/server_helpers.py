"""One way to run `litellama serve` for the end-to-end server tests: in a subprocess (float32, CPU), ready once
`/health` answers, stopped with SIGTERM (then killed if it hangs)."""
import os, socket, subprocess, sys, time

KEY = "sk-test"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def start_server(model_dir, model_name, log, port=None, num_kv_blocks=256, extra_args="", **serve_kw):
    """Start `litellama.entrypoints.openai.api_server.serve` on `model_dir` (None: the bundled model) in a subprocess; return `(proc, url)`
    once /health answers. `serve_kw` go in as literals, `extra_args` as source (e.g. `limits=ServerLimits(...)`)."""
    import httpx
    port = port or free_port()
    model_dir = None if model_dir is None else str(model_dir)
    kw = "".join(f", {k}={v!r}" for k, v in serve_kw.items()) + (f", {extra_args}" if extra_args else "")
    code = ("import sys; from litellama.entrypoints.openai.api_server import serve; from litellama.entrypoints.openai.protocol import ServerLimits; "
            f"sys.exit(serve({model_dir!r}, host='127.0.0.1', port={port}, api_key={KEY!r}, "
            f"served_model_name={model_name!r}{kw}, dtype='float32', device='cpu', num_kv_blocks={num_kv_blocks}))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None: raise RuntimeError(f"server exited with {proc.returncode}; log: {log.name}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200: return proc, url
        except httpx.HTTPError: pass
        time.sleep(0.1)
    proc.kill(); raise RuntimeError("server did not start within 60 s")


def stop_server(proc):
    "SIGTERM, then SIGKILL after 30 s."
    proc.terminate()
    try: proc.wait(30)
    except subprocess.TimeoutExpired: proc.kill()


def served(model_dir, model_name, **serve_kw):
    "Run a server on `model_dir` (log in `model_dir/server.log`); yield its URL once /health answers, then stop it."
    log = open(os.path.join(model_dir, "server.log"), "w")
    proc, url = start_server(model_dir, model_name, log, **serve_kw)
    try: yield url
    finally:
        stop_server(proc)
        log.close()
