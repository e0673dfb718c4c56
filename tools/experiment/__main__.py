import sys

from tools.experiment.cli import main

sys.exit(main())
