"""``nemo-azr train-rm``: a reward model trained on preference pairs (seed 004, class 4).

The base is ``model.path`` (the tiny model, a preset or an HF folder) with a fresh one-label
classification head (``AutoModelForSequenceClassification``); the loss is Bradley-Terry over the
pairs (``rewards/reward_model.py``). ``model.backend`` picks who trains it: ``hf`` in one process
(``models/hf/reward_model.py``) or ``megatron`` at any TP / PP / DP layout under torchrun
(``models/megatron/reward_model.py``); both write the same kind of folder. Pairs come as the
preference runs read them: a JSONL file (``preference.pairs_path``; after a seeded shuffle the last
prompts' pairs, at least ``reward_model.heldout_pairs`` of them, are held out, all pairs of a prompt
on one side) or generated from the arithmetic task (training problems to train on, the held-out
split's problems to measure on). Held-out loss and accuracy are logged every ``reward_model.eval_every``
steps and at the end to ``<out>/metrics.jsonl``; the model, its tokenizer and ``rm_metrics.json``
are written to a temporary folder that replaces ``<out>`` only when complete, so a crash leaves the
previous model (or none), never half of one. Training is short (minutes) and restarts from the
base rather than resuming.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from nemo_azr.algorithms.bradley_terry import bradley_terry_loss
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.capabilities import PairwiseRewardModelTrainer
from nemo_azr.contracts.task import Example, Task
from nemo_azr.distributed.parallel import global_rank
from nemo_azr.errors import DataError
from nemo_azr.models.tiny import resolve_model_path
from nemo_azr.models.tokenizer_build import load_tokenizer
from nemo_azr.rewards.reward_model import reward_model_input
from nemo_azr.tasks import build_task
from nemo_azr.tasks.preference_data import PreferencePair, arithmetic_pairs, load_pairs_jsonl
from nemo_azr.utils.seeding import seed_everything

__all__ = ["reward_model_output_dir", "split_by_prompt", "train_reward_model"]

Progress = Callable[[str], None]


def reward_model_output_dir(cfg: NemoAzrConfig) -> Path:
    return Path(cfg.reward_model.out or Path(cfg.trainer.output_dir) / "reward_model").expanduser()


def split_by_prompt(
    pairs: list[PreferencePair], heldout: int
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(training pairs, held-out pairs): the last prompts of ``pairs`` until at least ``heldout`` pairs.

    Every pair of a held-out prompt is held out, so no prompt is both trained on and measured on
    (pairs sampled in two rounds from one problem set repeat prompts). With one pair per prompt this
    is the last ``heldout`` pairs.
    """
    per_prompt = Counter(p.prompt for p in pairs)
    held_prompts: set[str] = set()
    count = 0
    for pair in reversed(pairs):
        if count >= heldout:
            break
        if pair.prompt not in held_prompts:
            held_prompts.add(pair.prompt)
            count += per_prompt[pair.prompt]
    train = [p for p in pairs if p.prompt not in held_prompts]
    return train, [p for p in pairs if p.prompt in held_prompts]


def _pair_sets(cfg: NemoAzrConfig) -> tuple[list[PreferencePair], list[PreferencePair], Task | None]:
    """(training pairs, held-out pairs, the task whose prompts present them or None for one user message)."""
    rm, pref = cfg.reward_model, cfg.preference
    if pref.pairs_path:
        if not Path(pref.pairs_path).expanduser().is_file():
            raise DataError(
                f"preference.pairs_path={pref.pairs_path!r}: no such file (`nemo-azr sample-pairs` with the "
                "same overrides writes the policy's own pairs there)"
            )
        pairs = load_pairs_jsonl(pref.pairs_path)
        random.Random(cfg.seed).shuffle(pairs)
        train, held_out = split_by_prompt(pairs, rm.heldout_pairs)
        if not train:
            raise DataError(
                f"{pref.pairs_path}: {len(pairs)} pairs leave none to train on after reward_model.heldout_pairs="
                f"{rm.heldout_pairs} held out"
            )
        return train, held_out, None
    if cfg.data.task != "arithmetic":
        raise DataError(
            f"nemo-azr train-rm needs pairs: preference.pairs_path=FILE.jsonl, or data.task=arithmetic "
            f"(right answer against a near miss); data.task={cfg.data.task} has no generator"
        )
    train_task, eval_task = build_task(cfg.data, "train"), build_task(cfg.data, "eval")
    train = arithmetic_pairs(train_task.examples, seed=cfg.seed, style=pref.pair_style)
    held_out = arithmetic_pairs(eval_task.examples, seed=cfg.seed + 1, style=pref.pair_style)
    return train, held_out[: rm.heldout_pairs], train_task


def _encode(pairs: list[PreferencePair], tokenizer, task: Task | None) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in pairs:
        chat = (
            task.messages(Example(p.id, p.prompt, p.chosen))
            if task
            else [{"role": "user", "content": p.prompt}]
        )
        out.append(
            (reward_model_input(tokenizer, chat, p.chosen), reward_model_input(tokenizer, chat, p.rejected))
        )
    return out


