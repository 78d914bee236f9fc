"""W4A16 on the H200, one run: (1) every kernel path against its float32 reference on the GPU (bf16 and fp16), (2) a sweep of
paths and launch configurations (the sm_90 warpgroup-MMA `wgmma` kernel, the two-codes-per-instruction `pair` tensor-core kernel,
the phase-1 `gemv`/`dot`/`dequant` kernels, and the one-row `half2` kernel in float16 pairs) for M = 1, 4, 16, 64, 4096 on Qwen3-8B's projection shapes (AWQ layout, group 128) under
CUDA-graph replay with the weights rotated beyond L2, against the bf16 GEMM (cuBLAS and litellama's skinny kernel) in the same
run, printing the best per shape and a `TUNED` table for `litellama.kernels.w4a16`, (3) the read floor: the
same words, scales and zeros read and XOR-ed, nothing else, timed the same way, (4) batch-1 TPOT through the engine of a
random Qwen3-8B in AWQ layout (the sweep's best configurations installed) against the same model in bf16.

Run: PYTHONPATH=. python3 benchmarks_nb/gpu/w4.py $OUT            (GPU, under 140 s)
     PYTHONPATH=. python3 benchmarks_nb/gpu/w4.py $OUT --dry-run  (CPU, Triton interpreter, tiny shapes)
Writes $OUT/w4.json and prints a table. Every part is guarded: a failure is recorded and the next part runs."""

import datetime, gc, os, subprocess, sys, time, traceback

DRY = "--dry-run" in sys.argv
if DRY:
    os.environ["TRITON_INTERPRET"] = "1"  # before the kernel module is imported
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from common import QWEN3_8B, batch1_tpot, graph_ms, rel, write_json
from litellama.kernels import w4a16 as W

OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), ".")
DEV = "cpu" if DRY or not torch.cuda.is_available() else "cuda"
CUDA = DEV == "cuda"
T0 = time.time()
LIMIT_S = 1e9 if DRY else 200.0  # no part starts past its own deadline; nothing starts past this
NW, NS = (1, 1) if DRY else (4, 4)  # the launch configs' default warps and stages


def gemv(bn, bk, nw=NW, ns=NS, prefetch=False):
    cfg = dict(PATH="gemv", BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)
    return {**cfg, "PREFETCH": True} if prefetch else cfg


def half2(bn, bk, nw=NW, ns=1):
    "The one-row kernel in float16 pairs (kernels_nb/13_w4a16, `_w4_half2_kernel`)."
    return dict(PATH="half2", BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)


def dot(bm, bn, bk, nw=NW, ns=NS):
    return dict(PATH="dot", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns)


def deq(bn, bw, nw=NW):
    return dict(PATH="dequant", BLOCK_N=bn, BLOCK_W=bw, num_warps=nw)


def wg(bn, ks, nw=4):
    "The sm_90 warpgroup-MMA path (kernels_nb/13b_w4a16_hopper): BLOCK_N rows, slices of K_SPLIT inputs."
    return dict(PATH="wgmma", BLOCK_N=bn, K_SPLIT=ks, num_warps=nw)


def pair(bm, bn, bk, nw=NW, ns=NS, asm=True):
    return dict(PATH="pair", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=nw, num_stages=ns, ASM=asm)


if DRY:
    SHAPES = {"qkv": (64, 96), "o": (64, 64), "gate_up": (64, 192), "down": (128, 64)}  # name: (K, N)
    GROUP, DTYPE, CHECK_DTYPES, L2_BYTES, MS = 32, torch.float16, (torch.float16,), 0, (1, 4, 16, 64)
    SWEEP = {
        1: [gemv(16, 32), gemv(32, 64), gemv(16, 64, prefetch=True), half2(16, 64), dot(16, 16, 32), pair(16, 16, 32)],
        4: [dot(16, 16, 32), gemv(16, 64), half2(16, 32), pair(16, 32, 32)],
        16: [dot(16, 32, 32), pair(16, 16, 32)],
        64: [deq(16, 4), dot(32, 16, 32), pair(32, 16, 32)],
    }
    PAIR_CHECK = [pair(16, 16, 32), pair(16, 32, 32)]  # BLOCK_K: whole runs of 32
    TPOT_LIKE, PROMPT, GEN = "tiny-qwen3", 8, 4
