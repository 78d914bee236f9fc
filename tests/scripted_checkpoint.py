"""A tiny Llama checkpoint whose greedy reply is a known script: its weights make the next token a fixed function of
the current one. The attention and MLP write nothing (zero output projections), so the last hidden state is the current
token's embedding; script token k embeds as the k-th unit vector and the LM head maps direction k to the token after it.
Tokens off the script embed as zero, so every logit ties there (greedy then takes the lowest id a grammar allows)."""
import json
from pathlib import Path

THINK_OPENED = "open_think"  # the chat-template kwarg that ends the prompt with `<think>` (a prompt-opened reasoning block)
TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% if " + THINK_OPENED + " %}{{ '<think>' }}{% endif %}{% endif %}")
REASONING, ANSWER = "Paris is the capital", '{"city": "Rome"}'
# The chain of single tokens: the generation prompt's last token ("\n"), then the reply. Every token appears once.
SCRIPT = ["\n", "<think>", "Paris", " is", " the", " capital", "</think>", '{"city":', " ", '"Rome"}', "<|im_end|>"]
ADDED = ["<think>", "</think>", "Paris", " is", " the", " capital", '{"city":', '"Rome"}']  # plain (not special) added tokens, as Qwen3's think tags are


def make_scripted_checkpoint(out):
    "Write the checkpoint (config, safetensors, tokenizer) to `out`; return `out` as a Path."
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from litellama.testing.tokenizer import make_tokenizer
    out = Path(out)
    tok = make_tokenizer()
    tok.add_tokens(ADDED)
    tok.chat_template = TEMPLATE
    ids = [tok.convert_tokens_to_ids(s) if s in ADDED or s.startswith("<|") else tok.encode(s)[0] for s in SCRIPT]
    assert [tok.decode([i]) for i in ids] == SCRIPT and len(set(ids)) == len(ids), ids
    V, H = len(tok), 32
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=256, rms_norm_eps=1e-6,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      pad_token_id=tok.pad_token_id, torch_dtype="float32")
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_(); layer.mlp.down_proj.weight.zero_()
        emb, head = model.model.embed_tokens.weight, model.lm_head.weight
        emb.zero_(); head.zero_()
        for k, (cur, nxt) in enumerate(zip(ids, ids[1:])):
            emb[cur, k] = 1.0
            head[nxt, k] = 10.0
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "script.json").write_text(json.dumps(ids))
    return out
