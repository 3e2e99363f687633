"""The ``megatron`` policy backend trains like ``hf``: same loss and weights after a GRPO step on one
process and at DP=2 and PP=2 over gloo (torchrun, 2 processes); a TP=2 run resumed from its
checkpoint continues the same metrics; its checkpoint loads at TP=1/DP=2, PP=2 and TP=2 with the same
log-probs as the HF export of that checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.trainer.metrics import read_metrics  # noqa: E402
from nemo_azr.trainer.sft import run_sft_warmup  # noqa: E402
from nemo_azr.trainer.trainer import Trainer  # noqa: E402
from tests.integration.torchrun import run_torchrun_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_train_worker.py")
LAYOUTS_WORKER = Path(__file__).with_name("megatron_layouts_worker.py")
ATOL = 1e-5
TIMEOUT_S = 300
SFT_STEPS = 40
RUN = ["trainer.max_steps=4", "trainer.save_interval=2", "trainer.keep_last=0"]
DISTOPT = "parallel.distributed_optimizer=true"
SP = "parallel.sequence_parallel=true"
#: Adam's eps above float noise in every step comparison: some gradients of a step are near zero, and
#: Adam's first step (~lr * sign(grad) at eps=1e-8) would turn their 1e-9 differences between the
#: backends' reductions into 1e-5 weight differences (loss and grad norm are compared as they are).
ADAM_EPS = "optim.eps=1e-4"
ENTROPY = ["algorithm.entropy_coef=0.05"]
#: (parallel preset, extra overrides, name) of the one-step checks at two processes.
STEP_VARIANTS = [
    ("tp1pp1", [], "dp2"),
    ("tp1pp2", [], "pp2"),
    ("tp1pp1", [DISTOPT], "dp2_distopt"),
    ("tp1pp2", [DISTOPT], "pp2_distopt"),
    ("tp2pp1", [SP], "tp2_sp"),  # norm-weight gradients summed over the TP ranks
    ("tp2pp1", [SP, DISTOPT], "tp2_sp_distopt"),  # ... by megatron's finalize_model_grads
    ("tp2pp1", ENTROPY, "tp2_entropy"),  # vocab-parallel entropy bonus
    ("tp1pp2", ENTROPY, "pp2_entropy"),
]


def overrides(cache: str, out: Path, *extra: str) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        "trainer.device=cpu",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "generation.n_samples=4",
        ADAM_EPS,
        *extra,
    ]


def one_step(cfg) -> tuple[Trainer, dict[str, float]]:
    trainer = Trainer(cfg)
    trainer.setup_generation()
    return trainer, trainer.train_step(0)


def hf_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    policy = trainer.policy
    if hasattr(policy, "export_hf_state_dict"):
        return policy.export_hf_state_dict()
    return {k: v.detach() for k, v in policy.model.state_dict().items()}


@pytest.fixture(scope="module")
def warm_model(tiny_cache, tmp_path_factory) -> str:
    """The tiny model after a short supervised warm-up, so the rollout's rewards differ (a real GRPO
    update). Both backends start from this folder: a warm-up on each would drift apart (AdamW)."""
    out = tmp_path_factory.mktemp("warm")
    cfg = load_config(overrides(tiny_cache, out, "model.backend=hf", f"sft_warmup.steps={SFT_STEPS}"))
    trainer = Trainer(cfg)
    run_sft_warmup(trainer.policy, trainer.task, trainer.tokenizer, cfg, workflow=trainer.workflow)
    trainer.policy.save(out, tokenizer=trainer.tokenizer)
    return str(out / "model")


@pytest.fixture(scope="module")
def hf_steps(warm_model, tiny_cache, tmp_path_factory):
    """``hf_steps(*extra)``: metrics and weights after one hf GRPO step (computed once per ``extra``)."""
    cache: dict[tuple[str, ...], tuple[dict[str, float], dict[str, torch.Tensor]]] = {}

    def step(*extra: str):
        if extra not in cache:
            out = tmp_path_factory.mktemp("hf")
            cfg = load_config(
                overrides(tiny_cache, out, "model.backend=hf", f"model.path={warm_model}", *extra)
            )
            trainer, metrics = one_step(cfg)
            cache[extra] = metrics, hf_weights(trainer)
        return cache[extra]

    return step


@pytest.fixture(scope="module")
def hf_step(hf_steps):
    return hf_steps()


def assert_step_matches(metrics: dict[str, float], state: dict[str, torch.Tensor], reference) -> None:
    """One GRPO step's metrics and updated weights equal the hf backend's ``reference`` step."""
    hf_metrics, hf_state = reference
    assert hf_metrics["actor/grad_norm"] > 0  # a real update (not an all-zero-advantage batch)
    for key in ("actor/loss", "actor/pg_loss", "actor/clip_frac", "actor/entropy"):
        if key in hf_metrics:
            assert metrics[key] == pytest.approx(hf_metrics[key], abs=ATOL), key
    assert metrics["actor/grad_norm"] == pytest.approx(hf_metrics["actor/grad_norm"], rel=1e-4)
    assert metrics["batch/tokens"] == hf_metrics["batch/tokens"]
    for key, want in hf_state.items():
        if key not in state:  # a tied lm_head is the embedding
            assert key == "lm_head.weight"
            continue
        torch.testing.assert_close(state[key], want, atol=ATOL, rtol=0, msg=key)


def test_single_process_matches_hf(hf_step, warm_model, tiny_cache, tmp_path):
    cfg = load_config(
        overrides(
            tiny_cache, tmp_path, "model.backend=megatron", "parallel=tp1pp1", f"model.path={warm_model}"
        )
    )
    trainer, metrics = one_step(cfg)
    state = hf_weights(trainer)
    assert_step_matches(metrics, state, hf_step)
    # The checkpoint round trip: dist/ restores the weights and the optimizer state exactly.
    folder = trainer.save_checkpoint()
    assert (folder / "model" / "model.safetensors").is_file() and (
        folder / "dist" / "metadata.json"
    ).is_file()
    saved_optim = trainer.policy.optimizer.state_dict()
    trainer.policy.setup_optimizer(total_steps=10)  # a fresh optimizer: load must restore it
    trainer.load_checkpoint(folder)
    for key, value in trainer.policy.export_hf_state_dict().items():
        assert torch.equal(value, state[key]), key
    loaded_optim = trainer.policy.optimizer.state_dict()
    assert loaded_optim["param_groups"][0]["lr"] == saved_optim["param_groups"][0]["lr"]
    assert trainer.policy.scheduler.last_epoch == 1
    for pid, st in saved_optim["state"].items():
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded_optim["state"][pid][name], st[name]), (pid, name)


def test_entropy_bonus_step_matches_hf(hf_steps, warm_model, tiny_cache, tmp_path):
    cfg = load_config(
        overrides(tiny_cache, tmp_path, "model.backend=megatron", f"model.path={warm_model}", *ENTROPY)
    )
    trainer, metrics = one_step(cfg)
    reference = hf_steps(*ENTROPY)
    assert reference[0]["actor/entropy"] > 0
    assert reference[0]["actor/loss"] != pytest.approx(hf_steps()[0]["actor/loss"], abs=1e-4)  # it counts
    assert_step_matches(metrics, hf_weights(trainer), reference)


def fixed_batch(vocab: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts and right-padded responses of random tokens (the rollout's layout)."""
    from nemo_azr.contracts.assemble import pack_prompt_response

    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 2, 7, 3)]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (4, 6, 1, 5)]
    return pack_prompt_response(prompts, responses, None, pad_id=0)