else:
    SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}
    GROUP, DTYPE, CHECK_DTYPES, L2_BYTES, MS = (
        128,
        torch.bfloat16,
        (torch.bfloat16, torch.float16),
        160 << 20,
        (1, 4, 16, 64, 4096),
    )
    PAIRS = [
        pair(16, 32, 128),
        pair(16, 64, 128),
        pair(16, 64, 128, 4, 3),
        pair(16, 128, 128, 4, 3),
        pair(16, 128, 128, 8, 4),
        pair(16, 256, 128, 8, 3),
        pair(16, 64, 64),
        pair(16, 64, 128, asm=False),
    ]
    PAIR_CHECK = [pair(16, 64, 128), pair(16, 64, 128, asm=False), pair(64, 128, 128, 8, 3)]
    PAIR_CHECK += [wg(64, 512), wg(128, 1024, 8)]
    SWEEP = {
        1: [
            gemv(64, 512, 4, 1),
            gemv(64, 256, 4, 1),
            gemv(128, 256, 4, 1),
            gemv(64, 1024, 8, 1),
            gemv(32, 512, 4, 1),
            gemv(128, 512, 8, 1),
            gemv(64, 512, 4, 2),
            gemv(64, 512, 4, 1, prefetch=True),
            gemv(64, 256, 4, 1, prefetch=True),
            gemv(64, 1024, 8, 1, prefetch=True),
            gemv(32, 512, 4, 1, prefetch=True),
            dot(16, 64, 128),
            dot(16, 128, 128, 4, 3),
        ],
        4: [dot(16, 32, 128), dot(16, 64, 128), dot(16, 128, 128, 4, 3), dot(16, 64, 64), gemv(32, 512)],
        16: [
            dot(16, 32, 128),
            dot(16, 64, 128),
            dot(16, 128, 128, 4, 3),
            dot(16, 64, 64),
            dot(16, 128, 128, 8, 3),
            dot(16, 64, 128, 4, 2),
        ],
        64: [deq(32, 32), deq(16, 64), dot(64, 64, 128, 4, 3), dot(64, 128, 128, 8, 3), dot(32, 128, 128, 4, 3)],
        4096: [deq(32, 32), deq(16, 64), dot(128, 128, 128, 8, 3), dot(64, 128, 128, 4, 3)],
    }
    WGS = [wg(64, 512), wg(64, 1024), wg(64, 2048), wg(128, 512, 8), wg(128, 1024, 8), wg(128, 1024), wg(128, 2048, 8)]
    for _m in (1, 4, 16):  # the warpgroup-MMA kernel, the two-codes-per-instruction kernel, the phase-1 kernels
        SWEEP[_m] = WGS + PAIRS[:4] + SWEEP[_m][: (None if _m == 1 else 2)]
    H2S = [half2(128, 512, 4), half2(64, 512, 4), half2(128, 1024, 8), half2(128, 256, 4), half2(32, 512, 4)]
    SWEEP[1] += H2S  # two codes per float16 instruction
    SWEEP[4] += H2S[:2]
    SWEEP[64] = [
        pair(64, 128, 128, 8, 3),
        pair(32, 128, 128, 4, 3),
        pair(64, 64, 128, 4, 3),
        pair(16, 128, 128, 4, 3),
    ] + SWEEP[64]
    TPOT_LIKE, PROMPT, GEN = "qwen3-8b", 16, 64

res = dict(
    name="w4",
    command=" ".join([sys.executable] + sys.argv),
    dry_run=DRY,
    group_size=GROUP,
    parts={},
    errors={},
    date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    torch=torch.__version__,
    triton=triton.__version__,
    gpu=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter dry run)",
    note="ms: 20 calls in one CUDA graph, replayed, divided, median of 5 replays; the calls cycle over copies of the "
    "weights (> 160 MB together) so L2 cannot serve them. GB/s: the W4 layer's own bytes (codes, fp16 scales and "
    "zeros, x, out) over its time; bf16 GB/s: the bf16 weight's bytes. speedup: best bf16 (cuBLAS or skinny) / W4.",
)
try:
    import transformers

    res["transformers"] = transformers.__version__
