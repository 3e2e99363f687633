"""``python_exec``: Absolute-Zero code tasks (deduction, abduction, induction) checked by running
model-written Python in a contained subprocess.

Modules: :mod:`.sandbox` (the contained run, :func:`run_python`), :mod:`._runner` (its child-side
bootstrap and audit hook), :mod:`.literals` (literal parsing/equality), :mod:`.programs` (program
checks and the per-input driver), :mod:`.seeds` (seed programs), :mod:`.tasks` (task types,
question texts, proposal validation), :mod:`.env` (episodes), :mod:`.domain` (registration).
"""

from nemo_azr.envs.python_exec.domain import PythonExecDomain
from nemo_azr.envs.python_exec.env import PythonExecEnv
from nemo_azr.envs.python_exec.literals import LiteralError, canonical, literal_equal, parse_literal
from nemo_azr.envs.python_exec.programs import ProgramError, ProgramRun, check_program, run_program
from nemo_azr.envs.python_exec.sandbox import SandboxResult, run_python
from nemo_azr.envs.python_exec.tasks import TASK_TYPES, extract_answer

__all__ = [
    "TASK_TYPES",
    "LiteralError",
    "ProgramError",
    "ProgramRun",
    "PythonExecDomain",
    "PythonExecEnv",
    "SandboxResult",
    "canonical",
    "check_program",
    "extract_answer",
    "literal_equal",
    "parse_literal",
    "run_program",
    "run_python",
]
