"""Small helpers shared by the GPU scripts: the run's environment and its JSON file, guarded parts (under a global time
budget or not), timers (CUDA-graph replay over weight copies larger than L2, do_bench, synchronised wall time), 8-bit
weights, Qwen3-8B's shape, and litellama against HF transformers on a vision-language model.
Import after setting TRITON_INTERPRET for a dry run."""

import datetime
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch
import triton

from litellama.testing.checkpoints import REAL_SHAPES

# ---------------------------------------------------------------- compiling without a GPU


def stand_in_driver(capability: int = 90) -> None:
    """Let Triton compile for an NVIDIA GPU of compute `capability` (sm_90 by default) on a machine without one: a
    stand-in driver answers the device, the stream and the target, and launches made with `warmup=True` only compile."""
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class StandIn:
        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

        def get_device_interface(self):
            return torch.cuda

        def get_benchmarker(self):
            return None

        def __getattr__(self, k):
            raise AttributeError(k)

    driver.set_active(StandIn())


# ---------------------------------------------------------------- the run


def run_info(dry: bool) -> dict:
    "GPU name, versions, date and git commit of this run."
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except Exception:
        commit = "unknown"
    return {
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and not dry else "cpu (dry run)",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
    }


def environment(dry: bool) -> dict:
    "`run_info`, the command line of this run and whether it is a dry run."
    return {**run_info(dry), "command": " ".join([sys.executable] + sys.argv), "dry_run": dry}


def write_json(res: dict, out_dir, name: str) -> str:
    "Write `res` to `out_dir`/`name` (the folder made if need be); the file's path."
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(res, f, indent=1, default=str)
    return path


# ---------------------------------------------------------------- guarded parts


def guarded(res: dict, name: str, results: dict | None = None, then=None):
    """A decorator that runs the function at once and returns it: its result under `results[name]` (when `results` is
    given), its error under `res["errors"][name]` (the traceback printed), its wall seconds under
    `res["part_seconds"][name]`; then `then()`, when given."""

    def wrap(fn):
        t = time.perf_counter()
        try:
            out = fn()
            if results is not None:
                results[name] = out
        except Exception as e:
            res["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        res.setdefault("part_seconds", {})[name] = round(time.perf_counter() - t, 2)
        if then is not None:
            then()
        return fn

    return wrap


class Budget:
    """A global time guard: `part(name, need)` runs a function unless fewer than `need` seconds are left (of `seconds`
    from `t0`, default now), recording errors in `res`."""

    def __init__(self, seconds: float, res: dict, t0: float | None = None):
        self.t0, self.seconds, self.res = time.time() if t0 is None else t0, seconds, res
        res.setdefault("errors", {})
        res.setdefault("skipped", [])
        res.setdefault("part_seconds", {})

    def left(self) -> float:
        return self.seconds - (time.time() - self.t0)

    def part(self, name: str, need: float = 5.0):
        def deco(fn):
            if self.left() < need:
                self.res["skipped"].append(name)
                print(f"SKIP {name}: time budget spent", flush=True)
                return fn
            t = time.time()
            try:
                fn()
            except Exception as e:
                self.res["errors"][name] = f"{type(e).__name__}: {str(e)[:500]}"
                traceback.print_exc()
            self.res["part_seconds"][name] = round(time.time() - t, 2)
            return fn

        return deco


# ---------------------------------------------------------------- timers (benchmarks_nb/gpu/timing.py)

from timing import eager_ms, graph_ms, sync, timed  # noqa: E402,F401  (the scripts import them from here too)


def copies_for(nbytes: int, cuda: bool = True, total: int = 256 << 20) -> int:
    "How many copies of an `nbytes` weight together exceed `total` bytes (far more than L2), so each call reads HBM."
    return 1 if not cuda else max(1, min(16, math.ceil(total / max(nbytes, 1))))


def rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


# ---------------------------------------------------------------- 8-bit weights

FP8 = torch.float8_e4m3fn


def quant_rows(w, dtype):
    "int8 or fp8 weight with one scale per row, and the scales."
    from litellama.kernels.quant_gemm import QMAX

    s = w.float().abs().amax(1).clamp_min(1e-10) / QMAX[dtype]
    q = w.float() / s[:, None]
    return (q.round().clamp(-127, 127).to(torch.int8) if dtype == torch.int8 else q.clamp(-448, 448).to(dtype)), s


def quant_block(w, bk: int = 128):
    "fp8 weight with one scale per row and `bk` columns (what the block method keeps after load)."
    N, K = w.shape
    kb = -(-K // bk)
    pad = torch.nn.functional.pad(w.float(), (0, kb * bk - K)).view(N, kb, bk)
    s = pad.abs().amax(-1).clamp_min(1e-10) / 448
    return (pad / s[..., None]).view(N, kb * bk)[:, :K].to(FP8), s.contiguous()


# the one-token tiles of the skinny kernel before _w8a16_gemv_kernel (112185c's "gemv" entries), for A/B rows
SKINNY_GEMV = dict(BLOCK_N=8, BLOCK_K=512, num_warps=4, num_stages=3, GEMV=False)
SKINNY_GEMV_TUNED = {  # (kind, N, K) -> tiles over SKINNY_GEMV
    ("fp8", 4096, 4096): dict(BLOCK_N=4, BLOCK_K=1024, SPLIT_K=1),
    ("fp8", 4096, 12288): dict(BLOCK_N=4, BLOCK_K=1024),
    ("fp8", 6144, 4096): dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=1),
    ("fp8", 151936, 4096): dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=1),
    ("int8", 4096, 4096): dict(BLOCK_N=4, BLOCK_K=1024),
    ("int8", 4096, 12288): dict(BLOCK_N=4, BLOCK_K=1024),
    ("int8", 24576, 4096): dict(BLOCK_N=8, BLOCK_K=512, SPLIT_K=1),
}


