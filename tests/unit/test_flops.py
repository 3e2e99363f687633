"""Model FLOPs and MFU: the count from the config against torch's FLOP counter and hand arithmetic."""

import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

from nemo_azr.trainer.flops import ModelShape, device_peak_flops, mfu_metrics, step_flops


def _llama(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    return LlamaConfig(**{**base, **kw})


def test_matmul_weights_are_the_models_linear_weights():
    config = _llama()
    model = LlamaForCausalLM(config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert ModelShape.from_hf_config(config).matmul_weights() == linear


@pytest.mark.parametrize("tokens", [5, 16])
def test_forward_flops_equal_torchs_flop_counter(tokens):
    """A forward over ``tokens`` tokens with eager attention: its score and value matmuls span the full
    ``T x T`` matrix (the causal mask is added, not skipped), so every token is charged ``T`` keys here."""
    config = _llama()
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, tokens))
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    expected = counter.get_total_flops()
    assert ModelShape.from_hf_config(config).forward_flops(tokens, keys_per_token=tokens) == expected


def test_step_flops_by_hand():
    shape = ModelShape(layers=1, hidden=2, heads=1, kv_heads=1, head_dim=2, intermediate=3, vocab=5)
    # weights: q,o 2*2*2=8, k,v 8, gated mlp 3*2*3=18, head 2*5=10 -> 44; attention 4*1*1*2 = 8 per key
    assert shape.matmul_weights() == 44
    # 2 rows of 3 prompt + 2 response tokens
    out = step_flops(shape, rows=2, prompt_tokens=6, response_tokens=4, logprob_passes=2, update_epochs=1)
    prompt = 6 * (88 + 8 * 2.0)  # prompt keys: (3 + 1) / 2
    decode = 4 * (88 + 8 * 4.5)  # 3 prompt keys + (2 + 1) / 2
    forward = 10 * (88 + 8 * 3.0)  # whole rows: (5 + 1) / 2 keys
    assert out["rollout"] == pytest.approx(prompt + decode)
    assert out["logprob"] == pytest.approx(2 * forward)
    assert out["update"] == pytest.approx(3 * forward)
    assert out["total"] == pytest.approx(prompt + decode + 5 * forward)


def test_mfu_is_flops_over_time_over_peak():
    flops = {"rollout": 2e12, "logprob": 1e12, "update": 3e12, "total": 6e12}
    got = mfu_metrics(flops, step_s=2.0, rollout_s=1.0, update_s=0.5, peak=10e12)
    assert got == {
        "throughput/model_tflops": pytest.approx(3.0),
        "throughput/mfu": pytest.approx(0.3),
        "throughput/update_mfu": pytest.approx(0.6),
        "throughput/rollout_mfu": pytest.approx(0.2),
    }
    assert set(mfu_metrics(flops, step_s=2.0, rollout_s=1.0, update_s=0.5, peak=None)) == {
        "throughput/model_tflops"
    }


def test_no_peak_on_cpu():
    assert device_peak_flops("cpu") is None


def test_trainer_logs_the_model_flops_rate(tiny_cache, tmp_path):
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.metrics import read_metrics
    from nemo_azr.trainer.trainer import Trainer

    cfg = load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=1",
            "sft_warmup.steps=0",
            "data.prompts_per_step=2",
            "generation.n_samples=2",
        ]
    )
    Trainer(cfg).fit()
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    shape = ModelShape.from_hf_config(
        __import__("transformers").AutoConfig.from_pretrained(tmp_path / "checkpoints" / "step_1" / "model")
    )
    flops = step_flops(
        shape,
        rows=int(record["batch/rows"]),
        prompt_tokens=record["batch/prompt_tokens"],
        response_tokens=record["batch/tokens"],
        logprob_passes=0,  # one update per step: old log-probs come from its forward; no KL reference
        update_epochs=cfg.algorithm.ppo_epochs,
    )
    assert math.isclose(
        record["throughput/model_tflops"], flops["total"] / record["timing/step_s"] / 1e12, rel_tol=1e-6
    )
    assert "throughput/mfu" not in record  # no peak known for a CPU
