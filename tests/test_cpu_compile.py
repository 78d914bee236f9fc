"""A CPU's compiled decode path (nbs/11b_cpu.ipynb): one graph per batch bucket, all compiled at start-up, none inside
a request, whatever the batch and the context; float32 greedy tokens equal to the eager path's."""

import logging
import random
from pathlib import Path

import torch
from torch._dynamo.utils import counters

from litellama.entrypoints.llm import LLM
from litellama.sampling_params import SamplingParams
from litellama.testing.checkpoints import make_random_checkpoint

BLOCK = 4  # small blocks: short sequences cross several block boundaries


def _greedy(llm: LLM, prompts: list, gens: list) -> list:
    params = [SamplingParams(temperature=0, max_tokens=g, ignore_eos=True) for g in gens]
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def test_buckets_compile_at_start_up_only_and_match_eager(monkeypatch, tmp_path, caplog):
    path = make_random_checkpoint("tiny-qwen3", tmp_path / "q3", dtype=torch.float32, seed=58, num_hidden_layers=1)
    opts = dict(dtype="float32", device="cpu", max_num_seqs=64, block_size=BLOCK)
    monkeypatch.setenv("LITELLAMA_CPU_COMPILE", "1")  # conftest.py runs the other tests eagerly
    with caplog.at_level(logging.INFO, logger="litellama"):
        llm = LLM(path, **opts)
    compiled = llm.engine.runner.compiled
    assert compiled is not None and compiled.failed is None
    assert compiled.buckets == [1, 2, 4, 8, 16, 32, 64]
    assert compiled.graphs == len(compiled.buckets)  # one graph per bucket, all compiled at start-up
    said = [r.getMessage() for r in caplog.records if "compiled the CPU decode step" in r.getMessage()]
    assert len(said) == 1, said
    assert any((Path(compiled.cache_dir) / "fxgraph").rglob("*")), "compiled graphs kept on disk for the next process"
    graphs_after_start = counters["stats"]["unique_graphs"]

    seen = []  # (bucket, blocks read) of every compiled step
    padded = compiled._padded

    def watch(n, B):
        mi = padded(n, B)
        seen.append((B, mi.attn.per_step["decode"][1][1].shape[-1] // BLOCK))
        return mi

    compiled._padded = watch
    monkeypatch.setenv("LITELLAMA_CPU_COMPILE", "0")
    eager = LLM(path, **opts)
    assert eager.engine.runner.compiled is None

    rng = random.Random(58)
    sizes = [1, 3, 17, 64]
    rng.shuffle(sizes)
    for bs in sizes:
        prompts = [[rng.randrange(3, 200) for _ in range(rng.randrange(2, 15))] for _ in range(bs)]
        gens = [rng.randrange(1, 12) for _ in range(bs)]
        assert _greedy(llm, prompts, gens) == _greedy(eager, prompts, gens), f"batch {bs}"

    assert compiled.graphs == len(compiled.buckets)  # nothing compiled inside a request
    assert counters["stats"]["unique_graphs"] == graphs_after_start
    assert {1, 4, 32, 64} <= {b for b, _ in seen}  # the batches of 1, 3, 17 and 64 in their buckets
    assert len({nb for _, nb in seen}) >= 4  # contexts across block boundaries, in the same graphs
