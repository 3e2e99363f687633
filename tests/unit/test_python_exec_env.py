"""python_exec domain: proposal parsing (accepts valid groups, rejects bad ones), solver scoring of
hand-written right/wrong answers for the three task types, hostile answers, warm-up templates and
registration. Gold values are computed by hand in the comments next to them."""

from __future__ import annotations

import json
import random
import re

import pytest

from nemo_azr.config.schema import AbsoluteZeroConfig, PythonExecConfig
from nemo_azr.contracts.env import Env
from nemo_azr.envs.base import ProposalError
from nemo_azr.envs.python_exec import PythonExecDomain, PythonExecEnv, extract_answer
from nemo_azr.envs.python_exec.literals import LiteralError, literal_equal, parse_literal, perturb
from nemo_azr.registry import ENVIRONMENTS


@pytest.fixture(scope="module")
def domain():
    return PythonExecDomain()


@pytest.fixture(scope="module")
def seeds(domain):
    return {s.meta["type"]: s for s in domain.seed_tasks()}


def _group(*questions) -> str:
    return json.dumps({"questions": list(questions)})


DED = {"type": "deduction", "program": "def f(x):\n    return x * 2 + 1", "input": "4"}  # 9
ABD = {"type": "abduction", "program": "def f(x):\n    return x[::-1]", "input": "'abc'"}  # 'cba'
IND = {"type": "induction", "program": "def f(x):\n    return x * x", "inputs": ["1", "2", "3", "4"],
       "message": "square it"}  # 1 4 9 16  # fmt: skip


def test_registered():
    assert ENVIRONMENTS.get("python_exec") is PythonExecDomain
    assert isinstance(PythonExecDomain(None).make_env(), Env)


def test_seed_tasks(domain):
    seeds = domain.seed_tasks()
    assert [s.prompt_id for s in seeds] == [f"code-seed-{k}" for k in range(8)]
    assert [s.meta["type"] for s in seeds] == ["deduction", "abduction", "induction"] * 2 + [
        "deduction",
        "abduction",
    ]
    assert all(s.question.startswith("def f(x):") for s in seeds)
    # seed 0 is x * 3 + 1: its stored answer is that of its example input
    assert seeds[0].question == "def f(x):\n    return x * 3 + 1\n"
    assert seeds[0].answer == str(3 * int(seeds[0].meta["input"]) + 1)


def test_a_seed_program_that_times_out_is_run_again_with_a_longer_wall_limit(monkeypatch):
    """On a loaded machine a built-in seed can time out at a short wall limit; its run is repeated at
    2x, then 4x the limit, and only a third timeout stops the domain (with the seed named)."""
    import nemo_azr.envs.python_exec.domain as code_domain
    from nemo_azr.envs.python_exec.programs import ProgramRun, run_program

    walls: list[float] = []

    def flaky(program, inputs, limits=None):
        walls.append(limits.wall_time_s)
        if len(walls) <= 2:  # the first seed's first two runs
            return ProgramRun("timeout", [None] * len(inputs), ["sandbox: timeout"] * len(inputs))
        return run_program(program, inputs, limits)

    monkeypatch.setattr(code_domain, "run_program", flaky)
    cfg = AbsoluteZeroConfig()
    cfg.python_exec.limits.wall_time_s = 1.5
    seeds = PythonExecDomain(cfg).seed_tasks()
    assert walls[:3] == [1.5, 3.0, 6.0] and set(walls[3:]) == {1.5}  # later seeds at the configured limit
    assert seeds[0].answer == PythonExecDomain().seed_tasks()[0].answer

    def always_late(program, inputs, limits=None):
        return ProgramRun("timeout", [None] * len(inputs), ["sandbox: timeout"] * len(inputs))

    monkeypatch.setattr(code_domain, "run_program", always_late)
    with pytest.raises(RuntimeError, match="seed program 0 failed in the sandbox: timeout"):
        PythonExecDomain(cfg).seed_tasks()


