"""What the Qwen3-MoE GPU scripts (`moe_kernels.py`, `moe.py`) share: their expert shapes, weights and router inputs, timers,
guarded parts that keep their results and free memory after each; and the whole-model half: batch-1 TPOT through the
engine with the kernels of 8 decode steps by group, workload 1 through the engine, HF transformers' batch 1 and
workload 1 on the same random-weight shape, and the two side by side. Each script passes its device, dtype and time
guards."""

import gc
import time

import torch

import timing
from common import batch1_tpot, guarded

# ---------------------------------------------------------------- the kernel half: shapes, weights, timers, parts


def expert_shape(dry: bool) -> dict:
    "Qwen3-30B-A3B's experts (128, top-8, hidden 2048, intermediate 768), or tiny ones for a dry run."
    return dict(E=4, K=2, H=64, I=128) if dry else dict(E=128, K=8, H=2048, I=768)


def expert_weights(shape: dict, dev, dt) -> tuple:
    "Random gate|up `[E, 2I, H]` and down `[E, H, I]` expert weights (seed 0), scaled by their fan-in."
    E, H, inter = shape["E"], shape["H"], shape["I"]
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (torch.randn(E, 2 * inter, H, device=dev, generator=g) / H**0.5).to(dt)
    w2 = (torch.randn(E, H, inter, device=dev, generator=g) / inter**0.5).to(dt)
    return w13, w2


def router_inputs(T: int, seed: int, shape: dict, dev, dt) -> tuple:
    "`T` tokens' hidden states `[T, H]` and router logits `[T, E]`, drawn from `seed`."
    gg = torch.Generator(device=dev).manual_seed(seed)
    x = torch.randn(T, shape["H"], device=dev, generator=gg).to(dt)
    return x, torch.randn(T, shape["E"], device=dev, generator=gg).to(dt)


def rel_err(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))


def graph_ms(fn, dev, calls=10):
    "Ms per call of `fn` replayed from one CUDA graph of `calls` calls; the median of three wall-clock calls on the CPU."
    return timing.graph_call_ms(fn, dev == "cuda", calls)


def free(dev):
    gc.collect()
    if dev == "cuda":
        torch.cuda.empty_cache()


def part(res, name, dev, then=None):
    "`common.guarded` keeping the part's result under `res['parts']`; then `then()` (when given) and memory freed."

    def after():
        if then is not None:
            then()
        free(dev)

    return guarded(res, name, res["parts"], then=after)


# ---------------------------------------------------------------- the whole-model half

# each kernel in the first group whose pattern it contains, in this order; the rest under "other"
GROUPS = [
    ("expert GEMMs (gate|up, down)", ("_moe_gate_up_kernel", "_moe_down_kernel", "_moe_gemv_")),
    ("lm_head and sampling", ("nvjet", "ArgMax", "argmax", "_gumbel", "index_elementwise", "indexSelect")),
    (
        "MoE glue (top-k, alignment, sum, cast)",
        ("_topk_softmax", "_moe_align", "reduce_kernel", "direct_copy", "bfloat16_copy"),
    ),
    ("dense linears (qkv, o, router) + split sums", ("_skinny_linear", "_split_sum", "gemv", "gemm")),
    (
        "attention, kv store and rope",
        ("_decode_split", "_decode_merge", "_decode_attention", "_store_kv", "_kv_store", "_rope"),
    ),
    ("norms", ("_rms_norm",)),
]


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def group_of(name):
    return next((g for g, pats in GROUPS if any(p in name for p in pats)), "other")


def _engine(model, cfg, dev, dt, **options):
    from litellama.engine.llm_engine import ContinuousBatchingEngine
    from litellama.testing.tokenizer import make_tokenizer

    t = time.perf_counter()
    eng = ContinuousBatchingEngine(
        model, cfg, make_tokenizer(), device=dev, dtype=dt, enable_prefix_caching=False, **options
    )
    sync(dev)
    return eng, time.perf_counter() - t


def _llm(model, cfg, dev, dt, **options):
    "`(an LLM over the engine of `model` with `options`, its setup seconds)`: the harness's generate calls take an LLM."
    from litellama.entrypoints.llm import LLM

    llm = LLM.__new__(LLM)  # LLM builds its engine from a checkpoint; this one wraps a model already in memory
    llm.engine, setup_s = _engine(model, cfg, dev, dt, **options)
    return llm, setup_s


