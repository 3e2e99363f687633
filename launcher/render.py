"""Render the sbatch script of a :class:`~nemo_azr_launch.spec.JobSpec` from ``slurm/job.sbatch.tmpl``.

The template has ``{{name}}`` slots filled with whole blocks built here (headers, env, the srun
line); conditionals live in Python, so the template stays a plain, readable bash script.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from nemo_azr_launch.errors import LaunchError
from nemo_azr_launch.spec import JobSpec

TEMPLATE_NAME = "job.sbatch.tmpl"
_SLOT = re.compile(r"\{\{(\w+)\}\}")


def templates_dir() -> Path:
    """``slurm/`` at the top of the repo (installed as ``nemo_azr_launch/templates``: setup.py maps it)."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "templates", here.parent / "slurm"):
        if (candidate / TEMPLATE_NAME).is_file():
            return candidate
    raise LaunchError(
        f"cannot find {TEMPLATE_NAME} in nemo_azr_launch/templates or the repo's slurm/; reinstall the package"
    )


def fill(template: str, values: dict[str, str]) -> str:
    """Replace every ``{{name}}``; a slot without a value is a bug in the caller, not a silent blank."""
    missing = sorted(set(_SLOT.findall(template)) - set(values))
    if missing:
        raise LaunchError(f"template slots without a value: {', '.join(missing)}")
    return _SLOT.sub(lambda m: values[m.group(1)], template)


def sbatch_headers(spec: JobSpec, log_folder: Path, *, max_parallel: int = 0) -> list[str]:
    c = spec.cluster
    torchrun = c.launcher == "torchrun"
    flags = [f"--job-name={c.job_name or spec.cfg.experiment_name}"]
    flags += [
        f"--{k}={v}" for k, v in (("partition", c.partition), ("account", c.account), ("qos", c.qos)) if v
    ]
    flags.append(f"--nodes={c.nodes}")
    # torchrun: one Slurm task per node that starts tasks_per_node workers, so it gets their CPUs.
    flags.append(f"--ntasks-per-node={1 if torchrun else c.tasks_per_node}")
    if torchrun:
        flags.append(f"--cpus-per-task={max(1, c.cpus_per_task) * c.tasks_per_node}")
    elif c.cpus_per_task:
        flags.append(f"--cpus-per-task={c.cpus_per_task}")
    if c.gpus_per_node:
        flags.append(f"--gpus-per-node={c.gpus_per_node}")
    if c.mem:
        flags.append(f"--mem={c.mem}")
    flags.append(f"--time={c.time}")
    out = "slurm-%A_%a.out" if spec.is_array else "slurm-%j.out"
    flags += [f"--output={log_folder / out}", "--open-mode=append"]  # a requeued job appends
    flags.append(f"--signal=B:USR1@{c.signal_margin_s}")
    flags.append("--no-requeue" if spec.chain > 1 else "--requeue")
    if spec.is_array:
        last = len(spec.override_sets) - 1
        flags.append(f"--array=0-{last}" + (f"%{max_parallel}" if max_parallel else ""))
    flags += list(c.sbatch_flags)
    return [f"#SBATCH {f}" for f in flags]


def _bash_array(name: str, items: list[str]) -> str:
    return f"{name}=(" + " ".join(shlex.quote(x) for x in items) + ")"


def overrides_block(spec: JobSpec) -> str:
    """``OVERRIDES`` (the trainer's command line) and ``OUTPUT_DIR`` (its resolved
    ``trainer.output_dir``, where the script looks for the checkpoint a run left), per array task."""
    outputs = [f"OUTPUT_DIR={shlex.quote(str(c.trainer.output_dir))}" for c in spec.configs]
    if not spec.is_array:
        return _bash_array("OVERRIDES", spec.override_sets[0]) + "\n" + outputs[0]
    blocks = []
    for name, values in (
        ("OVERRIDES", [_bash_array("OVERRIDES", s) for s in spec.override_sets]),
        ("OUTPUT_DIR", outputs),
    ):
        lines = ['case "${SLURM_ARRAY_TASK_ID:-}" in']
        lines += [f"    {i}) {v} ;;" for i, v in enumerate(values)]
        lines.append(
            f'    *) echo "nemo-azr-launch: no {name} for array task ${{SLURM_ARRAY_TASK_ID:-}}" >&2; exit 2 ;;'
        )
        lines.append("esac")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def python_for(spec: JobSpec) -> str:
    """The job's interpreter: configured, else ``python`` in a container, else the submitting one."""
    c = spec.cluster
    return c.python or ("python" if c.container_image else sys.executable)


def launch_line(spec: JobSpec, workdir: str) -> str:
    """``srun`` with one task per rank (``nemo_azr_launch.task``) or one ``torchrun`` per node."""
    c = spec.cluster
    torchrun = c.launcher == "torchrun"
    srun = ["srun", f"--nodes={c.nodes}", f"--ntasks-per-node={1 if torchrun else c.tasks_per_node}"]
    srun.append("--kill-on-bad-exit=0")  # ranks exit on their own after a preemption checkpoint
    if c.container_image:  # pyxis
        srun.append(f"--container-image={c.container_image}")
        if c.container_mounts:
            srun.append(f"--container-mounts={','.join(c.container_mounts)}")
        srun.append(f"--container-workdir={c.container_workdir or workdir}")
    srun += list(c.srun_flags)
    py = shlex.quote(python_for(spec))
    if torchrun:
        # Rendezvous on the first host of the allocation (MASTER_ADDR, set above in the script).
        cmd = (
            f"{py} -m nemo_azr_launch.torchrun_node --nnodes={c.nodes} --nproc-per-node={c.tasks_per_node} "
            '--rdzv-backend=c10d --rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}" --rdzv-id="${SLURM_JOB_ID}" '
            "-m nemo_azr train"
        )
    else:
        cmd = f"{py} -m nemo_azr_launch.task train"
    return " ".join(shlex.quote(x) for x in srun) + " \\\n    " + cmd + ' "${OVERRIDES[@]}"'


def render_script(spec: JobSpec, log_folder: Path, workdir: str, *, max_parallel: int = 0) -> str:
    c = spec.cluster
    values = {
        "headers": "\n".join(sbatch_headers(spec, log_folder, max_parallel=max_parallel)),
        "log_folder": str(log_folder),
        "signal_margin": str(c.signal_margin_s),
        "chain": "1" if spec.chain > 1 else "0",
        "max_requeues": str(c.max_requeues),
        "world_size": str(c.nodes * c.tasks_per_node),  # training ranks, in both launcher modes
        "env": "\n".join(f"export {k}={shlex.quote(str(v))}" for k, v in c.env.items()),
        "setup": "\n".join(c.setup),
        "workdir": shlex.quote(workdir),
        "overrides": overrides_block(spec),
        "launch": launch_line(spec, workdir),
    }
    template = (templates_dir() / TEMPLATE_NAME).read_text()
    return fill(template, values)
