"""``python -m memlens``: the same command line as ``memlens``."""

import sys

from ._cli import main

sys.exit(main())
