"""W4A16 GEMM on the H200: Qwen3-8B projection shapes in AWQ layout against bf16 torch.matmul, same run.

Run: PYTHONPATH=. python3 benchmarks_nb/gpu/i19.py $OUT            (GPU, under 90 s)
     PYTHONPATH=. python3 benchmarks_nb/gpu/i19.py $OUT --dry-run  (CPU, Triton interpreter, tiny shapes)
Writes $OUT/i19.json and prints a table."""
import datetime, json, os, subprocess, sys, time, traceback

DRY = "--dry-run" in sys.argv
if DRY: os.environ["TRITON_INTERPRET"] = "1"        # before the kernel module is imported
import torch
import triton
from litellama.kernels import w4a16 as W

OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), ".")
DEV = "cuda" if torch.cuda.is_available() and not DRY else "cpu"
if DRY:
    SHAPES = {"qkv": (64, 96), "o": (64, 64), "gate_up": (64, 192), "down": (128, 64)}   # name: (K, N)
    MS, GROUP, DTYPE, CHECK_DTYPES = (1, 4, 16, 33), 32, torch.float16, (torch.float16, torch.float32)
    SWEEP_MS = (1, 16)
    SWEEP = [dict(BLOCK_N=bn, BLOCK_K=32, SPLIT_K=sk, num_warps=1, num_stages=1) for bn in (16, 32) for sk in (1, 2)]
else:
    SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}
    MS, GROUP, DTYPE, CHECK_DTYPES = (1, 4, 16, 64, 256, 4096), 128, torch.bfloat16, (torch.bfloat16, torch.float16)
    SWEEP_MS = (1, 16)
    SWEEP = [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=nw, num_stages=3)     # few tile shapes: each is a compile
             for bn, bk, nw, sk in ((32, 128, 4, 8), (64, 128, 4, 1), (64, 128, 4, 4), (64, 128, 4, 8), (128, 128, 4, 4), (128, 64, 8, 8))]
T0, BUDGET_S = time.time(), (1e9 if DRY else 75.0)  # stop starting new parts past this (the whole run must stay under 90 s)
def over_budget(part):
    if time.time() - T0 < BUDGET_S: return False
    result["errors"].append(f"{part}: skipped, past the {BUDGET_S:.0f} s budget"); return True
LAYERS = 36        # Qwen3-8B decoder layers: the per-token projection time is the sum over one layer times this

result = dict(name="i19",  command=" ".join([sys.executable] + sys.argv), dry_run=DRY,
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              torch=torch.__version__, triton=triton.__version__, group_size=GROUP, errors=[])
try: import transformers; result["transformers"] = transformers.__version__
except Exception as e: result["transformers"] = f"unavailable ({e})"
try: result["git_commit"] = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
except Exception: result["git_commit"] = "unknown"
result["gpu"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter dry run)"

def timer(fn):
    "Median milliseconds of `fn`."
    if DEV == "cuda": return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")
    fn(); ts = []
    for _ in range(3):
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[1]