@pytest.fixture(scope="module")
def layouts_run(hf_step, warm_model, tiny_cache, tmp_path_factory):
    """One torchrun launch (2 processes) of megatron_layouts_worker.py; its output folder."""
    out = tmp_path_factory.mktemp("layouts")
    vocab = json.loads((Path(warm_model) / "config.json").read_text())["vocab_size"]
    torch.save(fixed_batch(vocab), out / "batch.pt")
    spec = {
        "overrides": [*overrides(tiny_cache, out, "model.backend=megatron", f"model.path={warm_model}")],
        "steps": {name: [f"parallel={layout}", *extra] for layout, extra, name in STEP_VARIANTS},
        "run_c": ["trainer.max_steps=2", "trainer.save_interval=1", "trainer.keep_last=0"],
        "run_e": ["trainer.max_steps=2", "trainer.save_interval=0"],
        "run": RUN,
        "run_a_extra": ["trainer.async_save=true"],  # run_b resumes from a background-written checkpoint
        "reshard_layouts": ["tp1pp1", "tp1pp2", "tp2pp1"],
        "batch_file": str(out / "batch.pt"),
    }
    run_layouts_worker(out, spec, nproc=2)
    return out


def run_layouts_worker(out: Path, spec: dict, *, nproc: int) -> None:
    """One torchrun launch of megatron_layouts_worker.py with ``spec`` (written to ``out/spec.json``)."""
    run_torchrun_worker(LAYOUTS_WORKER, out, spec, nproc=nproc, timeout=TIMEOUT_S)


