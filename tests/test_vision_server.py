"""Images through the OpenAI-compatible server: a real uvicorn server in a subprocess over a tiny random LLaVA
checkpoint, sent `image_url` content parts (base64 data URLs, local files) by the official `openai` client."""
import base64, io, os, tempfile
import pytest

pytest.importorskip("fastapi"); pytest.importorskip("uvicorn"); pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from server_helpers import KEY, served  # pytest puts tests/ on the path

MODEL = "tiny-llava"


@pytest.fixture(scope="module")
def dirs():
    import torch
    from litellama.testing.checkpoints import make_random_checkpoint
    d, media = tempfile.mkdtemp(prefix="litellama-vision-"), tempfile.mkdtemp(prefix="litellama-media-")
    make_random_checkpoint("tiny-llava", d, dtype=torch.float32)
    return d, media


@pytest.fixture(scope="module")
def server(dirs):
    d, media = dirs
    yield from served(d, MODEL, allowed_local_media_path=media)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _png(seed=0, size=(37, 23)):
    import numpy as np
    from PIL import Image
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    buf = io.BytesIO(); img.save(buf, "PNG")
    return buf.getvalue()


def _url(data: bytes, kind="png"): return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def _msgs(*urls, text="What is in this picture?"):
    return [{"role": "user", "content": [*({"type": "image_url", "image_url": {"url": u}} for u in urls), {"type": "text", "text": text}]}]


def test_base64_image_streams_a_reply(client):
    msgs = _msgs(_url(_png(0)))
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    stream = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage: usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content: pieces.append(ch.delta.content)
            if ch.finish_reason: finish = ch.finish_reason
    assert finish == "length" and usage.completion_tokens == 12
    assert "".join(pieces) == whole.choices[0].message.content
    # the prompt counts the image's 4 tokens (a 2x2-patch tower), not its one placeholder
    text_only = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "\nWhat is in this picture?"}], max_tokens=1)
    assert whole.usage.prompt_tokens == text_only.usage.prompt_tokens + 4


def test_the_image_matters_and_the_same_image_is_served_the_same(client):
    def ask(data):
        r = client.chat.completions.create(model=MODEL, messages=_msgs(_url(data)), max_tokens=4, temperature=0, logprobs=True,
                                           extra_body={"ignore_eos": True})
        return [(t.token, round(t.logprob, 5)) for t in r.choices[0].logprobs.content]
    a, b = ask(_png(1)), ask(_png(2))
    assert ask(_png(1)) == a          # the second time from the prefix cache: the same answer and logprobs
    assert a != b                     # same text, another image: other logprobs


def test_local_file_only_under_the_allowed_directory(client, dirs):
    media = dirs[1]
    with open(os.path.join(media, "cat.png"), "wb") as f: f.write(_png(0))
    r = client.chat.completions.create(model=MODEL, messages=_msgs(f"file://{media}/cat.png"), max_tokens=4, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=_msgs(f"file://{dirs[0]}/config.json"), max_tokens=4)
    assert "outside the allowed directory" in e.value.body["message"]


@pytest.mark.parametrize("urls, text, message", [
    (["data:image/png;base64," + base64.b64encode(b"definitely not a png").decode()], "hi", "cannot decode the image"),
    (["https://example.com/cat.png"], "hi", "remote image URLs are not fetched"),
    (["data:image/png;base64,@@@"], "hi", "not valid base64"),
    (["data:text/plain;base64,aGk="], "hi", "data URL image must be"),
    ([None], "<image> and one more", "2 image placeholder(s) but 1 image(s)"),     # an image part whose placeholder is not its own
    ([None] * 130, "hi", "maximum context length is 512 tokens"),       # too many images for the context
])
def test_bad_images_are_400_with_an_openai_error_body(client, server, urls, text, message):
    png = _url(_png(3))
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=_msgs(*[u or png for u in urls], text=text), max_tokens=4)
    assert e.value.status_code == 400 and message in e.value.body["message"], e.value.body
    assert e.value.body["type"] == "invalid_request_error"
    r = client.chat.completions.create(model=MODEL, messages=_msgs(png), max_tokens=2)   # nothing else disturbed
    assert r.usage.completion_tokens == 2
