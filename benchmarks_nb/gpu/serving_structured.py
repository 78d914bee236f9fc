"""Serving with structured outputs on one GPU: `litellama serve` on a random qwen3-0.6b checkpoint (bf16), loaded with
Poisson arrivals (`bench_serving`) at rate inf and one finite rate, once with plain requests only and once with 20 % of
them asking for `response_format` `json_schema` (the same prompts, the same requests picked); the two kinds of run
alternate, then repeat in the other order. Checks that every structured answer that ended its grammar parses and follows
the schema, and records /health latency while the server is loaded.

    PYTHONPATH=. python3 benchmarks_nb/gpu/serving_structured.py $OUT              # on the GPU: writes $OUT/serving_structured.json
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/serving_structured.py /tmp/out --dry-run   # tiny shapes on the CPU

The GPU image has no fastapi, uvicorn, pydantic, xgrammar, prometheus-client or httpx: they are installed first from the
wheels in `.wheels/` (pip, no index), and the outcome is recorded.
"""

import datetime, json, os, socket, statistics, subprocess, sys, threading, time, traceback
from pathlib import Path

T0 = time.perf_counter()
GUARD_S = 118  # the whole script, however it goes
DRY = "--dry-run" in sys.argv
OUT = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", ".")))
NAME = "serving_structured"
LIKE = "tiny-qwen3" if DRY else "qwen3-0.6b"
NUM_REQUESTS = 8 if DRY else 96
PROMPT_LEN = 16 if DRY else 256
MAX_TOKENS = 8 if DRY else 128
RATES = (float("inf"), 4.0) if DRY else (float("inf"), 16.0)
FRACTION = 0.2
PKGS = [
    "fastapi",
    "starlette",
    "uvicorn",
    "click",
    "h11",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "annotated-doc",
    "anyio",
    "idna",
    "opentelemetry-api",
    "prometheus-client",
    "xgrammar",
    "apache-tvm-ffi",
    "httpx",
    "httpcore",
    "certifi",
]
RES = {"errors": {}, "runs": [], "checks": {}}
PROC = None


def elapsed():
    return time.perf_counter() - T0


def write():
    OUT.mkdir(parents=True, exist_ok=True)
    RES["wall_s"] = round(elapsed(), 1)
    (OUT / f"{NAME}.json").write_text(json.dumps(RES, indent=1, default=str))


def stop_server():
    global PROC
    if PROC is not None and PROC.poll() is None:
        PROC.terminate()
        try:
            PROC.wait(10)
        except subprocess.TimeoutExpired:
            PROC.kill()
    PROC = None


def on_guard():
    "The global time guard: record, stop the server, write what there is, leave."
    RES["errors"]["time_guard"] = f"stopped at {GUARD_S} s"
    try:
        stop_server()
    finally:
        write()
        print(f"time guard: stopped after {elapsed():.0f} s; partial results in {OUT / (NAME + '.json')}", flush=True)
        os._exit(0)


