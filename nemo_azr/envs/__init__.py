"""Environments: the built-in self-play domains (the Env protocol is ``nemo_azr.contracts.env``).

:func:`load_builtin_environments` registers ``sandbox_os`` (simulated computer use),
``python_exec`` (Absolute-Zero code tasks in a sandbox) and ``desktop_env`` (OSWorld adapter; its
own package is imported only when an environment is made). It runs when self-play is configured,
so importing ``nemo_azr.envs`` alone stays light.
"""

from nemo_azr.envs.base import ProposalDomain, ProposalError


def load_builtin_environments() -> None:
    """Import the built-in domains so they register in ``ENVIRONMENTS`` (idempotent)."""
    from nemo_azr.envs import desktop_env, python_exec, sandbox_os  # noqa: F401


__all__ = ["ProposalDomain", "ProposalError", "load_builtin_environments"]
