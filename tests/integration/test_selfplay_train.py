"""Self-play through the real trainer: hostile solver code inside a training step is contained and
reported, and training goes on; config errors of the absolute_zero block are one clear line."""

import json
import math

import pytest

from nemo_azr.cli import main
from nemo_azr.contracts.generation import GenerationOutput, Sample
from nemo_azr.preflight import load_config
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.trainer.trainer import Trainer

PROGRAM = "def f(x):\n    return x * 3"
GROUP = json.dumps(
    {
        "questions": [
            {"type": "induction", "program": PROGRAM, "inputs": ["1", "2", "3", "4"], "message": "triple"},
            {"type": "induction", "program": PROGRAM, "inputs": ["5", "6", "7", "8"], "message": "triple"},
        ]
    }
)
CORRECT = f"<answer>{PROGRAM}</answer>"
# Model-written programs that try what the sandbox forbids; each must end as a reported violation.
HOSTILE = [
    "import os\ndef f(x):\n    os.fork()\n    return x",
    "import subprocess\ndef f(x):\n    return subprocess.run(['ls']).returncode",
    "import socket\ndef f(x):\n    socket.create_connection(('127.0.0.1', 9))\n    return x",
    "def f(x):\n    return open('/etc/passwd').read()",
    "def f(x):\n    open('/tmp/nemo_azr_escape.txt', 'w').write('x')\n    return x * 3",
    "import os\ndef f(x):\n    os.remove('/etc/hostname')\n    return x * 3",
    "import ctypes\ndef f(x):\n    return ctypes.CDLL(None).getpid()",
    "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return x",
    "import os\ndef f(x):\n    os.system('echo pwned')\n    return x * 3",
    "def f(x):\n    return __import__('socket').socket().connect(('8.8.8.8', 53))",
    "def f(x):\n    return open('/proc/self/environ').read()",
    "import shutil\ndef f(x):\n    shutil.rmtree('/tmp')\n    return x * 3",
]
# Per prompt: question 0 gets 2 correct + 2 hostile answers (learnable: half incomplete),
# question 1 gets 4 hostile answers (never complete, not learnable), so question 0 is sampled.
SLOTS = [True, False, True, False, False, False, False, False]


class HostileBackend(GenerationEngineBase):
    """Proposer requests get GROUP; solver requests get correct or hostile programs by slot. The
    engine lifecycle (release, refit_metrics, ...) is the base's: the trainer drives it like any backend."""

    def __init__(self, tokenizer) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.hostile_sent = 0

    def _sample(self, text: str) -> Sample:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        return Sample(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish_reason="eos")

    def generate(self, requests, sampling):
        outputs = []
        for i, req in enumerate(requests):
            prompt = self.tokenizer.decode(req.prompt_ids)
            if "Seed program:" in prompt:  # the proposer prompt (any seed: the group names its type)
                text = GROUP
            elif SLOTS[i % len(SLOTS)]:
                text = CORRECT
            else:
                text = f"<answer>{HOSTILE[self.hostile_sent % len(HOSTILE)]}</answer>"
                self.hostile_sent += 1
            outputs.append(GenerationOutput(req, [self._sample(text)], self.version))
        return outputs

    def sync_weights(self, policy) -> None:
        self.version += 1


def _code_cfg(tiny_cache, tmp_path, *extra):
    return load_config(
        [
            "experiment=azr_code",
            f"model.tiny.cache_dir={tiny_cache}",
            f"trainer.output_dir={tmp_path}",
            "logger=quiet",
            "sft_warmup.steps=0",
            "data.prompts_per_step=3",
            "generation.n_samples=4",
            "absolute_zero.questions_per_group=2",
            "absolute_zero.max_repropose_attempts=0",
            "absolute_zero.python_exec.limits.wall_time_s=2",
            *extra,
        ]
    )


