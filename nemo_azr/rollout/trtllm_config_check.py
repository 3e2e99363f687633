"""Config checks of ``generation.backend=trtllm``: the engine keys and TensorRT-LLM itself
(``nemo_azr.preflight`` runs them; nothing here imports TensorRT-LLM)."""

from __future__ import annotations

from nemo_azr.config.checks import DTYPES, one_of, require
from nemo_azr.config.schema import NemoAzrConfig


def check_trtllm_config(cfg: NemoAzrConfig) -> None:
    """``generation.backend=trtllm``: the engine keys (docs/config.md) and TensorRT-LLM itself."""
    from nemo_azr.rollout.trtllm_backend import TRTLLM_MISSING, trtllm_available

    gen, t = cfg.generation, cfg.generation.trtllm
    require(
        not gen.dtype,
        "generation.dtype is the hf backend's; the trtllm engine's dtype is generation.trtllm.dtype",
    )
    one_of("generation.trtllm.dtype", t.dtype, ("auto", *DTYPES))
    require(
        t.tensor_parallel_size >= 1,
        f"generation.trtllm.tensor_parallel_size must be >= 1, got {t.tensor_parallel_size}",
    )
    require(
        0 < t.kv_cache_free_gpu_memory_fraction < 1,
        "generation.trtllm.kv_cache_free_gpu_memory_fraction must be in (0, 1), got "
        f"{t.kv_cache_free_gpu_memory_fraction}",
    )
    require(
        t.max_batch_size >= gen.n_samples,
        f"generation.trtllm.max_batch_size={t.max_batch_size} must be >= generation.n_samples={gen.n_samples} "
        "(the engine batches a prompt's samples together)",
    )
    require(
        t.max_seq_len >= 0,
        f"generation.trtllm.max_seq_len must be >= 0 (0 = the model's), got {t.max_seq_len}",
    )
    require(t.refit_bucket_mb > 0, f"generation.trtllm.refit_bucket_mb must be > 0, got {t.refit_bucket_mb}")
    require(t.probe_tolerance > 0, f"generation.trtllm.probe_tolerance must be > 0, got {t.probe_tolerance}")
    require(t.probe_length >= 1, f"generation.trtllm.probe_length must be >= 1, got {t.probe_length}")
    require(bool(t.probe_prompt.strip()), "generation.trtllm.probe_prompt is empty; give it some text")
    require(t.rpc_timeout_s > 0, f"generation.trtllm.rpc_timeout_s must be > 0, got {t.rpc_timeout_s}")
    require(t.checksum_rtol > 0, f"generation.trtllm.checksum_rtol must be > 0, got {t.checksum_rtol}")
    require(trtllm_available(), TRTLLM_MISSING)
