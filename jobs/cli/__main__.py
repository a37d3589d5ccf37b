"""``python -m jobs.cli``: the ``overnight`` command."""

import sys

from jobs.cli import main

sys.exit(main())