def skinny_gemv_config(kind: str, N: int, K: int) -> dict:
    "The config that runs a one-token product of `kind` (int8 | fp8) and shape `N x K` as 112185c did."
    return dict(SKINNY_GEMV, **SKINNY_GEMV_TUNED.get((kind, N, K), {}))


# ---------------------------------------------------------------- Qwen3-8B's shape (random weights, real shapes)

# Qwen3-0.6B's family settings (vocabulary, 8 KV heads of 128, RoPE, norm eps) at Qwen3-8B's widths and depth, untied
QWEN3_8B = dict(
    REAL_SHAPES["qwen3-0.6b"],
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    tie_word_embeddings=False,
)

# ---------------------------------------------------------------- the engine


def batch1_tpot(eng, vocab_size: int, prompt_len: int, gen: int, seeds: int = 3) -> tuple:
    """Greedy requests of `gen` tokens through `eng`, one at a time, after random prompts of `prompt_len` tokens
    (seeds 0, 1, ...): the ms per output token after the first of each, and the last prompt."""
    from litellama.sampling_params import SamplingParams

    runs = []
    for seed in range(seeds):
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, min(10000, vocab_size), (prompt_len,), generator=g).tolist()
        eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=gen, ignore_eos=True))
        times = []
        while eng.has_unfinished_requests():
            outs = eng.step()
            times += [time.perf_counter()] * sum(len(o.token_ids) for o in outs)
        runs.append((times[-1] - times[0]) / max(1, len(times) - 1) * 1e3)
    return runs, prompt


# ---------------------------------------------------------------- a vision-language model against HF transformers


def perturb_norms(model, scale: float = 0.05):
    "HF initialises norms to 1 and biases to 0: perturb them (in place) so they are tested."
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "bias" in n:
                p.add_(torch.randn_like(p) * scale)


def vlm_engines(model, text_config, image_processor, device, dtype, **options):
    """`make_engine(max_num_seqs)`: the engine over `model` of that many sequences, kept while the count stays the same
    (a new count drops the old engine and empties the CUDA cache first); no tokenizer, blocks of 16, no prefix caching,
    `options` for the rest."""
    from litellama.engine.llm_engine import ContinuousBatchingEngine

    cache = {}

    def make_engine(max_num_seqs: int):
        if max_num_seqs in cache:
            return cache[max_num_seqs]
        cache.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
        eng = ContinuousBatchingEngine(
            model,
            text_config,
            None,
            None,
            device=device,
            dtype=dtype,
            max_num_seqs=max_num_seqs,
            block_size=16,
            enable_prefix_caching=False,
            **options,
        )
        eng.image_processor = image_processor
        cache[max_num_seqs] = eng
        return eng

    return make_engine


def engine_decode(eng, requests, sp) -> tuple:
    """Run `requests` (engine prompts, all with sampling params `sp`) through `eng` together: (decode tok/s from the
    step at which every request has its first token, wall seconds of the whole)."""
    for r in requests:
        eng.add_request(r, sp)
    firsts, n_after, t_all_first = set(), 0, None
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.request_id in firsts:
                n_after += len(o.token_ids)
            elif o.token_ids:
                firsts.add(o.request_id)
                n_after += len(o.token_ids) - 1
        if t_all_first is None and len(firsts) == len(requests):
            sync()
            t_all_first, n_after = time.perf_counter(), 0
    sync()
    return n_after / (time.perf_counter() - t_all_first), time.perf_counter() - t0


def hf_decode(gen, batch: int, tokens: int) -> tuple:
    """HF's decode tok/s, `gen(n)` generating `n` new tokens for each of `batch` prompts: `tokens` tokens less the
    first, over the time of `tokens` tokens less that of one; and the time of `tokens` tokens."""
    gen(2)
    t_first = timed(lambda: gen(1), reps=2, warmup=0)
    t_full = timed(lambda: gen(tokens), reps=1, warmup=0)
    return batch * (tokens - 1) / max(t_full - t_first, 1e-9), t_full


def ms_vs_hf(ours_s: float, hf_s: float, **more) -> dict:
    "Both times (seconds in, ms out) and HF's over ours."
    return {"litellama": ours_s * 1e3, "hf": hf_s * 1e3, "speedup": hf_s / ours_s, **more}


def decode_vs_hf(ours: tuple, hf: tuple, tokens: int, eng) -> dict:
    "A decode row from `engine_decode` (ours) and `hf_decode` (HF's) of `tokens` tokens per request."
    return {
        "litellama": ours[0],
        "hf": hf[0],
        "speedup": ours[0] / hf[0],
        "litellama_wall_s": ours[1],
        "hf_wall_s": hf[1],
        "tokens_per_request": tokens,
        "cuda_graphs": bool(eng.runner.graphs),
    }


def print_vs_hf(rows, errors: dict):
    "The `(name, row)` rows as a table of litellama, HF and their ratio; then the errors."
    print(f"{'':<32}{'litellama':>12}{'HF':>12}{'ratio':>8}")
    for name, v in rows:
        print(f"{name:<32}{v['litellama']:>12.2f}{v['hf']:>12.2f}{v['speedup']:>8.2f}")
    for k, e in errors.items():
        print(f"ERROR in {k}: {e}")
