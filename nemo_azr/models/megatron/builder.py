"""Build a megatron-core ``GPTModel`` equivalent to a HF Llama / Qwen2 causal LM.

Equivalence (checked against the HF model in tests): RMSNorm, SwiGLU (gated linear unit, silu),
RoPE with the HF ``rope_theta`` (rotate-half layout), grouped-query attention, no biases except
Qwen2's QKV bias, tied input/output embeddings when the HF config ties them, and no lookup gradient
for the ``pad_token_id`` row (transformers' ``padding_idx``: :func:`_pad_lookup_without_grad`).
Weights are created on the CPU (``use_cpu_initialization``) so a TP=2 model starts from the same
weights as TP=1. The layer spec is megatron-core's local one with the core attention by torch's
SDPA (:mod:`nemo_azr.models.megatron.sdpa_attention`); TransformerEngine's only when it is importable
and CUDA is there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import torch

from nemo_azr.distributed.parallel import ParallelLayout
from nemo_azr.errors import ConfigError
from nemo_azr.models.megatron.fallback_notice import announce_torch_fallbacks

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "build_gpt_model",
    "check_layout_fits",
    "padded_vocab_size",
    "stage_layer_range",
    "transformer_config_from_hf",
    "use_transformer_engine",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# HF config attributes that change the maths beyond what the mapping below reproduces.
_UNSUPPORTED_FLAGS = ("use_sliding_window", "mlp_bias", "attention_bias")


def _rope_theta(hf_config: Any) -> float:
    """``rope_theta`` of a transformers 4.x (attribute) or 5.x (``rope_parameters``) config."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(
            f"rope_type {rope_type!r} is not supported by the megatron backend (only 'default')"
        )
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ConfigError("the HF config has no rope_theta")
    return float(theta)


def _check_model(hf_config: Any) -> None:
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"model_type {model_type!r} is not supported by the megatron backend; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    for flag in _UNSUPPORTED_FLAGS:
        if getattr(hf_config, flag, False):
            raise ConfigError(
                f"{model_type} config sets {flag}=True, which the megatron backend does not support"
            )
    if hf_config.hidden_act != "silu":
        raise ConfigError(f"hidden_act {hf_config.hidden_act!r} is not supported (only silu / SwiGLU)")
    _rope_theta(hf_config)


