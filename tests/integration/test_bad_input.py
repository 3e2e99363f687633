"""Bad configs and bad data give one clear line (CLI) or a counted, logged skip; never a wrong update."""

import math

import pytest
import torch

from nemo_azr.errors import ConfigError, RewardError
from nemo_azr.preflight import load_config
from nemo_azr.registry import TASKS
from nemo_azr.tasks.arithmetic import ArithmeticTask
from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.trainer import Trainer
from tests.cli_errors import cli_error


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm.estimator=nope"], "algorithm.estimator='nope' is unknown; known: gae, grpo"),
        (["algorithm.loss=nope"], "algorithm.loss='nope' is unknown; known: cispo, gspo"),
        (["algorithm.loss_agg_mode=mean"], "algorithm.loss_agg_mode='mean' is not one of"),
        (["trainer.max_steps=abc"], "trainer.max_steps"),
        (["trainer.nonexistent=1"], "unknown config key 'trainer.nonexistent': no such key."),
        (["algorithm=nope"], "Could not find 'algorithm/nope'"),
        (["trainer.max_steps"], "Error parsing override"),
        (["generation.n_samples=1"], "needs generation.n_samples >= 2"),
        (["trainer.async_save=true"], "trainer.async_save=true needs model.backend=megatron"),
        (["algorithm.mini_batch_size=7"], "must divide the rows per step"),
        (["algorithm.dual_clip=true", "algorithm.clip_ratio_c=0.5"], "clip_ratio_c must be > 1"),
        (["algorithm.kl.estimator=k9"], "algorithm.kl.estimator='k9' is not one of: k1, k2, k3"),
        (["data.task=jsonl"], "data.task=jsonl needs data.path"),
        (["data.task=jsonl", "data.path=/nonexistent.jsonl"], "no such file"),
        (["data.eval_size=-1"], "data.eval_size must be >= 0"),
        (
            ["model.autocast_dtype=float32"],
            "model.autocast_dtype='float32' is not one of: '' (off), auto, bfloat16, float16",
        ),
        (["generation.dtype=int8"], "generation.dtype='int8' is not one of"),
        (
            ["+data.demonstrations=[{role: assistant, content: x}]"],
            "data.demonstrations[0].role is 'assistant'",
        ),
        (["+data.demonstrations=[{role: user, content: q}]"], "must end with an assistant message"),
        (["+data.demonstrations=[{role: user}]"], "data.demonstrations[0] must be {role: ..., content: ...}"),
        (
            ["+data.demonstrations=[{role: user, content: ' '}, {role: assistant, content: a}]"],
            "non-empty string",
        ),
        (["data.arithmetic.question_template='What is {a}?'"], "must contain {a}, {op} and {b}"),
        (["data.task=synthetic_qa", "data.synthetic_qa.kinds=[riddles]"], "data.synthetic_qa.kinds"),
        # a `+` override would otherwise be dropped without a word by the dataclass conversion
        (["+foo=1"], "unknown config key 'foo': settings of your own go under extra (+extra.foo=...)"),
        (["+trainer.max_step=5"], "unknown config key 'trainer.max_step': did you mean trainer.max_steps?"),
        (["+algorithm.kl.coeff=0.1"], "'algorithm.kl.coeff': did you mean algorithm.kl.coef?"),
        # the same typo without the +: Hydra's own advice would be to append it
        (["trainer.max_stesp=5"], "unknown config key 'trainer.max_stesp': did you mean trainer.max_steps?"),
        (["absolute_zero.judge.modle_path=x"], "did you mean absolute_zero.judge.model_path?"),
        (["algorithm.kl.reference=ref"], "algorithm.kl.reference='ref' is not one of: initial, warmup"),
        (
            ["algorithm.kl.reference=warmup", "sft_warmup.steps=0"],
            "algorithm.kl.reference=warmup needs a supervised warm-up",
        ),
        (["experiment=azr_sandbox", "absolute_zero.proposer_rows=twice"], "absolute_zero.proposer_rows"),
        (["experiment=azr_sandbox", "absolute_zero.sandbox_os.seed_goals=all"], "seed_goals='all'"),
        (["experiment=azr_sandbox", "absolute_zero.judge.on_parse_failure=zero"], "on_parse_failure='zero'"),
        (
            ["experiment=azr_code", "absolute_zero.python_exec.max_concurrent_runs=-1"],
            "max_concurrent_runs must be >= 0",
        ),
        (["+data.demonstrations=[{role: user, content: q, name: x}]"], "data.demonstrations"),
        (["optim.lr=inf"], "optim.lr=inf is not a finite number"),
        (["optim.lr=nan"], "optim.lr=nan is not a finite number"),
        (["optim.betas=[0.9,nan]"], "optim.betas=[0.9, nan] is not a finite number"),
        (["algorithm.clip_ratio_high=-inf"], "algorithm.clip_ratio_high=-inf is not a finite number"),
        (["model=hf"], "model.path is empty: set model.path="),
        (["algorithm=ppo", "critic.cliprange_value=-1"], "critic.cliprange_value must be >= 0"),
        (["critic.optim.lr=0"], "critic.optim.lr must be > 0"),
        (["algorithm=ppo", "critic.mini_batch_size=7"], "critic.mini_batch_size=7 must divide the rows"),
        (["algorithm.gae_lambda=2"], "algorithm.gae_lambda must be in [0, 1]"),
        (
            ["algorithm=dapo", "algorithm.overlong_buffer_frac=1.5"],
            "algorithm.overlong_buffer_frac must be in [0, 1)",
        ),
        (["algorithm=remax", "algorithm.dynamic_sampling=true"], "dynamic_sampling with estimator=remax"),
        (["algorithm.max_sampling_rounds=0"], "algorithm.max_sampling_rounds must be >= 1"),
        (["algorithm.estimator=trr_plus_plus"], "trr_plus_plus normalises per task type x role"),
        (
            ["algorithm=ppo", "critic.shared_trunk=true", "critic.warmup_steps=2"],
            "critic.warmup_steps trains the critic alone",
        ),
        (
            ["model=megatron", "critic.shared_trunk=true"],
            "critic.shared_trunk=true puts the value head on the hf policy",
        ),
        (["preference.loss=orpo"], "preference.loss='orpo' is not one of: '' (off), dpo, ipo, kto"),
        (["preference.loss=kto", "data.prompts_per_step=1"], "data.prompts_per_step must be >= 2"),
        (["preference.loss=dpo", "preference.unpaired_path=/u.jsonl"], "which only kto trains on"),
        (
            ["preference.loss=kto", "preference.unpaired_path=/nope.jsonl"],
            "unpaired_path='/nope.jsonl': no such file",
        ),
        (["preference.loss=dpo", "preference.desirable_weight=2"], "are KTO's; preference.loss=dpo"),
        (["preference.loss=kto", "preference.undesirable_weight=0"], "must be > 0, got 1.0 and 0"),
        (["preference.loss=dpo", "preference.beta=0"], "preference.beta must be > 0"),
        (
            ["preference.loss=ipo", "preference.label_smoothing=0.1"],
            "conservative DPO's; preference.loss=ipo",
        ),
        (
            ["preference.loss=kto", "preference.nll_weight=0.5"],
            "needs pairs (dpo, ipo); got 0.5 with preference.loss=kto",
        ),
        (
            ["preference.loss=dpo", "preference.nll_weight=-1"],
            "nll_weight (RPO's NLL on the chosen reply) must be >= 0",
        ),
        (["preference.loss=dpo", "data.task=synthetic_qa"], "needs pairs: preference.pairs_path=FILE.jsonl"),
        (["preference.loss=dpo", "rollout.async_rollout=true"], "set rollout.async_rollout=false"),
        (["preference.loss=dpo", "preference.pairs_path=/nope.jsonl"], "/nope.jsonl"),
    ],
)
def test_bad_configs_fail_with_one_line(capsys, overrides, expected):
    assert expected in cli_error(capsys, *overrides)


