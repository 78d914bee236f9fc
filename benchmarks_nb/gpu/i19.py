"""W4A16 GEMM on the H200: Qwen3-8B projection shapes in AWQ layout against bf16 torch.matmul, same run, eager and under
CUDA-graph replay, plus a sweep of launch configurations per shape and M whose best entries are printed in the form of
`litellama.kernels.w4a16.TUNED`.

Run: PYTHONPATH=. python3 benchmarks_nb/gpu/i19.py $OUT            (GPU, about 100 s)
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
T0, BUDGET_S = time.time(), (1e9 if DRY else 100.0)   # stop starting new parts past this; the run stays under 120 s
LAYERS = 36        # Qwen3-8B decoder layers: the per-token projection time is the sum over one layer times this
if DRY:
    SHAPES = {"qkv": (64, 96), "o": (64, 64), "gate_up": (64, 192), "down": (128, 64)}   # name: (K, N)
    MS, GROUP, DTYPE, CHECK_DTYPES, L2_BYTES = (1, 4, 16, 33), 32, torch.float16, (torch.float16, torch.float32), 0
    SWEEP = {1: [dict(PATH="tile", BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=1, num_stages=1)
                 for bn, bk, sk in ((16, 32, 1), (32, 64, 2))],
             16: [dict(PATH="tile", BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, SPLIT_K=2, num_warps=1, num_stages=1)],
             33: [dict(PATH="dequant", BLOCK_W=4, BLOCK_N=16, num_warps=1),
                  dict(PATH="tile", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SPLIT_K=1, num_warps=1, num_stages=1)]}
else:
    SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}
    MS, GROUP, DTYPE, CHECK_DTYPES, L2_BYTES = (1, 4, 16, 64, 256, 4096), 128, torch.bfloat16, (torch.bfloat16, torch.float16), 160 << 20
    def one(bn, bk, sk, nw=4, ns=3): return dict(PATH="tile", BLOCK_M=1, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=nw, num_stages=ns)
    def dot(bm, bn, bk, sk, nw=4, ns=3): return dict(PATH="tile", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=nw, num_stages=ns)
    DQ = dict(PATH="dequant", BLOCK_W=16, BLOCK_N=128, num_warps=4)
    SWEEP = {1: [one(32, 256, 0), one(64, 128, 0), one(64, 256, 0), one(128, 128, 0), one(64, 512, 0, 8), one(128, 256, 0, 8),
                 one(64, 256, 0, 4, 4), one(32, 512, 0)],
             16: [dot(16, 32, 128, 0), dot(16, 64, 128, 0), dot(16, 128, 128, 0), dot(16, 64, 256, 0), dot(16, 64, 128, 0, 4, 4),
                  dot(16, 128, 128, 0, 8)],
             256: [DQ, dot(64, 128, 128, 0), dot(128, 128, 128, 0, 8), dot(64, 64, 128, 0)],
             4096: [DQ, dot(128, 128, 128, 1, 8, 3)]}
def over_budget(part):
    if time.time() - T0 < BUDGET_S: return False
    result["errors"].append(f"{part}: skipped, past the {BUDGET_S:.0f} s budget"); return True

result = dict(name="i19",  command=" ".join([sys.executable] + sys.argv), dry_run=DRY,
              date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              torch=torch.__version__, triton=triton.__version__, group_size=GROUP, errors=[],
              note="graph_ms: 20 calls captured in one CUDA graph, replayed, divided; the calls cycle over enough copies "
                   "of the weights (> 160 MB) that the 50 MB L2 cannot serve them; eager_ms: triton do_bench median")
try: import transformers; result["transformers"] = transformers.__version__
except Exception as e: result["transformers"] = f"unavailable ({e})"
try: result["git_commit"] = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, stderr=subprocess.DEVNULL).strip()
except Exception: result["git_commit"] = "unknown"
result["gpu"] = torch.cuda.get_device_name() if DEV == "cuda" else "cpu (interpreter dry run)"

def eager_ms(fn):
    "Median milliseconds of `fn`, launched eagerly."
    if DEV == "cuda": return triton.testing.do_bench(fn, warmup=10, rep=30, return_mode="median")
    fn(); ts = []
    for _ in range(3):
        t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1e3)
    return sorted(ts)[1]

def graph_ms(fns, calls=20, replays=5):
    "Milliseconds per call: `calls` calls (cycling over `fns`) recorded in one CUDA graph, median of `replays` replays."
    if DEV != "cuda": return eager_ms(fns[0])
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns[:2]: f()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls): fns[i % len(fns)]()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) / calls)
    del g
    return sorted(ts)[len(ts) // 2]

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
    return (qw, s, zz, grp), dense.to(dtype)

def copies(t, nbytes):
    "Enough copies of tensors `t` (a tuple) that together they exceed `L2_BYTES`."
    n = max(1, -(-L2_BYTES // max(nbytes, 1)))
    return [t] + [tuple(x.clone() if torch.is_tensor(x) else x for x in t) for _ in range(n - 1)]

def w4_bytes(K, N, M): return K * N // 2 + 2 * 2 * N * K // GROUP + 2 * M * (K + N)
def bf_bytes(K, N, M): return 2 * K * N + 2 * M * (K + N)
def cfg_str(c): return {k: v for k, v in c.items()}

gen = torch.Generator(device=DEV).manual_seed(0)
layers = {}
for name, (K, N) in SHAPES.items():
    try:
        (qw, s, z, grp), dense = layer(K, N, DTYPE, gen)
        layers[name] = dict(w4=copies((qw, s, z, grp), w4_bytes(K, N, 0)), bf=copies((dense,), bf_bytes(K, N, 0)))
    except Exception as e: result["errors"].append(f"make {name}: {type(e).__name__}: {e}")
result["setup_s"] = time.time() - T0

# speed: the default launch rule vs the bf16 GEMM, same shapes, same run; eager and graph
rows = []
for name, (K, N) in SHAPES.items():
    if name not in layers or over_budget(f"gemm {name}"): continue
    L = layers[name]
    for M in MS:
        row = dict(shape=name, K=K, N=N, M=M)
        try:
            x = torch.randn(M, K, device=DEV).to(DTYPE)
            w4 = [lambda t=t: W.w4a16_linear(x, *t) for t in L["w4"]]
            bf = [lambda t=t: torch.matmul(x, t[0].t()) for t in L["bf"]]
            row["config"] = W._config(M, N, K, GROUP, DEV, W._num_sms(x.device))
            row["w4a16_eager_ms"], row["bf16_eager_ms"] = eager_ms(w4[0]), eager_ms(bf[0])
            row["w4a16_ms"], row["bf16_ms"] = graph_ms(w4), graph_ms(bf)
            row["speedup"] = row["bf16_ms"] / row["w4a16_ms"]
            row["speedup_eager"] = row["bf16_eager_ms"] / row["w4a16_eager_ms"]
            row["w4a16_gbps"] = w4_bytes(K, N, M) / row["w4a16_ms"] / 1e6
            row["bf16_gbps"] = bf_bytes(K, N, M) / row["bf16_ms"] / 1e6
            row["w4a16_tflops"] = 2 * M * N * K / row["w4a16_ms"] / 1e9
            row["bf16_tflops"] = 2 * M * N * K / row["bf16_ms"] / 1e9
        except Exception as e: row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
result["gemm"] = rows

# correctness of the default paths: kernel vs its float32 reference, per dtype and shape
checks = []
for name, (K, N) in SHAPES.items():
    if name not in layers or over_budget(f"correctness {name}"): continue
    qw, s, z, grp = layers[name]["w4"][0]
    for dtype in CHECK_DTYPES:
        for M in ((1, 16, 64, 1024) if not DRY else (1, 16, 33)):
            try:
                x = torch.randn(M, K, device=DEV).to(dtype)
                got = W.w4a16_linear(x, qw, s, z, grp).float()
                want = W.w4a16_linear_ref(x, qw, s, z, grp).float()
                rel = ((got - want).norm() / want.norm()).item()
                tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
                checks.append(dict(shape=name, M=M, dtype=str(dtype).removeprefix("torch."), rel_err=rel, ok=rel < tol,
                                   path=W._config(M, N, K, grp, DEV, W._num_sms(x.device))["PATH"]))
            except Exception as e:
                checks.append(dict(shape=name, M=M, dtype=str(dtype).removeprefix("torch."), ok=False, error=f"{type(e).__name__}: {e}"))
result["correctness"] = checks

# batch-1 projection time per token of a Qwen3-8B decoder (the GEMMs only: attention, norms and the LM head excluded)
try:
    one_rows = [r for r in rows if r["M"] == 1 and "w4a16_ms" in r]
    if len(one_rows) == len(SHAPES):
        t = {}
        for k in ("", "_eager"):
            w4 = sum(r[f"w4a16{k}_ms"] for r in one_rows) * LAYERS; bf = sum(r[f"bf16{k}_ms"] for r in one_rows) * LAYERS
            t["graph" if not k else "eager"] = dict(w4a16=w4, bf16=bf, ratio=w4 / bf)
        result["batch1_projection_ms_per_token"] = dict(layers=LAYERS, **t)
except Exception as e: result["errors"].append(f"tpot: {e}")

# the sweep: each configuration checked against the reference and timed under graph replay
sweep = []
for M, cfgs in SWEEP.items():
    for name, (K, N) in SHAPES.items():
        if name not in layers or over_budget(f"sweep {name} M={M}"): continue
        L = layers[name]
        qw, s, z, grp = L["w4"][0]
        try:
            x = torch.randn(M, K, device=DEV).to(DTYPE)
            want = W.w4a16_linear_ref(x, qw, s, z, grp).float()
        except Exception as e: result["errors"].append(f"sweep ref {name} M={M}: {e}"); continue
        for cfg in cfgs:
            cfg = dict(cfg)
            if cfg.get("SPLIT_K") == 0:                               # 0: the rule's split for this tile
                d = W.DEFAULTS["cuda"]; want_p = d["programs_per_sm"] * W._num_sms(x.device)
                tiles = triton.cdiv(M, cfg["BLOCK_M"]) * triton.cdiv(N, cfg["BLOCK_N"])
                cfg["SPLIT_K"] = 1 if tiles >= want_p else max(1, min(triton.cdiv(want_p, tiles), K // d["min_split"], d["max_split"]))
            r = dict(shape=name, N=N, K=K, M=M, config=cfg)
            if over_budget(f"sweep {name} M={M} {cfg}"): break
            try:
                got = W.w4a16_linear(x, qw, s, z, grp, config=cfg).float()
                r["rel_err"] = ((got - want).norm() / want.norm()).item()
                r["ms"] = graph_ms([lambda t=t: W.w4a16_linear(x, *t, config=cfg) for t in L["w4"]])
                r["gbps"] = w4_bytes(K, N, M) / r["ms"] / 1e6
            except Exception as e: r["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            sweep.append(r)
result["sweep"] = sweep
best = {}
for r in sweep:
    if "ms" in r and r["rel_err"] < 2e-2:
        k = (r["shape"], r["M"])
        if k not in best or r["ms"] < best[k]["ms"]: best[k] = r
result["sweep_best"] = [dict(shape=k[0], M=k[1], ms=v["ms"], gbps=v["gbps"], config=v["config"]) for k, v in best.items()]
result["tuned_table"] = {f"({v['N']}, {v['K']}, {k[1]})": v["config"] for k, v in best.items()}
result["seconds"] = time.time() - T0

os.makedirs(OUT, exist_ok=True)
path = os.path.join(OUT, "i19.json")
with open(path, "w") as f: json.dump(result, f, indent=1, default=str)

print(f"{result['gpu']}  torch {result['torch']}  triton {result['triton']}  group {GROUP}")
print(f"correctness: {sum(c['ok'] for c in checks)}/{len(checks)} ok; worst rel err "
      f"{max((c.get('rel_err', float('inf')) for c in checks), default=float('nan')):.2e}")
print(f"{'shape':<8} {'M':>5} {'w4 graph':>9} {'bf graph':>9} {'speedup':>8} {'w4 GB/s':>8} {'w4 eager':>9} {'bf eager':>9} {'sp eager':>8}  path")
for r in rows:
    if "error" in r: print(f"{r['shape']:<8} {r['M']:>5}  error: {r['error'][:80]}"); continue
    print(f"{r['shape']:<8} {r['M']:>5} {r['w4a16_ms']:>9.4f} {r['bf16_ms']:>9.4f} {r['speedup']:>8.2f} {r['w4a16_gbps']:>8.0f} "
          f"{r['w4a16_eager_ms']:>9.4f} {r['bf16_eager_ms']:>9.4f} {r['speedup_eager']:>8.2f}  {r['config'].get('PATH')}")
if "batch1_projection_ms_per_token" in result:
    t = result["batch1_projection_ms_per_token"]
    for k in ("graph", "eager"):
        print(f"batch-1 projections per token ({LAYERS} layers, {k}): w4a16 {t[k]['w4a16']:.3f} ms, bf16 {t[k]['bf16']:.3f} ms, ratio {t[k]['ratio']:.2f}")
for b in result["sweep_best"]: print(f"sweep best {b['shape']:<8} M={b['M']:<5} {b['ms']:.4f} ms {b['gbps']:6.0f} GB/s {b['config']}")
bad = [r for r in sweep if "error" in r or r.get("rel_err", 0) >= 2e-2]
for r in bad[:10]: print("sweep bad:", r["shape"], r["M"], r["config"], r.get("error", r.get("rel_err")))
for e in result["errors"]: print("error:", e)
print(f"TUNED = {{{', '.join(f'{k}: {v}' for k, v in result['tuned_table'].items())}}}")
print(f"wrote {path} in {result['seconds']:.1f} s")