def padded_vocab_size(vocab_size: int, layout: ParallelLayout) -> int:
    """Megatron's padded vocabulary: a multiple of ``make_vocab_size_divisible_by * tp``."""
    multiple = layout.make_vocab_size_divisible_by * layout.tp
    return -(-vocab_size // multiple) * multiple


def check_layout_fits(hf_config: Any, layout: ParallelLayout) -> None:
    """One-line ConfigError when ``layout`` cannot split this model (heads, kv heads, layers, vocab)."""
    _check_model(hf_config)
    tp, pp = layout.tp, layout.pp
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    layers = hf_config.num_hidden_layers
    if heads % tp:
        raise ConfigError(f"num_attention_heads {heads} is not divisible by tensor parallel size {tp}")
    if kv % tp and tp % kv:
        # megatron replicates kv heads when tp is a multiple of them; anything else cannot be split
        raise ConfigError(
            f"num_key_value_heads {kv} is neither a multiple nor a divisor of tensor parallel size {tp}"
        )
    stages = pp * max(layout.vpp, 1)
    if layers % stages:
        raise ConfigError(f"num_hidden_layers {layers} is not divisible by pipeline stages pp*vpp = {stages}")
    vocab = hf_config.vocab_size
    per_rank = padded_vocab_size(vocab, layout) // tp
    if vocab <= (tp - 1) * per_rank:  # the last TP rank would hold padding only
        raise ConfigError(
            f"vocab size {vocab} is too small for tp={tp} with make_vocab_size_divisible_by="
            f"{layout.make_vocab_size_divisible_by}: the last rank would hold padding only; lower it"
        )


def stage_layer_range(
    num_layers: int, layout: ParallelLayout, pp_rank: int, vp_stage: int | None = None
) -> range:
    """Global indices of the decoder layers that pipeline rank ``pp_rank`` (chunk ``vp_stage``) holds.

    Megatron's even split: ``num_layers / (pp * vpp)`` consecutive layers per model chunk, chunk ``v``
    of rank ``r`` being global chunk ``v * pp + r``.
    """
    chunks = layout.pp * max(layout.vpp, 1)
    per_chunk = num_layers // chunks
    chunk = (vp_stage or 0) * layout.pp + pp_rank
    return range(chunk * per_chunk, (chunk + 1) * per_chunk)


def use_transformer_engine(requested: bool | None = None) -> bool:
    """TransformerEngine's layer spec: when asked (error if missing) or, by default, when importable on CUDA."""
    available = importlib.util.find_spec("transformer_engine") is not None
    if requested and not available:
        raise ConfigError(
            "the TransformerEngine layer spec was requested but transformer_engine is not installed"
        )
    if requested is None:
        return available and torch.cuda.is_available()
    return requested


def transformer_config_from_hf(hf_config: Any, layout: ParallelLayout, *, dtype: torch.dtype = torch.float32):
    """megatron-core ``TransformerConfig`` equivalent to a HF Llama / Qwen2 config split by ``layout``."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    check_layout_fits(hf_config, layout)
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=heads,
        num_query_groups=getattr(hf_config, "num_key_value_heads", None) or heads,
        kv_channels=head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2",
        hidden_dropout=0.0,
        attention_dropout=0.0,
        # HF scales scores by 1/sqrt(head_dim) and does softmax in fp32; no extra layer scaling.
        apply_query_key_layer_scaling=False,
        attention_softmax_in_fp32=True,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp or None,
        sequence_parallel=layout.sequence_parallel,
        pipeline_dtype=dtype,
        # The interleaved schedule: forward and backward sends in separate exchanges (Megatron-LM's
        # default with virtual stages). The batched default sends a stage's activation and gradient
        # in one exchange; at pp=2 both go to the same peer, which receives them swapped (and their
        # shapes, with variable_seq_lengths): a wrong update, or a shape error (Megatron-LM #1450).
        overlap_p2p_comm=bool(layout.vpp),
        batch_p2p_comm=not layout.vpp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
        # No CUDA graphs either way; [] is the current spelling of the default ("full", which
        # megatron-core warns about as deprecated on every config it builds).
        cuda_graph_scope=[],
        # The project's losses already carry their global normalisers (tokens of the whole
        # mini-batch): the pipeline schedule must not divide them by tokens or micro-batches again.
        calculate_per_token_loss=True,
    )


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm for megatron's local layer spec under sequence parallelism.

    megatron's ``WrappedTorchNorm`` refuses sequence parallelism because torch's norm weight lacks
    the ``sequence_parallel`` mark that TE's and apex's norms carry: each TP rank then normalises
    only its slice of the sequence, and the marked weight's partial gradients get summed over the
    TP group (``finalize_model_grads`` / ``grads.all_reduce_sequence_parallel_grads``). Same
    construction (and state-dict key) as ``WrappedTorchNorm``'s RMSNorm otherwise.
    """

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_unused: Any) -> None:
        super().__init__(normalized_shape=hidden_size, eps=eps)
        self.weight.sequence_parallel = config.sequence_parallel


def _with_sdpa_attention(spec):
    """The local layer spec with its core attention computed by torch's SDPA (sdpa_attention.py)."""
    from nemo_azr.models.megatron.sdpa_attention import SDPACoreAttention

    attention = spec.submodules.self_attention
    return dataclasses.replace(
        spec,
        submodules=dataclasses.replace(
            spec.submodules,
            self_attention=dataclasses.replace(
                attention,
                submodules=dataclasses.replace(attention.submodules, core_attention=SDPACoreAttention),
            ),
        ),
    )


