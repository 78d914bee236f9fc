"""Tensor and data parallelism on one host: tp=1 vs tp=2 correctness (NCCL, eager and CUDA graphs), batch-1 TPOT of a
Qwen3-8B-shaped model (its layer shapes; 4 layers, a 32k vocabulary) at tp 1 and 2, the all-reduce share of a decode step, ledger
bytes of a decode step against (2L+1)*T*H*b, and data parallelism 1 vs 2 on a cut-down workload 2.

    PYTHONPATH=. python3 benchmarks_nb/gpu/parallel.py $OUT            # 2 GPUs
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/parallel.py /tmp/out --dry-run   # CPU, gloo, tiny shapes
"""

import datetime, json, os, subprocess, sys, tempfile, time, traceback

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
import torch

DRY = "--dry-run" in sys.argv
OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
DEV = "cpu" if DRY else "cuda"
RESULT = {"command": " ".join(sys.argv), "dry_run": DRY, "parts": {}, "errors": {}}

PARTS = []


def part(name):
    "Register one part (run in order by main: spawned children re-import this file and must not run them)."

    def wrap(fn):
        PARTS.append((name, fn))
        return fn

    return wrap


BUDGET_S, START = 80.0, time.perf_counter()


def run_part(name, fn):
    "Run one part; record its result or its error, never stop the script; skip it once the time budget is spent."
    t0 = time.perf_counter()
    if not DRY and t0 - START > BUDGET_S:
        RESULT["errors"][name] = f"skipped: the {BUDGET_S:.0f} s budget was spent"
        return
    try:
        RESULT["parts"][name] = fn()
    except BaseException as e:
        RESULT["errors"][name] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    RESULT.setdefault("seconds", {})[name] = time.perf_counter() - t0
    print(f"[{name}] {time.perf_counter() - t0:.1f} s")


def meta():
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        commit = "unknown"
    import triton, transformers

    RESULT.update(
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        gpus=torch.cuda.device_count(),
        torch=torch.__version__,
        triton=triton.__version__,
        transformers=transformers.__version__,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
        commit=commit,
    )


from litellama.testing.checkpoints import make_random_checkpoint
from litellama.entrypoints.llm import LLM
from litellama.sampling_params import SamplingParams

TMP = tempfile.mkdtemp() if __name__ == "__main__" else None
SMALL = dict(dtype="float32", device=DEV, max_num_seqs=8, max_num_batched_tokens=64, block_size=16, num_kv_blocks=64)


def _shutdown(llm):
    ex = getattr(llm.engine, "executor", None)
    if ex is not None:
        ex.shutdown()
    elif hasattr(llm.engine, "shutdown"):
        llm.engine.shutdown()


@part("correctness")
def correctness():
    "Greedy tokens at tp=2 equal tp=1 on tiny fp32 checkpoints (GQA tied; MQA with qkv bias), eager and with CUDA graphs."
    out = {}
    prompts = [[1, 2, 3], list(range(5, 40)), [9]]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for kind, like, kw in (("gqa", "tiny-llama", {}), ("mqa", "tiny-qwen2", {"vocab_size": 321})):
        path = make_random_checkpoint(like, f"{TMP}/{kind}", dtype=torch.float32, seed=1, **kw)
        for eager in (True,) if DRY or kind == "mqa" else (True, False):
            res = {}
            for tp in (1, 2):
                llm = LLM(path, tensor_parallel_size=tp, enforce_eager=eager, **SMALL)
                try:
                    res[tp] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
                finally:
                    _shutdown(llm)
            out[f"{kind}_{'eager' if eager else 'graphs'}"] = dict(same_tokens=res[1] == res[2])
    return out


def _big():
    "Qwen3-8B layer shapes (hidden 4096, 32 heads, 8 kv heads, intermediate 12288), few layers; tiny in a dry run."
    if DRY:
        return make_random_checkpoint("tiny-qwen3", f"{TMP}/big", dtype=torch.float32, seed=2), 2
    L = 4
    return make_random_checkpoint(
        "qwen3-0.6b",
        f"{TMP}/big",
        dtype=torch.bfloat16,
        seed=2,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        num_hidden_layers=L,
        vocab_size=32768,
    ), L  # a smaller vocabulary: the checkpoint is written in seconds


