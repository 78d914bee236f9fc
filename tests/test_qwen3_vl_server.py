"""Qwen3-VL through the OpenAI-compatible server: a tiny random Qwen3-VL checkpoint served by uvicorn in a subprocess,
two base64 images of different sizes in one message sent by the official `openai` client; the reply equals what
`LLM.chat` answers in-process for the same images."""
import base64, tempfile
import pytest

pytest.importorskip("fastapi"); pytest.importorskip("uvicorn"); pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
from test_vision_server import _png, served   # pytest puts tests/ on the path

KEY, MODEL = "sk-test", "tiny-qwen3-vl"


@pytest.fixture(scope="module")
def ckpt():
    import torch
    from litellama.testing.checkpoints import make_random_checkpoint
    return make_random_checkpoint("tiny-qwen3-vl", tempfile.mkdtemp(prefix="litellama-qwen3-vl-"), dtype=torch.float32)


@pytest.fixture(scope="module")
def client(ckpt):
    for url in served(ckpt, MODEL):
        yield openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _url(png): return "data:image/png;base64," + base64.b64encode(png).decode()


def test_two_images_in_one_message(client, ckpt):
    from litellama.entrypoints.llm import LLM
    from litellama.multimodal.processing import decode_image
    from litellama.sampling_params import SamplingParams
    pngs = [_png(1, (64, 96)), _png(2, (40, 100))]
    content = [{"type": "text", "text": "compare"}, {"type": "image_url", "image_url": {"url": _url(pngs[0])}},
               {"type": "text", "text": "with"}, {"type": "image_url", "image_url": {"url": _url(pngs[1])}}]
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0, stream=True) if c.choices)
    llm = LLM(ckpt, dtype="float32", device="cpu")
    local = [{"type": "image", "image": decode_image(p)} if isinstance(p, bytes) else {"type": "text", "text": p}
             for p in ("compare", pngs[0], "with", pngs[1])]
    want = llm.chat([{"role": "user", "content": local}], SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert r.choices[0].message.content == want.outputs[0].text
    assert streamed == want.outputs[0].text
    assert r.usage.prompt_tokens == len(want.prompt_token_ids)        # the placeholders expanded to each image's size