@pytest.mark.parametrize("extra,name", [(extra, name) for _, extra, name in STEP_VARIANTS], ids=str)
def test_data_and_pipeline_parallel_step_matches_hf(extra, name, layouts_run, hf_steps):
    """Also with the distributed optimizer (megatron's DDP buffers, reduce-scatter, sharded AdamW)
    and with the entropy bonus (vocab-parallel entropy, through the pipeline schedule at PP=2)."""
    got = torch.load(layouts_run / f"step_{name}.pt")
    reference = hf_steps(*[e for e in extra if e in ENTROPY])
    assert_step_matches(got["metrics"], got["weights"], reference)


@pytest.fixture(scope="module")
def hf_run(warm_model, tiny_cache, tmp_path_factory) -> list[dict]:
    """The metrics of a four-step GRPO run on the hf backend."""
    out = tmp_path_factory.mktemp("hf_run")
    cfg = load_config(overrides(tiny_cache, out, "model.backend=hf", f"model.path={warm_model}", *RUN))
    Trainer(cfg).fit()
    return read_metrics(out / "metrics.jsonl")


def test_tp2_grpo_run_follows_the_hf_backend(layouts_run, hf_run):
    """Four GRPO steps at TP=2 (two processes) take the hf backend's path: same rewards, same losses."""
    tp2 = read_metrics(layouts_run / "run_a" / "metrics.jsonl")
    assert [r["step"] for r in tp2] == [r["step"] for r in hf_run] == [1, 2, 3, 4]  # rank 0 logs once
    assert len({r["reward/mean"] for r in hf_run}) > 1  # the policy (and its samples) changed
    for a, b in zip(hf_run, tp2):
        assert b["reward/mean"] == a["reward/mean"], a["step"]
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=ATOL), a["step"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4), a["step"]


def test_distributed_optimizer_run_resumes_at_another_layout(layouts_run, hf_run):
    """DP=2 with the distributed optimizer follows the hf run; its step-1 checkpoint (AdamW state
    sharded over the two data-parallel ranks) resumes at TP=2 (DP=1) and continues the same metrics."""
    run_c = read_metrics(layouts_run / "run_c" / "metrics.jsonl")
    run_d = read_metrics(layouts_run / "run_d" / "metrics.jsonl")
    assert [r["step"] for r in run_c] == [1, 2] and [r["step"] for r in run_d] == [2]
    for a, b in [*zip(hf_run, run_c), (hf_run[1], run_d[0])]:
        assert b["reward/mean"] == a["reward/mean"], a["step"]
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=ATOL), a["step"]
        assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"], rel=1e-4), a["step"]
        assert b["actor/lr"] == pytest.approx(a["actor/lr"], rel=1e-9), a["step"]
    assert run_d[0]["actor/loss"] == pytest.approx(run_c[1]["actor/loss"], abs=ATOL)
    # The resumed step moves the weights exactly as the uninterrupted one (AdamW's moments and
    # step count came back; with a zero gradient the update is the moments alone).
    assert_same_step_weights(layouts_run / "run_c", layouts_run / "run_d", before=1, after=2)


def assert_same_step_weights(run: Path, resumed: Path, *, before: int, after: int) -> None:
    """``resumed``'s step-``after`` HF export equals ``run``'s, and that step changed the weights."""
    from safetensors.torch import load_file

    def export(folder: Path, step: int) -> dict[str, torch.Tensor]:
        return load_file(folder / "checkpoints" / f"step_{step}" / "model" / "model.safetensors")

    want, got, start = export(run, after), export(resumed, after), export(run, before)
    assert max(float((want[k] - start[k]).abs().max()) for k in want) > 1e-4  # a real update
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=key)


