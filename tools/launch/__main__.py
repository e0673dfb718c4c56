"""``python -m tools.launch RECIPE [KEY=VALUE ...] [--launcher slurm --nodes N ...]``: one run (tools.launch.cli)."""

import sys

from tools.launch.cli import main

sys.exit(main())
