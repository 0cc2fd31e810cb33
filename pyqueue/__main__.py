"""``python -m pyqueue``: the pyqueue command."""

import sys

from pyqueue.cli import main

sys.exit(main())
