"""LLM tasks: what to do with each document (summarize, extract, classify, a user prompt, the
ready contact-center tasks), and doing it over many documents at once.

- ``spec``: a task's validated specification (``TaskSpec``), one document's input and output;
- ``schemas``: the JSON an extraction replies with (conformed, validated, bounded for
  decoding) and the ready tasks' output schemas;
- ``prompts``: the messages each kind sends, untrusted document text defused;
- ``registry``: every task a job can name (``TASKS``, ``TASK_NAMES``) and how it is built;
- ``run``: ``run_task``, every item ending as a result or an error row.

Imports point one way: ``schemas`` ← ``spec`` ← ``prompts`` ← ``run``, and ``registry`` on
``spec`` and ``schemas``. Importing this package loads none of them; the registry loads no
engine, pyarrow or pydantic, so the command line reads the task names from it.
"""

from __future__ import annotations

import importlib
from typing import Any

# The names scripts/ import from the package itself (bench_process.py, gpu_check.py), each
# loaded from its module on first use so that importing the registry stays light.
_FROM_MODULE = {
    "TaskInput": "spec",
    "TaskSpec": "spec",
    "validate": "schemas",
    "summarize_messages": "prompts",
    "promise_to_pay": "registry",
    "run_task": "run",
}


def __getattr__(name: str) -> Any:
    if name in _FROM_MODULE:
        return getattr(importlib.import_module(f"{__name__}.{_FROM_MODULE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