def decode_profile(eng, prompt, dev, steps=8):
    "The kernels of `steps` decode steps after `prompt`'s prefill: per group, in total and the top 20, per step."
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    from litellama.sampling_params import SamplingParams

    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    eng.step()
    sync(dev)  # the prefill, outside the profile
    with tprof(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])) as prof:
        while eng.has_unfinished_requests():
            eng.step()
        sync(dev)
    avg = prof.key_averages()
    key = next(
        k
        for k in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total")
        if hasattr(avg[0], k) and (dev == "cuda" or k == "self_cpu_time_total")
    )
    kern = [e for e in avg if getattr(e, key) > 0 and not e.key.startswith(("aten::", "cuda", "Activity"))]
    kern.sort(key=lambda e: -getattr(e, key))
    by = {g: 0.0 for g, _ in GROUPS} | {"other": 0.0}
    for e in kern:
        by[group_of(e.key)] += getattr(e, key) / steps
    top = [
        dict(
            name=e.key[:90], group=group_of(e.key), us_per_step=getattr(e, key) / steps, calls_per_step=e.count / steps
        )
        for e in kern[:20]
    ]
    return dict(
        steps=steps,
        metric=key,
        us_per_step_by_group=by,
        us_per_step_all_kernels=sum(getattr(e, key) for e in kern) / steps,
        kernels_per_step=sum(e.count for e in kern) / steps,
        top=top,
    )


