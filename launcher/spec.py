"""What one submission runs: the composed config(s), the override sets, and the checks before sbatch.

Every problem found here is a :class:`LaunchError` with one line, raised before anything is
submitted: a bad trainer config (the trainer's own validation), a bad ``cluster`` group, a job shape
that does not match the parallel layout, or a partition ``sinfo`` does not know.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

from nemo_azr.config.schema import ClusterConfig, NemoAzrConfig
from nemo_azr.errors import ConfigError
from nemo_azr_launch.errors import LaunchError

LAUNCHERS = ("srun", "torchrun")
MEGATRON_BACKEND = "megatron"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Slurm --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


@dataclass
class JobSpec:
    """One submission: a single override set, or one per array task (a Hydra multirun sweep)."""

    override_sets: list[list[str]]
    configs: list[NemoAzrConfig]
    chain: int = 1  # links of a --chain (1: a single job)

    @property
    def cfg(self) -> NemoAzrConfig:
        return self.configs[0]

    @property
    def cluster(self) -> ClusterConfig:
        return self.configs[0].cluster

    @property
    def is_array(self) -> bool:
        return len(self.override_sets) > 1


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """Hydra multirun overrides (``a=1,2 b=x,y``) -> the cartesian product of plain override sets."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception as exc:  # Hydra's parse errors span several lines
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchError(f"cannot parse the overrides: {first}") from None
    choices: list[list[str]] = []
    for o in parsed:
        if o.is_sweep_override():
            key = o.get_key_element()
            choices.append([f"{key}={v}" for v in o.sweep_string_iterator()])
        else:
            choices.append([o.input_line])
    return [list(combo) for combo in itertools.product(*choices)]


def time_limit_s(value: str) -> int:
    """Seconds of a Slurm ``--time`` value ("UNLIMITED" -> a very large number)."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return 10**9
    m = _TIME.match(value)
    if m is None:
        raise LaunchError(
            f"cluster.time={value!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)"
        )
    days, a, b, c = m.group(1), m.group(2), m.group(3), m.group(4)
    d = int(days or 0)
    if days is None:  # M | M:S | H:M:S
        if c is not None:
            secs = int(a) * 3600 + int(b) * 60 + int(c)
        elif b is not None:
            secs = int(a) * 60 + int(b)
        else:
            secs = int(a) * 60
    else:  # D-H | D-H:M | D-H:M:S
        secs = int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    return d * 86400 + secs


def world_size(cluster: ClusterConfig) -> int:
    return cluster.nodes * cluster.tasks_per_node


def check_cluster(cfg: NemoAzrConfig) -> None:
    """The ``cluster`` group on its own and against the model's parallel layout."""
    c = cfg.cluster
    if c.launcher not in LAUNCHERS:
        raise LaunchError(f"cluster.launcher={c.launcher!r} is not one of: {', '.join(LAUNCHERS)}")
    for key in ("nodes", "tasks_per_node"):
        if getattr(c, key) < 1:
            raise LaunchError(f"cluster.{key} must be >= 1, got {getattr(c, key)}")
    for key in ("gpus_per_node", "cpus_per_task", "signal_margin_s", "max_requeues"):
        if getattr(c, key) < 0:
            raise LaunchError(f"cluster.{key} must be >= 0, got {getattr(c, key)}")
    limit = time_limit_s(c.time)
    if c.signal_margin_s >= limit:
        raise LaunchError(
            f"cluster.signal_margin_s={c.signal_margin_s} is not below cluster.time={c.time} ({limit} s): "
            "the warning signal would come before the job starts"
        )
    if c.gpus_per_node and c.tasks_per_node != c.gpus_per_node:
        raise LaunchError(
            f"cluster.tasks_per_node={c.tasks_per_node} but cluster.gpus_per_node={c.gpus_per_node}: "
            "GPU jobs run one rank per GPU; set both to the same value"
        )
    if c.container_mounts and not c.container_image:
        raise LaunchError("cluster.container_mounts is set but cluster.container_image is empty")
    bad_env = [k for k in c.env if not _ENV_NAME.match(k)]
    if bad_env:
        raise LaunchError(f"cluster.env: {bad_env[0]!r} is not a valid environment variable name")
    if not c.log_dir:
        raise LaunchError("cluster.log_dir must be set")
    check_layout(cfg)


def check_layout(cfg: NemoAzrConfig) -> None:
    """nodes x tasks_per_node (the world size) must fit the model's tp x pp (x dp) layout."""
    c, par = cfg.cluster, cfg.parallel
    world = world_size(c)
    shape = f"cluster.nodes={c.nodes} x cluster.tasks_per_node={c.tasks_per_node} = {world} ranks"
    if cfg.model.backend != MEGATRON_BACKEND:
        if world != 1:
            raise LaunchError(
                f"{shape}, but model.backend={cfg.model.backend} trains in one process; "
                "use 1 node x 1 task, or model=megatron with a parallel layout"
            )
        return
    tp, pp, dp = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.data_parallel_size,
    )
    if dp > 0 and world != tp * pp * dp:
        raise LaunchError(
            f"{shape}, but the parallel layout needs tp {tp} x pp {pp} x dp {dp} = {tp * pp * dp}"
        )
    if world % (tp * pp) != 0:
        raise LaunchError(f"{shape}, which tp {tp} x pp {pp} = {tp * pp} does not divide")


def check_partition(cluster: ClusterConfig, partitions: Callable[[], list[str] | None]) -> None:
    """An unknown partition fails here, not in the queue; skipped when ``sinfo`` cannot answer."""
    if not cluster.partition:
        return
    known = partitions()
    if known is not None and cluster.partition not in known:
        raise LaunchError(
            f"unknown partition cluster.partition={cluster.partition!r}; sinfo lists: "
            f"{', '.join(known) or '(none)'}"
        )


def build_spec(overrides: list[str], *, multirun: bool, chain: int) -> JobSpec:
    """Compose and validate every override set of the submission (trainer checks, then cluster checks)."""
    from nemo_azr.preflight import load_config

    if chain < 1:
        raise LaunchError(f"--chain must be >= 1, got {chain}")
    sets = expand_sweep(overrides) if multirun else [list(overrides)]
    if multirun and chain > 1 and len(sets) > 1:
        raise LaunchError(
            "--chain cannot be combined with a multirun sweep (-m); submit one chain per setting"
        )
    configs = []
    for s in sets:
        try:
            cfg = load_config(s)
        except ConfigError as exc:
            where = f" (override set {' '.join(s)})" if len(sets) > 1 else ""
            raise LaunchError(f"{exc}{where}") from None
        check_cluster(cfg)
        configs.append(cfg)
    if len({c.trainer.output_dir for c in configs}) < len(configs):
        # Array tasks sharing an output folder would resume from each other's checkpoints.
        for i, (s, cfg) in enumerate(zip(sets, configs)):
            cfg.trainer.output_dir = f"{cfg.trainer.output_dir}/{i}"
            s.append(f"trainer.output_dir={cfg.trainer.output_dir}")
    first = configs[0].cluster
    if any(c.cluster != first for c in configs[1:]):
        raise LaunchError(
            "a multirun sweep must not change cluster.* keys: every array task has one job shape"
        )
    if chain > 1 and configs[0].trainer.resume == "never":
        raise LaunchError("--chain needs trainer.resume=auto (each link continues from the last checkpoint)")
    return JobSpec(override_sets=sets, configs=configs, chain=chain)