def test_tp2_resume_continues_the_same_metrics(layouts_run):
    run_a = read_metrics(layouts_run / "run_a" / "metrics.jsonl")
    run_b = read_metrics(layouts_run / "run_b" / "metrics.jsonl")
    assert [r["step"] for r in run_b] == [3, 4]
    for a, b in zip(run_a[2:], run_b):
        for key in ("actor/loss", "actor/grad_norm", "reward/mean", "batch/tokens", "actor/lr"):
            assert b[key] == pytest.approx(a[key], abs=1e-6), (a["step"], key)
    for step in (2, 4):
        assert (layouts_run / "run_a" / "checkpoints" / f"step_{step}" / "dist" / "metadata.json").is_file()
    assert_same_step_weights(layouts_run / "run_a", layouts_run / "run_b", before=2, after=4)


def test_checkpoint_loads_at_other_layouts_with_identical_logprobs(layouts_run, tiny_cache):
    from nemo_azr.contracts import Batch
    from nemo_azr.models.hf.policy import HFPolicy

    batch = Batch(tensors=torch.load(layouts_run / "batch.pt"))
    export = layouts_run / "run_a" / "checkpoints" / "step_4" / "model"
    cfg = load_config(overrides(tiny_cache, layouts_run, "model.backend=hf", f"model.path={export}"))
    want = HFPolicy(export, cfg, trainable=False).compute_logprobs(batch)
    assert (want != 0).sum() == batch["loss_mask"].sum()
    for layout in ("tp1pp1", "tp1pp2", "tp2pp1"):
        got = torch.load(layouts_run / f"reshard_{layout}.pt")
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=layout)


def test_convert_round_trip_is_exact_and_the_result_is_a_model_path(warm_model, tiny_cache, tmp_path):
    from safetensors.torch import load_file

    from nemo_azr.cli import main as cli_main
    from nemo_azr.contracts import Batch
    from nemo_azr.models.hf.policy import HFPolicy

    mg, hf = tmp_path / "mg", tmp_path / "hf"
    assert cli_main(["convert", "hf-to-megatron", warm_model, str(mg)]) == 0
    assert (mg / "dist" / "metadata.json").is_file() and not (mg / "model" / "model.safetensors").exists()
    assert cli_main(["convert", "megatron-to-hf", str(mg), str(hf)]) == 0
    want, got = load_file(Path(warm_model) / "model.safetensors"), load_file(hf / "model.safetensors")
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert cli_main(["convert", "hf-to-megatron", warm_model, str(mg)]) == 2  # never overwrites

    # The converted folder is a model.path of the megatron backend: same log-probs as the HF model.
    vocab = json.loads((Path(warm_model) / "config.json").read_text())["vocab_size"]
    batch = Batch(tensors=fixed_batch(vocab))
    cfg = load_config(overrides(tiny_cache, tmp_path / "run", "model.backend=megatron", f"model.path={mg}"))
    trainer = Trainer(cfg)
    ref_cfg = load_config(overrides(tiny_cache, tmp_path, "model.backend=hf", f"model.path={warm_model}"))
    want_lp = HFPolicy(warm_model, ref_cfg, trainable=False).compute_logprobs(batch)
    torch.testing.assert_close(trainer.policy.compute_logprobs(batch), want_lp, atol=ATOL, rtol=0)
    hf_cfg = load_config(overrides(tiny_cache, tmp_path / "run2", "model.backend=hf", f"model.path={mg}"))
    with pytest.raises(ConfigError, match="is a megatron checkpoint: use model.backend=megatron"):
        Trainer(hf_cfg)


