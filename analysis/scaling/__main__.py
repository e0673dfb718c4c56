"""``python -m analysis.scaling``: see :mod:`analysis.scaling.cli`."""

import sys

from analysis.scaling.cli import main

sys.exit(main())
