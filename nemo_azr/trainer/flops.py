"""Model FLOPs of a training step and the model FLOPs utilisation (MFU) they give on the device.

Counted from the model's config (the usual dense-transformer count, as Megatron-LM and PaLM do): a
token's forward costs ``2 x`` the matmul weights it passes (attention projections, gated MLP, LM
head) plus ``4 x layers x heads x head_dim x keys`` for the attention scores and the weighted sum of
values; a backward costs twice a forward. Embedding lookups, norms and softmax are not counted. Only
work the algorithm needs counts (a recomputed chunk of logits does not): MFU measures how far a run
is from the hardware, not how busy the GPU is.

A step's model FLOPs: prompts encoded once and responses decoded (rollout), one forward over every
row per log-prob pass (the old policy unless the rollout's are used, the KL reference), and a forward
plus backward per row per PPO epoch (update).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Dense bf16 tensor-core peak, FLOP/s, by a substring of the CUDA device name (vendor data sheets,
#: SXM parts; sparsity not counted). A device not listed logs no MFU.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 70e12,
}


#: Decoder families whose MLP is two matmuls (up, down) rather than gated (gate, up, down).
NON_GATED_MLP = ("gpt2", "gpt_neox", "opt", "falcon", "phi", "starcoder2")


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs of a decoder's config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    gated_mlp: bool = True

    @classmethod
    def from_hf_config(cls, config) -> ModelShape:
        """From a transformers config (Llama, Qwen2, Mistral and other decoders with these fields)."""
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=config.intermediate_size,
            vocab=config.vocab_size,
            gated_mlp=getattr(config, "model_type", "") not in NON_GATED_MLP,
        )

    def matmul_weights(self) -> int:
        """Weights a token multiplies through: per layer q, k, v, o and the MLP, then the LM head."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        return self.layers * (q_o + k_v + mlp) + self.hidden * self.vocab

    def forward_flops(self, tokens: float, keys_per_token: float) -> float:
        """Forward FLOPs of ``tokens`` tokens that each attend to ``keys_per_token`` keys on average."""
        attention = 4 * self.layers * self.heads * self.head_dim * keys_per_token
        return tokens * (2 * self.matmul_weights() + attention)


def step_flops(
    shape: ModelShape,
    *,
    rows: int,
    prompt_tokens: float,
    response_tokens: float,
    logprob_passes: int,
    update_epochs: int,
) -> dict[str, float]:
    """Model FLOPs of one step's rollout, log-prob passes and update (and their sum, ``total``).

    A row of ``p`` prompt and ``r`` response tokens attends causally: its ``p + r`` tokens see
    ``(p + r + 1) / 2`` keys on average in a full forward; in the rollout the prompt is encoded as such
    a forward and each response token sees ``p`` plus the tokens before it.
    """
    if rows <= 0:
        return {"rollout": 0.0, "logprob": 0.0, "update": 0.0, "total": 0.0}
    p, r = prompt_tokens / rows, response_tokens / rows
    seq_tokens = prompt_tokens + response_tokens
    full_keys = (p + r + 1) / 2
    rollout = shape.forward_flops(prompt_tokens, (p + 1) / 2) + shape.forward_flops(
        response_tokens, p + (r + 1) / 2
    )
    forward = shape.forward_flops(seq_tokens, full_keys)
    out = {"rollout": rollout, "logprob": logprob_passes * forward, "update": update_epochs * 3 * forward}
    out["total"] = sum(out.values())
    return out


def device_peak_flops(device: torch.device | str) -> float | None:
    """Dense bf16 peak FLOP/s of a CUDA device from ``PEAK_BF16_FLOPS``; None elsewhere or unknown."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    # the longest listed name inside the device's: "GH200" before "H200"
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def mfu_metrics(
    flops: dict[str, float], *, step_s: float, rollout_s: float, update_s: float, peak: float | None
) -> dict[str, float]:
    """``throughput/model_tflops`` (the step's model FLOPs over its wall time) and, where the device's
    peak is known, ``throughput/mfu`` (the step) and ``throughput/update_mfu`` / ``rollout_mfu``."""
    out = {"throughput/model_tflops": flops["total"] / max(step_s, 1e-9) / 1e12}
    if peak:
        out["throughput/mfu"] = flops["total"] / max(step_s, 1e-9) / peak
        out["throughput/update_mfu"] = flops["update"] / max(update_s, 1e-9) / peak
        out["throughput/rollout_mfu"] = flops["rollout"] / max(rollout_s, 1e-9) / peak
    return out


__all__ = ["PEAK_BF16_FLOPS", "ModelShape", "device_peak_flops", "mfu_metrics", "step_flops"]
