"""``absolute_zero.env=python_exec``: Absolute-Zero code self-play (seed programs, proposer
prompt/parser, sandboxed episodes, warm-up templates).

A proposal is JSON ``{"questions": [...]}`` (text around it is ignored) with exactly
``num_questions`` questions; each is ``{"type", "program", "input"}`` (deduction/abduction) or
``{"type", "program", "inputs": [...], "message"}`` (induction), inputs given as strings holding
Python literals. ``type`` may be left out (the seed's type is used). Every question is checked by
running its program in the sandbox twice (see :func:`.tasks.build_question`); any failure rejects
the whole group with :class:`~nemo_azr.envs.base.ProposalError`.
"""

from __future__ import annotations

import ast
import json
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nemo_azr.config.schema import AbsoluteZeroConfig, PythonExecConfig, SandboxLimitsConfig
from nemo_azr.contracts.task import Example
from nemo_azr.envs.base import ProposalDomain, ProposalError
from nemo_azr.envs.python_exec.env import PythonExecEnv
from nemo_azr.envs.python_exec.literals import canonical, parse_literal, perturb
from nemo_azr.envs.python_exec.pool import LIMITER, map_ordered
from nemo_azr.envs.python_exec.programs import ProgramRun, run_program
from nemo_azr.envs.python_exec.seeds import SEED_PROGRAMS
from nemo_azr.envs.python_exec.tasks import build_question, find_json_object
from nemo_azr.registry import ENVIRONMENTS
from nemo_azr.utils import thread_safe_ast

# one-question JSON examples shown to the proposer (terse: the tiny model's context is 512 tokens)
_FORMATS = {
    "deduction": '{"type":"deduction","program":"def f(x):\\n    return x+1","input":"3"}',
    "abduction": '{"type":"abduction","program":"def f(x):\\n    return x+1","input":"3"}',
    "induction": '{"type":"induction","program":"def f(x):\\n    return x+1","inputs":["1","2","3"],"message":"add one"}',
}
_IDENTITY = "def f(x):\n    return x"


class _BumpFirstInt(ast.NodeTransformer):
    """Adds 1 to the first int constant: a program that is plausibly, not surely, wrong."""

    def __init__(self) -> None:
        self.done = False

    def visit_Constant(self, node: ast.Constant) -> ast.Constant:
        if not self.done and type(node.value) is int:
            self.done = True
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node


def _wrong_program(program: str) -> str:
    bumper = _BumpFirstInt()
    tree = bumper.visit(thread_safe_ast.parse(program))
    return ast.unparse(tree) if bumper.done else _IDENTITY


SEED_RUN_ATTEMPTS = 3  # a built-in seed program's run, with the wall limit doubled after each timeout


def _run_seed_program(program: str, inputs: list[Any], limits: SandboxLimitsConfig) -> ProgramRun:
    """Run a built-in seed program; on a timeout, again with twice the wall-clock limit (up to
    ``SEED_RUN_ATTEMPTS`` runs). The seeds are known to finish at once, so a timeout here is a loaded
    machine (a short ``limits.wall_time_s`` beside other jobs), not the program: one slow start must
    not stop a training run before its first step. Proposed programs keep the configured limits."""
    run = run_program(program, inputs, limits)
    for _ in range(SEED_RUN_ATTEMPTS - 1):
        if run.status != "timeout":
            break
        limits = replace(limits, wall_time_s=2 * limits.wall_time_s)
        run = run_program(program, inputs, limits)
    return run