def layer(K, N, dtype, gen):
    "A random 4-bit layer written in AWQ layout and read back into the kernel layout, plus its bf16 twin."
    codes = torch.randint(0, 16, (K, N), generator=gen, device=DEV)
    zeros = torch.randint(0, 16, (K // GROUP, N), generator=gen, device=DEV)
    scales = (torch.rand(K // GROUP, N, generator=gen, device=DEV) * 0.004 + 0.001)
    qweight, qzeros, s16 = W.awq_pack(codes, zeros, scales)
    c, z = W.awq_unpack(qweight, qzeros)
    g_idx = torch.arange(K, device=DEV) // GROUP
    qw, s, zz, grp, perm = W.to_kernel_layout(c, z, s16, g_idx)      # fp16 scales and zeros, as the loader keeps them
    dense = W.dequantize(c, z, s16, g_idx).t().contiguous()          # [N, K], what a bf16 model would hold
    return [t.to(DEV) for t in (qw, s, zz)] + [grp], dense.to(DEV, dtype)

gen = torch.Generator(device=DEV).manual_seed(0)
layers = {}
for name, (K, N) in SHAPES.items():
    try: layers[name] = layer(K, N, DTYPE, gen)
    except Exception as e: result["errors"].append(f"make {name}: {type(e).__name__}: {e}")

# speed: W4A16 vs the bf16 GEMM on the same shapes, same run
rows = []
for name, (K, N) in SHAPES.items():
    if name not in layers or over_budget(f"gemm {name}"): continue
    (qw, s, z, grp), dense = layers[name]
    for M in MS:
        row = dict(shape=name, K=K, N=N, M=M)
        try:
            x = torch.randn(M, K, device=DEV).to(DTYPE)
            row["w4a16_ms"] = timer(lambda: W.w4a16_linear(x, qw, s, z, grp))
            row["bf16_ms"] = timer(lambda: torch.matmul(x, dense.t()))
            row["speedup"] = row["bf16_ms"] / row["w4a16_ms"]
            row["w4a16_gbps"] = (K * N // 2 + 2 * 2 * N * K // grp + 2 * M * (K + N)) / row["w4a16_ms"] / 1e6
            row["bf16_gbps"] = (2 * K * N + 2 * M * (K + N)) / row["bf16_ms"] / 1e6
            row["w4a16_tflops"] = 2 * M * N * K / row["w4a16_ms"] / 1e9
            row["bf16_tflops"] = 2 * M * N * K / row["bf16_ms"] / 1e9
            row["config"] = W._rule(M, N, K, grp, DEV, W._num_sms(x.device))
        except Exception as e: row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
result["gemm"] = rows

# correctness: kernel vs its reference, per dtype, path and shape
checks = []
for name, (K, N) in SHAPES.items():
    if name not in layers or over_budget(f"correctness {name}"): continue
    (qw, s, z, grp), _ = layers[name]
    for dtype in CHECK_DTYPES:
        for M in (1, 16, 256 if not DRY else 33):
            try:
                x = torch.randn(M, K, device=DEV).to(dtype)
                got = W.w4a16_linear(x, qw, s, z, grp).float()
                want = W.w4a16_linear_ref(x, qw, s, z, grp).float()
                rel = ((got - want).norm() / want.norm()).item()
                tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
                checks.append(dict(shape=name, M=M, dtype=str(dtype).removeprefix("torch."), rel_err=rel, ok=rel < tol))
            except Exception as e:
                checks.append(dict(shape=name, M=M, dtype=str(dtype).removeprefix("torch."), ok=False, error=f"{type(e).__name__}: {e}"))
result["correctness"] = checks

# per-token projection time of a Qwen3-8B decoder at batch 1 (the GEMMs only: attention, norms and the LM head excluded)
try:
    one = [r for r in rows if r["M"] == 1 and "w4a16_ms" in r]
    if len(one) == len(SHAPES):
        w4, bf = sum(r["w4a16_ms"] for r in one) * LAYERS, sum(r["bf16_ms"] for r in one) * LAYERS
        result["batch1_projection_ms_per_token"] = dict(w4a16=w4, bf16=bf, ratio=w4 / bf, layers=LAYERS)
except Exception as e: result["errors"].append(f"tpot: {e}")

# a small tile-config sweep of the skinny (decode) path
sweep = []
for name, (K, N) in SHAPES.items():
    if name not in layers or over_budget(f"sweep {name}"): continue
    (qw, s, z, grp), _ = layers[name]
    for M in SWEEP_MS:
        x = torch.randn(M, K, device=DEV).to(DTYPE)
        want = W.w4a16_linear_ref(x, qw, s, z, grp).float()
        for cfg in SWEEP:
            cfg = {**cfg, "BLOCK_M": 1 if M == 1 else 16}
            r = dict(shape=name, M=M, config=cfg)
            try:
                got = W.w4a16_linear(x, qw, s, z, grp, config=cfg).float()
                r["rel_err"] = ((got - want).norm() / want.norm()).item()
                r["ms"] = timer(lambda: W.w4a16_linear(x, qw, s, z, grp, config=cfg))
            except Exception as e: r["error"] = f"{type(e).__name__}: {e}"
            sweep.append(r)
result["skinny_sweep"] = sweep
result["seconds"] = time.time() - T0
best = {}
for r in sweep:
    if "ms" in r and r["rel_err"] < 2e-2:
        k = (r["shape"], r["M"])
        if k not in best or r["ms"] < best[k]["ms"]: best[k] = r
result["skinny_best"] = [dict(shape=k[0], M=k[1], ms=v["ms"], config=v["config"]) for k, v in best.items()]

os.makedirs(OUT, exist_ok=True)
path = os.path.join(OUT, "i19.json")
with open(path, "w") as f: json.dump(result, f, indent=1, default=str)

print(f"{result['gpu']}  torch {result['torch']}  triton {result['triton']}  group {GROUP}")
print(f"correctness: {sum(c['ok'] for c in checks)}/{len(checks)} ok; worst rel err "
      f"{max((c.get('rel_err', float('inf')) for c in checks), default=float('nan')):.2e}")
print(f"{'shape':<8} {'M':>5} {'w4a16 ms':>9} {'bf16 ms':>9} {'speedup':>8} {'w4 GB/s':>8}")
for r in rows:
    if "error" in r: print(f"{r['shape']:<8} {r['M']:>5}  error: {r['error'][:80]}"); continue
    print(f"{r['shape']:<8} {r['M']:>5} {r['w4a16_ms']:>9.4f} {r['bf16_ms']:>9.4f} {r['speedup']:>8.2f} {r['w4a16_gbps']:>8.0f}")
if "batch1_projection_ms_per_token" in result:
    t = result["batch1_projection_ms_per_token"]
    print(f"batch-1 projections per token ({LAYERS} layers): w4a16 {t['w4a16']:.3f} ms, bf16 {t['bf16']:.3f} ms, ratio {t['ratio']:.2f}")
for b in result["skinny_best"]: print(f"skinny best {b['shape']:<8} M={b['M']:<3} {b['ms']:.4f} ms {b['config']}")
for e in result["errors"]: print("error:", e)
print("wrote", path)
