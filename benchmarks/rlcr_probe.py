#!/usr/bin/env python
"""Can a two-turn RLCR model's confidence read whether its answer is right? A linear probe says.

For each answer of a ``nemo-azr eval`` of a two-turn run (its ``samples.jsonl``), the turn-2 context
is rebuilt exactly as the workflow builds it (the question's chat prompt, the answer, the confidence
request, the prefilled ``<confidence>`` tag) and the model's hidden states at its last position, where
the confidence is written, are read at a few layers. Per question kind, a logistic regression on them
predicts the answer's correctness (5-fold cross-validation, features standardised, L2-regularised);
the out-of-fold AUROC says how much of right-versus-wrong the model's own state carries where it
states its confidence. Beside it, the AUROC of the rule "the question asks for the last-listed row"
(the model answers the last value; docs/real_model.md). A probe AUROC well above the confidence's
within-kind AUROC means the information is there and training does not bring it to the digits.

    .venv/bin/python benchmarks/rlcr_probe.py --checkpoint model --samples EVAL_DIR/samples.jsonl \\
        experiment=rlcr_two_turn_smollm2 'data.synthetic_qa.kinds=[pair_lookup,table_lookup]'
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict

from nemo_azr.evaluation.common import resolve_eval_model
from nemo_azr.preflight import load_config
from nemo_azr.rlcr.two_turn import TwoTurnRLCRWorkflow
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.tasks import build_task

_ASKED = re.compile(r"of (?P<name>[\w ]+)\?\s*$")
_LISTED = re.compile(r"([A-Za-z][\w ]*?) -?\d+")


def asked_last_row(question: str) -> int:
    """1 where the question asks for the last name of its list ("Ages: Dina 17, Fay 96. ... of Fay?")."""
    names = _LISTED.findall(question.split(".")[0].split(":", 1)[-1])
    asked = _ASKED.search(question)
    return int(bool(names and asked and names[-1].strip() == asked.group("name").strip()))


def probe_auroc(features: np.ndarray, labels: np.ndarray, c: float = 0.05, seed: int = 0) -> float:
    """Out-of-fold AUROC of an L2 logistic regression on standardised ``features``."""
    folds = min(5, int(labels.sum()), int((1 - labels).sum()))
    if folds < 2:
        return float("nan")
    x = (features - features.mean(0)) / (features.std(0) + 1e-6)
    model = LogisticRegression(C=c, max_iter=2000)
    cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
    scores = cross_val_predict(model, x, labels, cv=cv, method="predict_proba")[:, 1]
    return float(roc_auc_score(labels, scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", required=True, help="a step_N checkpoint, an HF folder, or `model`")
    parser.add_argument("--samples", required=True, type=Path, help="a nemo-azr eval samples.jsonl")
    parser.add_argument("--layers", default="10,20,30", help="hidden-state layers to probe (0 = embeddings)")
    parser.add_argument("overrides", nargs="*", help="the run's config overrides (experiment=..., kinds)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(args.overrides)
    path, _ = resolve_eval_model(cfg, args.checkpoint, key="--checkpoint")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    task = build_task(cfg.data, split="eval")
    by_id = {ex.prompt_id: ex for ex in task.examples}
    workflow = TwoTurnRLCRWorkflow(task, tok, cfg)
    layers = [int(v) for v in args.layers.split(",")]

    rows = [json.loads(line) for line in args.samples.open()]
    rows = [r for r in rows if r["sample_type"] == "answer" and r["prompt_id"] in by_id]
    features: dict[int, list[np.ndarray]] = {k: [] for k in layers}
    labels, kinds, last = [], [], []
    for i, r in enumerate(rows):
        ex = by_id[r["prompt_id"]]
        prompt = encode_prompt(tok, task.messages(ex, instruction=workflow.instruction))
        answer = tok(r["response"], add_special_tokens=False)["input_ids"]
        context = workflow.confidence_context(prompt, answer, ex, r["response"])
        with torch.no_grad():
            hidden = model(torch.tensor([context]), output_hidden_states=True).hidden_states
        for k in layers:
            features[k].append(hidden[k][0, -1].float().numpy())
        labels.append(int(r["answer_correct"] > 0.5))
        kinds.append(r["kind"])
        last.append(asked_last_row(r["question"]))
        if (i + 1) % 50 == 0:
            print(f"rlcr_probe: {i + 1}/{len(rows)} answers", flush=True)

    y, kind_of, last_row = np.array(labels), np.array(kinds), np.array(last)
    header = " | ".join(f"layer {k} probe" for k in layers)
    print(f"\n| kind | answers | right | asked the last row | {header} |")
    print("| --- | --- | --- | --- |" + " --- |" * len(layers))
    for kind in sorted(set(kinds)):
        m = kind_of == kind
        rule = roc_auc_score(y[m], last_row[m]) if 0 < y[m].sum() < m.sum() else float("nan")
        probes = " | ".join(f"{probe_auroc(np.array(features[k])[m], y[m]):.3f}" for k in layers)
        print(f"| {kind} | {m.sum()} | {y[m].sum()} | {rule:.3f} | {probes} |")


if __name__ == "__main__":
    main()