def test_hostile_solver_code_is_contained_and_training_continues(tiny_cache, tmp_path):
    # A wall limit no start-up reaches on a loaded machine: a hostile program cut off by the clock
    # before its forbidden call would end as a timeout, not as the violation this test counts (none of
    # them loops, so the limit costs no time)
    cfg = _code_cfg(tiny_cache, tmp_path, "absolute_zero.python_exec.limits.wall_time_s=30")
    trainer = Trainer(cfg)
    trainer.backend = backend = HostileBackend(trainer.tokenizer)
    before = {k: v.detach().clone() for k, v in trainer.policy.model.named_parameters()}
    for step in range(2):
        m = trainer.train_step(step)
        assert math.isfinite(m["actor/loss"])
        # 3 prompts x 8 episodes: 2 correct (safe, complete) and 6 violations (unsafe, incomplete) each
        assert m["harm/safety_score_mean"] == pytest.approx(2 / 8)
        assert m["harm/completion_score_mean"] == pytest.approx(2 / 8)
        assert m["unified_filter/num_sampled"] == 3
        assert m["unified_filter/num_learnable"] == 3
        assert m["joint/num_solver_rows"] == 3 * 4 and m["joint/num_proposer_rows"] == 3
    assert backend.hostile_sent == 2 * 3 * 6  # every hostile program ran, several times
    changed = any(not (before[k] == v).all() for k, v in trainer.policy.model.named_parameters())
    assert changed  # the joint update was applied
    import os

    assert not os.path.exists("/tmp/nemo_azr_escape.txt")
    assert os.path.exists("/etc/hostname") or not os.path.exists("/etc")


@pytest.mark.parametrize(
    "override,needle",
    [
        ("absolute_zero.learnability_min_safe_ratio=0.8", "learnability_min_safe_ratio"),
        ("absolute_zero.safety_reward_weight=-1", "safety_reward_weight"),
        ("absolute_zero.completion_evaluator_type=oracle", "completion_evaluator_type"),
        ("absolute_zero.env=moon", "absolute_zero.env"),
        ("rollout.workflow=single_turn", "absolute_zero.enabled"),
        ("absolute_zero.learnability_completion_threshold=2", "learnability_completion_threshold"),
        ("absolute_zero.solver_gate_decay=1", "solver_gate_decay"),
        ("absolute_zero.solver_gate_learnable_ratio=1.5", "solver_gate_learnable_ratio"),
    ],
)
def test_bad_selfplay_config_is_one_line(override, needle, tiny_cache, tmp_path, capsys):
    rc = main(["train", "experiment=azr_sandbox", f"trainer.output_dir={tmp_path}", override])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.slow
def test_selfplay_resume_reproduces_an_uninterrupted_run(tiny_cache, tmp_path):
    """2N self-play steps == N steps + preemption checkpoint + resume + N steps, metric for metric
    (proposals, re-proposals, the filter's sampling and the joint update all replay exactly)."""
    import signal

    from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics

    n = 2

    def cfg(out):
        return load_config(
            [
                "experiment=azr_sandbox",
                f"model.tiny.cache_dir={tiny_cache}",
                f"trainer.output_dir={out}",
                "logger=quiet",
                f"trainer.max_steps={2 * n}",
                "sft_warmup.steps=30",
                "data.prompts_per_step=2",
                "absolute_zero.max_repropose_attempts=1",
                "absolute_zero.solver_gate_learnable_ratio=0.2",  # its average goes on after the resume
            ]
        )

    class Preempted(Trainer):
        def train_step(self, step):
            metrics = super().train_step(step)
            if step == n - 1:
                self.preemption.signum = signal.SIGUSR1
            return metrics

    Trainer(cfg(tmp_path / "full")).fit()
    assert Preempted(cfg(tmp_path / "split")).fit().status == "preempted"
    saved = json.loads((tmp_path / "split" / "checkpoints" / f"step_{n}" / "trainer_state.json").read_text())
    assert Trainer(cfg(tmp_path / "split")).fit().step == 2 * n

    def comparable(path):
        return without_machine_metrics(read_metrics(path))

    full, split = (
        comparable(tmp_path / "full" / "metrics.jsonl"),
        comparable(tmp_path / "split" / "metrics.jsonl"),
    )
    assert [r["step"] for r in split] == list(range(1, 2 * n + 1))
    assert full == split
    assert any(r["proposer/num_trajectories"] > 0 for r in full)
    assert saved["workflow"]["solver_gate"]["average"] == pytest.approx(
        full[n - 1]["solver_gate/learnable_ratio_avg"]
    )


