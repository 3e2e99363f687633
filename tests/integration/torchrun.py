"""One torchrun launch of a worker script over a spec file, shared by the multi-process megatron tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_torchrun_worker(worker: Path, out: Path, spec: dict, *, nproc: int = 2, timeout: int = 300) -> None:
    """Writes ``spec`` to ``out/spec.json`` and runs ``worker out out/spec.json`` on ``nproc`` ranks
    (one torch thread each); fails the test with the end of stderr if any rank fails."""
    (out / "spec.json").write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*cmd, str(worker), str(out), str(out / "spec.json")],
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
