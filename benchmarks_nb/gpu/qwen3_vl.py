"""Qwen3-VL on one GPU, litellama against HF transformers in the same run:
(a) the engine's placeholder expansion and token types against transformers' `Qwen3VLProcessor` for three image sizes;
(b) bf16 parity on a random Qwen3-VL-4B shape built in GPU memory (vision features and each DeepStack feature, three-row
    positions against `get_rope_index`, prefill logits, greedy tokens through the engine);
(c) time to first token for one 448x448 and one 1024x1024 image, decode tok/s at batch 1 and 32, vision-encoder time.
Random weights (speed does not depend on their values). A global time guard skips what would not fit in 120 s.

    PYTHONPATH=. python3 benchmarks_nb/gpu/qwen3_vl.py $OUT            # on the GPU: writes $OUT/qwen3_vl.json
    PYTHONPATH=. TRITON_INTERPRET=1 python3 benchmarks_nb/gpu/qwen3_vl.py /tmp/out --dry-run   # tiny shapes on the CPU
"""

import os, sys, time, traceback

T_START = time.perf_counter()
import numpy as np
import torch

DRY = "--dry-run" in sys.argv
OUT = next((a for a in sys.argv[1:] if not a.startswith("--")), os.environ.get("OUT", "."))
DEV = "cpu" if DRY else "cuda"
DT = torch.float32 if DRY else torch.bfloat16
LIKE = "tiny-qwen3-vl" if DRY else "qwen3-vl-4b"
BUDGET_S = 112  # the whole run stays under 120 s of wall time
DECODE_TOKENS = 6 if DRY else 64
BATCHES = (1, 2) if DRY else (1, 32)
SIZES = ((64, 64), (96, 64)) if DRY else ((448, 448), (1024, 1024))  # TTFT and vision-encoder images (w, h)
RES = {"errors": {}, "skipped": []}


from common import (
    decode_vs_hf,
    engine_decode,
    guarded,
    hf_decode,
    ms_vs_hf,
    perturb_norms,
    print_vs_hf,
    rel,
    run_info,
    timed,
    vlm_engines,
    write_json,
)


def left():
    return BUDGET_S - (time.perf_counter() - T_START)


def part(name, need_s=5):
    "Run one part when at least `need_s` seconds of the budget are left; record its error and go on."
    if left() < need_s:
        RES["skipped"].append(f"{name}: {left():.0f} s left of the budget")
        return lambda fn: fn
    return guarded(RES, name)


def save():
    RES["wall_seconds"] = round(time.perf_counter() - T_START, 1)
    write_json(RES, OUT, "qwen3_vl.json")


RES.update(run_info(DRY), command=" ".join([sys.executable, *sys.argv]), shape=LIKE, dtype=str(DT))
from PIL import Image
from litellama.models import qwen3_vl as Q
from litellama.testing import vision_shapes as S
from litellama.testing.vision_checkpoints import qwen3_vl_tokenizer
from litellama.models.decoder import load_weights
from litellama.sampling_params import SamplingParams


