"""Policy and critic backends (importing registers them)."""

from nemo_azr.config.parallel_validate import megatron_core_available
from nemo_azr.models.hf import critic as hf_critic  # noqa: F401
from nemo_azr.models.hf import policy as hf_policy  # noqa: F401

# The megatron backend registers only where megatron-core is installed; validate_config reports
# model.backend=megatron without it in one line (MEGATRON_MISSING).
if megatron_core_available():
    from nemo_azr.models.megatron import critic as megatron_critic  # noqa: F401
    from nemo_azr.models.megatron import policy as megatron_policy  # noqa: F401