def _layer_spec(use_te: bool, config: Any, vp_stage: int | None):
    from megatron.core.models.gpt import gpt_layer_specs

    if use_te:
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    spec = _with_sdpa_attention(gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm"))
    if not config.sequence_parallel:
        return spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    layer = dataclasses.replace(
        spec,
        submodules=dataclasses.replace(
            spec.submodules,
            input_layernorm=SequenceParallelRMSNorm,
            pre_mlp_layernorm=SequenceParallelRMSNorm,
        ),
    )
    # A block spec, so that the final norm is the sequence-parallel one too.
    return TransformerBlockSubmodules(
        layer_specs=[layer] * get_num_layers_to_build(config, vp_stage=vp_stage),
        layer_norm=SequenceParallelRMSNorm,
    )


def build_gpt_model(
    hf_config: Any,
    layout: ParallelLayout,
    *,
    dtype: torch.dtype = torch.float32,
    pre_process: bool | None = None,
    post_process: bool | None = None,
    vp_stage: int | None = None,
    use_te: bool | None = None,
):
    """This rank's ``GPTModel`` (its pipeline stage and tensor shard) for a HF Llama / Qwen2 config.

    Needs :func:`nemo_azr.distributed.parallel.initialize_parallel` first. ``pre_process`` /
    ``post_process`` default to whether this rank is the first / last pipeline stage (for
    ``vp_stage`` with virtual pipelining). The vocabulary is padded as megatron does
    (:func:`padded_vocab_size`); the padded rows are zero and never looked up.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    if dtype != torch.float32 and not torch.cuda.is_available():
        raise ConfigError(f"dtype {dtype} needs CUDA; the megatron backend runs float32 on CPU")
    te = use_transformer_engine(use_te)
    if not te:
        announce_torch_fallbacks(
            is_main=not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        )
    config = transformer_config_from_hf(hf_config, layout, dtype=dtype)
    if pre_process is None:
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    if post_process is None:
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    model = GPTModel(
        config=config,
        transformer_layer_spec=_layer_spec(te, config, vp_stage),
        vocab_size=padded_vocab_size(hf_config.vocab_size, layout),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_base=_rope_theta(hf_config),
        vp_stage=vp_stage,
    )
    _cast_floating_params(model, config.params_dtype)
    if torch.cuda.is_available():
        model.cuda(torch.cuda.current_device())
    # Remembered for the state-dict adapter and the log-prob kernel (padded rows must not count).
    model.real_vocab_size = hf_config.vocab_size
    model.padded_vocab_size = padded_vocab_size(hf_config.vocab_size, layout)
    pad = getattr(hf_config, "pad_token_id", None)
    if pre_process and pad is not None and 0 <= pad < hf_config.vocab_size:
        embedding = model.embedding.word_embeddings
        embedding.hf_padding_idx = pad
        embedding.register_forward_hook(_pad_lookup_without_grad)
    return model


def _cast_floating_params(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Every floating parameter in ``dtype``, as Megatron-LM's Float16Module casts its model.

    ``params_dtype`` reaches megatron's own layers only: without apex / TE the norms fall back to
    torch's, created in float32. A bf16 model with float32 norm weights misses the fused norm kernel
    and breaks the distributed optimizer's checkpoint, whose per-parameter state lookup assumes one
    dtype per group (megatron-core 0.16: fp32 shards are listed before the bf16 ones). Buffers (RoPE
    frequencies) are left alone.
    """
    for param in model.parameters():
        if param.dtype.is_floating_point and param.dtype != dtype:
            param.data = param.data.to(dtype)


def _pad_lookup_without_grad(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook of the word embedding: positions holding ``pad_token_id`` pass no gradient to the
    embedding table, as transformers' ``nn.Embedding(..., padding_idx=pad_token_id)`` of Llama / Qwen2.

    Values are unchanged. It matters when the pad token is also a real token (SmolLM2's pad is its
    ``<|im_end|>``, in every chat prompt): HF never trains that row through the lookup (a tied output
    layer still trains it), so neither may this backend if a step is to equal the ``hf`` backend's.
    The output is the TP-reduced ``[b, s, h]``, or with sequence parallelism this rank's
    reduce-scattered ``[s/tp, b, h]`` chunk.
    """
    if not torch.is_grad_enabled() or not output.requires_grad:
        return output
    pad = args[0] == module.hf_padding_idx  # [b, s]
    if module.reduce_scatter_embeddings:
        pad = pad.t().chunk(module.tp_group.size())[module.tp_group.rank()]  # [s/tp, b]
    return torch.where(pad.unsqueeze(-1), output.detach(), output)
