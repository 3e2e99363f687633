"""Write an HF Llama folder as a GGUF file, the way llama.cpp's converter lays it out, so the import
tests need no downloaded GGUF: metadata keys, the byte-level BPE vocabulary and merges, the chat
template, and the q/k rows permuted per rotary half (llama.cpp's ``permute``; transformers undoes it
on load). ``quant`` quantizes 2-D tensors with gguf's own quantizer; ``raw_types`` stores named
tensors as raw bytes of another GGML type (for the "cannot dequantize" error path)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp stores q/k rows interleaved per rotary half (convert_hf_to_gguf's permute)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    hf_dir: Path, out: Path, *, arch: str = "llama", quant=None, raw_types: dict | None = None
) -> Path:
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tok_cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg.get("rope_theta") or cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = tok["model"]["vocab"]
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    inv = {i: t for t, i in {**vocab, **added}.items()}
    tokens = [inv.get(i, f"[PAD{i}]") for i in range(cfg["vocab_size"])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in added else 1 for t in tokens])
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(cfg["eos_token_id"])
    if cfg.get("pad_token_id") is not None:
        w.add_pad_token_id(cfg["pad_token_id"])
    if tok_cfg.get("chat_template") or (hf_dir / "chat_template.jinja").exists():
        w.add_chat_template(tok_cfg.get("chat_template") or (hf_dir / "chat_template.jinja").read_text())
    state = load_file(str(hf_dir / "model.safetensors"))
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    layer = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    for key, t in state.items():
        a = t.to(torch.float32).numpy()
        if key in names:
            name = names[key]
        elif key == "lm_head.weight":
            if cfg.get("tie_word_embeddings"):
                continue
            name = "output.weight"
        else:
            parts = key.split(".")
            i, rest = parts[2], ".".join(parts[3:-1])
            name = f"blk.{i}.{layer[rest]}.weight"
            if rest == "self_attn.q_proj":
                a = _permute(a, cfg["num_attention_heads"])
            elif rest == "self_attn.k_proj":
                a = _permute(a, cfg["num_key_value_heads"])
        if raw_types and name in raw_types:
            qtype = raw_types[name]
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((a.shape[0], a.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        elif quant is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, quant), raw_dtype=quant)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
