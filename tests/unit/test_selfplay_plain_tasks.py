"""``absolute_zero.solver_plain_tasks``: the solver also solves some of the step's seed goals as posed,
outside the band, and trains on them. References: the committed held-out plain tasks (the same
config shape), the environment's own scores of the seed's benign actions, and rewards and GRPO
advantages computed by hand from the seeds' harm reward."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from nemo_azr.algorithms.per_role import role_split_estimator
from nemo_azr.config.schema import AbsoluteZeroConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import PlainTasks
from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.envs.sandbox_os.domain import SandboxOSDomain
from nemo_azr.envs.sandbox_os.env import SandboxOSEnv
from nemo_azr.envs.sandbox_os.heldout import PLAIN, load_heldout
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.selfplay import AbsoluteZeroWorkflow
from nemo_azr.selfplay.config_check import check_absolute_zero_config
from tests.unit.selfplay_fakes import ScriptedBackend, ScriptedDomain, group_text, make_cfg, question

N = 4
LEARNABLE = question("L", [1, 1, 0, 0], [0, 0, 1, 1])
TOO_EASY = question("E", [1, 1, 1, 1], [1, 1, 1, 1])
MIXED = group_text(LEARNABLE, TOO_EASY)
NONE_LEARNABLE = group_text(TOO_EASY, TOO_EASY)
PLAIN_COMPLETION = [1, 0, 1, 0]  # two episodes do the goal, two do nothing (both safe)


class PlainScriptedDomain(ScriptedDomain):
    def plain_task(self, seed_task):
        return question(f"plain {seed_task.prompt_id}", [1, 1, 1, 1], list(PLAIN_COMPLETION))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def _step(tokenizer, plans, *, steps: int = 1, **az):
    cfg = make_cfg(N, **az)
    cfg.data.prompts_per_step = len(plans)
    domain = PlainScriptedDomain(list(plans))
    workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, cfg)
    backend = ScriptedBackend(tokenizer, plans)
    batches = [
        workflow.run(domain.seed_tasks(), backend, SamplingParams(n=N, max_new_tokens=8), step=s)
        for s in range(steps)
    ]
    return batches, backend, cfg, workflow


def test_sandbox_os_plain_task_is_the_seed_goal_alone_as_the_heldout_set_poses_it() -> None:
    domain = SandboxOSDomain()
    assert isinstance(domain, PlainTasks)
    _seeds, tasks = load_heldout()
    heldout_plain = {t["seed_id"]: t for t in tasks if t["kind"] == PLAIN}
    for seed in domain.heldout_seeds():
        expected = {k: v for k, v in heldout_plain[seed.prompt_id].items() if k not in ("task_id", "kind")}
        assert domain.plain_task(seed) == expected

    cfg = AbsoluteZeroConfig()
    cfg.sandbox_os.seed_goals = "generated"
    for seed in SandboxOSDomain(cfg).seed_tasks()[:10]:
        task = SandboxOSDomain(cfg).plain_task(seed)
        done, idle = SandboxOSEnv(cfg.sandbox_os), SandboxOSEnv(cfg.sandbox_os)
        done.reset(task)
        done.step("\n".join([*seed.meta["actions"], "done"]))
        idle.reset(task)
        idle.step("done")
        # the seed's own actions complete it safely; doing nothing is safe and incomplete
        assert (done.evaluate().safety_score, done.evaluate().completion_score) == (1.0, 1.0)
        assert (idle.evaluate().safety_score, idle.evaluate().completion_score) == (1.0, 0.0)


def test_plain_rows_are_one_group_per_seed_rewarded_by_the_harm_reward(tokenizer) -> None:
    plans = {"A": [MIXED], "B": [MIXED]}
    (off,), _, _, _ = _step(tokenizer, plans, max_repropose_attempts=0)
    (on,), backend, cfg, workflow = _step(tokenizer, plans, max_repropose_attempts=0, solver_plain_tasks=1)
    az = cfg.absolute_zero

    plain = [i for i, t in enumerate(on["task_type"]) if t == "plain"]
    assert len(plain) == N and len(on) == len(off) + N
    assert {on[F.GROUP_ID][i] for i in plain} == {"s0-A-plain"}  # the step's first seed only
    assert all(on[F.ROLE][i] == "solver" for i in plain)
    # harm reward 0.7 * safety + 0.3 * completion, plus the format term (the scripted env: 1.0)
    expected = [
        az.safety_reward_weight + az.task_completion_weight * c + az.format_reward_weight
        for c in PLAIN_COMPLETION
    ]
    assert on[F.REWARDS][plain].tolist() == pytest.approx(expected)
    # the band's rows are untouched
    rest = [i for i in range(len(on)) if i not in plain]
    assert torch.equal(on[F.REWARDS][rest], off[F.REWARDS])
    assert [on[F.UID][i] for i in rest] == off[F.UID]
    metrics = on.info["metrics"]
    assert metrics["plain/completion_score_mean"] == 0.5 and metrics["plain/safety_score_mean"] == 1.0
    assert metrics["plain/informative_group_ratio"] == 1.0
    for key in ("harm/completion_score_mean", "joint/proposer_solver_ratio"):  # measured without them
        assert metrics[key] == off.info["metrics"][key]
    assert backend.calls.count(("solve", N)) == 1  # one solve call for the plain episodes
    assert workflow.rows_per_prompt == N + 1 + math.ceil(N / len(plans))

    # GRPO over the plain group: doing the goal is pushed up, doing nothing down, by the same amount
    adv, _ = role_split_estimator({"solver": "grpo", "proposer": "grpo"}, {"solver": 1.0, "proposer": 1.0})(
        on, cfg.algorithm
    )
    per_row = adv[plain].sum(dim=-1) / on[F.LOSS_MASK][plain].sum(dim=-1)
    assert per_row[0] > 0 and per_row[1] < 0 and per_row[0] == pytest.approx(-per_row[1])


def test_a_closed_gate_solves_no_plain_task_unless_it_keeps_the_solver_rows(tokenizer) -> None:
    plans = {"A": [NONE_LEARNABLE] * 2, "B": [NONE_LEARNABLE] * 2}
    gate = {"solver_gate_learnable_ratio": 0.5, "max_repropose_attempts": 0, "solver_plain_tasks": 2}
    (dropped, _), backend, _, _ = _step(tokenizer, plans, steps=2, **gate)
    assert "solver" not in dropped[F.ROLE] and "plain/completion_score_mean" not in dropped.info["metrics"]
    assert ("solve", 2 * N) not in backend.calls

    (kept, _), _, _, _ = _step(tokenizer, plans, steps=2, solver_gate_closed="kl_only", **gate)
    assert sum(t == "plain" for t in kept["task_type"]) == 2 * N  # both seeds, zero advantages
    assert kept.info["metrics"]["plain/informative_group_ratio"] == 1.0


def test_solver_plain_tasks_config_check() -> None:
    with pytest.raises(ConfigError, match="solver_plain_tasks must be >= 0"):
        check_absolute_zero_config(make_cfg(N, solver_plain_tasks=-1))
    with pytest.raises(ConfigError, match="cannot pose a seed's goal alone"):
        check_absolute_zero_config(make_cfg(N, solver_plain_tasks=1, env="python_exec"))
    check_absolute_zero_config(make_cfg(N, solver_plain_tasks=1, env="sandbox_os"))
