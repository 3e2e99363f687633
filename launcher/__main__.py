"""``python -m nemo_azr_launch`` is ``nemo-azr-launch``."""

import sys

from nemo_azr_launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