def test_checkpoint_of_another_model_shape_fails_in_one_line(tiny_cache, tmp_path):
    from nemo_azr.errors import CheckpointError
    from nemo_azr.models.megatron.dist_ckpt import load_dist_checkpoint

    base = overrides(tiny_cache, tmp_path / "a", "model.backend=megatron", "trainer.max_steps=1")
    folder = Trainer(load_config(base)).fit().checkpoint
    wider = overrides(tiny_cache, tmp_path / "b", "model.backend=megatron", "model.tiny.hidden_size=64")
    other = Trainer(load_config([*wider, f"trainer.resume={folder}"]))
    with pytest.raises(CheckpointError) as exc:
        other.load_checkpoint(folder)
    assert "was written for another model shape" in str(exc.value) and "\n" not in str(exc.value)
    # The dist checkpoint alone (no config to compare) fails as clearly.
    with pytest.raises(CheckpointError) as exc:
        load_dist_checkpoint(other.policy.chunks, None, None, folder / "dist")
    assert "does not fit this model (another model shape?)" in str(exc.value) and "\n" not in str(exc.value)
    # Optimizer state of the other format (torch AdamW's, loaded by the distributed optimizer).
    sharded = Trainer(load_config([*base, DISTOPT, f"trainer.output_dir={tmp_path / 'c'}"]))
    with pytest.raises(CheckpointError) as exc:
        sharded.load_checkpoint(folder)
    assert "written with parallel.distributed_optimizer=false: resume with the same setting" in str(exc.value)


def test_sft_warmup_with_the_distributed_optimizer_matches_torch_adamw(warm_model, tiny_cache, tmp_path):
    """The supervised warm-up steps megatron's sharded AdamW like torch's (same losses and weights)."""
    results = []
    for extra in ([], [DISTOPT]):
        cfg = load_config(
            overrides(
                tiny_cache,
                tmp_path / str(len(extra)),
                "model.backend=megatron",
                f"model.path={warm_model}",
                "sft_warmup.steps=3",
                *extra,
            )
        )
        trainer = Trainer(cfg)
        losses = run_sft_warmup(
            trainer.policy, trainer.task, trainer.tokenizer, cfg, workflow=trainer.workflow
        )
        results.append((losses, trainer.policy.export_hf_state_dict()))
    (want_losses, want), (got_losses, got) = results
    assert got_losses == pytest.approx(want_losses, abs=ATOL) and want_losses[0] != want_losses[-1]
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=ATOL, rtol=0, msg=key)


# --- generation.backend=megatron: megatron's inference path on the training weights -----------------
def _prompts(trainer: Trainer, count: int) -> list[list[int]]:
    from nemo_azr.rollout.single_turn import encode_prompt

    examples = list(trainer.task.examples)[:count]
    return [encode_prompt(trainer.tokenizer, trainer.task.messages(ex)) for ex in examples]


def _generate(backend, prompts: list[list[int]], sampling, seed: int = 0):
    from nemo_azr.contracts.generation import GenerationRequest

    torch.manual_seed(seed)
    outputs = backend.generate([GenerationRequest(prompt_ids=p) for p in prompts], sampling)
    return [s for out in outputs for s in out.samples]


def assert_same_samples(got, want) -> None:
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in want]
    for a, b in zip(got, want):
        assert a.logprobs == pytest.approx(b.logprobs, abs=ATOL)


@pytest.fixture(scope="module")
def generation_pair(warm_model, tiny_cache, tmp_path_factory):
    """A megatron trainer whose generation backend is megatron's, and an hf backend on its weights."""
    from nemo_azr.rollout.hf_backend import HFGenerationBackend

    out = tmp_path_factory.mktemp("gen")
    cfg = load_config(
        overrides(
            tiny_cache,
            out,
            "model.backend=megatron",
            "generation.backend=megatron",
            f"model.path={warm_model}",
        )
    )
    trainer = Trainer(cfg)
    trainer.setup_generation()
    return trainer, HFGenerationBackend(trainer.policy.generation_model(), trainer.tokenizer)


