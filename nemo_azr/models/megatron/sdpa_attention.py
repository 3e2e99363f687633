"""megatron-core's local core attention computed by torch's fused SDPA kernels (no TransformerEngine).

Why by hand: megatron's local layer spec (the one used without TransformerEngine) attends with
``DotProductAttention``, which repeats every KV head per query head, materialises the ``[b * heads,
sq, sk]`` scores, and without apex falls back to an unfused float32 softmax: at a 1k-token row that
costs more time and memory than the rest of the layer (a Qwen2-0.5B-shaped update ran at 0.75x the hf
backend's tokens/s with 1.9x its memory, the log-prob forward at 0.53x; results/megatron_tokens_per_s_h200.md).
``torch.nn.functional.scaled_dot_product_attention`` with ``is_causal`` and ``enable_gqa`` runs the
flash / memory-efficient kernels instead. The constructor (partition sizes, softmax scale, dropout) is
megatron's own; the forward keeps its mask semantics exactly:

* no mask, causal type, ``sq > 1``: the causal mask (megatron asserts ``sq == sk``; so does this);
* no mask and ``sq == 1`` (a decode step against a KV cache): every key is visible;
* a given mask (megatron's convention: True = masked out) is applied as megatron's unfused softmax
  does, a score of -10000; a query that sees no key at all averages every value uniformly, as
  megatron's filled scores do (numbers, not NaN).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

#: megatron's ``attention_mask_func`` fill value.
MASKED_SCORE = -10000.0


class SDPACoreAttention(DotProductAttention):
    """``DotProductAttention`` with the same inputs and outputs, computed by torch's SDPA."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError(
                "SDPACoreAttention takes neither packed sequences nor an attention bias"
            )
        if self.scale_mask_softmax.window_size is not None:
            raise NotImplementedError("SDPACoreAttention has no sliding-window attention")
        sq, b, heads, dim = query.shape
        sk = key.shape[0]
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = mask_type == AttnMaskType.causal and attention_mask is None and sq > 1
        if causal and sq != sk:
            raise ValueError(f"causal self-attention needs as many keys as queries, got {sq} and {sk}")
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, heads, s, dim]
        mask = None
        if attention_mask is not None:
            hidden = attention_mask.bool()
            mask = torch.zeros(hidden.shape, dtype=query.dtype, device=query.device).masked_fill(
                hidden, MASKED_SCORE
            )
            # A query that sees no key: megatron fills every score with -10000, i.e. a uniform
            # average of the values; equal scores (a zero query) over an open row give the same.
            blind = hidden.all(dim=-1, keepdim=True)
            mask = mask.masked_fill(blind, 0.0)
            q = q.masked_fill(blind, 0.0)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.attention_dropout.p if self.training else 0.0,
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=k.shape[1] != heads,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)


__all__ = ["MASKED_SCORE", "SDPACoreAttention"]