def part(name):
    "Run one part now; record its error and go on."

    def wrap(fn):
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:
            RES["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        RES.setdefault("part_seconds", {})[name] = round(time.perf_counter() - t, 2)
        return fn

    return wrap


GUARD = threading.Timer(GUARD_S if not DRY else 600, on_guard)  # the interpreter is slow: a loose guard on the CPU
GUARD.daemon = True
GUARD.start()
import torch


@part("meta")
def _():
    import triton, transformers

    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        commit = "unknown"
    RES.update(
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() and not DRY else "cpu (dry run)",
        torch=torch.__version__,
        triton=triton.__version__,
        transformers=transformers.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        commit=commit,
        command=" ".join([sys.executable, *sys.argv]),
        shape=LIKE,
        num_requests=NUM_REQUESTS,
        prompt_len=PROMPT_LEN,
        max_tokens=MAX_TOKENS,
        rates=[str(r) for r in RATES],
        structured_fraction=FRACTION,
    )


@part("install")
def _():
    "The server's dependencies from `.wheels/` when they are missing (the GPU image has none of them)."
    import importlib.util

    missing = [
        m
        for m in ("fastapi", "uvicorn", "pydantic", "xgrammar", "prometheus_client", "httpx")
        if importlib.util.find_spec(m) is None
    ]
    RES["install"] = {"missing_before": missing, "packages": PKGS}
    if not missing:
        RES["install"]["status"] = "nothing to install"
        return
    wheels = Path(__file__).resolve().parents[2] / ".wheels"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels)]
    r = subprocess.run(pip + PKGS, capture_output=True, text=True, timeout=60)
    RES["install"].update(
        status="ok" if r.returncode == 0 else f"pip failed with {r.returncode}", pip_tail=(r.stdout + r.stderr)[-1500:]
    )
    if (
        r.returncode != 0
    ):  # e.g. an externally managed Python: every package (the list is complete) into a folder of its own
        site = "/tmp/litellama-serving-structured-site"
        r = subprocess.run(pip + ["--no-deps", "--target", site] + PKGS, capture_output=True, text=True, timeout=60)
        RES["install"].update(
            fallback=f"--no-deps --target {site}: " + ("ok" if r.returncode == 0 else f"failed with {r.returncode}"),
            fallback_tail=(r.stdout + r.stderr)[-1500:],
        )
        sys.path.insert(0, site)
        os.environ["PYTHONPATH"] = os.pathsep.join([site, os.environ.get("PYTHONPATH", "")])  # the server's process too
    importlib.invalidate_caches()
    still = [m for m in missing if importlib.util.find_spec(m) is None]
    RES["install"]["missing_after"] = still
    if still:
        raise RuntimeError(f"still missing after pip install: {still}")


def validate(obj, schema):
    "Does `obj` follow `schema` (the subset `BENCH_SCHEMA` uses: object, string, integer, array, required, no extras)?"
    t = schema.get("type")
    if t == "object":
        props = schema.get("properties", {})
        return (
            isinstance(obj, dict)
            and all(k in obj for k in schema.get("required", ()))
            and (schema.get("additionalProperties", True) or set(obj) <= set(props))
            and all(validate(v, props[k]) for k, v in obj.items() if k in props)
        )
    if t == "string":
        return isinstance(obj, str)
    if t == "integer":
        return isinstance(obj, int) and not isinstance(obj, bool)
    if t == "array":
        return isinstance(obj, list) and all(validate(v, schema.get("items", {})) for v in obj)
    return True


URL = None


