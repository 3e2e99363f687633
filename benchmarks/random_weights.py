#!/usr/bin/env python
"""A model folder with the architecture and tokenizer of ``SRC`` and freshly initialised weights.

For throughput measurements on a machine that cannot receive the real weights (a GPU machine reached
only with a few MiB of files): compute per token does not depend on the weights, and the tokenizer,
chat template and shapes are the real model's. Generations of random weights rarely hit EOS, so
every response runs to ``generation.max_new_tokens``: say so next to any number measured this way.

    python benchmarks/random_weights.py SRC DST [--seed 0]

``SRC`` needs config.json and the tokenizer files only (its weights are not read).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

#: Everything of a model folder but its weights.
NON_WEIGHT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)


def random_weights_model(src: Path, dst: Path, seed: int = 0) -> Path:
    """Writes ``dst``: ``src``'s config and tokenizer files, weights initialised with ``seed``."""
    if not (src / "config.json").is_file():
        raise SystemExit(f"{src} has no config.json")
    dst.mkdir(parents=True, exist_ok=True)
    for name in NON_WEIGHT_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(str(src))
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(dst))
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = random_weights_model(args.src, args.dst, args.seed)
    print(f"random-weight model written to {out}")


if __name__ == "__main__":
    main()
