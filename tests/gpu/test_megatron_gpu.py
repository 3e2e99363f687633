"""The megatron backend on one CUDA GPU (nccl, bf16, TransformerEngine's spec when importable).

Skipped without CUDA (CI); ``scripts/gpu_check.sh`` runs them on a GPU machine. One GPU, so one
process: the multi-process layouts are the CPU tests' (tests/integration/test_megatron_*.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # before importing megatron-core: CI skips this file at once
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("megatron.core")

from nemo_azr.config.schema import TinyModelConfig  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.models.tiny import ensure_tiny_model  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402


def _te_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken TE install counts as absent
        return False
    return True


SPECS = ["local", pytest.param("te", marks=pytest.mark.skipif(not _te_available(), reason="no TE"))]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return ensure_tiny_model(TinyModelConfig(cache_dir=str(tmp_path_factory.mktemp("tiny"))))


@pytest.fixture(scope="module")
def batch(model_dir) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 2, 7, 3)]
    responses = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (4, 6, 1, 5)]
    return pack_prompt_response(prompts, responses, None, pad_id=0)


def hf_logprobs(model_dir: Path, batch: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).cuda().eval()
    ids, attn = batch["input_ids"].cuda(), batch["attention_mask"].cuda()
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"].cuda()).logits
    lp = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp * ((attn[:, 1:] > 0) & (attn[:, :-1] > 0)), (1, 0)).cpu()


def megatron_logprobs(model_dir: Path, batch, dtype: torch.dtype, spec: str) -> torch.Tensor:
    from transformers import AutoConfig

    from nemo_azr.distributed.parallel import ParallelLayout, initialize_parallel
    from nemo_azr.models.megatron.builder import build_gpt_model
    from nemo_azr.models.megatron.hf_adapter import load_hf_into_megatron
    from nemo_azr.models.megatron.logprobs import megatron_token_logprobs

    layout = ParallelLayout()
    initialize_parallel(layout, seed=0, backend="nccl")
    model = build_gpt_model(AutoConfig.from_pretrained(model_dir), layout, dtype=dtype, use_te=spec == "te")
    load_hf_into_megatron(model, model_dir, layout)
    with torch.no_grad():
        lp = megatron_token_logprobs(
            model.eval(), batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        )
    return lp.float().cpu()


@pytest.mark.parametrize("spec", SPECS)
def test_fp32_logprobs_match_hf(model_dir, batch, spec):
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here
    torch.backends.cudnn.allow_tf32 = False
    want = hf_logprobs(model_dir, batch, torch.float32)
    got = megatron_logprobs(model_dir, batch, torch.float32, spec)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("spec", SPECS)
def test_bf16_logprobs_are_as_close_to_fp32_as_hf_bf16(model_dir, batch, spec):
    """bf16 keeps ~3 significant digits, so compare errors against the fp32 reference: megatron's
    bf16 error may not exceed twice HF's own bf16 error (plus 0.02 for tiny errors)."""
    reference = hf_logprobs(model_dir, batch, torch.float32)
    hf_err = (hf_logprobs(model_dir, batch, torch.bfloat16) - reference).abs().max().item()
    got = megatron_logprobs(model_dir, batch, torch.bfloat16, spec)
    assert (got - reference).abs().max().item() <= 2 * hf_err + 0.02


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["parallel.distributed_optimizer=true"],
        ["generation.backend=megatron"],
    ],
    ids=["adamw", "distributed_optimizer", "megatron_generation"],
)
def test_grpo_steps_on_cuda_bf16(model_dir, tmp_path, extra):
    from nemo_azr.trainer.trainer import Trainer

    cfg = load_config(
        [
            f"model.tiny.cache_dir={model_dir.parent}",
            "model.backend=megatron",
            "model.dtype=bfloat16",
            "trainer.device=cuda",
            "logger=quiet",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "trainer.save_interval=2",
            "sft_warmup.steps=0",
            "data.prompts_per_step=2",
            "generation.n_samples=4",
            *extra,
        ]
    )
    result = Trainer(cfg).fit()
    assert (Path(result.checkpoint) / "dist" / "metadata.json").is_file()
    from nemo_azr.trainer.metrics import read_metrics

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]  # steps count from 1
    for record in records:
        for key in ("actor/loss", "actor/grad_norm", "reward/mean"):
            assert math.isfinite(record[key]), (key, record)
