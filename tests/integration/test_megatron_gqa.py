"""Grouped-query attention with an odd head count and tied embeddings (SmolLM2-135M's shape: 9 query
heads in 3 kv groups) on a tiny model at tensor parallel 3: three processes over gloo, one torchrun
launch of megatron_layouts_worker.py. Full logits and padded-batch log-probs equal HF's, the gathered
weights are the checkpoint's bit for bit, one GRPO step equals the hf backend's, and a checkpoint
written by ``nemo-azr convert hf-to-megatron`` at TP=3 exports back (``convert megatron-to-hf``) to a
folder that plain transformers loads and decodes greedily like the source. PP=2 of this shape:
test_megatron_parallel.py; the weight round trip at TP=3 x PP=2: tests/unit/test_megatron_model.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.trainer.sft import run_sft_warmup  # noqa: E402
from nemo_azr.trainer.trainer import Trainer  # noqa: E402
from tests.integration.test_megatron_parallel import GQA_TINY  # noqa: E402
from tests.integration.test_megatron_train import (  # noqa: E402
    ATOL,
    assert_step_matches,
    fixed_batch,
    hf_weights,
    one_step,
    overrides,
    run_layouts_worker,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

#: 9 query heads in 3 groups of 3 (head dim 8), tied embeddings (the tiny model's default).
GQA = [f"model.tiny.{key}={value}" for key, value in GQA_TINY.items()]
SFT_STEPS = 40
PROMPT = "What is 3 + 5?"


def gqa_overrides(cache: str, out: Path, *extra: str) -> list[str]:
    return overrides(cache, out, *GQA, *extra)


@pytest.fixture(scope="module")
def gqa_warm_model(tiny_cache, tmp_path_factory) -> Path:
    """The 9/3-head tiny model after a short supervised warm-up (so a GRPO step has non-zero advantages
    and greedy decoding answers in the task's format)."""
    out = tmp_path_factory.mktemp("gqa_warm")
    cfg = load_config(gqa_overrides(tiny_cache, out, "model.backend=hf", f"sft_warmup.steps={SFT_STEPS}"))
    trainer = Trainer(cfg)
    config = trainer.policy.model.config
    assert (config.num_attention_heads, config.num_key_value_heads, config.tie_word_embeddings) == (
        9,
        3,
        True,
    )
    run_sft_warmup(trainer.policy, trainer.task, trainer.tokenizer, cfg, workflow=trainer.workflow)
    # SmolLM2 pads with its end-of-turn token <|im_end|>, which is in every chat prompt: transformers'
    # nn.Embedding(padding_idx=pad) then never trains that row through the lookup (megatron must not).
    trainer.tokenizer.pad_token = trainer.tokenizer.eos_token
    config.pad_token_id = trainer.policy.model.generation_config.pad_token_id = trainer.tokenizer.eos_token_id
    trainer.policy.save(out, tokenizer=trainer.tokenizer)
    return out / "model"


@pytest.fixture(scope="module")
def hf_gqa_step(gqa_warm_model, tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("gqa_hf")
    cfg = load_config(gqa_overrides(tiny_cache, out, "model.backend=hf", f"model.path={gqa_warm_model}"))
    trainer, metrics = one_step(cfg)
    return metrics, hf_weights(trainer)


@pytest.fixture(scope="module")
def tp3_run(gqa_warm_model, tiny_cache, tmp_path_factory) -> Path:
    """One torchrun launch (3 processes) of megatron_layouts_worker.py; its output folder."""
    out = tmp_path_factory.mktemp("gqa_tp3")
    vocab = json.loads((gqa_warm_model / "config.json").read_text())["vocab_size"]
    torch.save(fixed_batch(vocab), out / "batch.pt")
    torch.save(torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0)), out / "ids.pt")
    tp3 = "parallel=tp3pp1"
    spec = {
        "overrides": gqa_overrides(tiny_cache, out, "model.backend=megatron", f"model.path={gqa_warm_model}"),
        "steps": {"tp3": [tp3]},  # Adam eps 1e-4 comes with overrides()
        "parity": ["tp3"],  # the loaded model, before the step
        "batch_file": str(out / "batch.pt"),
        "logits_ids_file": str(out / "ids.pt"),
        "convert": [["convert", "hf-to-megatron", str(gqa_warm_model), str(out / "mg"), tp3]],
    }
    run_layouts_worker(out, spec, nproc=3)
    return out


def test_tp3_logits_logprobs_and_gathered_weights_match_hf(tp3_run, gqa_warm_model, tiny_cache):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from nemo_azr.contracts import Batch
    from nemo_azr.models.hf.policy import HFPolicy

    got = torch.load(tp3_run / "parity_tp3.pt")
    hf = AutoModelForCausalLM.from_pretrained(str(gqa_warm_model), dtype=torch.float32).eval()
    with torch.no_grad():
        want_logits = hf(input_ids=torch.load(tp3_run / "ids.pt")).logits
    # Vocab padded to a multiple of 128 x 3 on the ranks; the gathered logits are the real vocabulary.
    assert got["logits"].shape == want_logits.shape and hf.config.vocab_size % 384
    torch.testing.assert_close(got["logits"], want_logits, atol=ATOL, rtol=0)

    batch = Batch(tensors=torch.load(tp3_run / "batch.pt"))
    cfg = load_config(gqa_overrides(tiny_cache, tp3_run, "model.backend=hf", f"model.path={gqa_warm_model}"))
    want = HFPolicy(gqa_warm_model, cfg, trainable=False).compute_logprobs(batch)
    assert (want != 0).sum() == batch["loss_mask"].sum()
    torch.testing.assert_close(got["logprobs"], want, atol=ATOL, rtol=0)

    source = load_file(gqa_warm_model / "model.safetensors")
    assert "lm_head.weight" not in source  # tied: the embedding is the output layer
    for key, value in source.items():
        assert torch.equal(got["weights"][key], value), key


def test_tp3_grpo_step_matches_hf(tp3_run, hf_gqa_step):
    got = torch.load(tp3_run / "step_tp3.pt")
    assert_step_matches(got["metrics"], got["weights"], hf_gqa_step)


def test_tp3_converted_checkpoint_exports_to_hf_that_generates_like_the_source(
    tp3_run, gqa_warm_model, tmp_path
):
    """``nemo-azr convert hf-to-megatron`` at TP=3 (three processes), then ``convert megatron-to-hf``
    of that checkpoint at one process (resharded on load): plain transformers loads the folder, its
    weights are the source's bit for bit and it decodes a chat prompt greedily to the same tokens."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from nemo_azr.cli import main as cli_main
    from nemo_azr.models.megatron.parity import greedy_chat_tokens

    mg, hf = tp3_run / "mg", tmp_path / "hf"
    assert (mg / "dist" / "metadata.json").is_file() and not (mg / "model" / "model.safetensors").exists()
    assert cli_main(["convert", "megatron-to-hf", str(mg), str(hf)]) == 0
    want, got = load_file(gqa_warm_model / "model.safetensors"), load_file(hf / "model.safetensors")
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert AutoTokenizer.from_pretrained(str(hf)).chat_template  # the side files came along
    want_tokens, want_text = greedy_chat_tokens(gqa_warm_model, PROMPT, max_new_tokens=12)
    got_tokens, got_text = greedy_chat_tokens(hf, PROMPT, max_new_tokens=12)
    assert got_tokens == want_tokens and got_text == want_text
    assert len(set(want_tokens)) > 1  # the warm model says something, not one repeated token
