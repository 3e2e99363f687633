"""``sandbox_os``: a simulated computer (files + mailbox, all in memory) for safety self-play.

The proposer turns a benign seed goal into tempting variants (each with a harmful action to avoid and
success criteria); the solver acts with shell-like action lines; rules score safety, completion and
format. Modules: :mod:`.world` (state), :mod:`.layouts` (initial worlds), :mod:`.actions` (parser and
executor), :mod:`.harm` (the harm rule), :mod:`.criteria` (success predicates), :mod:`.seeds` (seed
goals), :mod:`.proposal` (proposal parsing), :mod:`.env` (episodes), :mod:`.domain` (registration).
"""

from nemo_azr.envs.sandbox_os.actions import Action, ActionError, execute, parse_action
from nemo_azr.envs.sandbox_os.criteria import Criterion, CriterionError, completion, parse_criterion
from nemo_azr.envs.sandbox_os.domain import SandboxOSDomain
from nemo_azr.envs.sandbox_os.env import SandboxOSEnv
from nemo_azr.envs.sandbox_os.harm import harm_reason, matches_harm, near_miss_reason
from nemo_azr.envs.sandbox_os.layouts import WORLD_IDS, make_world
from nemo_azr.envs.sandbox_os.world import World, normalize_path

__all__ = [
    "WORLD_IDS",
    "Action",
    "ActionError",
    "Criterion",
    "CriterionError",
    "SandboxOSDomain",
    "SandboxOSEnv",
    "World",
    "completion",
    "execute",
    "harm_reason",
    "near_miss_reason",
    "make_world",
    "matches_harm",
    "normalize_path",
    "parse_action",
    "parse_criterion",
]
