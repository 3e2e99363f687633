"""distributed/collectives.py on two gloo ranks, against the single-process result."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from nemo_azr.distributed.collectives import (
    broadcast_metric_dict,
    broadcast_state_dict,
    gather_metric_dicts,
    gather_strided_rows,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        rows = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)  # the whole batch, by hand
        mine = rows[rank::2]  # strided: rank 0 rows 0, 2, 4; rank 1 rows 1, 3
        gathered = gather_strided_rows(mine, 5, 2, None)
        state = {"w": torch.full((2, 2), 7.0), "b": torch.tensor([1, 2, 3])} if rank == 0 else None
        received = broadcast_state_dict(state, src=0)
        metrics = gather_metric_dicts({"loss": float(rank + 1)}, 2, None)
        last = broadcast_metric_dict({"loss": 10.0 * rank}, src=1, group=None)
        torch.save(
            {"gathered": gathered, "received": received, "metrics": metrics, "last": last},
            f"{out_dir}/{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


def test_two_ranks_gather_rows_in_order_and_share_state_and_metrics(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    rows = torch.arange(15, dtype=torch.float32).reshape(5, 3)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert torch.equal(got["gathered"], rows)
        assert torch.equal(got["received"]["w"], torch.full((2, 2), 7.0))
        assert torch.equal(got["received"]["b"], torch.tensor([1, 2, 3]))
        assert got["metrics"] == [{"loss": 1.0}, {"loss": 2.0}]
        assert got["last"] == {"loss": 10.0}