def engine_tpot(model, cfg, dev, dt, prompt_len: int, gen: int) -> dict:
    "Batch-1 TPOT (the median of two timed requests after a warm-up) and the decode profile."
    eng, setup_s = _engine(
        model, cfg, dev, dt, max_num_seqs=1, max_model_len=256, max_num_batched_tokens=256, num_kv_blocks=64
    )
    runs, prompt = batch1_tpot(eng, cfg.vocab_size, prompt_len, gen)  # the first warms up
    try:
        profile = decode_profile(eng, prompt, dev)
    except Exception as e:
        profile = f"{type(e).__name__}: {e}"
    graphs = sorted(getattr(getattr(getattr(eng, "executor", None), "runner", None), "graphs", {}))
    del eng
    gc.collect()
    return dict(
        tpot_ms=sorted(runs[1:])[len(runs[1:]) // 2],
        runs_ms=runs,
        cuda_graph_sizes=graphs,
        engine_setup_s=setup_s,
        prompt=prompt_len,
        generated=gen,
        decode_profile=profile,
    )


def workload1_ours(model, cfg, dev, dt, rows, tokens_per_step: int, may_start=lambda batch: True) -> dict:
    "Workload 1's `(batch, prompt, generated)` rows through the engine (CUDA graphs on a GPU); rows `may_start` skips."
    from litellama.benchmarks.harness import ours_generate, random_prompts

    blocks = max(-(-(p + g) // 16) * b for b, p, g in rows) + 64
    llm, setup_s = _llm(
        model,
        cfg,
        dev,
        dt,
        max_num_seqs=max(b for b, _, _ in rows),
        max_model_len=512,
        max_num_batched_tokens=tokens_per_step,
        num_kv_blocks=blocks,
    )
    out = []
    for b, p, g in rows:
        if not may_start(b):
            out.append(dict(batch=b, prompt=p, skipped="time"))
            continue
        prompts = random_prompts(b, p, seed=b, vocab=min(10000, cfg.vocab_size))
        ours_generate(llm, prompts[:1], 4)  # warm-up
        n, s = ours_generate(llm, prompts, g)
        out.append(dict(batch=b, prompt=p, generated=g, litellama_tok_s=n / s, seconds=s))
        print("workload1 litellama", out[-1], flush=True)
    del llm
    return dict(rows=out, engine_setup_s=setup_s, num_kv_blocks=blocks)


def hf_speed(cfg, dev, dt, prompt_len: int, gen: int, rows, hf_tokens: int, may_start=lambda batch: True) -> dict:
    """HF transformers on the same shape: batch-1 output tok/s over `gen` tokens (after a warm-up of the same length,
    the fastest of three runs), then workload 1's rows with the same tokens as litellama's, each after a warm-up at its own
    shape and length, those that `may_start`. HF's first calls of a shape are several times slower than its
    later ones, so a warm-up shorter than the run flatters every speed-up over it."""
    from transformers import AutoModelForCausalLM

    from litellama.benchmarks.harness import hf_generate, random_prompts

    t = time.perf_counter()
    with torch.device(dev):
        hf = AutoModelForCausalLM.from_config(cfg, dtype=dt)
    hf.eval()
    sync(dev)
    build_s = time.perf_counter() - t
    ids = torch.randint(0, min(10000, cfg.vocab_size), (1, prompt_len), device=dev)
    with torch.inference_mode():
        hf.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0)  # warm up
        runs = []
        for _ in range(3):
            sync(dev)
            t = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False, pad_token_id=0)
            sync(dev)
            runs.append(time.perf_counter() - t)
        s = min(runs)
    w1 = []
    try:  # workload 1's rows, HF's tokens and time capped
        for b, p, g in rows:
            if not may_start(b):
                w1.append(dict(batch=b, prompt=p, skipped="HF's time for workload 1 spent"))
                continue
            n_new = g  # the same number of tokens as litellama's row (`hf_tokens` no longer caps it: unequal counts are unfair)
            prompts = random_prompts(b, p, seed=b, vocab=min(10000, cfg.vocab_size))
            hf_generate(hf, prompts, n_new, b)  # warm up at the very shape and length that is timed
            n_h, t_h = hf_generate(hf, prompts, n_new, b)
            w1.append(dict(batch=b, prompt=p, generated=n_new, hf_tok_s=n_h / t_h, seconds=t_h))
            print("workload1 hf", w1[-1], flush=True)
    except Exception as e:
        w1.append(dict(error=f"{type(e).__name__}: {e}"))
    impl = getattr(hf.config, "_experts_implementation", None)
    del hf
    return dict(
        output_tok_s=(out.shape[1] - prompt_len) / s,
        seconds=s,
        runs_s=runs,
        generated=gen,
        build_s=build_s,
        experts_implementation=impl,
        workload1=w1,
    )


def model_like(dry: bool) -> str:
    return "tiny-qwen3-moe" if dry else "qwen3-30b-a3b"


def model_config(like: str):
    "The transformers config of the checkpoint shape `like`."
    from transformers import AutoConfig

    from litellama.testing.checkpoints import SHAPES

    return AutoConfig.for_model(**SHAPES[like])


def random_model_tpot(like: str, dev, dt, prompt_len: int, gen: int) -> tuple:
    """A random-weight model shaped `like` built on the device and `engine_tpot` on it, with its build seconds and
    parameter count: (that result, the model, its config)."""
    from litellama.models.qwen3_moe import random_model

    cfg = model_config(like)
    t = time.perf_counter()
    model = random_model(cfg, dt, dev, seed=0)
    sync(dev)
    build_s = time.perf_counter() - t
    out = engine_tpot(model, cfg, dev, dt, prompt_len, gen)
    out.update(build_s=build_s, params=sum(p.numel() for p in model.parameters()))
    return out, model, cfg


def workload2_ours(model, cfg, dev, dt, num_requests: int, num_kv_blocks: int) -> dict:
    "Workload 2 (random requests of 100-1024 tokens in and out, sampled) through the engine on `model`."
    from litellama.benchmarks.harness import workload2

    llm, setup_s = _llm(model, cfg, dev, dt, max_num_seqs=256, max_model_len=2048, num_kv_blocks=num_kv_blocks)
    out = workload2(llm, num_requests=num_requests)
    del llm
    return dict(out, engine_setup_s=setup_s, num_kv_blocks=num_kv_blocks)


def side_by_side(parts: dict) -> list:
    "Workload 1's rows of both engines (HF: fewer tokens per row, see `hf_generated`) with the speed-up."
    hf_rows = {(r["batch"], r["prompt"]): r for r in parts.get("hf_batch1", {}).get("workload1", []) if "hf_tok_s" in r}
    out = []
    for r in parts["workload1_litellama"]["rows"]:
        if "litellama_tok_s" not in r:
            continue
        h = hf_rows.get((r["batch"], r["prompt"]))
        out.append(
            dict(
                batch=r["batch"],
                prompt=r["prompt"],
                generated=r["generated"],
                litellama_tok_s=r["litellama_tok_s"],
                hf_tok_s=h and h["hf_tok_s"],
                hf_generated=h and h["generated"],
                speedup=h and r["litellama_tok_s"] / h["hf_tok_s"],
            )
        )
    return out


def print_end(res: dict, path: str):
    "Workload 1 side by side, the errors and where the results went."
    for r in res["parts"].get("workload1", []):
        f = lambda k: format(r[k], "10.1f") if r.get(k) is not None else "         -"
        print(
            f"workload1 {r['batch']:>4}x{r['prompt']}x{r['generated']:<4} litellama {f('litellama_tok_s')} tok/s  "
            f"HF {f('hf_tok_s')} tok/s ({r['hf_generated']} tokens)  x{f('speedup')}"
        )
    for k, v in res["errors"].items():
        print(f"ERROR {k}: {v}")
    print(f"wrote {path} in {res['total_seconds']} s")
