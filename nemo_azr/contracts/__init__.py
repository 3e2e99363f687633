"""Data contract: the ``Batch`` type, canonical field names and stage-gated validation."""

from nemo_azr.contracts import fields
from nemo_azr.contracts.batch import Batch
from nemo_azr.contracts.fields import Role, SampleType
from nemo_azr.contracts.schema import STAGES, validate_batch

__all__ = ["Batch", "Role", "SampleType", "STAGES", "fields", "validate_batch"]