def test_megatron_generation_matches_hf_backend(generation_pair):
    """Greedy decoding of prompts of different lengths (megatron's static batching: right padding,
    prompt tokens kept until each row's prompt ends), and sampling with the same random stream."""
    from nemo_azr.contracts.generation import SamplingParams

    trainer, hf = generation_pair
    base = _prompts(trainer, 4)
    prompts = [base[0], base[1][3:], base[2][:-2], base[3] + base[3][-3:]]  # four different lengths
    assert len({len(p) for p in prompts}) == 4
    greedy = SamplingParams(n=2, max_new_tokens=8, greedy=True)
    got = _generate(trainer.backend, prompts, greedy)
    assert_same_samples(got, _generate(hf, prompts, greedy))
    assert any(s.finish_reason == "eos" for s in got)
    short = SamplingParams(max_new_tokens=1, greedy=True)  # every row stops at the length limit
    got = _generate(trainer.backend, prompts, short)
    assert {s.finish_reason for s in got} == {"length"}
    assert_same_samples(got, _generate(hf, prompts, short))
    # Equal-length prompts draw the same uniforms per step as the hf backend: same samples.
    sampled = SamplingParams(n=4, temperature=0.8, top_k=20, max_new_tokens=8)
    assert_same_samples(_generate(trainer.backend, base, sampled, 3), _generate(hf, base, sampled, 3))


def test_megatron_generation_reads_the_training_weights_in_place(generation_pair):
    from nemo_azr.contracts.generation import SamplingParams
    from nemo_azr.rollout.hf_backend import HFGenerationBackend

    trainer, _ = generation_pair
    prompts = _prompts(trainer, 2)
    greedy = SamplingParams(max_new_tokens=4, greedy=True)
    before = _generate(trainer.backend, prompts, greedy)
    with torch.no_grad():  # an in-place update of the training parameters, no sync_weights call
        for p in trainer.policy.model.parameters():
            p.mul_(1.05)
    after = _generate(trainer.backend, prompts, greedy)
    assert after[0].logprobs[0] != pytest.approx(before[0].logprobs[0], abs=1e-4)
    fresh = HFGenerationBackend(trainer.policy.generation_model(), trainer.tokenizer)
    assert_same_samples(after, _generate(fresh, prompts, greedy))


def test_megatron_generation_needs_the_megatron_policy(tiny_cache, tmp_path, capsys):
    from tests.cli_errors import cli_error

    message = cli_error(capsys, f"model.tiny.cache_dir={tiny_cache}", "generation.backend=megatron")
    assert message == (
        "nemo-azr: error: generation.backend=megatron samples from the megatron policy's own weights: it needs "
        "model.backend=megatron (or use generation.backend=hf)"
    )
    megatron = [f"model.tiny.cache_dir={tiny_cache}", "model.backend=megatron", "generation.backend=megatron"]
    message = cli_error(capsys, *megatron, "parallel=tp2pp1", "parallel.sequence_parallel=true")
    assert "generation.backend=megatron does not support parallel.sequence_parallel=true" in message
    message = cli_error(
        capsys, *megatron, "parallel=tp1pp2", "parallel.virtual_pipeline_model_parallel_size=2"
    )
    assert "generation.backend=megatron does not support virtual pipeline stages yet" in message


def test_tp2_static_decode_matches_megatrons_loop_on_every_rank(layouts_run):
    """generation.decode=static at TP=2: each rank runs its heads and its vocabulary slice, the logits
    are gathered, and both ranks decode megatron-core's loop's greedy replies (prompts of different
    lengths, after two training steps)."""
    ranks = [torch.load(layouts_run / f"static_decode_tp2_rank{r}.pt") for r in (0, 1)]
    for replies in ranks:
        assert replies["static"] == replies["dynamic"]
        assert all(len(r) > 0 for r in replies["static"])
    assert ranks[0]["static"] == ranks[1]["static"]


@pytest.mark.parametrize("run", ["run_e", "run_f"], ids=["tp2", "pp2"])
def test_parallel_run_generating_with_megatron_follows_the_hf_backend(run, layouts_run, hf_run):
    """At TP=2 both ranks decode with megatron's inference path from their own shards; at PP=2 the
    activations pass stage to stage and the last stage's logits are broadcast. Both draw the hf
    backend's samples (equal-length prompts, same random stream), with no refit copy."""
    records = read_metrics(layouts_run / run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for a, b in zip(hf_run, records):
        assert b["reward/mean"] == a["reward/mean"] and b["batch/tokens"] == a["batch/tokens"], a["step"]
        assert b["actor/loss"] == pytest.approx(a["actor/loss"], abs=ATOL), a["step"]
        assert b["timing/refit_s"] < 0.01  # the version bump only
