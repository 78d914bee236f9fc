"""Any head size on the Triton kernels (issue 16), on one H200, kernels only.

Run from the repository root:  PYTHONPATH=. python3 benchmarks_nb/gpu/head_sizes.py $OUT   (or --dry-run: the CPU, tiny shapes)

1. the power-of-two path, head_dim 128 and 64, timed at shapes of `benchmarks_nb/results/history/kernels.json` (same op,
   backend, shape and dtype): each row carries that file's figure, measured at an earlier commit, for comparison;
2. correctness in bf16 (and an fp8 cache for decode) against the PyTorch references, at head sizes 64, 128 (the
   power-of-two path) and 24, 80, 96, 112, 192, 256 (padded tiles);
3. head sizes 80, 96, 112, 192, 256 (and 128, the peer) against the torch reference in the same run.
Parts run in that order; once 70 s have passed the rest are skipped (and recorded as skipped).
Writes `$OUT/head_sizes.json` and prints a table. Every part is caught: a failure is recorded and the script goes on.
"""

import datetime, json, os, platform, subprocess, sys, time, traceback
from pathlib import Path

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
import torch
import triton

import timing

from litellama.kernels import reference as ref
from litellama.kernels import decode_attention as da, kv_store, prefill_attention as pa, rmsnorm, rope

DEV = "cpu" if DRY else "cuda"
DT = torch.float16 if DRY else torch.bfloat16  # the interpreter mishandles bfloat16
FP8 = torch.float8_e4m3fn
BUDGET_S = 1e9 if DRY else 70  # leave the rest of 90 s to start-up and the JSON
T0 = time.time()
ROWS, CHECKS, ERRORS = [], [], []


def timer(fn):
    "Median ms: `triton.testing.do_bench` on the GPU, a few wall-clock runs in the dry run."
    return timing.median_ms(fn, not DRY)


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def part(name):
    "Run one part, catching and recording any error; skip it once the time budget is spent."

    def wrap(fn):
        if time.time() - T0 > BUDGET_S:
            ERRORS.append(dict(part=name, error="skipped: time budget spent"))
            return fn
        try:
            fn()
        except Exception as e:
            ERRORS.append(dict(part=name, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:]))
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
        return fn

    return wrap


def paged(lens, Hk, D, dtype, bs=16):
    return pa.random_paged_kv(lens, Hk, D, bs, dtype, DEV)