except Exception as e:
    res["transformers"] = f"unavailable ({e})"
try:
    res["git_commit"] = subprocess.check_output(
        ["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL
    ).strip()
except Exception:
    res["git_commit"] = "unknown"


def part(name, start_before):
    "Run the decorated part unless the run is past `start_before` seconds; record its result or its error."

    def deco(fn):
        if time.time() - T0 > (1e9 if DRY else start_before):
            res["errors"][name] = f"skipped: past {start_before} s"
            return fn
        t = time.time()
        try:
            res["parts"][name] = fn()
        except Exception as e:
            res["errors"][name] = f"{type(e).__name__}: {str(e)[:400]}"
            traceback.print_exc()
        res.setdefault("part_seconds", {})[name] = round(time.time() - t, 2)
        gc.collect()
        if DEV == "cuda":
            torch.cuda.empty_cache()
        return fn

    return deco


def write():
    "The JSON as it stands."
    res["sweep"] = SWEEP_ROWS
    res["seconds"] = round(time.time() - T0, 1)
    return write_json(res, OUT, "w4.json")


def _time_out():
    "The global time guard: past 140 s, write what there is and leave."
    res["errors"]["watchdog"] = "stopped at 140 s; parts after this point are missing"
    try:
        print("time guard: wrote", write(), flush=True)
    finally:
        os._exit(3)


import threading

WATCHDOG = threading.Timer(1e9 if DRY else 140.0, _time_out)
WATCHDOG.daemon = True
WATCHDOG.start()


def late(limit=LIMIT_S):
    return not DRY and time.time() - T0 > limit


def make_layer(K, N, gen):
    "A random 4-bit layer written in AWQ layout and read back into the kernel layout (fp16 scales and zeros, as the loader keeps them), and its dense bf16 twin [N, K]."
    codes = torch.randint(0, 16, (K, N), generator=gen, device=DEV)
    zeros = torch.randint(0, 16, (K // GROUP, N), generator=gen, device=DEV)
    scales = torch.rand(K // GROUP, N, generator=gen, device=DEV) * 0.004 + 0.001
    qweight, qzeros, s16 = W.awq_pack(codes, zeros, scales)
    c, z = W.awq_unpack(qweight, qzeros)
    qw, s, zz, grp, _ = W.to_kernel_layout(c, z, s16, torch.arange(K, device=DEV) // GROUP)
    dense = W.dequantize(c, z, s16, torch.arange(K, device=DEV) // GROUP).t().contiguous().to(DTYPE)
    return (qw, s, zz, grp), dense


def copies(t, nbytes):
    "Enough copies of the tuple `t` that together they exceed `L2_BYTES`."
    n = max(1, -(-L2_BYTES // max(nbytes, 1)))
    return [t] + [tuple(x.clone() if torch.is_tensor(x) else x for x in t) for _ in range(n - 1)]


def w4_bytes(K, N, M):
    return K * N // 2 + 2 * 2 * N * (K // GROUP) + 2 * M * (K + N)


def bf_bytes(K, N, M):
    return 2 * K * N + 2 * M * (K + N)


def with_split(cfg, M, N, K):
    "`cfg` with the rule's K split for its tile (four programs per SM)."
    if cfg["PATH"] in ("dequant", "wgmma"):
        return dict(cfg)
    tiles = (
        M * triton.cdiv(N, cfg["BLOCK_N"])
        if cfg["PATH"] in ("gemv", "half2")
        else triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
    )
    d = W.DEFAULTS["cuda" if DEV == "cuda" else "interpret"]
    return {**cfg, "SPLIT_K": W._split(tiles, K, d, W._num_sms(torch.device(DEV)))}


gen = torch.Generator(device=DEV).manual_seed(0)
LAYERS = {}
for name, (K, N) in SHAPES.items():
    try:
        w4, dense = make_layer(K, N, gen)
        LAYERS[name] = dict(w4=copies(w4, w4_bytes(K, N, 0)), bf=copies((dense,), bf_bytes(K, N, 0)))
    except Exception as e:
        res["errors"][f"make {name}"] = f"{type(e).__name__}: {e}"
res["setup_s"] = round(time.time() - T0, 2)


@part("correctness", 45)
def _():
    "Each path (rule, and one forced config per path) against the float32 reference, bf16 and fp16 activations."
    rows = []
    forced = (
        [None]
        + PAIR_CHECK
        + [c for M in SWEEP for c in SWEEP[M][:1]]
        + [SWEEP[max(SWEEP)][-1]]
        + [next(c for c in SWEEP[min(SWEEP)] if c["PATH"] == p) for p in ("gemv", "half2", "dot")]
    )
    forced = [c for i, c in enumerate(forced) if c not in forced[:i]]
    for name, (K, N) in SHAPES.items():
        if name not in LAYERS:
            continue
        qw, s, z, grp = LAYERS[name]["w4"][0]
        for dtype in CHECK_DTYPES:
            for M in (1, 4, 16, 64) if DRY else (1, 4, 16, 64, 1024):
                x = torch.randn(M, K, device=DEV).to(dtype)
                want = W.w4a16_linear_ref(x, qw, s, z, grp)
                for cfg in forced:
                    if cfg is not None and cfg["PATH"] in ("dot", "pair") and cfg["BLOCK_M"] > 16 and M < 16:
                        continue
                    if cfg is not None and cfg["PATH"] == "wgmma" and M > 16:
                        continue
                    r = dict(shape=name, M=M, dtype=str(dtype).removeprefix("torch."), config=cfg or "rule")
                    try:
                        got = W.w4a16_linear(x, qw, s, z, grp, config=None if cfg is None else with_split(cfg, M, N, K))
                        r["rel_err"] = rel(got, want)
                        r["ok"] = r["rel_err"] < (1e-2 if dtype == torch.bfloat16 else 2e-3)
                    except Exception as e:
                        r.update(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
                    rows.append(r)
                if late(45):
                    return dict(rows=rows, truncated=True)
    return dict(rows=rows, passed=sum(r["ok"] for r in rows), total=len(rows))


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _xor_chunk(acc, ptr, n, pid, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    for i in range(0, CHUNK, BLOCK):
        o = pid * CHUNK + i + tl.arange(0, BLOCK)
        acc ^= tl.load(ptr + o, mask=o < n, other=0).to(tl.int32)
    return acc


@triton.jit
def _read_kernel(
    w_ptr, n_w, s_ptr, n_s, z_ptr, n_z, out_ptr,
    CHUNK_W: tl.constexpr, CHUNK_S: tl.constexpr, CHUNK_Z: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    "The bytes a W4 kernel must read (words, scales, zeros), XOR-ed together in contiguous chunks: a read and nothing else."
    pid = tl.program_id(0)
    acc = _xor_chunk(tl.zeros([BLOCK], tl.int32), w_ptr, n_w, pid, CHUNK_W, BLOCK)
    acc = _xor_chunk(acc, s_ptr, n_s, pid, CHUNK_S, BLOCK)
    acc = _xor_chunk(acc, z_ptr, n_z, pid, CHUNK_Z, BLOCK)
    tl.store(out_ptr + pid, tl.reduce(acc, 0, _xor))


def _bits(t):
    "`t` flat, as integers of its own width (16 or 32 bits)."
    return t.reshape(-1).view({2: torch.int16, 4: torch.int32}[t.element_size()])


def read_all(qw, s, z, programs, block, num_warps):
    "XOR of every word of `qw` and every scale and zero (as integers), by `programs` programs; `read_ref` checks it."
    bufs = [_bits(t) for t in (qw, s, z)]
    chunks = [triton.cdiv(triton.cdiv(b.numel(), programs), block) * block for b in bufs]
    out = torch.empty(programs, dtype=torch.int32, device=qw.device)
    args = [a for b in bufs for a in (b, b.numel())]
    _read_kernel[(programs,)](*args, out, *chunks, BLOCK=block, num_warps=num_warps)
    return out


def read_ref(qw, s, z) -> int:
    "The same XOR in PyTorch: bit b of the result is the parity of bit b over every value, sign-extended to 32 bits."
    t = torch.cat([_bits(x).long() & 0xFFFFFFFF for x in (qw, s, z)])
    return sum(int(((t >> b) & 1).sum() % 2) << b for b in range(32))


READS = [(1, 64, 1), (4, 128, 1)] if DRY else [(4, 1024, 4), (8, 1024, 4), (16, 512, 4), (2, 2048, 8), (4, 2048, 8)]


@part("read_floor", 50)
def _():
    """The floor of any W4 kernel on each shape: reading its words, scales and zeros and nothing else (XOR-reduced, so
    every load is used), graph replay with the weights rotated beyond L2, as the sweep times the kernels."""
    rows, sms = [], W._num_sms(torch.device(DEV))
    for name, (K, N) in SHAPES.items():
        if name not in LAYERS:
            continue
        qw, s, z, _ = LAYERS[name]["w4"][0]
        want = read_ref(qw, s, z)
        for per_sm, block, nw in READS:
            r = dict(shape=name, N=N, K=K, programs=per_sm * sms, BLOCK=block, num_warps=nw)
            try:
                got = read_all(qw, s, z, per_sm * sms, block, nw)
                folded = 0
                for v in got.tolist():
                    folded ^= v & 0xFFFFFFFF
                r["same_xor"] = folded == want
                fns = [lambda t=t: read_all(*t[:3], per_sm * sms, block, nw) for t in LAYERS[name]["w4"]]
                r["ms"] = graph_ms(fns, CUDA, cpu_warmup=False)
                r["gbps"] = sum(t.numel() * t.element_size() for t in (qw, s, z)) / r["ms"] / 1e6
            except Exception as e:
                r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(r)
    return dict(rows=rows)


SWEEP_ROWS, BEST = [], {}


def sweep(ms, deadline):
    for M in ms:
        for name, (K, N) in SHAPES.items():
            if name not in LAYERS:
                continue
            if late(deadline):
                res["errors"][f"sweep M={M} {name}"] = f"skipped: past {deadline} s"
                continue
            L = LAYERS[name]
            qw, s, z, grp = L["w4"][0]
            x = torch.randn(M, K, device=DEV).to(DTYPE)
            want = W.w4a16_linear_ref(x, qw, s, z, grp)
            peers = {"bf16_cublas": [lambda t=t: F.linear(x, t[0]) for t in L["bf"]]}
            if M <= 16:
                from litellama.kernels.linear import skinny_linear

                peers["bf16_skinny"] = [lambda t=t: skinny_linear(x, t[0]) for t in L["bf"]]
            base = dict(shape=name, N=N, K=K, M=M)
            for peer, fns in peers.items():
                try:
                    t = graph_ms(fns, CUDA, cpu_warmup=False)
                    SWEEP_ROWS.append(dict(base, variant=peer, ms=t, gbps=bf_bytes(K, N, M) / t / 1e6))
                except Exception as e:
                    SWEEP_ROWS.append(dict(base, variant=peer, error=f"{type(e).__name__}: {str(e)[:200]}"))
            for cfg in [None] + SWEEP.get(M, []):
                if late(deadline):
                    break
                c = None if cfg is None else with_split(cfg, M, N, K)
                mults = (0.5, 1, 2) if c is not None and c["PATH"] in ("gemv", "half2") else (1, 2)
                for split_mult in (1,) if c is None or c["PATH"] in ("dequant", "wgmma") else mults:
                    cc = (
                        None
                        if c is None
                        else {**c, "SPLIT_K": max(1, int(c.get("SPLIT_K", 1) * split_mult))}
                        if "SPLIT_K" in c
                        else c
                    )
                    r = dict(
                        base,
                        variant="rule" if cc is None else cc["PATH"],
                        config=W._config(M, N, K, GROUP, DEV, W._num_sms(x.device)) if cc is None else cc,
                    )
                    try:
                        r["rel_err"] = rel(W.w4a16_linear(x, qw, s, z, grp, config=cc), want)
                        w4_fns = [lambda t=t: W.w4a16_linear(x, *t, config=cc) for t in L["w4"]]
                        r["ms"] = graph_ms(w4_fns, CUDA, cpu_warmup=False)
                        r["gbps"] = w4_bytes(K, N, M) / r["ms"] / 1e6
                        ok = r["rel_err"] < 1e-2
                        k = (name, M)
                        if ok and (k not in BEST or r["ms"] < BEST[k]["ms"]):
                            BEST[k] = r
                    except Exception as e:
                        r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    SWEEP_ROWS.append(r)
    return len(SWEEP_ROWS)


def summary():
    "Best W4 per shape and M against the best bf16 peer; the TUNED table."
    out, tuned = [], {}
    for (name, M), b in sorted(BEST.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        bf = [
            r["ms"]
            for r in SWEEP_ROWS
            if r["shape"] == name and r["M"] == M and r["variant"].startswith("bf16") and "ms" in r
        ]
        rule = next(
            (
                r["ms"]
                for r in SWEEP_ROWS
                if r["shape"] == name and r["M"] == M and r["variant"] == "rule" and "ms" in r
            ),
            None,
        )
        by_path = {}
        for r in SWEEP_ROWS:
            if (
                r["shape"] == name
                and r["M"] == M
                and "ms" in r
                and r["variant"] in ("gemv", "half2", "dot", "pair", "wgmma", "dequant")
                and r.get("rel_err", 1) < 1e-2
            ):
                by_path[r["variant"]] = min(by_path.get(r["variant"], 1e9), r["ms"])
        row = dict(
            shape=name,
            M=M,
            w4_ms=b["ms"],
            w4_gbps=b["gbps"],
            config=b["config"],
            rule_ms=rule,
            bf16_ms=min(bf) if bf else None,
            speedup=(min(bf) / b["ms"]) if bf else None,
            best_ms_by_path=by_path,
        )
        out.append(row)
        tuned[(b["N"], b["K"], W._bucket(M))] = {k: v for k, v in b["config"].items()}
    return out, tuned


@part("sweep_decode", 130)
def _():
    return dict(rows=sweep([m for m in MS if m <= 16], 132))


@part("sweep_prefill", 150)
def _():
    return dict(rows=sweep([m for m in MS if m > 16], 153))


TUNED_FOUND = {}


@part("tuned", 185)
def _():
    best, tuned = summary()
    TUNED_FOUND.update(tuned)
    return dict(best=best, table={str(k): v for k, v in tuned.items()})


def random_model(cfg, quant):
    "A model of `cfg` built on the device with random weights: 16-bit parameters as `qwen3_moe.random_model` draws them, and random AWQ codes, zeros and scales for the quantized linears, finished by `process_after_loading`."
    from litellama.models.decoder import model_class

    dtype = DTYPE if DEV == "cuda" else torch.float32
    with torch.device(DEV):
        model = model_class(cfg)(cfg, dtype=dtype, device=DEV, quant=quant)
    g = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("qweight", "qzeros")):
                p.copy_(torch.randint(-(2**31), 2**31 - 1, p.shape, generator=g, device=DEV, dtype=torch.int32))
            elif name.endswith("scales"):
                p.copy_(torch.rand(p.shape, generator=g, device=DEV) * 0.0008 + 0.0002)
            elif "norm" in name:
                p.normal_(1.0, 0.1, generator=g)
            elif p.dim() == 1:
                p.normal_(0.0, 0.1, generator=g)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=g)
        for m in model.modules():
            if hasattr(m, "process_after_loading"):
                m.process_after_loading()
    return model


def tpot(quant):
    "Batch-1 ms per output token through the engine (CUDA graphs), median of two runs after a warm-up."
    from transformers import AutoConfig
    from litellama.testing.checkpoints import SHAPES as CK
    from litellama.testing.tokenizer import make_tokenizer
    from litellama.engine.llm_engine import ContinuousBatchingEngine

    cfg = AutoConfig.for_model(**(CK[TPOT_LIKE] if DRY else QWEN3_8B))
    t = time.time()
    model = random_model(cfg, quant)
    build_s = time.time() - t
    t = time.time()
    eng = ContinuousBatchingEngine(
        model,
        cfg,
        make_tokenizer(),
        device=DEV,
        dtype=DTYPE if DEV == "cuda" else torch.float32,
        max_num_seqs=1,
        max_model_len=256,
        max_num_batched_tokens=256,
        num_kv_blocks=64,
        enable_prefix_caching=False,
    )
    setup_s = time.time() - t
    runs, _ = batch1_tpot(eng, cfg.vocab_size, PROMPT, GEN)
    params_bytes = sum(b.numel() * b.element_size() for b in list(model.parameters()) + list(model.buffers()))
    del eng, model
    gc.collect()
    if DEV == "cuda":
        torch.cuda.empty_cache()
    return dict(
        tpot_ms=sorted(runs[1:])[len(runs[1:]) // 2],
        runs_ms=runs,
        build_s=build_s,
        engine_setup_s=setup_s,
        model_bytes=params_bytes,
    )


@part("tpot_bf16", 165)
def _():
    return tpot(None)


@part("tpot_awq", 180)
def _():
    from litellama.layers.awq_gptq import AWQConfig

    W.TUNED.update(TUNED_FOUND)
    W._PLANS.clear()  # the sweep's best configs, as the kernel would read them
    r = tpot(AWQConfig(GROUP))
    r["tuned_entries_used"] = len(TUNED_FOUND)
    if "tpot_bf16" in res["parts"]:
        r["ratio_vs_bf16"] = r["tpot_ms"] / res["parts"]["tpot_bf16"]["tpot_ms"]
    return r


@part("tuned_all", 198)
def _():
    best, tuned = summary()
    return dict(best=best, table={str(k): v for k, v in tuned.items()})


WATCHDOG.cancel()
path = write()

print(f"{res['gpu']}  torch {res['torch']}  triton {res['triton']}  group {GROUP}  commit {res['git_commit'][:10]}")
c = res["parts"].get("correctness", {})
if c:
    print(
        f"correctness: {c.get('passed')}/{c.get('total')} ok; worst rel err "
        f"{max((r.get('rel_err', float('inf')) for r in c['rows']), default=float('nan')):.2e}"
    )
for r in c.get("rows") or []:
    if not r["ok"]:
        print("  bad:", r["shape"], r["M"], r["dtype"], r["config"], r.get("error", r.get("rel_err")))
best = res["parts"].get("tuned_all", res["parts"].get("tuned", {})).get("best", [])
print(
    f"{'shape':<8} {'M':>5} {'w4 ms':>9} {'rule ms':>9} {'bf16 ms':>9} {'speedup':>8} {'w4 GB/s':>8}  best ms per path; best config"
)
for b in best:
    f = lambda v, p=4: "-" if v is None else f"{v:.{p}f}"
    print(
        f"{b['shape']:<8} {b['M']:>5} {f(b['w4_ms']):>9} {f(b['rule_ms']):>9} {f(b['bf16_ms']):>9} {f(b['speedup'], 2):>8} {b['w4_gbps']:>8.0f}  {' '.join(f'{k}={v:.4f}' for k, v in sorted(b.get('best_ms_by_path', {}).items()))}; {b['config']}"
    )
for k in ("tpot_bf16", "tpot_awq"):
    if k in res["parts"]:
        print(
            f"{k}: {res['parts'][k]['tpot_ms']:.3f} ms/token"
            + (f"  ratio {res['parts'][k]['ratio_vs_bf16']:.3f}" if "ratio_vs_bf16" in res["parts"][k] else "")
        )
for r in [r for r in SWEEP_ROWS if "error" in r][:8]:
    print("sweep error:", r["shape"], r["M"], r.get("config", r["variant"]), r["error"][:160])
for k, e in res["errors"].items():
    print(f"error {k}: {e[:200]}")
tbl = res["parts"].get("tuned_all", res["parts"].get("tuned", {})).get("table", {})
print("TUNED = {" + ",\n         ".join(f"{k}: {v}" for k, v in tbl.items()) + "}")
print(f"wrote {path} in {res['seconds']:.1f} s")
