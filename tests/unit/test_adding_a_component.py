"""docs/architecture.md's worked example: the estimator file it shows, named by `plugins`, is checked
by the preflight, computes what its docstring says, and trains."""

import re
from pathlib import Path

import pytest
import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import ConfigError
from nemo_azr.preflight import load_config
from nemo_azr.trainer.trainer import Trainer

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


@pytest.fixture(scope="module", autouse=True)
def registry_as_before():
    """The plugin registers into the process's registry: take it out again after this module, so
    the tests that follow see the built-in names only (their error messages list them)."""
    import sys
    from unittest import mock

    from nemo_azr.registry import ADVANTAGE_ESTIMATORS

    with mock.patch.dict(ADVANTAGE_ESTIMATORS._entries):
        yield
    sys.modules.pop("nemo_azr_plugin_my_estimators", None)  # a later import registers it again


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory) -> Path:
    section = DOC.read_text().split("## Adding a component", 1)[1]
    code = re.search(r"```python\n(# my_estimators\.py\n.*?)```", section, re.S).group(1)
    path = tmp_path_factory.mktemp("plugin") / "my_estimators.py"
    path.write_text(code)
    return path


def test_the_documented_estimator_is_registered_and_computes_the_median_baseline(plugin_file):
    cfg = load_config([f"plugins=[{plugin_file}]", "algorithm.estimator=group_median"])
    from nemo_azr.registry import ADVANTAGE_ESTIMATORS

    estimator = ADVANTAGE_ESTIMATORS.get("group_median")
    batch = Batch(
        {F.REWARDS: torch.tensor([1.0, 0.0, 0.0, 3.0, 5.0, 4.0]), F.LOSS_MASK: torch.tensor([[1, 1]] * 6)},
        meta={F.GROUP_ID: ["a", "a", "a", "b", "b", "b"]},
    )
    advantages, returns = estimator(batch, cfg.algorithm)
    # medians: group a 0.0, group b 4.0 (torch's median of an odd count is the middle value)
    expected = torch.tensor([1.0, 0.0, 0.0, -1.0, 1.0, 0.0])[:, None].expand(6, 2)
    assert torch.equal(advantages, expected) and returns is None
    with pytest.raises(ConfigError, match=r"group_median .* generation.n_samples >= 2 \(got 1\)"):
        load_config(
            [f"plugins=[{plugin_file}]", "algorithm.estimator=group_median", "generation.n_samples=1"]
        )


def test_training_with_the_documented_estimator(plugin_file, tiny_cache, tmp_path):
    cfg = load_config(
        [
            f"plugins=[{plugin_file}]",
            "algorithm.estimator=group_median",
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "sft_warmup.steps=3",
            "data.prompts_per_step=2",
            "generation.n_samples=4",
        ]
    )
    result = Trainer(cfg).fit()
    assert result.status == "completed" and result.step == 2


def test_a_plugin_that_cannot_be_imported_is_one_line(tmp_path):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match=r"plugins: cannot import .*broken_plugin.py.*RuntimeError: boom"):
        load_config([f"plugins=[{broken}]"])
    with pytest.raises(
        ConfigError, match=r"plugins: cannot import 'no_such_module_xyz'.*ModuleNotFoundError"
    ):
        load_config(["plugins=[no_such_module_xyz]"])
    with pytest.raises(ConfigError, match="is not a file"):
        load_config([f"plugins=[{tmp_path / 'missing.py'}]"])
