#!/usr/bin/env python
"""Join preference-pair files from several sampling rounds into one file ``nemo-azr train-rm`` reads.

``nemo-azr sample-pairs`` names a pair by its problem (``arith-10+11``), so two rounds over one
problem set repeat ids, which a pair file refuses. Each input is given a tag, and every id becomes
``<tag>-<id>``. Pairs of one problem from different rounds keep one prompt, so ``train-rm`` holds
them out together (decision 185).

    .venv/bin/python benchmarks/union_pairs.py outputs/rm_round2/pairs_union.jsonl \\
        r1=outputs/rm_sampled/sampled_pairs.jsonl r2=outputs/rm_round2/sampled_pairs.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nemo_azr.tasks.preference_data import PreferencePair, load_pairs_jsonl, write_pairs_jsonl


def union(tagged_files: list[tuple[str, Path]]) -> list[PreferencePair]:
    """Every pair of every file in order, its id prefixed by its file's tag."""
    tags = [tag for tag, _ in tagged_files]
    if len(set(tags)) != len(tags):
        raise SystemExit(f"each file needs its own tag, got {tags}")
    return [
        PreferencePair(f"{tag}-{p.id}", p.prompt, p.chosen, p.rejected)
        for tag, path in tagged_files
        for p in load_pairs_jsonl(path)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the joined pair file to write")
    parser.add_argument("inputs", nargs="+", help="TAG=FILE.jsonl, one per sampling round")
    args = parser.parse_args()
    tagged = []
    for item in args.inputs:
        tag, sep, path = item.partition("=")
        if not sep or not tag or not path:
            raise SystemExit(f"{item!r}: expected TAG=FILE.jsonl")
        tagged.append((tag, Path(path)))
    pairs = union(tagged)
    write_pairs_jsonl(pairs, args.out)
    prompts = len({p.prompt for p in pairs})
    print(f"wrote {args.out}: {len(pairs)} pairs over {prompts} prompts from {len(tagged)} files")


if __name__ == "__main__":
    main()
