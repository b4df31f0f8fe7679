"""``python -m benchmarks COMMAND``, from the repository root (``make bench``)."""

import sys

from benchmarks.cli import main

sys.exit(main())
