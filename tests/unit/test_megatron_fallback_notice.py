"""A megatron model built without TransformerEngine / Apex says so in one line on the main process,
instead of megatron-core's per-rank fallback warnings (fresh process: the warnings fire at import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")

SCRIPT = """
import sys, warnings
from pathlib import Path
warnings.simplefilter("default")  # every UserWarning shown, as in a plain `python` run
from transformers import AutoModelForCausalLM
from nemo_azr.config.schema import TinyModelConfig
from nemo_azr.distributed.parallel import ParallelLayout, initialize_parallel
from nemo_azr.models.megatron import build_gpt_model
from nemo_azr.models.megatron.dist_ckpt import load_dist_checkpoint, save_dist_checkpoint
from nemo_azr.models.tiny import ensure_tiny_model
import megatron.core.optimizer  # warns at import without TE / Apex

hf = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model(TinyModelConfig(cache_dir=sys.argv[1]))))
initialize_parallel(ParallelLayout(), seed=0)
model = build_gpt_model(hf.config, ParallelLayout())
build_gpt_model(hf.config, ParallelLayout())  # a second model (a critic, a reference): no second line
save_dist_checkpoint([model], None, None, Path(sys.argv[2]))
load_dist_checkpoint([model], None, None, Path(sys.argv[2]))  # a resume: deprecations inside megatron
warnings.warn("a warning of the user's own")  # others still show
"""


def test_one_notice_and_no_megatron_fallback_warnings(tiny_cache, tmp_path):
    from nemo_azr.models.megatron.fallback_notice import NOTICE

    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_cache, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count(NOTICE) == 1, run.stderr
    for noise in (
        "Apex is not installed",
        "Transformer Engine and Apex",
        "full scope is deprecated",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "ShardedTensor",
        "`load_state_dict` is deprecated",
    ):
        assert noise not in run.stderr, run.stderr
    assert "a warning of the user's own" in run.stderr