def random_image(w, h, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


# ---------------------------------------------------------------- (a) expansion and token types vs Qwen3VLProcessor
@part("a_processor")
def _():
    from transformers import Qwen3VLProcessor

    tok = qwen3_vl_tokenizer()
    pil = S.qwen3_vl_image_processor("qwen3-vl-4b")  # what the engine runs (transformers' PIL backend)
    try:  # the processor as transformers builds it: fast image processor
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        fast = Qwen2VLImageProcessor(
            **{
                k: getattr(pil, k)
                for k in ("patch_size", "temporal_patch_size", "merge_size", "image_mean", "image_std")
            },
            size=dict(pil.size),
        )
        proc = Qwen3VLProcessor(
            image_processor=fast,
            tokenizer=tok,
            video_processor=Qwen3VLVideoProcessor(),
            chat_template=S.QWEN3_VL_CHAT_TEMPLATE,
        )
    except ImportError as e:
        if not DRY:
            raise
        # the CPU dry run has no torchvision: the processor around the PIL image processor, its video-processor check skipped
        from transformers.processing_utils import ProcessorMixin

        RES["a_processor_note"] = f"dry run: {e}; Qwen3VLProcessor built around the PIL image processor"

        def init(self, image_processor, tokenizer, video_processor, chat_template=None, **kw):
            self.image_processor, self.tokenizer, self.video_processor, self.chat_template = (
                image_processor,
                tokenizer,
                video_processor,
                chat_template,
            )

        orig, ProcessorMixin.__init__ = ProcessorMixin.__init__, init
        try:
            proc = Qwen3VLProcessor(image_processor=pil, tokenizer=tok, video_processor=None)
        finally:
            ProcessorMixin.__init__ = orig
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    rows = []
    for i, (w, h) in enumerate(((448, 448), (1024, 1024), (333, 771))):
        im = random_image(w, h, i)
        msgs = [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image"},
                    {"type": "text", "text": "what is it?"},
                ],
            }
        ]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        want = proc(text=[text], images=[im], return_tensors="pt")
        ours = pil([im], return_tensors="pt")
        grid = [tuple(int(v) for v in g) for g in ours["image_grid_thw"]]
        ids, spans = Q.expand_images(
            tok.encode(text, add_special_tokens=False), image_id, [t * hh * ww // 4 for t, hh, ww in grid]
        )
        rows.append(
            dict(
                size=f"{w}x{h}",
                grid=grid[0],
                image_tokens=spans[0][1],
                ids_equal=ids == want["input_ids"][0].tolist(),
                token_types_equal=Q.token_types(ids, image_id) == want["mm_token_type_ids"][0].tolist(),
                grid_equal=grid == [tuple(int(v) for v in g) for g in want["image_grid_thw"]],
                pixels_max_abs_diff=(ours["pixel_values"].float() - want["pixel_values"].float()).abs().max().item()
                if ours["pixel_values"].shape == want["pixel_values"].shape
                else f"shapes {tuple(ours['pixel_values'].shape)} vs {tuple(want['pixel_values'].shape)}",
            )
        )
    RES["a_processor"] = rows


# ---------------------------------------------------------------- build both models in device memory
config = S.qwen3_vl_config(
    LIKE, *((301, 300, 302) if DRY else (151655, 151652, 151653)), max_position_embeddings=32768 if not DRY else 1024
)
IMAGE_TOKEN = config.image_token_id
hf = ours = None
t0 = time.perf_counter()
try:
    from transformers import Qwen3VLForConditionalGeneration as HF

    torch.manual_seed(0)
    with torch.device(DEV):
        hf = HF._from_config(config, dtype=DT).eval()
    perturb_norms(hf)
    with torch.device(DEV):
        ours = Q.Qwen3VLForConditionalGeneration(config, dtype=DT, device=DEV)
    load_weights(ours, hf.state_dict().items())
    ours.eval()
except Exception as e:
    RES["errors"]["build"] = f"{type(e).__name__}: {e}"
    traceback.print_exc()
RES["build_seconds"] = round(time.perf_counter() - t0, 2)
IP = S.qwen3_vl_image_processor(LIKE)
rng = np.random.default_rng(0)
text_ids = lambda n: rng.integers(3, 280 if DRY else 150000, n).tolist()  # never a vision special
prompt_ids = lambda: (
    text_ids(6) + [config.vision_start_token_id, IMAGE_TOKEN, config.vision_end_token_id] + text_ids(20)
)


def hf_inputs(ids, images):
    "HF's inputs for token ids `ids` with one placeholder per image: expanded ids, pixels, grids, token types."
    px = IP(images, return_tensors="pt")
    grids = [tuple(int(v) for v in g) for g in px["image_grid_thw"]]
    full, _ = Q.expand_images(ids, IMAGE_TOKEN, [t * h * w // 4 for t, h, w in grids])
    x = torch.tensor([full], device=DEV)
    return dict(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        pixel_values=px["pixel_values"].to(DEV, DT),
        image_grid_thw=px["image_grid_thw"].to(DEV),
        mm_token_type_ids=(x == IMAGE_TOKEN).int(),
    ), grids


make_engine = vlm_engines(
    ours,
    config.text_config,
    IP,
    DEV,
    DT,
    max_num_batched_tokens=8192 if not DRY else 64,
    max_model_len=8192 if not DRY else 1024,
    kv_cache_memory=(16 << 30) if not DRY else None,
    num_kv_blocks=None if not DRY else 512,
)


def hf_kw(kw):
    "Drop `mm_token_type_ids` where this transformers' Qwen3-VL does not take it (older versions find the images by their ids)."
    import inspect

    return (
        kw
        if "mm_token_type_ids" in inspect.signature(hf.forward).parameters
        else {k: v for k, v in kw.items() if k != "mm_token_type_ids"}
    )


def hf_rope_index(kw):
    import inspect

    params = inspect.signature(hf.model.get_rope_index).parameters
    args = {k: kw[k] for k in ("input_ids", "mm_token_type_ids", "image_grid_thw", "attention_mask") if k in params}
    return hf.model.get_rope_index(**args)


def hf_image_features(pv, grid):
    "`(merged per image, [DeepStack layer][image])` from either return shape of `get_image_features`."
    out = hf.model.get_image_features(pv, grid)
    merged, ds = (out.pooler_output, out.deepstack_features) if hasattr(out, "pooler_output") else (out[0], out[1])
    sizes = (grid.prod(-1) // 4).tolist()
    if torch.is_tensor(merged):
        merged = merged.split(sizes)
    ds = [d.split(sizes) if torch.is_tensor(d) else d for d in ds]
    return merged, ds


# ---------------------------------------------------------------- (b) parity
@part("b_parity", 10)
def _():
    if ours is None:
        raise RuntimeError("the models were not built")
    imgs = [
        random_image(w, h, 10 + i)
        for i, (w, h) in enumerate(((448, 448), (320, 640)) if not DRY else ((64, 64), (96, 64)))
    ]
    raw = (
        prompt_ids()[:10]
        + [77, 78, config.vision_start_token_id, IMAGE_TOKEN, config.vision_end_token_id]
        + text_ids(5)
    )
    kw, grids = hf_inputs(raw, imgs)
    with torch.no_grad():
        ref_merged, ref_ds = hf_image_features(kw["pixel_values"], kw["image_grid_thw"])
        mine = ours.embed_images(kw["pixel_values"], grids)
        H = config.text_config.hidden_size
        b = {
            "features_rel_diff": [rel(m[:, :H], r) for m, r in zip(mine, ref_merged)],
            "deepstack_rel_diff": [
                [rel(m[:, H * (j + 1) : H * (j + 2)], ref_ds[j][i]) for j in range(len(ref_ds))]
                for i, m in enumerate(mine)
            ],
        }
        pos_hf, delta_hf = hf_rope_index(kw)
        ids = kw["input_ids"][0].tolist()
        spans = [
            (i, n)
            for i, n in zip(
                [i for i in range(len(ids)) if ids[i] == IMAGE_TOKEN and (i == 0 or ids[i - 1] != IMAGE_TOKEN)],
                [t * h * w // 4 for t, h, w in grids],
            )
        ]
        pos, delta = Q.mrope_positions(len(ids), spans, grids, 2)
        b["positions_equal_get_rope_index"] = bool(torch.equal(pos, pos_hf[:, 0].cpu())) and delta == int(delta_hf)
        logits_hf = hf(**hf_kw(kw)).logits[0].float()
        # our prefill logits at every position, the step built as the engine builds it, over a scratch cache
        from types import SimpleNamespace as NS
        from litellama.executor.model_input import build_model_input
        from litellama.executor.model_runner import paged_kv_cache
        from litellama.multimodal.processing import image_embeds, mrope_step_positions

        full, mm = ours.process_images(IP, raw, imgs, 1 << 20, DEV)
        tc, nb = config.text_config, -(-len(full) // 16)
        ours.bind_kv_cache(paged_kv_cache(tc.num_hidden_layers, nb, 16, tc.num_key_value_heads, tc.head_dim, DT, DEV))
        mi = build_model_input([(full, 0, list(range(nb)))], 16, DEV)
        mi.logits_indices = torch.arange(len(full), device=DEV)
        seq = NS(num_computed_tokens=0, mm_inputs=mm)
        mi.inputs_embeds, mi.positions = (
            image_embeds(ours, mi.input_ids, [(seq, len(full))]),
            mrope_step_positions([(seq, len(full))], DEV),
        )
        logits = ours(mi).float()
        b["expanded_ids_equal"] = full == ids
        b["prefill_logits_max_abs_diff"] = (logits - logits_hf).abs().max().item()
        b["prefill_logits_rel_diff"] = rel(logits, logits_hf)
        b["prefill_top1_agreement"] = (logits.argmax(-1) == logits_hf.argmax(-1)).float().mean().item()
    eng = make_engine(4)
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    got = []
    eng.add_request({"prompt_token_ids": raw, "multi_modal_data": {"image": imgs}}, sp)
    while eng.has_unfinished_requests():
        for o in eng.step():
            got += o.token_ids
    with torch.no_grad():
        want = hf.generate(**hf_kw(kw), max_new_tokens=16, min_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
    b["greedy_16_equal_prefix"] = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), len(want))
    b["greedy_ours"], b["greedy_hf"] = got, want
    b["prompt_tokens"] = len(ids)
    RES["b_parity"] = b


# ---------------------------------------------------------------- (c) speed
@part("c_vision_encoder", 10)
def _():
    for w, h in SIZES:
        im = random_image(w, h, w)
        px = IP([im], return_tensors="pt")
        pv, g = px["pixel_values"].to(DEV, DT), px["image_grid_thw"].to(DEV)
        grids = [tuple(int(v) for v in x) for x in px["image_grid_thw"]]
        with torch.no_grad():
            t_ours = timed(lambda: ours.embed_images(pv, grids), reps=3 if DRY else 5)
            t_hf = timed(lambda: hf_image_features(pv, g), reps=3 if DRY else 5)
        RES.setdefault("c_vision_encoder_ms", {})[f"{w}x{h}"] = ms_vs_hf(t_ours, t_hf, patches=pv.shape[0])


@part("c_ttft", 15)
def _():
    eng = make_engine(32)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    for w, h in SIZES:
        seeds = iter(range(100, 200))

        def ours_once():
            eng.add_request(
                {"prompt_token_ids": prompt_ids(), "multi_modal_data": {"image": random_image(w, h, next(seeds))}}, sp
            )
            while eng.has_unfinished_requests():
                eng.step()

        kw, _ = hf_inputs(prompt_ids(), [random_image(w, h, 7)])

        def hf_once():
            with torch.no_grad():
                hf.generate(**hf_kw(kw), max_new_tokens=1, do_sample=False)

        t_ours, t_hf = timed(ours_once, reps=3), timed(hf_once, reps=3)
        RES.setdefault("c_ttft_ms", {})[f"{w}x{h}"] = ms_vs_hf(
            t_ours,
            t_hf,
            prompt_tokens=kw["input_ids"].shape[1],
            note="litellama: add_request (PIL preprocessing, vision encoder) + prefill + first token; "
            "HF: generate(max_new_tokens=1) on preprocessed pixels",
        )


@part("c_decode", 20)
def _():
    w, h = SIZES[0]
    for B in BATCHES:
        if left() < 15:
            RES["skipped"].append(f"decode batch {B}: {left():.0f} s left")
            continue
        eng = make_engine(32)
        imgs = [random_image(w, h, 1000 + B + i) for i in range(B)]
        sp = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS, ignore_eos=True)
        prompts = [prompt_ids() for _ in range(B)]

        run_ours = lambda: engine_decode(
            eng, [{"prompt_token_ids": p, "multi_modal_data": {"image": im}} for p, im in zip(prompts, imgs)], sp
        )
        run_ours()
        ours_run = run_ours()
        kws = [hf_inputs(p, [im])[0] for p, im in zip(prompts, imgs)]
        kw = dict(
            input_ids=torch.cat([k["input_ids"] for k in kws]),
            attention_mask=torch.cat([k["attention_mask"] for k in kws]),
            pixel_values=torch.cat([k["pixel_values"] for k in kws]),
            image_grid_thw=torch.cat([k["image_grid_thw"] for k in kws]),
            mm_token_type_ids=torch.cat([k["mm_token_type_ids"] for k in kws]),
        )  # same sizes: equal lengths, no padding

        def hf_gen(n):
            with torch.no_grad():
                hf.generate(**hf_kw(kw), max_new_tokens=n, min_new_tokens=n, do_sample=False)

        hf_run = hf_decode(hf_gen, B, DECODE_TOKENS)
        RES.setdefault("c_decode_tok_s", {})[B] = {
            **decode_vs_hf(ours_run, hf_run, DECODE_TOKENS, eng),
            "image": f"{w}x{h}",
        }


save()
print(
    f"\n{LIKE} on {RES['gpu']} ({RES['dtype']}), {RES['wall_seconds']} s, results in {os.path.join(OUT, 'qwen3_vl.json')}"
)
for r in RES.get("a_processor", []):
    print("(a)", r)
if "b_parity" in RES:
    b = RES["b_parity"]
    print(
        f"(b) features rel {b['features_rel_diff']}, deepstack rel {b['deepstack_rel_diff']}, positions equal {b['positions_equal_get_rope_index']}, "
        f"prefill logits rel {b.get('prefill_logits_rel_diff', float('nan')):.3g} (top-1 agreement {b.get('prefill_top1_agreement', float('nan')):.3f}), "
        f"greedy equal for the first {b['greedy_16_equal_prefix']} of 16"
    )
rows = [(f"vision encoder {k}, ms", v) for k, v in RES.get("c_vision_encoder_ms", {}).items()]
rows += [(f"TTFT {k}, ms", v) for k, v in RES.get("c_ttft_ms", {}).items()]
rows += [(f"decode tok/s, batch {k}", v) for k, v in RES.get("c_decode_tok_s", {}).items()]
print_vs_hf(rows, RES["errors"])
for s in RES["skipped"]:
    print(f"skipped {s}")
