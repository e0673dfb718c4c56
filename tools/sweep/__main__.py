"""``python -m tools.sweep``: the CLI (:mod:`tools.sweep.cli`)."""

import sys

from tools.sweep.cli import main

sys.exit(main())