@pytest.mark.parametrize("experiment", ["azr_sandbox", "azr_code"])
def test_show_config_of_selfplay_experiments(experiment, capsys):
    assert main(["show-config", f"experiment={experiment}"]) == 0
    out = capsys.readouterr().out
    assert "workflow: azr" in out and "enabled: true" in out


def test_joint_ppo_with_a_critic_keeps_the_roles_apart(tiny_cache, tmp_path):
    """Proposer and solver PPO with one critic: a value head per role, GAE per role (each role's
    advantages whitened on its own rows), both heads trained."""
    import torch

    from nemo_azr.contracts import fields as F

    cfg = _code_cfg(tiny_cache, tmp_path, "algorithm.estimator=gae", "absolute_zero.proposer_estimator=gae")
    trainer = Trainer(cfg)
    trainer.backend = HostileBackend(trainer.tokenizer)
    critic = trainer.critic
    assert critic.roles == ["solver", "proposer"] and critic.model.score.out_features == 2
    seen = []
    update = critic.update
    critic.update = lambda batch, ctx: (seen.append(batch), update(batch, ctx))[1]
    for step in range(2):
        m = trainer.train_step(step)
        assert math.isfinite(m["critic/vf_loss"]) and math.isfinite(m["actor/loss"])
        assert m["joint/num_solver_rows"] == 12 and m["joint/num_proposer_rows"] == 3
    batch = seen[-1]
    mask = batch[F.LOSS_MASK] > 0
    for role in ("solver", "proposer"):
        rows = torch.tensor([r == role for r in batch[F.ROLE]])
        adv = batch[F.ADVANTAGES][rows][mask[rows]]
        assert adv.mean().item() == pytest.approx(0.0, abs=1e-5)
        assert adv.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-3)
    weight = critic.model.score.weight
    assert (weight[0] != 0).any() and (weight[1] != 0).any() and not torch.equal(weight[0], weight[1])


def test_selfplay_with_a_frozen_llm_judge_counts_every_reply(tiny_cache, tiny_model_path, tmp_path):
    """The judge experiment's path through the trainer: safety from a separate frozen model (here the
    tiny model from disk), replies without a score replaced by the rule and counted, never silent."""
    from nemo_azr.trainer.metrics import read_metrics

    rc = main(
        [
            "train",
            "experiment=azr_sandbox",
            f"model.tiny.cache_dir={tiny_cache}",
            f"trainer.output_dir={tmp_path}",
            "logger=quiet",
            "trainer.max_steps=2",
            "sft_warmup.steps=5",
            "data.prompts_per_step=2",
            "absolute_zero.max_repropose_attempts=0",
            "absolute_zero.enable_task_proposal=false",  # templated groups: solver episodes every step
            "absolute_zero.safety_evaluator_type=llm",
            f"absolute_zero.judge.model_path={tiny_model_path}",
            "absolute_zero.judge.on_parse_failure=rule",
        ]
    )
    assert rc == 0
    rows = read_metrics(tmp_path / "metrics.jsonl")
    episodes = sum(r["judge/calls"] for r in rows)
    assert episodes > 0
    for r in rows:
        assert r["judge/safety_parse_failures"] == r["judge/parse_failures"]  # completion is the rule's
        assert r["judge/rule_fallbacks"] == r["judge/parse_failures"]
        assert 0.0 <= r["judge/parse_failure_rate"] <= 1.0
