"""The seed tasks of a self-play domain, presented to the trainer as an ordinary prompt dataset."""

from __future__ import annotations

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.task import Example, Task
from nemo_azr.envs.base import ProposalDomain
from nemo_azr.errors import DataError
from nemo_azr.registry import ENVIRONMENTS


class SelfPlaySeedTask(Task):
    """Examples are the domain's seed tasks; rewards come from the environment, not from here."""

    name = "selfplay_seeds"

    def __init__(self, cfg: NemoAzrConfig, domain: ProposalDomain) -> None:
        super().__init__(cfg.data)
        self.domain = domain
        self.examples = list(domain.seed_tasks())
        if not self.examples:
            raise DataError(f"absolute_zero.env={cfg.absolute_zero.env!r} has no seed tasks")

    def reward(self, example: Example, response_text: str) -> float:
        raise NotImplementedError("self-play rewards come from the environment's evaluation")


def build_domain(cfg: NemoAzrConfig) -> ProposalDomain:
    """The ``absolute_zero.env`` domain (registry ENVIRONMENTS), seeded by the run seed."""
    from nemo_azr.envs import load_builtin_environments

    load_builtin_environments()

    return ENVIRONMENTS.get(cfg.absolute_zero.env)(cfg.absolute_zero, seed=cfg.seed)


def build_selfplay_task(cfg: NemoAzrConfig) -> SelfPlaySeedTask:
    return SelfPlaySeedTask(cfg, build_domain(cfg))
