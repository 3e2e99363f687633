"""The megatron generation backend's fast decode path: a static KV cache and, on CUDA, the step in a CUDA graph.

megatron-core's static inference loop (``GPTInferenceWrapper`` + ``StaticInferenceContext``) keeps the
cache's write position as a Python integer and rebuilds its inputs on the host every token, so it
cannot be recorded in a CUDA graph; megatron's own CUDA-graphed decode needs flash-attention's
``flash_attn_with_kvcache`` (``flash_decode``) and TransformerEngine-style layer graphs. Why by hand:
this module runs the same megatron modules (embedding, each layer's norms, ``linear_qkv`` split by
the layer's own ``get_query_key_value_tensors``, megatron's RoPE, ``linear_proj``, the MLP, the final
norm and the output weight) around a cache it owns, laid out ``[rows, kv heads, positions, dim]``:
every row writes its own position (a device tensor), so one recorded step serves every token, as in
the hf backend's :mod:`.static_decode`, whose loop, buckets and graph recording it shares.

Rows are left-aligned (real tokens from column 0, as megatron's RoPE wants), so a row's cache column
is its position and rows of different prompt lengths decode side by side from their first token.
The prompts are encoded by a causal forward of the same code (SDPA), which fills the cache.

Tensor parallelism: each rank runs its own heads and MLP shard (megatron's linears all-reduce), and
the vocabulary-parallel logits are all-gathered, so every rank samples the same tokens from the same
random stream. One pipeline stage, plain RoPE, dense MLP; anything else decodes through megatron's
static inference loop (:func:`megatron_static_decode_unsupported` says why).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.rollout.static_decode import StaticDecoder, _ShapeKey, _StepBuffers, gqa_decode_attention


def megatron_static_decode_unsupported(model: torch.nn.Module) -> str | None:
    """Why the megatron ``GPTModel`` ``model`` cannot use the static path (``None`` when it can)."""
    from megatron.core import parallel_state as ps

    config = model.config
    if ps.get_pipeline_model_parallel_world_size() > 1:
        return "pipeline parallelism (the static path runs every layer on each rank)"
    if getattr(model, "position_embedding_type", None) != "rope":
        return f"position embedding {getattr(model, 'position_embedding_type', None)!r} (needs rope)"
    checks = {
        "multi-latent attention": config.multi_latent_attention,
        "mixture-of-experts layers": config.num_moe_experts,
        "TransformerEngine's fused RoPE": config.apply_rope_fusion,
        "sliding-window attention": config.window_size is not None,
        "sequence parallelism": config.sequence_parallel,
        "an attention output gate": getattr(config, "attention_output_gate", False),
        "the residual after the norm": config.apply_residual_connection_post_layernorm,
    }
    found = [name for name, on in checks.items() if on]
    return found[0] if found else None


def _residual_add(
    residual: torch.Tensor, out_and_bias: tuple[torch.Tensor, torch.Tensor | None]
) -> torch.Tensor:
    """``residual + out (+ bias)``: megatron's bias-dropout-add in eval mode."""
    out, bias = out_and_bias
    return residual + (out if bias is None else out + bias)


