"""Every list and default the command line offers, from its one source.

The job-level lists are declared here (``jobs.ops.report``, ``jobs.ops.tune`` and ``jobs.ops.export``
import them); the workers' lists are their registries' own, which are light modules. So
``overnight --help`` builds every parser without loading the libraries (pyarrow, Ray,
pydantic, the engines) that the commands themselves need.
"""

from __future__ import annotations

from overnight.workers.devices import DEVICES
from overnight.workers.llm.contract import BACKENDS
from overnight.workers.llm.tasks.registry import TASK_NAMES
from overnight.workers.redact.types import PRESETS, TYPES
from overnight.workers.whisper_models import WHISPER_ENGINES, WHISPER_TASKS

__all__ = [
    "BACKENDS",
    "DEFAULT_FIRST_NIGHT",
    "DEFAULT_HEADROOM",
    "DEFAULT_SHOW_LIMIT",
    "DEFAULT_TUNE_BUDGET",
    "DEFAULT_UTILIZATION",
    "DEVICES",
    "EXPORT_FORMATS",
    "LLM_TASKS",
    "REDACTION_PRESETS",
    "REDACTION_TYPES",
    "REPORT_FORMATS",
    "REPORT_GROUPS",
    "TUNE_KINDS",
    "VIEW_DATASETS",
    "VIEW_ENGINES",
    "WHISPER_ENGINES",
    "WHISPER_TASKS",
]

# overnight transcribe / process (the workers' registries)
LLM_TASKS = TASK_NAMES
REDACTION_TYPES = TYPES
REDACTION_PRESETS = tuple(PRESETS)

# overnight export
EXPORT_FORMATS = ("srt", "vtt", "txt", "json")

# overnight report
REPORT_GROUPS = ("day", "tenant", "submission", "model", "run")
REPORT_FORMATS = ("table", "html", "csv", "parquet")

# overnight plan: the busy share of reserved time assumed when no run measured it, and the
# share of the deadline kept free for stragglers and restarts.
DEFAULT_UTILIZATION = 0.9
DEFAULT_HEADROOM = 0.2

# overnight tune
TUNE_KINDS = ("transcribe", "process")
DEFAULT_TUNE_BUDGET = "10m"

# overnight show: rows per dataset unless --limit says otherwise
DEFAULT_SHOW_LIMIT = 20

# overnight views: the engines it writes DDL for, the datasets of an OUTPUT it covers, and the
# first run_date the Athena and Trino partition projection reaches back to unless told
VIEW_ENGINES = ("duckdb", "athena", "trino")
VIEW_DATASETS = ("transcripts", "results", "costs", "probes", "run_table")
DEFAULT_FIRST_NIGHT = "2025-01-01"