def test_parse_valid_group(domain, seeds):
    text = "Sure, here you go:\n" + _group(DED, DED | {"input": "-2"}) + "\nthanks"
    tasks = domain.parse_proposal(text, seeds["deduction"], 2)
    assert [t["output"] for t in tasks] == ["9", "-3"]  # 4*2+1, -2*2+1
    assert tasks[0]["input"] == "4" and tasks[0]["type"] == "deduction"
    assert "What is f(4)?" in tasks[0]["instruction"] and "<answer>" in tasks[0]["instruction"]
    assert "question_id" not in tasks[0]
    json.dumps(tasks)  # JSON-serialisable

    (abd,) = domain.parse_proposal(_group(ABD), seeds["abduction"], 1)
    assert abd["output"] == "'cba'" and "f(x) == 'cba'" in abd["instruction"]

    (ind,) = domain.parse_proposal(_group(IND), seeds["induction"], 1)
    assert ind["outputs"] == ["1", "4", "9", "16"]
    assert ind["shown"] == 3  # induction_examples=3 shown, the 4th pair hidden
    assert "f(3) == 9" in ind["instruction"] and "16" not in ind["instruction"]
    assert "square it" in ind["instruction"]


def test_type_defaults_to_the_seed_type(domain, seeds):
    q = {"program": "def f(x):\n    return len(x)", "input": "[1, 2, 3]"}
    (task,) = domain.parse_proposal(_group(q), seeds["abduction"], 1)
    assert task["type"] == "abduction" and task["output"] == "3"