def layer_forward(
    layer: torch.nn.Module,
    hidden: torch.Tensor,
    freqs: torch.Tensor,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor],
) -> torch.Tensor:
    """One megatron ``TransformerLayer`` on ``hidden [s, b, H]`` with RoPE ``freqs`` (``[s, 1, 1, d]``
    or, one position per row, ``[1, b, 1, d]``). ``attend(q [s, b, heads, d], k, v [s, b, kv heads,
    d], scale)`` returns the attention output ``[s, b, heads * d]`` (``scale``: megatron's softmax
    scale). The norms are the layer's own modules (with TransformerEngine's spec they are identities
    and ``linear_qkv`` / ``linear_fc1`` norm)."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    attention = layer.self_attention
    config = attention.config
    q, k, v = attention.get_query_key_value_tensors(layer.input_layernorm(hidden), None)
    q = apply_rotary_pos_emb(q, freqs, config=config)
    k = apply_rotary_pos_emb(k, freqs, config=config)
    # megatron's own core attention keeps its scale; another (TransformerEngine's) may not: 1/sqrt(d)
    scale = getattr(attention.core_attention, "softmax_scale", None)
    hidden = _residual_add(hidden, attention.linear_proj(attend(q, k, v, scale)))
    return _residual_add(hidden, layer.mlp(layer.pre_mlp_layernorm(hidden)))


class _MegatronDecodeState(_StepBuffers):
    """The shared step buffers, with the cache as one ``(keys, values)`` pair per layer; a row's
    position is its cache column."""

    def __init__(self, model: torch.nn.Module, key: _ShapeKey, device: torch.device) -> None:
        b, length = key.bucket, key.cache_len
        super().__init__(b, device)
        attention = model.decoder.layers[0].self_attention
        kv_heads = attention.num_query_groups_per_partition  # this tensor-parallel rank's
        head_dim = attention.hidden_size_per_attention_head
        dtype = model.embedding.word_embeddings.weight.dtype
        self.layers = [
            (
                torch.zeros((b, kv_heads, length, head_dim), dtype=dtype, device=device),
                torch.zeros((b, kv_heads, length, head_dim), dtype=dtype, device=device),
            )
            for _ in model.decoder.layers
        ]
        self.mask = torch.zeros((b, 1, 1, length), dtype=torch.bool, device=device)
        self.rows = torch.arange(b, device=device)
        self.freqs: torch.Tensor | None = None  # RoPE of every cache position (set by the decoder)


class MegatronStaticDecoder(StaticDecoder):
    """Decodes batches of prompts through a megatron ``GPTModel`` with a static cache (graphs on CUDA)."""

    def __init__(
        self,
        model: torch.nn.Module,
        vocab_size: int,
        sample: Callable[[torch.Tensor, SamplingParams], tuple[torch.Tensor, torch.Tensor]],
        *,
        cuda_graphs: bool = True,
        sync_every: int = 16,
    ) -> None:
        # StaticDecoder's loop, buckets and graph recording; not its HF-model set-up
        self._init_loop(model, sample, cuda_graphs, sync_every)
        self.vocab_size = vocab_size

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[rows, V]`` of final-normed ``hidden [rows, H]`` over the real vocabulary,
        the same on every tensor-parallel rank (so each samples the same tokens from the same stream)."""
        from megatron.core import parallel_state as ps

        from nemo_azr.models.megatron.logprobs import output_weight_shard

        weight, _ = output_weight_shard(self.model)  # this rank's real-vocabulary rows
        local = (hidden @ weight.t()).float()
        tp = ps.get_tensor_model_parallel_world_size()
        if tp == 1:
            return local
        # Each rank holds an equal slice of the padded vocabulary; its rows past the real vocabulary
        # are -inf here (never sampled), then the slices are gathered in rank order.
        per_rank = (
            self.model.shared_embedding_or_output_weight()
            if self.model.share_embeddings_and_output_weights
            else self.model.output_layer.weight
        ).shape[0]
        padded = local.new_full((local.shape[0], per_rank), float("-inf"))
        padded[:, : local.shape[1]] = local
        gathered = local.new_empty((tp * local.shape[0], per_rank))
        torch.distributed.all_gather_into_tensor(gathered, padded, group=ps.get_tensor_model_parallel_group())
        full = gathered.view(tp, local.shape[0], per_rank).transpose(0, 1).reshape(local.shape[0], -1)
        return full[:, : self.vocab_size]

    # --- prompts ---------------------------------------------------------------------------------
    def encode(self, prompts: list[list[int]], pad_id: int):
        """A causal forward over the left-aligned prompts: the logits after each prompt's last
        token, its keys/values per layer (``[b, kv heads, S, d]``), the real-token mask and the
        next position of every row, in the arguments :meth:`StaticDecoder.decode` takes."""
        device = self.model.embedding.word_embeddings.weight.device
        b, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((b, width), pad_id, dtype=torch.long, device=device)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        lens = torch.tensor([len(p) for p in prompts], device=device)
        positions = torch.arange(width, device=device).expand(b, width)
        hidden = self.model.embedding(input_ids=ids, position_ids=positions)  # [S, b, H]
        freqs = self.model.rotary_pos_emb(width)  # [S, 1, 1, d]: megatron's own RoPE module
        past = []

        def attend(q, k, v, scale):
            past.append((k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3)))  # [b, kv heads, S, d]
            out = F.scaled_dot_product_attention(
                q.permute(1, 2, 0, 3),
                *past[-1],
                is_causal=True,
                scale=scale,
                enable_gqa=k.shape[2] != q.shape[2],
            )  # trailing padding comes after every real token: the causal mask keeps it unseen
            return out.permute(2, 0, 1, 3).reshape(width, b, -1)

        for layer in self.model.decoder.layers:
            hidden = layer_forward(layer, hidden, freqs, attend)
        hidden = self.model.decoder.final_layernorm(hidden)
        last = hidden[lens - 1, torch.arange(b, device=device)]  # [b, H]
        attn = (torch.arange(width, device=device)[None, :] < lens[:, None]).long()
        return self._logits(last), past, attn, lens[:, None]

    # --- StaticDecoder's hooks ---------------------------------------------------------------------
    def _new_state(self, key: _ShapeKey, device: torch.device) -> _StepBuffers:
        st = _MegatronDecodeState(self.model, key, device)
        # every position of the cache; the state holds it, so a recorded graph's input stays alive
        st.freqs = self.model.rotary_pos_emb(key.cache_len)
        return st

    def _load_prompt(self, st, past, attn, next_pos, b: int, width: int) -> None:
        for (keys, values), (k, v) in zip(st.layers, past, strict=True):
            keys[:b, :, :width].copy_(k)
            values[:b, :, :width].copy_(v)
        st.mask.zero_()
        st.mask[:b, 0, 0, :width] = attn.bool()
        st.mask[b:, 0, 0, 0] = True  # padding rows see one column: no all-masked softmax
        st.pos.zero_()
        st.pos[:b] = next_pos
        st.tok.zero_()

    def _step(self, st, sp: SamplingParams, eos_id: int, pad_id: int) -> None:
        """Feed ``st.tok`` at each row's position ``st.pos``; sample the next token into column ``st.t``."""
        pos = st.pos[:, 0]
        # scatter_ of a Python scalar: no host-to-device copy, which a CUDA graph cannot record
        st.mask.view(st.mask.shape[0], -1).scatter_(1, st.pos, True)
        hidden = self.model.embedding(input_ids=st.tok, position_ids=st.pos)  # [1, B, H]
        freqs = st.freqs[pos].transpose(0, 1)  # [1, B, 1, d]: one position per row

        for layer, (keys, values) in zip(self.model.decoder.layers, st.layers):

            def attend(q, k, v, scale, keys=keys, values=values):
                keys[st.rows, :, pos] = k[0]
                values[st.rows, :, pos] = v[0]
                out, _ = gqa_decode_attention(None, q.permute(1, 2, 0, 3), keys, values, st.mask, scale)
                return out.reshape(1, q.shape[1], -1)  # [B, 1, heads, d] -> [1, B, heads * d]

            hidden = layer_forward(layer, hidden, freqs, attend)
        self._sample_into(st, self._logits(self.model.decoder.final_layernorm(hidden)[0]), sp, eos_id, pad_id)


__all__ = ["MegatronStaticDecoder", "layer_forward", "megatron_static_decode_unsupported"]
