"""The names and defaults that the command line offers and the libraries check.

Kept in a module that imports nothing, so that ``overnight --help`` builds every parser
without loading the libraries (pyarrow, Ray, pydantic) that the commands themselves need.
"""

from __future__ import annotations

# overnight report
REPORT_GROUPS = ("day", "tenant", "submission", "model", "run")
REPORT_FORMATS = ("table", "html", "csv", "parquet")

# overnight plan: the busy share of reserved time assumed when no run measured it, and the
# share of the deadline kept free for stragglers and restarts.
DEFAULT_UTILIZATION = 0.9
DEFAULT_HEADROOM = 0.2

# overnight tune
TUNE_TASKS = ("transcribe", "process")
DEFAULT_TUNE_BUDGET = "10m"

# overnight show: rows per dataset unless --limit says otherwise
DEFAULT_SHOW_LIMIT = 20
