"""`python -m m3fleet.cli`: the `m3fleet` console script."""

import sys

from m3fleet.cli import main

sys.exit(main())
