"""One ``torchrun`` per node (``cluster.launcher=torchrun``), made preemption-aware.

    srun --ntasks-per-node=1 python -m nemo_azr_launch.torchrun_node --nnodes=2 --nproc-per-node=8 \
        --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT -m nemo_azr train OVERRIDE...

Plain torchrun falls short twice: SIGUSR1 (not among the signals it handles) would kill the agent
and its workers without a checkpoint, and a worker's exit status 75 becomes torchrun's 1. This
wrapper forwards SIGUSR1 to the workers, which checkpoint and exit 75, and exits 75 when every worker
that failed exited 75.
"""

from __future__ import annotations

import contextlib
import signal
import sys

from nemo_azr.errors import EXIT_PEER_LOST
from nemo_azr.trainer.preemption import EXIT_PREEMPTED

EXIT_FAILED = 1


def _forward_to_workers(signum: int, _frame) -> None:
    import psutil

    # The agent starts the workers as its direct children (each in its own session).
    for child in psutil.Process().children(recursive=False):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(signum)


def exit_status(exit_codes: list[int]) -> int:
    """75 when the failed workers all stopped for a preemption checkpoint, 76 when they all stopped
    because peers were lost (each said so in its own line), else 1."""
    for shared in (EXIT_PREEMPTED, EXIT_PEER_LOST):
        if exit_codes and all(c == shared for c in exit_codes):
            return shared
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGUSR1, _forward_to_workers)
    try:
        run(args)
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        status = exit_status(codes)
        if status == EXIT_FAILED:
            raise
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
