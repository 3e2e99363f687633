"""Policy backends (importing registers them)."""

from nemo_azr.models import hf_policy  # noqa: F401
