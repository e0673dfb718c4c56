"""``python -m tools.gpu_check``: see the package docstring."""

import sys

from tools.gpu_check import main

sys.exit(main())