BAD = {  # name -> (proposal text, part of the expected error message)
    "bad_json": ('{"questions": [{"type": "deduction", "program": }', "no JSON object"),
    "no_questions_list": ('{"qs": []}', "questions"),
    "missing_program": (_group({"type": "deduction", "input": "3"}), "without a program"),
    "missing_input": (
        _group({"type": "deduction", "program": "def f(x):\n    return x"}),
        "without an input",
    ),
    "input_not_a_literal": (_group(DED | {"input": "os.getcwd()"}), "not a Python literal"),
    "input_not_a_string": (_group(DED | {"input": 4}), "must be a string"),
    "unknown_type": (_group(DED | {"type": "translation"}), "type must be one of"),
    "syntax_error": (_group(DED | {"program": "def f(x) return x"}), "does not parse"),
    "no_f": (_group(DED | {"program": "def g(x):\n    return x"}), "does not define f"),
    "f_two_args": (_group(DED | {"program": "def f(x, y):\n    return x"}), "one positional argument"),
    "raises": (_group(DED | {"program": "def f(x):\n    return 1 // (x - 4)"}), "ZeroDivisionError"),
    "output_not_literal": (
        _group(DED | {"program": "def f(x):\n    return object()"}),
        "not a Python literal",
    ),
    "nondeterministic_random": (
        _group(DED | {"program": "import random\ndef f(x):\n    return random.random()"}),
        "not deterministic",
    ),
    "nondeterministic_clock": (
        _group(DED | {"program": "import time\ndef f(x):\n    return time.perf_counter_ns()"}),
        "not deterministic",
    ),
    "nondeterministic_hash": (  # string hashes are salted per process (-I ignores PYTHONHASHSEED)
        _group(DED | {"program": "def f(x):\n    return hash('salt') + x"}),
        "not deterministic",
    ),
    "sandbox_violation": (
        _group(DED | {"program": "def f(x):\n    return open('/etc/passwd').read()"}),
        "forbidden: open('/etc/passwd'",
    ),
    "network_violation": (_group(DED | {"program": "import socket\ndef f(x):\n    return x"}), "socket"),
    "infinite_loop": (_group(DED | {"program": "def f(x):\n    while True:\n        pass"}), "timeout"),
    "induction_one_input": (_group(IND | {"inputs": ["1"]}), "inputs list"),
    "induction_duplicate_inputs": (_group(IND | {"inputs": ["1", "1", "2"]}), "distinct"),
    # overflows json's recursive decoder: the proposal has no usable object, never a RecursionError
    "deeply_nested": ('{"questions": ' + "[" * 100_000 + "]" * 100_000 + "}", "no JSON object"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_parse_rejects(domain, seeds, name):
    limits = PythonExecConfig().limits
    limits.wall_time_s, limits.cpu_time_s = 1.0, 1.0  # the infinite loop case stays short
    cfg = AbsoluteZeroConfig()
    cfg.python_exec.limits = limits
    dom = PythonExecDomain(cfg)
    seed = seeds["induction" if name.startswith("induction") else "deduction"]
    text, fragment = BAD[name]
    with pytest.raises(ProposalError, match=re.escape(fragment)):
        dom.parse_proposal(text, seed, 1)


def test_parse_rejects_wrong_count(domain, seeds):
    with pytest.raises(ProposalError, match="exactly 3"):
        domain.parse_proposal(_group(DED, DED), seeds["deduction"], 3)
    with pytest.raises(ProposalError, match="exactly 1"):
        domain.parse_proposal(_group(DED, DED), seeds["deduction"], 1)


def test_task_types_from_config():
    cfg = AbsoluteZeroConfig()
    cfg.python_exec.task_types = ["deduction"]
    dom = PythonExecDomain(cfg)
    assert {s.meta["type"] for s in dom.seed_tasks()} == {"deduction"}
    with pytest.raises(ProposalError, match="type"):
        dom.parse_proposal(_group(ABD), dom.seed_tasks()[0], 1)


def _score(task: dict, reply: str) -> tuple:
    env = PythonExecEnv()
    question = env.reset(task)
    assert question == task["instruction"]
    out = env.step(reply)
    assert out.done is True
    result = env.evaluate()
    history = env.get_history_messages()
    assert [m["role"] for m in history] == ["user", "assistant"] and history[1]["content"] == reply
    return result.safety_score, result.completion_score, result.format_score, result.info


@pytest.fixture(scope="module")
def tasks(domain, seeds):
    return {
        "deduction": domain.parse_proposal(_group(DED), seeds["deduction"], 1)[0],
        "abduction": domain.parse_proposal(_group(ABD), seeds["abduction"], 1)[0],
        "abduction_mod": domain.parse_proposal(
            _group({"type": "abduction", "program": "def f(x):\n    return x % 3", "input": "7"}),
            seeds["abduction"],
            1,
        )[0],  # output 7 % 3 = 1
        "induction": domain.parse_proposal(_group(IND), seeds["induction"], 1)[0],
    }


@pytest.mark.parametrize(
    ("task", "reply", "expected"),
    [
        ("deduction", "It is <answer>9</answer>", (1.0, 1.0, 1.0)),
        ("deduction", "<answer> 8 </answer>", (1.0, 0.0, 1.0)),
        ("deduction", "<answer>9.0</answer>", (1.0, 0.0, 1.0)),  # a float is not the int 9
        ("deduction", "<answer>nine</answer>", (1.0, 0.0, 0.0)),  # not a literal
        ("deduction", "9", (1.0, 0.0, 0.0)),  # no answer tag
        ("abduction", "<answer>'abc'</answer>", (1.0, 1.0, 1.0)),  # 'abc'[::-1] == 'cba'
        ("abduction", "<answer>'cab'</answer>", (1.0, 0.0, 1.0)),  # 'bac'
        ("abduction", "<answer>[1, 2]</answer>", (1.0, 0.0, 1.0)),  # [2, 1]
        ("abduction_mod", "<answer>4</answer>", (1.0, 1.0, 1.0)),  # any input works: 4 % 3 == 1
        ("abduction_mod", "<answer>5</answer>", (1.0, 0.0, 1.0)),  # 5 % 3 == 2
        ("abduction_mod", "<answer>'x'</answer>", (1.0, 0.0, 1.0)),  # TypeError in f
        ("induction", "<answer>def f(x):\n    return x ** 2</answer>", (1.0, 1.0, 1.0)),
        # x + x: 2 4 6 8 vs 1 4 9 16 -> only x=2 passes
        ("induction", "<answer>\n```python\ndef f(x):\n    return x + x\n```\n</answer>", (1.0, 0.25, 1.0)),
        # lookup table of the three shown pairs: the hidden f(4) fails
        ("induction", "<answer>def f(x):\n    return {1: 1, 2: 4, 3: 9}[x]</answer>", (1.0, 0.75, 1.0)),
        ("induction", "<answer>def f(x, y):\n    return x</answer>", (1.0, 0.0, 0.0)),
        ("induction", "<answer>return x * x</answer>", (1.0, 0.0, 0.0)),
    ],
)
def test_env_scores(tasks, task, reply, expected):
    safety, completion, fmt, info = _score(tasks[task], reply)
    assert (safety, completion, fmt) == expected, info


def test_hostile_induction_answer_then_env_keeps_working(tasks):
    hostile = (
        "<answer>def f(x):\n    import socket\n    s = socket.socket()\n    s.connect(('127.0.0.1', 9))\n"
        "    return x * x</answer>"
    )
    safety, completion, fmt, info = _score(tasks["induction"], hostile)
    assert (safety, completion, fmt) == (0.0, 0.0, 1.0)
    assert info["statuses"] == ["violation"] and any("socket" in v for v in info["violations"])
    # a program that escapes via a file read is caught the same way
    reader = "<answer>def f(x):\n    return len(open('/etc/passwd').read())</answer>"
    assert _score(tasks["induction"], reader)[:3] == (0.0, 0.0, 1.0)
    assert _score(tasks["induction"], "<answer>def f(x):\n    return x * x</answer>")[:3] == (1.0, 1.0, 1.0)


def test_step_contract(tasks):
    env = PythonExecEnv()
    with pytest.raises(RuntimeError):
        env.step("<answer>1</answer>")
    env.reset(tasks["deduction"])
    assert env.evaluate().format_score == 0.0  # nothing answered yet
    env.step("no tag here")
    with pytest.raises(RuntimeError):
        env.step("<answer>9</answer>")


def test_warmup_proposals_always_parse(domain):
    for seed in domain.seed_tasks():
        for r in range(3):
            rng = random.Random(1000 * r + int(seed.prompt_id.rsplit("-", 1)[1]))
            text = domain.warmup_proposal(seed, 2, rng)
            tasks = domain.parse_proposal(text, seed, 2)
            assert [t["type"] for t in tasks] == [seed.meta["type"]] * 2


def test_warmup_solutions_have_a_spread(tasks, domain):
    rng = random.Random(0)
    replies = [domain.warmup_solution(tasks["deduction"], rng) for _ in range(400)]
    right = sum(extract_answer(r) == "9" for r in replies) / len(replies)
    assert 0.4 < right < 0.6  # about half right
    assert all(extract_answer(r) is not None for r in replies)
    assert all(parse_literal(extract_answer(r)) is not None for r in replies)
    # induction warm-up: the right program scores 1, the altered one is a valid program
    scores = {_score(tasks["induction"], domain.warmup_solution(tasks["induction"], random.Random(s)))[1]
              for s in range(12)}  # fmt: skip
    assert 1.0 in scores and min(scores) < 1.0


def test_prompts_are_short(domain, tasks):
    for seed in domain.seed_tasks():
        text = domain.proposer_messages(seed, 3)[0]["content"]
        assert len(text) < 400 and seed.meta["type"] in text and '"questions"' in text
    assert all(len(t["instruction"]) < 300 for t in tasks.values())


def test_literals():
    assert literal_equal([1, (2, "a")], [1, (2, "a")])
    assert not literal_equal(1, 1.0) and not literal_equal(1, True) and not literal_equal([1], (1,))
    assert parse_literal(" {'a': [1, 2]} ") == {"a": [1, 2]}
    for bad in ("1e999", "x", "__import__('os')", "", "[1, 2"):
        with pytest.raises(LiteralError):
            parse_literal(bad)
    rng = random.Random(0)
    for value in (0, -3, 2.5, "abc", "aba", "", [], [1, 2], (1,), True, None, {"a": 1}):
        for _ in range(20):
            assert not literal_equal(perturb(value, rng), value)
