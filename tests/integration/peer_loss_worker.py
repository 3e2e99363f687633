"""One rank of test_peer_loss.py: all-reduces in a loop; the rank named by PEER_LOSS_VICTIM dies
(``kill``) or stops as a whole (``hang``, SIGSTOP) before step 3; the survivors print what
:func:`peer_lost_error` makes of their failed collective as one JSON line. PEER_LOSS_LATE_RANK (with
PEER_LOSS_LATE_S) names a survivor that starts its check late.

    MASTER_ADDR=... MASTER_PORT=... WORLD_SIZE=3 RANK=r python peer_loss_worker.py
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from nemo_azr.distributed.peer_loss import peer_lost_error, start_heartbeat


def main() -> int:
    timeout_s = float(os.environ["PEER_LOSS_TIMEOUT_S"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    start_heartbeat(timeout_s)
    rank, victim, how = dist.get_rank(), int(os.environ["PEER_LOSS_VICTIM"]), os.environ["PEER_LOSS_HOW"]
    t = torch.ones(4)
    for step in range(1, 1000):
        if rank == victim and step == 3:
            if how == "hang":
                os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, heartbeat thread included
            os._exit(9)
        try:
            dist.all_reduce(t)
        except RuntimeError as exc:
            if rank == int(os.environ.get("PEER_LOSS_LATE_RANK", "-1")):
                # this survivor's check starts after the others' have ended and they have exited
                time.sleep(float(os.environ["PEER_LOSS_LATE_S"]))
            lost = peer_lost_error(exc, step=step, checkpoint="/ckpt/step_2")
            print(
                json.dumps({"rank": rank, "message": str(lost), "report": lost and lost.report}), flush=True
            )
            os._exit(76)
    return 0


if __name__ == "__main__":
    sys.exit(main())