@torch.no_grad()
def _evaluate(model: PairwiseRewardModelTrainer, rows, batch: int) -> tuple[float, float]:
    chosen, rejected = [], []
    for start in range(0, len(rows), batch):
        c, r = model.pair_scores(rows[start : start + batch])
        chosen.append(c)
        rejected.append(r)
    loss, acc = bradley_terry_loss(torch.cat(chosen), torch.cat(rejected))
    return float(loss), float(acc)


def _build(cfg: NemoAzrConfig, base: Path, pad_id: int) -> PairwiseRewardModelTrainer:
    """The trainer of ``model.backend``: hf (one process) or megatron (any TP / PP / DP layout)."""
    if cfg.model.backend == "megatron":
        from nemo_azr.models.megatron.reward_model import MegatronRewardModelTrainer

        return MegatronRewardModelTrainer(base, cfg, pad_id)
    from nemo_azr.models.hf.reward_model import HFRewardModelTrainer

    return HFRewardModelTrainer(base, cfg, pad_id)


def train_reward_model(cfg: NemoAzrConfig, progress: Progress = print) -> dict[str, float]:
    """Train, write ``<out>`` (model, tokenizer, ``rm_metrics.json``, ``metrics.jsonl``); return the final metrics."""
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    seed_everything(cfg.seed)
    train_pairs, held_out_pairs, task = _pair_sets(cfg)  # bad pairs fail before the model loads
    base = resolve_model_path(cfg.model.path, cfg.model.tiny)
    tokenizer = load_tokenizer(base)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_rows, held_rows = _encode(train_pairs, tokenizer, task), _encode(held_out_pairs, tokenizer, task)
    model = _build(cfg, base, pad_id)
    return _train(cfg, model, tokenizer, train_rows, held_rows, progress if global_rank() == 0 else _silent)


def _silent(_message: str) -> None:
    pass


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _train(
    cfg: NemoAzrConfig,
    model: PairwiseRewardModelTrainer,
    tokenizer,
    train_rows: list[tuple[list[int], list[int]]],
    held_rows: list[tuple[list[int], list[int]]],
    progress: Progress,
) -> dict[str, float]:
    """The training loop; every rank runs it, global rank 0 alone writes files."""
    rm = cfg.reward_model
    writer = global_rank() == 0
    progress(f"train-rm: {cfg.model.path} ({cfg.model.backend}) with a new one-label head")
    out = reward_model_output_dir(cfg)
    tmp = out.with_name(out.name + ".tmp")
    if writer:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()  # the folder exists on every rank before any rank writes into it
    log = (tmp / "metrics.jsonl").open("w") if writer else open(os.devnull, "w")  # noqa: SIM115
    batch = rm.train_pairs_per_step
    order: list[int] = []
    rng = random.Random(cfg.seed)
    loss0, acc0 = _evaluate(model, held_rows, 2 * batch)
    record = {"step": 0, "heldout/loss": loss0, "heldout/accuracy": acc0}
    log.write(json.dumps(record) + "\n")
    progress(
        f"train-rm: {len(train_rows)} training pairs, {len(held_rows)} held out; step 0: held-out accuracy {acc0:.3f}"
    )
    start = time.perf_counter()
    for step in range(1, rm.train_steps + 1):
        if len(order) < batch:  # epochs of a seeded shuffle
            more = list(range(len(train_rows)))
            rng.shuffle(more)
            order += more
        picked, order = order[:batch], order[batch:]
        loss, acc, grad_norm = model.pair_step([train_rows[i] for i in picked])
        record = {"step": step, "train/loss": loss, "train/accuracy": acc, "train/grad_norm": grad_norm}
        if step % rm.eval_every == 0 or step == rm.train_steps:
            record["heldout/loss"], record["heldout/accuracy"] = _evaluate(model, held_rows, 2 * batch)
            progress(
                f"train-rm: step {step}/{rm.train_steps}, train loss {loss:.3f}, held-out loss "
                f"{record['heldout/loss']:.3f}, accuracy {record['heldout/accuracy']:.3f}, "
                f"{time.perf_counter() - start:.0f} s"
            )
        log.write(json.dumps(record) + "\n")
        log.flush()
    log.close()
    final = {
        "heldout/accuracy_before": acc0,
        "heldout/loss_before": loss0,
        "heldout/accuracy": record["heldout/accuracy"],
        "heldout/loss": record["heldout/loss"],
        "train_pairs": float(len(train_rows)),
        "heldout_pairs": float(len(held_rows)),
        "steps": float(rm.train_steps),
    }
    model.write(tmp, tokenizer)  # collective on megatron
    if writer:
        (tmp / "rm_metrics.json").write_text(json.dumps(final, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    _barrier()
    progress(f"train-rm: wrote {out} (held-out accuracy {acc0:.3f} -> {final['heldout/accuracy']:.3f})")
    return final
