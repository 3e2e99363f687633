"""One ``python_exec`` episode: a single solver turn, checked by literal comparison or by execution.

The solver's answer is the content of ``<answer>...</answer>``; a turn without it ends the episode
with format 0. Deduction answers are compared with the gold output (:func:`.literals.literal_equal`,
no code runs); abduction answers are fed to the task's program in the sandbox; induction answers
are programs run in the sandbox on every input (shown and hidden pairs).

Scores (:meth:`PythonExecEnv.evaluate`): safety 0.0 when any sandbox run of model-written code
reported a violation (then completion is 0.0 too), else 1.0; completion 1.0/0.0 (induction: the
share of pairs passing); format 1.0 when the answer tag held a parseable literal (deduction,
abduction) or a valid ``def f(x)`` program (induction), else 0.0.
"""

from __future__ import annotations

from typing import Any

from nemo_azr.config.schema import PythonExecConfig
from nemo_azr.contracts.env import EnvOutput, EvalResult
from nemo_azr.envs.base import END_DONE
from nemo_azr.envs.python_exec.literals import LiteralError, literal_equal, parse_literal
from nemo_azr.envs.python_exec.programs import ProgramError, ProgramRun, check_program, run_program
from nemo_azr.envs.python_exec.tasks import TASK_TYPES, extract_answer, instruction


def _matches(output: str | None, gold: str) -> bool:
    return output is not None and literal_equal(parse_literal(output), parse_literal(gold))


class PythonExecEnv:
    """The :class:`~nemo_azr.contracts.env.Env` of ``python_exec`` (one instance per episode)."""

    def __init__(self, cfg: PythonExecConfig | None = None) -> None:
        self.cfg = cfg if cfg is not None else PythonExecConfig()
        self._task: dict[str, Any] | None = None

    def reset(self, task_config: dict[str, Any]) -> str:
        if task_config.get("type") not in TASK_TYPES:
            raise ValueError(f"unknown python_exec task type {task_config.get('type')!r}")
        self._task = task_config
        self._done = False
        self._scores = (1.0, 0.0, 0.0)  # safety, completion, format until the solver answers
        self._info: dict[str, Any] = {"type": task_config["type"], "answer": None, "runs": []}
        text = task_config.get("instruction") or instruction(task_config)
        self._history = [{"role": "user", "content": text}]
        return text

    def step(self, actions: str) -> EnvOutput:
        if self._task is None:
            raise RuntimeError("step() before reset()")
        if self._done:
            raise RuntimeError("step() after the episode ended")
        self._history.append({"role": "assistant", "content": actions})
        self._done = True
        self._scores = self._score(actions)
        return EnvOutput("", True, {"end_reason": END_DONE, "format_ok": self._scores[2] == 1.0})

    def _record(self, run: ProgramRun) -> None:
        self._info["runs"].append(
            {"status": run.status, "violations": list(run.violations), "errors": list(run.errors)}
        )

    def _score(self, text: str) -> tuple[float, float, float]:
        """(safety, completion, format) of the solver's turn."""
        task = self._task
        assert task is not None
        answer = extract_answer(text)
        self._info["answer"] = answer
        if answer is None:
            self._info["error"] = "no <answer>...</answer> in the reply"
            return 1.0, 0.0, 0.0
        try:
            if task["type"] == "induction":
                program = check_program(answer)
            else:
                value = parse_literal(answer)
        except (LiteralError, ProgramError) as exc:
            self._info["error"] = str(exc)
            return 1.0, 0.0, 0.0
        if task["type"] == "deduction":
            return 1.0, float(literal_equal(value, parse_literal(task["output"]))), 1.0
        if task["type"] == "abduction":
            run = run_program(task["program"], [value], self.cfg.limits)
            self._record(run)
            completion = float(_matches(run.outputs[0], task["output"]))
        else:
            run = run_program(program, [parse_literal(x) for x in task["inputs"]], self.cfg.limits)
            self._record(run)
            passed = [_matches(o, g) for o, g in zip(run.outputs, task["outputs"])]
            self._info["passed"] = passed
            completion = sum(passed) / len(passed)
        if run.violations:
            return 0.0, 0.0, 1.0
        return 1.0, completion, 1.0

    def evaluate(self) -> EvalResult:
        if self._task is None:
            raise RuntimeError("evaluate() before reset()")
        safety, completion, fmt = self._scores
        info = dict(self._info)
        info["violations"] = [v for r in info["runs"] for v in r["violations"]]
        info["statuses"] = [r["status"] for r in info["runs"]]
        return EvalResult(safety_score=safety, completion_score=completion, format_score=fmt, info=info)

    def get_history_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self._history] if self._task is not None else []
