"""``python -m overnight.jobs.cli``: the ``overnight`` command."""

import sys

from overnight.jobs.cli import main

sys.exit(main())
