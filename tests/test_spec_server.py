"""Speculative decoding through `litellama serve` and the openai client: `--speculative-config` as the command line
gives it, plain and streamed completions equal to the engine's without speculation, and the spec-decode counters on
/metrics move."""

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("fastapi"), pytest.importorskip("uvicorn"), pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from server_helpers import KEY, start_server, stop_server  # pytest puts tests/ on the path

from litellama.engine.llm_engine import ContinuousBatchingEngine
from litellama.entrypoints.cli import _engine_options, build_parser
from litellama.sampling_params import SamplingParams
from litellama.testing.checkpoints import make_random_checkpoint

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
PROMPTS = [[5, 9, 13, 7, 5, 9, 13, 7, 5, 9], [100, 101, 102, 103, 100, 101], [250, 3, 77]]


def _metric(url, name):
    "The values of the counter `name` on /metrics (one per label set)."
    lines = httpx.get(url + "/metrics", timeout=10).text.splitlines()
    return [float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.split("{")[0].split(" ")[0] == name]


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    "A tiny Llama served with n-gram speculation, its options parsed from the command line as `litellama serve`'s."
    tmp = tmp_path_factory.mktemp("spec-server")
    path = make_random_checkpoint("tiny-llama", tmp / "m", dtype=torch.float32)
    opts = _engine_options(build_parser().parse_args(["serve", "--speculative-config", SPEC]))
    assert opts == {"speculative_config": json.loads(SPEC)}
    log = open(tmp / "server.log", "w")
    proc, url = start_server(path, "tiny", log, **opts)
    yield url, path
    stop_server(proc)
    log.close()


def test_bad_speculative_config_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative-config", "ngram"])
    assert "invalid json_object value: 'ngram'" in capsys.readouterr().err


def test_spec_server_plain_and_streamed(spec_server):
    url, path = spec_server
    with ContinuousBatchingEngine.from_pretrained(path, dtype="float32", device="cpu", num_kv_blocks=256) as eng:
        want = []
        for p in PROMPTS:
            rid, text = eng.add_request(p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)), ""
            while eng.has_unfinished_requests():
                text += "".join(o.delta for o in eng.step() if o.request_id == rid)
            want.append(text)
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    before = _metric(url, "litellama:spec_decode_num_drafts_total")
    assert before == [0.0]
    extra = {"ignore_eos": True}
    for p, w in zip(PROMPTS, want):
        r = c.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0, extra_body=extra)
        assert r.choices[0].text == w and r.usage.completion_tokens == 24
        chunks = c.completions.create(model="tiny", prompt=p, max_tokens=24, temperature=0, stream=True, extra_body=extra)
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == w
    drafts = _metric(url, "litellama:spec_decode_num_drafts_total")[0]
    proposed = _metric(url, "litellama:spec_decode_num_draft_tokens_total")[0]
    accepted = _metric(url, "litellama:spec_decode_num_accepted_tokens_total")[0]
    per_pos = _metric(url, "litellama:spec_decode_num_accepted_tokens_per_pos_total")
    assert drafts > 0 and proposed >= accepted > 0 and sum(per_pos) == accepted, (drafts, proposed, accepted, per_pos)
    free, total = _metric(url, "litellama_kv_cache_free_blocks"), _metric(url, "litellama_kv_cache_total_blocks")
    assert free == total  # every block back once the requests are done
