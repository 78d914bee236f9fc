"""LLaVA-1.5-7B shape on one GPU, litellama against HF transformers in the same run: bf16 correctness (image features,
prefill logits, greedy tokens), vision-tower time, time to first token with one 336-px image, decode tok/s at batch 1
and 32 with images. Random weights (speed does not depend on their values), built in GPU memory from the config.

    PYTHONPATH=. python3 benchmarks_nb/gpu/llava.py $OUT            # on the GPU: writes $OUT/llava.json
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/llava.py /tmp/out --dry-run   # tiny shapes on the CPU
"""

import os, sys, time
import numpy as np
import torch

DRY = "--dry-run" in sys.argv
OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
LIKE = "tiny-llava" if DRY else "llava-1.5-7b"
DECODE_TOKENS = 8 if DRY else 64
BATCHES = (1, 2) if DRY else (1, 32)
RES = {"errors": {}}

from common import (
    decode_vs_hf,
    engine_decode,
    guarded,
    hf_decode,
    ms_vs_hf,
    perturb_norms,
    print_vs_hf,
    run_info,
    timed,
    vlm_engines,
    write_json,
)

part = lambda name: guarded(RES, name)  # run one part; record its error and go on
RES.update(run_info(DRY), command=" ".join([sys.executable, *sys.argv]), shape=LIKE, dtype=str(DT))
from transformers import LlavaForConditionalGeneration as HFLlava
from litellama.models.llava import LlavaForConditionalGeneration
from litellama.testing.vision_shapes import llava_config
from litellama.models.decoder import load_weights
from litellama.sampling_params import SamplingParams

IMAGE_TOKEN = 300 if DRY else 32000
config = llava_config(LIKE, IMAGE_TOKEN)
S = config.vision_config.image_size
MEAN, STD = np.array([0.48145466, 0.4578275, 0.40821073]), np.array([0.26862954, 0.26130258, 0.27577711])


def pixels_of(images):
    "CLIP preprocessing (resize to the tower's size, normalise) in numpy: the same pixels for both systems."
    arr = [(np.asarray(im.convert("RGB").resize((S, S)), dtype=np.float32) / 255 - MEAN) / STD for im in images]
    return torch.from_numpy(np.stack(arr).transpose(0, 3, 1, 2).astype(np.float32))


class Processor:
    def __call__(self, images, return_tensors="pt"):
        return {"pixel_values": pixels_of(images)}


def random_images(n, seed):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (S, S, 3), dtype=np.uint8)) for _ in range(n)]


t0 = time.perf_counter()
with torch.device(DEV):
    hf = HFLlava._from_config(config, dtype=DT).eval()
perturb_norms(hf)
ours = LlavaForConditionalGeneration(config, dtype=DT, device=DEV)
load_weights(ours, hf.state_dict().items())
RES["build_seconds"] = round(time.perf_counter() - t0, 2)
N_IMG = ours.num_image_tokens
V = config.text_config.vocab_size
rng = np.random.default_rng(0)
text_ids = lambda n: rng.integers(3, min(IMAGE_TOKEN, 30000) - 1, n).tolist()  # never the image token
prompt_ids = lambda: text_ids(5) + [IMAGE_TOKEN] + text_ids(20)  # "USER: <image>\n ... ASSISTANT:" of 26 tokens


def eng_prompt_ids(ids):
    i = ids.index(IMAGE_TOKEN)
    return ids[:i] + [IMAGE_TOKEN] * N_IMG + ids[i + 1 :]


make_engine = vlm_engines(
    ours,
    config.text_config,
    Processor(),
    DEV,
    DT,
    max_num_batched_tokens=8192 if not DRY else 256,
    kv_cache_memory=(8 << 30) if not DRY else None,
    num_kv_blocks=None if not DRY else 256,
)


