"""The built-in components, imported once: importing this module fills every registry (estimators,
losses, policy and generation backends, tasks, workflows, environments). Entry points and the
preflight check import it; components never do."""

import nemo_azr.algorithms  # noqa: F401
import nemo_azr.models  # noqa: F401
import nemo_azr.rlcr  # noqa: F401
import nemo_azr.rollout  # noqa: F401
import nemo_azr.selfplay  # noqa: F401  (the azr workflow)
import nemo_azr.tasks  # noqa: F401
from nemo_azr.envs import load_builtin_environments

load_builtin_environments()
