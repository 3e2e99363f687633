"""The arithmetic task's held-out phrasings: every operation has at least five, none is the training
phrasing, and the rephrased set asks the same problems with the same gold answers."""

from collections import Counter

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts.capabilities import RephrasedEvalSet
from nemo_azr.tasks.arithmetic import OPERATIONS, ArithmeticTask, rephrasing_templates


def test_at_least_five_templates_per_operation_none_the_training_one():
    training = DataConfig().arithmetic.question_template
    for op in OPERATIONS:
        templates = rephrasing_templates()[op]
        assert len(set(templates)) >= 5
        for t in templates:
            assert "{a}" in t and "{b}" in t and t != training
            assert t.format(a=93, b=13) != training.format(a=93, op=op, b=13)


def test_rephrased_set_keeps_problems_and_answers_and_uses_every_template():
    cfg = DataConfig()
    cfg.arithmetic.operations = ["+", "-", "*"]
    task = ArithmeticTask(cfg)
    assert isinstance(task, RephrasedEvalSet)
    examples = task.examples[:60]
    rephrased = task.rephrased(examples)
    assert [r.answer for r in rephrased] == [e.answer for e in examples]
    for e, r in zip(examples, rephrased):
        a, op, b = e.meta["a"], e.meta["op"], e.meta["b"]
        assert r.question == rephrasing_templates()[op][r.meta["template"]].format(a=a, b=b)
        assert r.meta["kind"] == e.meta["kind"] and r.question != e.question
        assert int(r.answer) == OPERATIONS[op](a, b)
    used = Counter((r.meta["op"], r.meta["template"]) for r in rephrased)
    for op in {e.meta["op"] for e in examples}:
        count = sum(e.meta["op"] == op for e in examples)
        assert len([k for k in used if k[0] == op]) == min(count, len(rephrasing_templates()[op]))
