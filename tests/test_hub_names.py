"""Models named as vLLM users name them: a Hugging Face hub id is read from a Hugging Face cache (written here in the
layout huggingface_hub writes) and generates the same greedy tokens as the checkpoint directory it came from; revisions,
missing ids, broken caches and missing paths each fail in one line; a draft model and a LoRA adapter by hub id too."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the batched LoRA kernels run in the interpreter on a CPU

import shutil
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download
from huggingface_hub.errors import IncompleteSnapshotError
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from litellama.entrypoints.llm import LLM
from litellama.models.lora import LoRARequest
from litellama.models.model_dir import ModelNotFoundError
from litellama.sampling_params import SamplingParams
from litellama.testing.checkpoints import make_random_checkpoint
from litellama.testing.hf_cache import write_hf_cache

PROMPTS = [[5, 17, 9, 33, 2, 41], [250, 11, 60, 7]]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
OPTS = dict(dtype="float32", device="cpu", num_kv_blocks=32)
OFF = "HF_HUB_OFFLINE is set, so the hub was not asked"


def run(llm, lora=None):
    "The greedy tokens of `PROMPTS` from `llm` (with adapter `lora`)."
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, False, lora_request=lora)]


def greedy(model, **kw):
    "The greedy tokens of `PROMPTS` from `LLM(model, **kw)`, and the name the engine goes by."
    llm = LLM(model, **OPTS, **kw)
    try:
        return run(llm), llm.engine.model_name
    finally:
        llm.shutdown()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    "A cache holding `org/tiny` at main (its repo has a `pytorch_model.bin`, not fetched) and at v2, other weights."
    tmp = tmp_path_factory.mktemp("hub")
    dirs = {"main": make_random_checkpoint("tiny-qwen3", tmp / "main", dtype=torch.float32)}
    dirs["v2"] = make_random_checkpoint("tiny-qwen3", tmp / "v2", dtype=torch.float32, seed=1)
    (dirs["main"] / "pytorch_model.bin").write_bytes(b"a pickled copy the loader never reads")
    cache = tmp / "cache"
    snaps = {rev: write_hf_cache(d, cache, "org/tiny", rev, ("pytorch_model.bin",)) for rev, d in dirs.items()}
    want = {rev: greedy(str(d))[0] for rev, d in dirs.items()}
    assert want["main"] != want["v2"]  # picking the wrong revision would show
    return tmp, cache, snaps, want


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "LITELLAMA_MODEL_DIR"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_hub_id_gives_the_directorys_tokens(hub, offline):
    tmp, cache, snaps, want = hub
    assert greedy("org/tiny", download_dir=str(cache)) == (want["main"], "org/tiny")
    assert greedy("org/tiny", revision="v2", download_dir=cache) == (want["v2"], "org/tiny")
    assert greedy("org/tiny", revision=snaps["v2"].name, download_dir=cache)[0] == want["v2"]  # a commit id


def test_cache_from_the_environment(hub, offline):
    tmp, cache, snaps, want = hub
    offline.setenv("HF_HUB_CACHE", str(cache))
    assert greedy("org/tiny") == (want["main"], "org/tiny")
    offline.delenv("HF_HUB_CACHE")
    home = tmp / "home"
    if not home.exists():
        shutil.copytree(cache, home / "hub", symlinks=True)
    offline.setenv("HF_HOME", str(home))
    assert greedy("org/tiny", revision="v2") == (want["v2"], "org/tiny")


def test_only_the_loaders_files_are_needed(hub, offline):
    tmp, cache, snaps, want = hub
    with pytest.raises(IncompleteSnapshotError, match="pytorch_model.bin"):  # the repo lists it; the cache lacks it
        snapshot_download("org/tiny", cache_dir=cache, local_files_only=True)
    assert not (snaps["main"] / "pytorch_model.bin").exists()  # and yet `org/tiny` loaded above


def one_line(f, want: str):
    with pytest.raises(ModelNotFoundError) as e:
        f()
    assert str(e.value) == want


def test_missing_in_one_line(hub, offline):
    tmp, cache, snaps, want = hub
    one_line(
        lambda: LLM("org/none", download_dir=cache), f"model 'org/none' is not in the Hugging Face cache {cache}; {OFF}"
    )
    one_line(lambda: LLM("org/tiny", revision="v9", download_dir=cache),
             f"model 'org/tiny' at revision 'v9' is not in the Hugging Face cache {cache}; {OFF}")  # fmt: skip
    one_line(lambda: LLM("./no/such/dir"), "model directory not found: ./no/such/dir")
    one_line(lambda: LLM(str(tmp / "nowhere")), f"model directory not found: {tmp / 'nowhere'}")
    one_line(lambda: LLM("~/no-such-model-dir"), f"model directory not found: {Path.home() / 'no-such-model-dir'}")


def test_broken_cache_in_one_line(hub, offline):
    tmp, cache, snaps, want = hub
    broken = tmp / "broken"
    gone = write_hf_cache(tmp / "main", broken, "org/gone")
    shutil.rmtree(gone)
    one_line(lambda: LLM("org/gone", download_dir=broken), f"model 'org/gone' is broken in the Hugging Face cache "
             f"{broken} (refs/main names commit {gone.name}, which has no snapshot); {OFF}")  # fmt: skip
    partial = write_hf_cache(tmp / "main", broken, "org/partial")
    (partial / "config.json").unlink()
    one_line(lambda: LLM("org/partial", download_dir=broken), f"model 'org/partial' is incomplete in the Hugging Face "
             f"cache {broken} (snapshot {partial.name} lacks files its commit lists); {OFF}")  # fmt: skip


def test_draft_model_by_hub_id(hub, offline):
    tmp, cache, snaps, want = hub
    draft = make_random_checkpoint("tiny-qwen3", tmp / "draft", dtype=torch.float32, seed=2, num_hidden_layers=1)
    write_hf_cache(draft, cache, "org/draft", "v1")
    spec = {"model": "org/draft", "revision": "v1", "num_speculative_tokens": 2}
    llm = LLM("org/tiny", download_dir=cache, speculative_config=spec, **OPTS)
    try:
        assert run(llm) == want["main"]  # greedy speculation keeps the target's tokens
        assert llm.engine.spec.proposer.config.num_hidden_layers == 1 and llm.engine.spec.stats.num_drafts > 0
    finally:
        llm.shutdown()


def test_lora_adapter_by_hub_id(hub, offline):
    tmp, cache, snaps, want = hub
    torch.manual_seed(0)
    qv = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft = get_peft_model(AutoModelForCausalLM.from_pretrained(tmp / "main", dtype=torch.float32), qv)
    peft.save_pretrained(tmp / "qv")
    write_hf_cache(tmp / "qv", cache, "org/qv-lora", not_fetched=("README.md",))
    offline.setenv("HF_HUB_CACHE", str(cache))
    llm = LLM("org/tiny", enable_lora=True, max_lora_rank=4, **OPTS)
    try:
        by_dir = run(llm, LoRARequest("qv", 1, str(tmp / "qv")))
        assert by_dir != want["main"]  # the adapter changes the tokens
        assert run(llm, LoRARequest("qv-hub", 2, "org/qv-lora")) == by_dir
    finally:
        llm.shutdown()