@part("correctness")
def _():
    imgs = random_images(2, 1)
    px = pixels_of(imgs).to(DEV)
    with torch.no_grad():
        f_ours = ours.embed_images(px)
        out = hf.get_image_features(pixel_values=px.to(DT))
        f_hf = getattr(out, "pooler_output", out)
        f_hf = torch.stack(list(f_hf)) if isinstance(f_hf, (list, tuple)) else f_hf
    f_hf = f_hf.view_as(f_ours)
    RES["features_max_abs_diff"] = (f_ours.float() - f_hf.float()).abs().max().item()
    RES["features_rel_diff"] = ((f_ours.float() - f_hf.float()).norm() / f_hf.float().norm()).item()
    # greedy tokens through the engine against HF generate, one image prompt
    eng = make_engine(4)
    ids = prompt_ids()
    rid = eng.add_request(
        {"prompt_token_ids": ids, "multi_modal_data": {"image": imgs[0]}},
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
    )
    got = []
    while eng.has_unfinished_requests():
        for o in eng.step():
            got += o.token_ids
    expanded = eng_prompt_ids(ids)
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([expanded], device=DEV),
            pixel_values=px[:1].to(DT),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(expanded) :].tolist()
    RES["greedy_16_tokens_equal_prefix"] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
    RES["greedy_ours"], RES["greedy_hf"] = got, want
    del eng


@part("vision_tower")
def _():
    for b in (1, 8) if not DRY else (1, 2):
        px = pixels_of(random_images(b, b)).to(DEV)
        with torch.no_grad():
            t_ours = timed(lambda: ours.embed_images(px))
            t_hf = timed(lambda: hf.get_image_features(pixel_values=px.to(DT)))
        RES.setdefault("vision_tower_ms", {})[b] = ms_vs_hf(t_ours, t_hf)


@part("ttft")
def _():
    eng = make_engine(32)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    seeds = iter(range(100, 200))

    def ours_once():
        eng.add_request(
            {"prompt_token_ids": prompt_ids(), "multi_modal_data": {"image": random_images(1, next(seeds))[0]}}, sp
        )
        while eng.has_unfinished_requests():
            eng.step()

    px = pixels_of(random_images(1, 7)).to(DEV, DT)
    ids = torch.tensor([eng_prompt_ids(prompt_ids())], device=DEV)

    def hf_once():
        with torch.no_grad():
            hf.generate(ids, pixel_values=px, max_new_tokens=1, do_sample=False, pad_token_id=0)

    t_ours, t_hf = timed(ours_once), timed(hf_once)
    RES["ttft_ms_one_image"] = ms_vs_hf(
        t_ours,
        t_hf,
        prompt_tokens=ids.shape[1],
        note="litellama: add_request (preprocess, vision tower) + prefill + first token",
    )


@part("decode")
def _():
    for B in BATCHES:
        eng = make_engine(32)
        imgs = random_images(B, 1000 + B)
        sp = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)

        run_ours = lambda: engine_decode(
            eng, [{"prompt_token_ids": prompt_ids(), "multi_modal_data": {"image": im}} for im in imgs], sp
        )
        run_ours()  # warm-up
        ours_run = run_ours()
        px = pixels_of(imgs).to(DEV, DT)
        ids = torch.tensor([eng_prompt_ids(prompt_ids()) for _ in range(B)], device=DEV)

        def hf_gen(n):
            with torch.no_grad():
                hf.generate(ids, pixel_values=px, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)

        hf_run = hf_decode(hf_gen, B, DECODE_TOKENS)
        RES.setdefault("decode_tok_s", {})[B] = decode_vs_hf(ours_run, hf_run, DECODE_TOKENS, eng)


path = write_json(RES, OUT, "llava.json")
print(f"\n{LIKE} on {RES['gpu']} ({RES['dtype']}), results in {path}")
print(
    f"features max|diff| {RES.get('features_max_abs_diff', float('nan')):.3g} (rel {RES.get('features_rel_diff', float('nan')):.3g}); "
    f"greedy tokens equal for the first {RES.get('greedy_16_tokens_equal_prefix')} of 16"
)
rows = [("vision tower, %s image(s), ms" % b, v) for b, v in RES.get("vision_tower_ms", {}).items()]
rows += [("TTFT one image, ms", RES["ttft_ms_one_image"])] if "ttft_ms_one_image" in RES else []
rows += [("decode tok/s, batch %s" % b, v) for b, v in RES.get("decode_tok_s", {}).items()]
print_vs_hf(rows, RES["errors"])