@part("tpot_and_ledger")
def tpot_and_ledger():
    "Batch-1 time per output token at tp 1 and 2 (after a warm-up), and the ledger of one decode step at tp 2."
    from litellama.distributed.comm import CollectiveStats

    path, L = _big()
    opts = dict(
        dtype="float32" if DRY else "bfloat16",
        device=DEV,
        max_num_seqs=4,
        max_num_batched_tokens=256 if DRY else 2048,
        num_kv_blocks=64 if DRY else 512,
    )
    n_tok = 8 if DRY else 128
    out = {"layers": L}
    for tp in (1, 2):
        llm = LLM(path, tensor_parallel_size=tp, **opts)
        try:
            sp = SamplingParams(temperature=0, max_tokens=n_tok, ignore_eos=True)
            llm.generate([[1] * 16], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)
            times = []
            for _ in range(3):
                if not DRY:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                llm.generate([[2] * 16], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), use_tqdm=False)
                t1 = time.perf_counter()
                llm.generate([[2] * 16], sp, use_tqdm=False)
                t2 = time.perf_counter()
                times.append(((t2 - t1) - (t1 - t0)) / (n_tok - 1) * 1e3)  # decode time only: minus a one-token run
            out[f"tpot_ms_tp{tp}"] = sorted(times)[1]
            if tp == 2:
                eng, c = llm.engine, llm.engine.config
                eng.add_request([3] * 16, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
                eng.step()  # the prefill
                with CollectiveStats() as w:
                    eng.step()  # one decode step: T = 1
                while eng.has_unfinished_requests():
                    eng.step()
                b = 4 if DRY else 2
                out["ledger"] = dict(
                    all_reduce_bytes=w.bytes("all_reduce", "data"),
                    formula=(2 * c.num_hidden_layers + 1) * 1 * c.hidden_size * b,
                    sampler_bytes=w.bytes("all_gather", "data"),
                    control_bytes=w.bytes(plane="control"),
                )
        finally:
            _shutdown(llm)
    return out


def _ar_rank(rank, port, H, L, q):
    from litellama.distributed import comm as D

    dev = "cpu" if DRY else f"cuda:{rank}"
    D.init_distributed(rank, 2, dev, master_port=port)
    x = torch.ones(1, H, dtype=torch.float32 if DRY else torch.bfloat16, device=dev)
    for _ in range(20):
        D.all_reduce(x)
    n = 200
    if not DRY:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        D.all_reduce(x)
    if not DRY:
        torch.cuda.synchronize()
    if rank == 0:
        q.put((time.perf_counter() - t0) / n * 1e6)
    D.destroy_distributed()


@part("allreduce_share")
def allreduce_share():
    "Time of one [1, H] all-reduce (eager, back to back), times 2L+1, against the tp=2 decode step (TPOT)."
    import torch.multiprocessing as mp
    from litellama.distributed.comm import free_port

    H = 64 if DRY else 4096
    L = RESULT["parts"].get("tpot_and_ledger", {}).get("layers", 2)
    ctx, port = mp.get_context("spawn"), free_port()
    q = ctx.Queue()
    ps = [ctx.Process(target=_ar_rank, args=(r, port, H, L, q)) for r in range(2)]
    for p in ps:
        p.start()
    us = q.get(timeout=120)
    for p in ps:
        p.join(30)
    tpot = RESULT["parts"].get("tpot_and_ledger", {}).get("tpot_ms_tp2")
    out = dict(allreduce_us=us, per_step_us=(2 * L + 1) * us)
    if tpot:
        out["share_of_tpot"] = (2 * L + 1) * us / (tpot * 1e3)
    return out


@part("data_parallel")
def data_parallel():
    "Cut-down workload 2 (random prompts, lengths 100-1024 in and out; fewer requests) at dp 1 and 2, tokens/s."
    from litellama.benchmarks.harness import workload2_requests

    n = 4 if DRY else 32
    prompts, params = workload2_requests(n, seed=0)
    if DRY:
        prompts, params = (
            [p[:12] for p in prompts],
            [SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=4) for _ in params],
        )
    path = make_random_checkpoint(
        "tiny-llama" if DRY else "qwen3-0.6b",
        f"{TMP}/dp",
        dtype=torch.float32 if DRY else torch.bfloat16,
        seed=3,
        **({} if DRY else {"vocab_size": 16384}),
    )
    prompts = [[t % 300 if DRY else t for t in p] for p in prompts]
    out = {"requests": n}
    opts = dict(SMALL, num_kv_blocks=256) if DRY else dict(device="cuda", dtype="bfloat16")
    for dp in (1, 2):
        llm = LLM(path, data_parallel_size=dp, **opts)
        try:
            llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            t = time.perf_counter() - t0
            toks = sum(len(o.outputs[0].token_ids) for o in outs)
            out[f"dp{dp}"] = dict(seconds=t, output_tokens=toks, tok_s=toks / t)
        finally:
            _shutdown(llm)
    return out


if __name__ == "__main__":
    meta()
    for name, fn in PARTS:
        run_part(name, fn)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "parallel.json")
    with open(path, "w") as f:
        json.dump(RESULT, f, indent=1, default=str)
    print(f"\n{'part':<18} result")
    for k, v in RESULT["parts"].items():
        print(f"{k:<18} {json.dumps(v, default=str)}")
    for k, v in RESULT["errors"].items():
        print(f"{k:<18} ERROR {v}")
    print("wrote", path)