def test_train_rm_without_its_pairs_file_names_the_command_that_writes_it(capsys, tmp_path):
    line = cli_error(
        capsys,
        f"preference.pairs_path={tmp_path / 'sampled_pairs.jsonl'}",
        f"trainer.output_dir={tmp_path}",
        command="train-rm",
    )
    assert "sampled_pairs.jsonl" in line and "nemo-azr sample-pairs" in line


def test_empty_dataset_is_a_clear_error(capsys, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    line = cli_error(
        capsys, "data.task=jsonl", f"data.path={empty}", f"trainer.output_dir={tmp_path}", command="train"
    )
    assert "empty" in line or "no rows" in line


# --- NaN rewards ---------------------------------------------------------------------------------
class _NanRewardTask(ArithmeticTask):
    """Arithmetic whose reward is NaN for the rows the test picks."""

    name = "nan_arithmetic"
    nan_every = 0  # 0: never; 1: always; k: every k-th call

    def __init__(self, cfg, **kw):
        super().__init__(cfg, **kw)
        self.calls = 0

    def reward(self, example, response_text):
        self.calls += 1
        if self.nan_every and self.calls % self.nan_every == 0:
            return math.nan
        return super().reward(example, response_text)


if "nan_arithmetic" not in TASKS:
    TASKS.register("nan_arithmetic")(_NanRewardTask)


def _trainer(tiny_cache, tmp_path, *extra):
    cfg = load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={tmp_path}",
            "data.task=nan_arithmetic",
            "data.prompts_per_step=2",
            "generation.n_samples=4",
            "sft_warmup.steps=0",
            *extra,
        ]
    )
    return Trainer(cfg)


