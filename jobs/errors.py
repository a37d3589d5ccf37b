"""Systemic failures: one exception type per cause, each message says what to do.

Per-item problems never raise; they become error rows (``schemas.errors``). These stop a
job; the CLI catches ``OvernightError`` once and exits with its ``exit_code``. Each cause has
its own code (the generated reference, docs/reference/exit-codes.md, is read off these
classes); ``tests/jobs/cli/test_cli_messages.py`` checks they differ.
"""

from typing import Any

# Answers a scheduler branches on, not failures of overnight: each has its own status, so
# that 1 means only an unexpected error (a bug to report).
EXIT_NO_OPTION_MEETS_SLA = 13  # plan, tune: no configuration meets the deadline or the SLA
EXIT_SUBMISSION_FAILED = 14  # submissions process: a submission failed
EXIT_STILL_RUNNING = 15  # submit --wait: the cluster job is still running at --timeout
OUTCOME_EXIT_CODES = (EXIT_NO_OPTION_MEETS_SLA, EXIT_SUBMISSION_FAILED, EXIT_STILL_RUNNING)


class OvernightError(Exception):
    """The base of every systemic failure: a subclass is one cause, and names its exit status
    where it is declared (``class ConfigError(OvernightError, exit_code=2)``)."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass without its own status keeps its parent's: Ray makes one of each error
        # raised in a task (``RayTaskError(Superseded)``, an instance of both), and with the
        # status required it could not, and warned on the terminal.
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str = ""):
        # Scrubbed where it is made, not only where the command line prints it: the Python
        # API raises it to a scheduler, which writes ``str(exc)`` to its task log (an input
        # URL's ``https://alice:password@...`` was there whole).
        from overnight.jobs.secrets import scrub_secrets

        message = scrub_secrets(message)
        super().__init__(message)
        # Kept apart from ``args``: Ray Data appends its retry advice to ``args`` when the
        # error leaves a task, and the user should read only what we wrote.
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(OvernightError, exit_code=2):
    """The job spec or flags are invalid."""


class StorageUnavailable(OvernightError, exit_code=3):
    """Object storage cannot be reached or listed (after retries)."""


class InputNotFound(OvernightError, exit_code=4):
    """The input location does not exist or holds nothing (for `status`, `wait` and `logs`: no
    submission has that id)."""


class ModelNotFound(OvernightError, exit_code=5):
    """The model cannot be found or loaded."""


class EngineFailed(OvernightError, exit_code=6):
    """The inference engine died (out of memory, crashed actor, broken install)."""


class AccessDenied(OvernightError, exit_code=7):
    """A submission references objects outside the prefixes its tenant may read."""


class Superseded(OvernightError, exit_code=8):
    """A later run took over the output this run was writing (one writer per dataset)."""


class ClusterJobFailed(OvernightError, exit_code=9):
    """A submitted job ended FAILED or STOPPED."""


class ClusterUnreachable(OvernightError, exit_code=10):
    """The Ray Jobs API (the head node's dashboard port) cannot be reached."""


class OutputNotWritable(OvernightError, exit_code=11):
    """The output location cannot be written (read-only, a file in the way, no permission)."""


class ErrorRateExceeded(OvernightError, exit_code=12):
    """The run finished, but more of its items failed than ``max_error_rate`` allows (a night
    where every object answers 403 must not look like success to a scheduler)."""

    def __init__(self, message: str = "", summary: dict | None = None):
        super().__init__(message)
        self.summary = summary or {}