@part("server")
def _():
    global PROC, URL
    from litellama.testing.checkpoints import make_random_checkpoint

    path = Path("/tmp/litellama-serving-structured") / LIKE
    t = time.perf_counter()
    if not (path / "config.json").exists():
        make_random_checkpoint(LIKE, path, dtype=torch.float32 if DRY else torch.bfloat16)
    RES["checkpoint_s"] = round(time.perf_counter() - t, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dev, dt = ("cpu", "float32") if DRY else ("cuda", "bfloat16")
    code = (
        f"import sys; from litellama.entrypoints.openai.api_server import serve; sys.exit(serve({str(path)!r}, port={port}, served_model_name={LIKE!r}, "
        f"device={dev!r}, dtype={dt!r}, max_num_seqs=128{', num_kv_blocks=256' if DRY else ''}))"
    )
    OUT.mkdir(parents=True, exist_ok=True)
    log = open(OUT / f"{NAME}-server.log", "w")
    PROC = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
    import httpx

    URL = f"http://127.0.0.1:{port}"
    t = time.perf_counter()
    while True:
        if PROC.poll() is not None:
            raise RuntimeError(f"the server exited with {PROC.returncode} (see {NAME}-server.log)")
        try:
            if httpx.get(URL + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if elapsed() > GUARD_S - 30 and not DRY:
            raise RuntimeError("the server did not answer in time")
        time.sleep(0.2)
    RES["server_start_s"] = round(time.perf_counter() - t, 1)


def health_poller(samples, stop):
    import httpx

    with httpx.Client(timeout=30) as c:
        while not stop.is_set():
            t = time.perf_counter()
            try:
                c.get(URL + "/health")
                samples.append(time.perf_counter() - t)
            except Exception:
                samples.append(float("inf"))
            time.sleep(0.05)


def one_run(mode, rate):
    from litellama.benchmarks.load_client import bench_serving

    samples, stop = [], threading.Event()
    th = threading.Thread(target=health_poller, args=(samples, stop), daemon=True)
    th.start()
    try:
        res = bench_serving(
            URL,
            LIKE,
            rates=(rate,),
            num_requests=NUM_REQUESTS,
            prompt_len=PROMPT_LEN,
            max_tokens=MAX_TOKENS,
            structured_fraction=FRACTION if mode == "json20" else 0.0,
        )
    finally:
        stop.set()
        th.join()
    r = res["results"][0]
    r.update(
        mode=mode,
        health_max_ms=1000 * max(samples) if samples else None,
        health_median_ms=1000 * statistics.median(samples) if samples else None,
        health_samples=len(samples),
    )
    return r


@part("warmup")
def _():
    "One plain and one structured request (builds the grammar backend, compiles the schema), then a small mixed load."
    if URL is None:
        raise RuntimeError("no server")
    import httpx
    from litellama.benchmarks.load_client import BENCH_SCHEMA

    rf = {"type": "json_schema", "json_schema": {"name": "bench", "schema": BENCH_SCHEMA, "strict": True}}
    body = {"model": LIKE, "prompt": "Write a review:", "max_tokens": MAX_TOKENS, "temperature": 0}
    t = time.perf_counter()
    httpx.post(URL + "/v1/completions", json=body, timeout=120).raise_for_status()
    r = httpx.post(URL + "/v1/completions", json={**body, "response_format": rf}, timeout=120)
    r.raise_for_status()
    ch = r.json()["choices"][0]
    RES["checks"]["warmup_structured"] = {"finish_reason": ch["finish_reason"], "text": ch["text"][:300]}
    if ch["finish_reason"] == "stop":
        RES["checks"]["warmup_structured"]["valid"] = validate(json.loads(ch["text"]), BENCH_SCHEMA)
    from litellama.benchmarks.load_client import bench_serving

    bench_serving(
        URL,
        LIKE,
        rates=(float("inf"),),
        num_requests=min(16, NUM_REQUESTS),
        prompt_len=PROMPT_LEN,
        max_tokens=16,
        structured_fraction=0.25,
    )
    RES["warmup_s"] = round(time.perf_counter() - t, 1)


EST = {}  # seconds one run of (mode, rate) took: whether the next fits before the guard


@part("runs")
def _():
    if URL is None:
        raise RuntimeError("no server")
    order = [(m, r) for r in RATES for m in ("plain", "json20")]
    order += [(m, r) for r in RATES for m in ("json20", "plain")]  # the same again, the other way round
    for mode, rate in order:
        need = EST.get(rate, 0) * 1.3 + 3
        if not DRY and elapsed() + need > GUARD_S - 8:
            RES["errors"].setdefault("skipped", []).append(f"{mode} at rate {rate}: {need:.0f} s would pass the guard")
            continue
        t = time.perf_counter()
        try:
            RES["runs"].append(one_run(mode, rate))
        except Exception as e:
            RES["errors"][f"{mode}@{rate}"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        EST[rate] = max(EST.get(rate, 0), time.perf_counter() - t)
        write()


@part("summary")
def _():
    from litellama.benchmarks.load_client import BENCH_SCHEMA

    summ = {}
    for rate in RATES:
        by = {m: [r for r in RES["runs"] if r["rate"] == rate and r["mode"] == m] for m in ("plain", "json20")}
        med = lambda m, k: statistics.median(r[k] for r in by[m]) if by[m] else None
        row = {
            m: {
                k: med(m, k)
                for k in ("output_token_throughput", "request_throughput", "tpot_median_ms", "ttft_median_ms")
            }
            for m in by
        }
        p, j = row["plain"]["output_token_throughput"], row["json20"]["output_token_throughput"]
        row["json20_over_plain_tokens"] = j / p if p and j else None
        p, j = row["plain"]["request_throughput"], row["json20"]["request_throughput"]
        row["json20_over_plain_requests"] = j / p if p and j else None
        row["within_10pct"] = (
            None if row["json20_over_plain_tokens"] is None else row["json20_over_plain_tokens"] >= 0.9
        )
        summ[str(rate)] = row
    RES["summary"] = summ
    st = [r for r in RES["runs"] if r["mode"] == "json20"]
    RES["checks"]["structured"] = {
        k: sum(r.get(k) or 0 for r in st) for k in ("structured", "structured_stopped", "structured_parsed")
    }
    RES["checks"]["health_max_ms"] = max(
        (r["health_max_ms"] for r in RES["runs"] if r.get("health_max_ms") is not None), default=None
    )
    RES["checks"]["all_completed"] = all(r["failed"] == 0 for r in RES["runs"]) and bool(RES["runs"])


# the texts of the structured answers are checked against the schema itself (not only parsed): through one more request
@part("schema_check")
def _():
    if URL is None:
        raise RuntimeError("no server")
    import httpx
    from litellama.benchmarks.load_client import BENCH_SCHEMA

    short = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }  # ends within a few tokens: always checked
    got = []
    for i, schema in enumerate([short] * 4 + [BENCH_SCHEMA] * 2):
        rf = {"type": "json_schema", "json_schema": {"name": "check", "schema": schema, "strict": True}}
        b = {
            "model": LIKE,
            "prompt": f"Answer number {i}:",
            "max_tokens": 48 if schema is short else MAX_TOKENS,
            "temperature": 0.8,
            "seed": i,
            "response_format": rf,
        }
        ch = httpx.post(URL + "/v1/completions", json=b, timeout=60).json()["choices"][0]
        ok = None
        if ch["finish_reason"] == "stop":
            try:
                ok = validate(json.loads(ch["text"]), schema)
            except ValueError:
                ok = False
        got.append(
            {
                "schema": "short" if schema is short else "bench",
                "finish_reason": ch["finish_reason"],
                "valid": ok,
                "text": ch["text"][:120],
            }
        )
    RES["checks"]["sampled_structured"] = got
    RES["checks"]["sampled_structured_ok"] = all(g["valid"] is not False for g in got) and any(g["valid"] for g in got)


stop_server()
write()
print(
    f"{NAME}: {RES.get('gpu')} torch {RES.get('torch')} triton {RES.get('triton')}  wall {elapsed():.0f} s  -> {OUT / (NAME + '.json')}"
)
print(
    f"{'mode':7} {'rate':>5} {'req/s':>7} {'tok/s':>8} {'ttft ms':>8} {'tpot ms':>8} {'health max ms':>13} structured stop/parsed"
)
for r in RES["runs"]:
    f = lambda v, w=8, d=1: f"{v:{w}.{d}f}" if isinstance(v, (int, float)) else f"{'-':>{w}}"
    print(
        f"{r['mode']:7} {r['rate']:>5} {f(r['request_throughput'], 7, 2)} {f(r['output_token_throughput'])} {f(r['ttft_median_ms'])} "
        f"{f(r['tpot_median_ms'], 8, 2)} {f(r.get('health_max_ms'), 13)} {r.get('structured', '-')} {r.get('structured_stopped', '-')}/{r.get('structured_parsed', '-')}"
    )
for rate, row in (RES.get("summary") or {}).items():
    print(
        f"rate {rate}: json20 / plain output tokens/s = {row['json20_over_plain_tokens']}, within 10 %: {row['within_10pct']}"
    )
if RES["errors"]:
    print("errors:", json.dumps(RES["errors"])[:2000])
GUARD.cancel()