@ENVIRONMENTS.register("python_exec")
class PythonExecDomain(ProposalDomain):
    """Deduction / abduction / induction questions about small ``def f(x)`` programs."""

    name = "python_exec"

    def __init__(self, cfg: AbsoluteZeroConfig | None = None, *, seed: int = 0) -> None:
        super().__init__(cfg if cfg is not None else AbsoluteZeroConfig(), seed=seed)
        self.env_cfg: PythonExecConfig = self.cfg.python_exec
        self.task_types = list(self.env_cfg.task_types)
        LIMITER.configure(self.env_cfg.max_concurrent_runs)
        self._seeds: list[Example] | None = None

    def seed_tasks(self) -> list[Example]:
        """One seed per built-in program; types cycle through ``task_types``. The example outputs are
        computed in the sandbox once and cached."""
        if self._seeds is None:
            seeds = []
            for k, sp in enumerate(SEED_PROGRAMS):
                program = sp.program(*sp.default) + "\n"
                inputs = [canonical(sp.sample_input(random.Random(k * 7 + j))) for j in range(2)]
                inputs = list(dict.fromkeys(inputs))  # distinct, in order
                run = _run_seed_program(program, [parse_literal(x) for x in inputs], self.env_cfg.limits)
                if not run.all_ok:
                    raise RuntimeError(f"seed program {k} failed in the sandbox: {run.status} {run.errors}")
                meta = {"type": self.task_types[k % len(self.task_types)], "program": program,
                        "input": inputs[0], "output": run.outputs[0], "seed_index": k}  # fmt: skip
                seeds.append(Example(f"code-seed-{k}", program, str(run.outputs[0]), meta))
            self._seeds = seeds
        return list(self._seeds)

    def proposer_messages(self, seed_task: Example, num_questions: int) -> list[dict[str, str]]:
        kind = seed_task.meta["type"]
        what = "inputs (3+ literals) and a short message" if kind == "induction" else "an input literal"
        user = (
            f"Seed program:\n{seed_task.question.rstrip()}\n"
            f"Write {num_questions} new {kind} tasks: a new def f(x) and {what}.\n"
            f'JSON {{"questions":[{_FORMATS[kind]}]}}'
        )
        return [{"role": "user", "content": user}]

    def parse_proposal(self, text: str, seed_task: Example, num_questions: int) -> list[dict[str, Any]]:
        obj = find_json_object(text)
        questions = obj.get("questions")
        if not isinstance(questions, list):
            raise ProposalError('the JSON object needs a "questions" list')
        if len(questions) != num_questions:
            raise ProposalError(f"expected exactly {num_questions} questions, got {len(questions)}")

        def build(k: int) -> dict[str, Any] | ProposalError:
            try:
                task = build_question(
                    questions[k],
                    default_type=seed_task.meta["type"],
                    task_types=self.task_types,
                    induction_examples=self.env_cfg.induction_examples,
                    limits=self.env_cfg.limits,
                )
            except ProposalError as exc:
                return ProposalError(f"question {k + 1}: {exc}")
            task["seed_id"] = seed_task.prompt_id
            return task

        # every question's programs run concurrently (pool.py); the first failure in order rejects
        built = map_ordered(build, range(len(questions)))
        error = next((b for b in built if isinstance(b, ProposalError)), None)
        if error is not None:
            raise error
        return built  # type: ignore[return-value]

    def parse_proposals(
        self, texts: Sequence[str], seed_tasks: Sequence[Example], num_questions: int
    ) -> list[list[dict[str, Any]] | ProposalError]:
        """All proposals of a step at once: their sandbox runs overlap (bounded by the pool)."""

        def parse(i: int) -> list[dict[str, Any]] | ProposalError:
            try:
                return self.parse_proposal(texts[i], seed_tasks[i], num_questions)
            except ProposalError as exc:
                return exc

        return map_ordered(parse, range(len(texts)))

    def timing(self) -> dict[str, float]:
        return {"timing/sandbox_s": LIMITER.seconds()}

    def make_env(self) -> PythonExecEnv:
        return PythonExecEnv(self.env_cfg)

    def warmup_proposal(self, seed_task: Example, num_questions: int, rng: random.Random) -> str:
        """Variants of the seed's program (new constants) with fresh inputs."""
        sp = SEED_PROGRAMS[seed_task.meta["seed_index"]]
        kind = seed_task.meta["type"]
        questions: list[dict[str, Any]] = []
        for _ in range(num_questions):
            q: dict[str, Any] = {"type": kind, "program": sp.sample_program(rng)}
            if kind == "induction":
                want = self.env_cfg.induction_examples + 1  # the shown pairs and one hidden
                inputs: list[str] = []
                for _ in range(50):  # distinct inputs; the input spaces are small
                    x = canonical(sp.sample_input(rng))
                    if x not in inputs:
                        inputs.append(x)
                    if len(inputs) == want:
                        break
                q["inputs"] = inputs
                q["message"] = sp.hint
            else:
                q["input"] = canonical(sp.sample_input(rng))
            questions.append(q)
        return json.dumps({"questions": questions}, separators=(",", ":"))

    def warmup_solution(self, task_config: dict[str, Any], rng: random.Random) -> str:
        """Right with probability 0.5, otherwise a plausible wrong answer of the right form."""
        right = rng.random() < 0.5
        kind = task_config["type"]
        if kind == "deduction":
            gold = parse_literal(task_config["output"])
            answer = canonical(gold if right else perturb(gold, rng))
        elif kind == "abduction":
            given = parse_literal(task_config["input"])
            answer = canonical(given if right else perturb(given, rng))
        else:
            program = task_config["program"].rstrip()
            answer = program if right else _wrong_program(program)
        return f"<answer>{answer}</answer>"
