import sys

from nemo_azr.cli import main

sys.exit(main())
