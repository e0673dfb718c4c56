"""``python -m analysis.routing``: see :mod:`analysis.routing.cli`."""

import sys

from analysis.routing.cli import main

sys.exit(main())
