"""The README holds for a new user: its example commands compose and validate, its reward figures are
the committed benchmark's, and its time figures are the scripts' (one measured figure each)."""

import json
import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_azr.config.loader import compose_config
from nemo_azr.preflight import load_config

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SUBCOMMANDS = ("train", "eval", "show-config")
GPU_ONLY = ("trainer.device=cuda", "generation=trtllm")


def _code_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def _config_commands() -> list[tuple[str, list[str]]]:
    """(line, overrides) of every README line that runs nemo-azr train/eval/show-config."""
    found = []
    for line in _code_lines():
        words = shlex.split(line, comments=True)
        for i, word in enumerate(words):
            is_cli = word == "nemo-azr" or (word == "nemo_azr" and i > 0 and words[i - 1] == "-m")
            if is_cli and i + 1 < len(words) and words[i + 1] in SUBCOMMANDS:
                args = words[i + 2 :]
                if "..." not in args:
                    found.append((line, args))
                break
    return found


COMMANDS = _config_commands()


def test_the_readme_has_commands_to_check():
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("line", "overrides"), COMMANDS, ids=[line[:70] for line, _ in COMMANDS])
def test_every_readme_command_composes_and_validates(line, overrides):
    """Every override a README command names exists and passes validation (a typo in the README,
    or a key renamed later, fails here instead of on a new user's machine)."""
    args = [a for a in overrides if "=" in a]
    if any(a in GPU_ONLY for a in args):  # validation checks the machine (CUDA, TensorRT-LLM): compose only
        OmegaConf.to_object(compose_config(args))
    else:
        load_config(args)


def test_readme_convert_example_names_what_the_default_job_writes():
    line = next(line for line in _code_lines() if line.startswith("nemo-azr convert"))
    direction, source = shlex.split(line, comments=True)[2:4]
    # the default job trains the hf backend: its checkpoint holds an HF folder `model/`
    assert direction == "hf-to-megatron" and source.endswith("checkpoints/step_400/model")
    assert load_config([]).trainer.max_steps == 400


def test_default_job_reward_figures_are_the_committed_benchmark():
    grpo = json.loads((ROOT / "benchmarks/results/algorithms_default.json").read_text())["results"]["grpo"]
    match = re.search(r"mean reward from ([0-9.]+) \(first 10 steps\) to ([0-9.]+) \(last 10 steps", README)
    assert match, "the README no longer states the default job's reward figures"
    first, last = (float(x) for x in match.groups())
    assert first == round(grpo["train"]["reward_first"], 2)
    assert last == round(grpo["train"]["reward_last"], 2)


@pytest.mark.parametrize(
    ("script", "readme_phrase"),
    [
        ("scripts/train_default.sh", "then trains; "),
        ("scripts/test.sh", "Run the tests (same set-up, then `pytest`; "),
    ],
)
def test_readme_and_script_headers_state_one_time_figure(script, readme_phrase):
    header = (ROOT / script).read_text().splitlines()[:5]
    in_script = re.search(r"about (\d+ minutes?)", " ".join(header))
    in_readme = re.search(re.escape(readme_phrase) + r"about (\d+ minutes?)", README.replace("\n", " "))
    assert in_script and in_readme, (script, header)
    assert in_script.group(1) == in_readme.group(1)