def rope_inputs(T, Hq, Hk, D, dtype):
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device=DEV, dtype=dtype)
    q, k, v = (
        qkv[:, : Hq * D].view(T, Hq, D),
        qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D),
        qkv[:, (Hq + Hk) * D :].view(T, Hk, D),
    )
    ang = torch.rand(4096, D // 2, device=DEV) * 6.3
    return q, k, v, torch.cat([ang.cos(), ang.sin()], -1), torch.randint(0, 4096, (T,), device=DEV)


# --- timings -----------------------------------------------------------------------------------------------------
def add(op, backend, shape, D, ms, nbytes=None, flops=None, group=""):
    r = dict(group=group, op=op, backend=backend, shape=shape, head_dim=D, dtype=str(DT).replace("torch.", ""), ms=ms)
    if nbytes:
        r["gbps"] = nbytes / ms / 1e6
    if flops:
        r["tflops"] = flops / ms / 1e9
    ROWS.append(r)


def time_decode(D, B, ctx, Hq, Hk, backends, group):
    lens = [ctx] * B
    kc, vc, bt = paged(lens, Hk, D, DT)
    q = torch.randn(B, Hq, D, device=DEV, dtype=DT)
    sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
    plan = [torch.from_numpy(a).to(DEV) for a in da.SplitPlanner(Hk, D, DT, DEV)(lens)]
    nbytes = 2 * B * ctx * Hk * D * kc.element_size()
    fns = {
        "triton": lambda: da.decode_attention(q, kc, vc, sl, bt, D**-0.5, splits=plan),
        "torch_reference": lambda: ref.decode_attention(q, kc, vc, sl, bt, D**-0.5),
    }
    for b in backends:
        add("decode_attention", b, f"{B}x{ctx}x{Hq}x{Hk}x{D}", D, timer(fns[b]), nbytes=nbytes, group=group)


def time_prefill(D, nseq, S, H, backends, group):
    kc, vc, bt = paged([S] * nseq, H, D, DT)
    q = torch.randn(nseq * S, H, D, device=DEV, dtype=DT)
    cu = torch.arange(nseq + 1, device=DEV, dtype=torch.int32) * S
    sl = torch.full((nseq,), S, dtype=torch.int32, device=DEV)
    fns = {
        "triton": lambda: pa.prefill_attention(q, kc, vc, cu, sl, bt, D**-0.5, max_seqlen_q=S),
        "torch_reference": lambda: ref.prefill_attention(q, kc, vc, cu, sl, bt, D**-0.5),
    }
    for b in backends:
        add(
            "prefill_attention",
            b,
            f"{nseq}x{S}x{H}x{D}",
            D,
            timer(fns[b]),
            flops=4 * nseq * H * S * S * D / 2,
            group=group,
        )


def time_rope(D, T, Hq, Hk, backends, group):
    e = torch.finfo(DT).bits // 8
    q, k, v, cache, pos = rope_inputs(T, Hq, Hk, D, DT)
    kc, vc = (torch.empty(triton.cdiv(T, 16), 16, Hk, D, device=DEV, dtype=DT) for _ in range(2))
    slots, w = torch.arange(T, device=DEV), torch.ones(D, device=DEV, dtype=DT)
    shape = f"{T}x{Hq}x{Hk}x{D}"
    rot = {
        "triton": lambda: rope.rotary_embedding(pos, q, k, cache),
        "torch": lambda: ref.rotary_embedding(pos, q, k, cache),
    }
    fused = {
        "triton": lambda: rope.rope_and_store_kv(pos, q, k, v, cache, kc, vc, slots, w, w, 1e-6),
        "torch": lambda: ref.rope_and_store_kv(pos, q, k, v, cache, kc, vc, slots, w, w, 1e-6),
    }
    for b in backends:
        add(
            "rotary_embedding",
            b,
            shape,
            D,
            timer(rot[b]),
            nbytes=2 * T * (Hq + Hk) * D * e + T * D * 4 + T * 8,
            group=group,
        )
        add(
            "rope_and_store_kv",
            b,
            shape,
            D,
            timer(fused[b]),
            nbytes=2 * T * (Hq + 2 * Hk) * D * e + T * D * 4 + T * 16,
            group=group,
        )


def time_norm_store(D, T, Hq, Hk, backends, group):
    e = torch.finfo(DT).bits // 8
    qkv = torch.randn(T, (Hq + 2 * Hk) * D, device=DEV, dtype=DT)
    q, w = qkv[:, : Hq * D].view(T, Hq, D), torch.ones(D, device=DEV, dtype=DT)
    k, v = qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D), qkv[:, (Hq + Hk) * D :].view(T, Hk, D)
    nb = triton.cdiv(T, 16)
    kc, vc = (torch.empty(nb, 16, Hk, D, device=DEV, dtype=DT) for _ in range(2))
    t = torch.arange(T, device=DEV)
    slots = torch.randperm(nb, device=DEV)[t // 16] * 16 + t % 16
    norm = {"triton": lambda: rmsnorm.rms_norm(q, w, 1e-6), "torch": lambda: ref.rms_norm(q, w, 1e-6)}
    store = {
        "triton": lambda: kv_store.store_kv_cache(k, v, kc, vc, slots),
        "torch": lambda: ref.store_kv_cache(k, v, kc, vc, slots),
    }
    for b in backends:
        add("rms_norm", b, f"{T}x{Hq}x{D}", D, timer(norm[b]), nbytes=(2 * T * Hq * D + D) * e, group=group)
        add("store_kv_cache", b, f"{T}x{Hk}x{D}", D, timer(store[b]), nbytes=4 * T * Hk * D * e + T * 8, group=group)


# 1. the power-of-two path at history/kernels.json's shapes (triton, and the reference where history/kernels.json has it)
if DRY:
    POW2 = dict(decode=[(1, 64)], prefill=[(1, 32)], tokens=[16])
else:
    POW2 = dict(
        decode=[(1, 4096), (16, 1024), (64, 4096), (256, 1024)], prefill=[(4, 1024), (4, 4096)], tokens=[1, 128, 4096]
    )
HQ, HK = (4, 2) if DRY else (16, 8)
for D in (128, 64):
    Hq, Hk = (HQ, HK) if D == 128 or DRY else (32, 8)

    @part(f"pow2 decode D={D}")
    def _():
        for B, ctx in POW2["decode"]:
            time_decode(D, B, ctx, HQ, HK, ["triton"], "pow2")

    @part(f"pow2 prefill D={D}")
    def _():
        for nseq, S in POW2["prefill"]:
            time_prefill(D, nseq, S, 2 * HK, ["triton"], "pow2")

    @part(f"pow2 rope D={D}")
    def _():
        for T in POW2["tokens"]:
            time_rope(D, T, Hq, Hk, ["triton", "torch"], "pow2")

    @part(f"pow2 norm/store D={D}")
    def _():
        for T in POW2["tokens"]:
            time_norm_store(D, T, HQ, HK, ["triton", "torch"], "pow2")


# --- 2. correctness -------------------------------------------------------------------------------------------------
DIMS = (64, 24, 80) if DRY else (64, 128, 24, 80, 96, 112, 192, 256)


def check(op, D, err, tol, **kw):
    CHECKS.append(dict(op=op, head_dim=D, rel_err=err, tol=tol, ok=bool(err < tol), **kw))


for D in DIMS:

    @part(f"check prefill_attention D={D}")
    def _():
        lens, qlens = ([5, 40], [5, 9]) if DRY else ([1, 300, 1025, 77], [1, 300, 129, 1])
        kc, vc, bt = paged(lens, 2, D, DT)
        q = torch.randn(sum(qlens), 8, D, device=DEV, dtype=DT)
        cu = torch.tensor([0] + qlens, device=DEV).cumsum(0).to(torch.int32)
        sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
        check(
            "prefill_attention",
            D,
            rel_err(
                pa.prefill_attention(q, kc, vc, cu, sl, bt, D**-0.5),
                ref.prefill_attention(q, kc, vc, cu, sl, bt, D**-0.5),
            ),
            2e-2,
        )

    @part(f"check decode_attention D={D}")
    def _():
        lens = [5, 40, 17] if DRY else [1, 17, 4096, 1000, 333]
        kc, vc, bt = paged(lens, 2, D, DT)
        q = torch.randn(len(lens), 8, D, device=DEV, dtype=DT)
        sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
        want = ref.decode_attention(q, kc, vc, sl, bt, D**-0.5)
        check("decode_attention", D, rel_err(da.decode_attention(q, kc, vc, sl, bt, D**-0.5), want), 2e-2)
        k8, v8 = kc.to(FP8), vc.to(FP8)
        want8 = ref.decode_attention(q, k8.float(), v8.float(), sl, bt, D**-0.5)
        kh, vk = k8.transpose(1, 2).contiguous().transpose(1, 2), da.v_key_minor(v8)  # the model runner's fp8 order
        check(
            "decode_attention",
            D,
            rel_err(da.decode_attention(q, kh, vk, sl, bt, D**-0.5), want8),
            2e-2,
            cache="fp8",
            words=bool(da.fp8_words(q, kh, vk)[2]),
        )

    @part(f"check rope/norm/store D={D}")
    def _():
        T = 7 if DRY else 777
        q, k, v, cache, pos = rope_inputs(T, 8, 2, D, DT)
        w = torch.rand(D, device=DEV, dtype=DT) + 0.5
        slots = torch.randperm(64 * 16, device=DEV)[:T]
        slots[::7] = -1
        kc = torch.randn(64, 16, 2, D, device=DEV, dtype=DT)
        vc = torch.randn_like(kc)
        kc2, vc2 = kc.clone(), vc.clone()
        got = rope.rope_and_store_kv(pos, q, k, v, cache, kc, vc, slots, w, w)
        want = ref.rope_and_store_kv(pos, q, k, v, cache, kc2, vc2, slots, w, w)
        check(
            "rope_and_store_kv", D, max(rel_err(got, want), rel_err(kc, kc2)), 1e-2, v_exact=bool(torch.equal(vc, vc2))
        )
        for a, b in zip(rope.rotary_embedding(pos, q, k, cache), ref.rotary_embedding(pos, q, k, cache)):
            check("rotary_embedding", D, rel_err(a, b), 1e-2)
        check("rms_norm", D, rel_err(rmsnorm.rms_norm(q, w, 1e-6), ref.rms_norm(q, w, 1e-6)), 1e-2)
        kv_store.store_kv_cache(k, v, kc, vc, slots)
        ref.store_kv_cache(k, v, kc2, vc2, slots)
        check("store_kv_cache", D, 0.0 if torch.equal(kc, kc2) and torch.equal(vc, vc2) else 1.0, 0.5)


# 3. padded head sizes against the reference, with 128 as the peer
ODD = (128, 80, 96, 112, 192, 256)
if DRY:
    SH = dict(decode=(2, 32), prefill=(1, 32), T=16)
else:
    SH = dict(decode=(16, 1024), prefill=(2, 1024), T=1024)
for D in ODD:

    @part(f"padded D={D}")
    def _():
        time_decode(D, *SH["decode"], HQ, HK, ["triton", "torch_reference"], "padded")
        if not DRY:
            time_decode(D, 64, 4096, HQ, HK, ["triton"], "padded")
        time_prefill(D, *SH["prefill"], 2 * HK, ["triton", "torch_reference"], "padded")
        time_rope(D, SH["T"], HQ, HK, ["triton", "torch"], "padded")
        time_norm_store(D, SH["T"], HQ, HK, ["triton", "torch"], "padded")


# --- the record -----------------------------------------------------------------------------------------------------
def earlier(r):
    "history/kernels.json's figure for the same op, backend, shape and dtype (an earlier commit), if it has one."
    p = Path("benchmarks_nb/results/history/kernels.json")
    if not p.exists():
        return None
    for x in json.loads(p.read_text()).get("rows", []):
        if (x.get("op"), x.get("backend"), x.get("shape"), x.get("dtype")) == (
            r["op"],
            r["backend"],
            r["shape"],
            r["dtype"],
        ):
            return x.get("ms")
    return None


for r in ROWS:
    if r["group"] == "pow2":
        old = earlier(r)
        if old:
            r.update(kernels_json_ms=old, ratio_vs_kernels_json=r["ms"] / old)
peers = {(r["op"], r["shape"]): r["ms"] for r in ROWS if r["backend"] != "triton"}
for r in ROWS:
    if r["group"] == "padded" and r["backend"] == "triton":
        peer = peers.get((r["op"], r["shape"]))
        if peer:
            r["speedup_vs_reference"] = peer / r["ms"]

try:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
except Exception:
    commit = "unknown"
try:
    import transformers

    tf = transformers.__version__
except Exception:
    tf = "not installed"
out = dict(
    script="benchmarks_nb/gpu/head_sizes.py",
    command=" ".join(["python3"] + sys.argv),
    dry_run=DRY,
    environment=dict(
        device=torch.cuda.get_device_name() if torch.cuda.is_available() and not DRY else "cpu (interpreter)",
        python=platform.python_version(),
        torch=torch.__version__,
        triton=triton.__version__,
        transformers=tf,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        commit=commit,
    ),
    seconds=round(time.time() - T0, 1),
    checks=CHECKS,
    all_checks_ok=all(c["ok"] for c in CHECKS) and bool(CHECKS),
    rows=ROWS,
    errors=ERRORS,
)
dest = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", ".")))
dest.mkdir(parents=True, exist_ok=True)
(dest / "head_sizes.json").write_text(json.dumps(out, indent=1))

print(f"{len(CHECKS)} checks, {sum(not c['ok'] for c in CHECKS)} failed; {len(ERRORS)} errors; {out['seconds']} s")
for c in CHECKS:
    if not c["ok"]:
        print("  FAILED", c)
print(f"{'group':<7} {'op':<18} {'backend':<16} {'shape':<22} {'ms':>9} {'GB/s|TF':>8} {'vs ref':>7} {'vs k.json':>9}")
for r in ROWS:
    perf = r.get("gbps", r.get("tflops", 0))
    vs = f"{r['speedup_vs_reference']:.1f}x" if "speedup_vs_reference" in r else ""
    kj = f"{r['ratio_vs_kernels_json']:.2f}" if "ratio_vs_kernels_json" in r else ""
    print(
        f"{r['group']:<7} {r['op']:<18} {r['backend']:<16} {r['shape']:<22} {r['ms']:>9.4f} {perf:>8.0f} {vs:>7} {kj:>9}"
    )
for e in ERRORS:
    print("ERROR", e["part"], e["error"])
print("wrote", dest / "head_sizes.json")
