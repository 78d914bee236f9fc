"""Tensor parallelism across real processes: torchrun's launcher against the in-process one, SIGTERM leaving no orphan,
overlapped steps and structured outputs at tp = 2 against tp = 1, and two tensor-parallel engines one after the other."""
import json, os, signal, subprocess, sys, time
from pathlib import Path
import pytest, torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = '''
import json, sys, time
from pathlib import Path
from litellama.entrypoints.llm import LLM
from litellama.sampling_params import SamplingParams

def main(path, out, mode):
    llm = LLM(path, dtype="float32", device="cpu", tensor_parallel_size=2, max_num_seqs=4, max_num_batched_tokens=16,
              block_size=4, num_kv_blocks=32)
    if mode == "hang":
        Path(out).write_text(json.dumps([p.pid for p in llm.engine.executor.procs])); time.sleep(600)
    prompts = [[1, 2, 3], list(range(5, 30)), [7]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
    seeded = llm.generate(prompts, SamplingParams(temperature=0.8, seed=3, max_tokens=4, ignore_eos=True), use_tqdm=False)
    if out: Path(out).write_text(json.dumps([[o.outputs[0].token_ids for o in outs], [o.outputs[0].token_ids for o in seeded]]))
    llm.engine.executor.shutdown()

SCHEMA = {"type": "object", "properties": {"capital": {"type": "string", "enum": ["Paris", "Rome"]}, "sure": {"type": "boolean"}},
          "required": ["capital", "sure"], "additionalProperties": False}

def overlapped(path, tp):
    "Tokens of a json_schema request among plain ones, overlapped steps on; the engine's async flag."
    from litellama.engine.structured_outputs import StructuredOutputsParams
    with LLM(path, dtype="float32", device="cpu", tensor_parallel_size=tp, max_num_seqs=4, max_num_batched_tokens=16,
             block_size=4, num_kv_blocks=64, async_scheduling=True) as llm:
        params = [SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=SCHEMA)),
                  SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
                  SamplingParams(temperature=0.8, seed=5, max_tokens=6, ignore_eos=True)]
        outs = llm.generate(["Capital of France, in JSON:", list(range(5, 30)), [7, 8]], params, use_tqdm=False)
        from litellama.engine.async_engine import prompt_logprobs
        try:  # a capability this executor declares it lacks: refused in one line
            refused = str(len(prompt_logprobs(llm.engine, [1, 2, 3])))
        except ValueError as e:
            refused = str(e)
        return dict(refused=refused, tokens=[o.outputs[0].token_ids for o in outs], json=outs[0].outputs[0].text,
                    reason=outs[0].outputs[0].finish_reason, overlapped=llm.engine.async_scheduling)

def one_after_another(path):
    "Two tensor-parallel LLMs in turn in this process (the first dropped, the second closed by `with`), each's tokens."
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    opts = dict(dtype="float32", device="cpu", tensor_parallel_size=2, block_size=4, num_kv_blocks=32)
    llm = LLM(path, **opts)
    first = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids
    try:  # while the first lives, a second is refused in one line, and the first keeps working
        LLM(path, **opts)
        clash = "no error"
    except Exception as e:
        clash = f"{type(e).__name__}: {e}"
    again = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids
    del llm
    with LLM(path, **opts) as llm:
        second = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids
    with LLM(path, **opts) as llm:
        third = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0].outputs[0].token_ids
    return [first, second, third, again, clash]

if __name__ == "__main__":       # spawned ranks re-import this file: the engine must start only in the main process
    path, out, mode = sys.argv[1:4]
    if mode == "overlap":
        Path(out).write_text(json.dumps([overlapped(path, 1), overlapped(path, 2)]))
    elif mode == "twice":
        Path(out).write_text(json.dumps(one_after_another(path)))
    else:
        main(path, out, mode)
'''

def _alive(pid: int) -> bool:
    "Is `pid` a running (not zombie) process?"
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError): return False

def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    return env

@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from litellama.testing.checkpoints import make_random_checkpoint
    d = tmp_path_factory.mktemp("tp")
    (d / "run.py").write_text(SCRIPT)
    return make_random_checkpoint("tiny-llama", d / "m", dtype=torch.float32, seed=1), d / "run.py"

def test_torchrun_matches_spawn(ckpt, tmp_path):
    from litellama.distributed.comm import free_port
    path, script = ckpt
    spawn, trun = tmp_path / "spawn.json", tmp_path / "torchrun.json"
    subprocess.run([sys.executable, str(script), str(path), str(spawn), "run"], env=_env(), check=True, timeout=240)
    torchrun = Path(sys.executable).with_name("torchrun")
    subprocess.run([str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port()), str(script), str(path), str(trun), "run"],
                   env=_env(), check=True, timeout=240)
    assert json.loads(trun.read_text()) == json.loads(spawn.read_text())

def test_sigterm_leaves_no_orphan(ckpt, tmp_path):
    path, script = ckpt
    pids = tmp_path / "pids.json"
    p = subprocess.Popen([sys.executable, str(script), str(path), str(pids), "hang"], env=_env())
    try:
        t0 = time.monotonic()
        while not pids.exists() or not pids.read_text():
            assert time.monotonic() - t0 < 180 and p.poll() is None, "the engine did not start"
            time.sleep(0.2)
        children = json.loads(pids.read_text())
        p.send_signal(signal.SIGTERM); p.wait(10)
        t0 = time.monotonic()
        while any(_alive(c) for c in children):
            assert time.monotonic() - t0 < 5, f"rank processes {children} outlived their parent"
            time.sleep(0.1)
    finally:
        if p.poll() is None: p.kill()

def test_overlap_and_structured_outputs_at_tp2(ckpt, tmp_path):
    "tp = 2 runs overlapped steps and a json_schema request whose output validates, with tp = 1's tokens."
    path, script = ckpt
    out = tmp_path / "overlap.json"
    subprocess.run([sys.executable, str(script), str(path), str(out), "overlap"], env=_env(), check=True, timeout=400)
    one, two = json.loads(out.read_text())
    assert one["overlapped"] and two["overlapped"]
    assert two["tokens"] == one["tokens"]
    obj = json.loads(two["json"])
    assert set(obj) == {"capital", "sure"} and obj["capital"] in ("Paris", "Rome") and isinstance(obj["sure"], bool)
    assert two["reason"] == "stop"
    assert one["refused"] == "3" and two["refused"].startswith("prompt logprobs need the whole model"), two["refused"]

def test_two_tp_engines_in_one_process(ckpt, tmp_path):
    "A tensor-parallel LLM dropped (or closed), then another in the same process: the same tokens each time."
    path, script = ckpt
    out = tmp_path / "twice.json"
    subprocess.run([sys.executable, str(script), str(path), str(out), "twice"], env=_env(), check=True, timeout=400)
    first, second, third, again, clash = json.loads(out.read_text())
    assert len(first) == 6 and first == second == third == again
    assert clash.startswith("DistributedError: this process already belongs to a tensor-parallel group"), clash
