import sys

from tools.explore.cli import main

sys.exit(main())
