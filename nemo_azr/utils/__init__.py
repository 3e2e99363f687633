"""Low-level helpers every package may import (no nemo_azr imports): seeding, atomic file writes."""