def test_nan_rows_are_dropped_and_counted(tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(_NanRewardTask, "nan_every", 2)
    trainer = _trainer(tiny_cache, tmp_path, "trainer.max_steps=2")
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["reward/nonfinite_rows"] for r in records] == [4.0, 4.0]
    assert all(r["batch/rows"] == 4.0 for r in records)
    assert all(math.isfinite(r["actor/loss"]) for r in records)
    for p in trainer.policy.model.parameters():
        assert torch.isfinite(p).all()


def test_all_nan_steps_are_skipped_then_stop(tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(_NanRewardTask, "nan_every", 1)
    trainer = _trainer(tiny_cache, tmp_path, "trainer.max_steps=5", "trainer.max_skipped_steps=2")
    before = [p.detach().clone() for p in trainer.policy.model.parameters()]
    with pytest.raises(RewardError, match="3 steps in a row"):
        trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["trainer/step_skipped"] for r in records] == [1.0, 1.0]
    for a, b in zip(before, trainer.policy.model.parameters()):
        assert torch.equal(a, b), "a skipped step must not touch the weights"


def test_non_numeric_reward_is_an_error(tiny_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(_NanRewardTask, "reward", lambda self, ex, text: "1.0")
    trainer = _trainer(tiny_cache, tmp_path, "trainer.max_steps=1")
    with pytest.raises(RewardError, match="returned reward '1.0' \\(str\\)"):
        trainer.fit()


def test_unknown_names_raise_config_error_in_python_too():
    with pytest.raises(ConfigError, match="unknown"):
        load_config(["algorithm.loss=nope"])


def test_extra_keys_of_your_own_are_kept():
    assert load_config(["+extra.my_plugin.depth=3"]).extra == {"my_plugin": {"depth": 3}}


# --- checked where the job runs, before the model is built --------------------------------------
def test_cuda_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = cli_error(capsys, "trainer.device=cuda", f"trainer.output_dir={tmp_path}", command="train")
    assert "trainer.device=cuda but this machine has no usable CUDA device" in line
    assert not (tmp_path / "checkpoints").exists()


def test_unwritable_output_dir_fails_before_any_work(capsys, tmp_path, monkeypatch):
    # As root, permission bits do not stop writes: a file where a folder should be does.
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    built = []
    monkeypatch.setattr(Trainer, "_optimizer_steps_total", lambda self: built.append(1) or 1)
    line = cli_error(capsys, f"trainer.output_dir={blocker}/run", command="train")
    assert f"trainer.output_dir='{blocker}/run' is under '{blocker}', which is a file, not a folder" in line
    assert not built  # no model was built
    line = cli_error(capsys, f"trainer.output_dir={blocker}", command="train")
    assert f"trainer.output_dir='{blocker}' is a file, not a folder" in line


def test_read_only_checkpoint_folder_fails_at_start(capsys, tmp_path):
    (tmp_path / "checkpoints").write_text("")  # a file where the checkpoints/ folder goes
    line = cli_error(capsys, f"trainer.output_dir={tmp_path}", command="train")
    assert "checkpoints/ folder" in line and "is a file, not a folder" in line


# --- a reward function that raises ---------------------------------------------------------------
def test_raising_reward_rows_are_dropped_counted_and_reported_once(tiny_cache, tmp_path, monkeypatch, capsys):
    def reward(self, example, text):
        self.calls += 1
        if self.calls % 4 == 0:
            raise KeyError("gold")
        return ArithmeticTask.reward(self, example, text)

    monkeypatch.setattr(_NanRewardTask, "reward", reward)
    trainer = _trainer(tiny_cache, tmp_path, "trainer.max_steps=2")
    trainer.fit()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["reward/errors"] for r in records] == [2.0, 2.0]  # 8 rows a step, every 4th raises
    assert [r["batch/rows"] for r in records] == [6.0, 6.0]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "raised" in line]
    assert len(warnings) == 1
    assert "the reward of task 'nan_arithmetic' raised KeyError: 'gold' (prompt " in warnings[0]


def test_reward_that_always_raises_ends_the_run_naming_the_task(tiny_cache, tmp_path, monkeypatch):
    def reward(self, example, text):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(_NanRewardTask, "reward", reward)
    trainer = _trainer(tiny_cache, tmp_path, "trainer.max_steps=5", "trainer.max_skipped_steps=1")
    with pytest.raises(RewardError, match="every reward was NaN/inf or raised for 2 steps in a row"):
        trainer.fit()


def test_reward_that_raises_in_eval_is_one_line(tiny_cache, tmp_path, monkeypatch, capsys):
    def reward(self, example, text):
        raise ValueError("bad gold")

    monkeypatch.setattr(_NanRewardTask, "reward", reward)
    line = cli_error(
        capsys,
        f"model.tiny.cache_dir={tiny_cache}",
        "data.task=nan_arithmetic",
        "data.eval_size=4",
        "eval.checkpoint=model",
        f"eval.output_dir={tmp_path}",
        command="eval",
    )
    assert "the reward of task 'nan_arithmetic' raised ValueError: bad gold (prompt " in line
