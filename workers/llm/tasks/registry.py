"""Every task a job can name (``TASKS``) and how it is built from the job's ``[process]``
fields (``TaskParams``): the four kinds as they are, and the ready contact-center tasks.

The one list of task names: the spec, the command line (``jobs.choices``) and the document
job read it from here. Light, as ``spec`` is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from overnight.workers.llm.tasks.schemas import PROMISE_TO_PAY_SCHEMA, phrases_schema
from overnight.workers.llm.tasks.spec import TASK_KINDS, TaskSpec, TaskSpecError

DISPOSITION_LABELS = ("paid", "promise_to_pay", "dispute", "wrong_number", "callback", "other")


# The ready contact-center tasks: each one's kind and instructions, the prompt the model
# reads with the document. Their constructors below add the one field the kind works on.
_READY: dict[str, tuple[str, str]] = {
    "call_summary": (
        "summarize",
        "The document is a call transcript between an agent and a customer. Say why "
        "the customer called, what was agreed, and any next step.",
    ),
    "disposition": (
        "classify",
        "The document is a call transcript. Labels: paid = the customer has paid; "
        "promise_to_pay = the customer commits to pay later; dispute = the customer "
        "contests the debt or amount; wrong_number = the agent reached the wrong person; "
        "callback = someone asks to be called back later; other = anything else.",
    ),
    "promise_to_pay": (
        "extract",
        "The document is a call transcript. Extract the customer's payment promise.",
    ),
    "compliance": (
        "extract",
        "The document is a call transcript. For each phrase, answer true if the agent "
        "said it or the same meaning, else false.",
    ),
}


def _ready(name: str, **fields: Any) -> TaskSpec:
    kind, instructions = _READY[name]
    return TaskSpec(kind=kind, name=name, instructions=instructions, **fields)


def call_summary(words: int = 80, **options: Any) -> TaskSpec:
    return _ready("call_summary", summary_words=words, **options)


def disposition(**options: Any) -> TaskSpec:
    return _ready("disposition", labels=DISPOSITION_LABELS, **options)


def promise_to_pay(**options: Any) -> TaskSpec:
    return _ready("promise_to_pay", json_schema=PROMISE_TO_PAY_SCHEMA, **options)


def compliance(required_phrases: Sequence[str], **options: Any) -> TaskSpec:
    """Which required phrases or disclosures the agent said. The model fills one boolean per
    phrase (a shape small models copy reliably); the stored JSON is
    ``{"said": [...], "missing": [...]}``, which always partitions the phrase list."""
    phrases = tuple(dict.fromkeys(p.strip() for p in required_phrases if p and p.strip()))
    if not phrases:
        raise TaskSpecError("required_phrases: give at least one phrase or disclosure")
    return _ready(
        "compliance", json_schema=phrases_schema(phrases), required_phrases=phrases, **options
    )


READY_TASKS: dict[str, Callable[..., TaskSpec]] = {
    "call_summary": call_summary,
    "disposition": disposition,
    "promise_to_pay": promise_to_pay,
    "compliance": compliance,
}


@dataclass(frozen=True)
class TaskParams:
    """A job's task parameters, files already read (``jobs.process`` reads them): the
    ``[process]`` fields each task's constructor takes what it needs from."""

    max_new_tokens: int | None = None
    instructions: str = ""
    summary_words: int = 100
    json_schema: dict[str, Any] | None = None
    labels: tuple[str, ...] = ()
    template: str | None = None
    required_phrases: tuple[str, ...] = ()


# The four kinds, each a task of its own name: the instructions, the token cap and the one
# [process] field the kind works on; a field with a message is required.
_KIND_FIELDS: dict[str, tuple[str, str | None]] = {
    "summarize": ("summary_words", None),
    "extract": (
        "json_schema",
        "schema: the extract task needs the fields as a JSON schema (--schema FILE)",
    ),
    "classify": ("labels", None),
    "prompt": ("template", "prompt: the prompt task needs a template with {text} (--prompt FILE)"),
}


def _kind_task(kind: str) -> Callable[[TaskParams], TaskSpec]:
    field, missing = _KIND_FIELDS[kind]

    def build(p: TaskParams) -> TaskSpec:
        value = getattr(p, field)
        if missing is not None and value in (None, ""):
            raise TaskSpecError(missing)
        return TaskSpec(
            kind=kind,
            instructions=p.instructions,
            max_new_tokens=p.max_new_tokens,
            **{field: value},
        )

    return build


# Name → constructor. The one list of task names: the spec's help, the command line and the
# document job read it from here.
TASKS: dict[str, Callable[[TaskParams], TaskSpec]] = {
    **{kind: _kind_task(kind) for kind in TASK_KINDS},
    "call_summary": lambda p: call_summary(p.summary_words, max_new_tokens=p.max_new_tokens),
    "disposition": lambda p: disposition(max_new_tokens=p.max_new_tokens),
    "promise_to_pay": lambda p: promise_to_pay(max_new_tokens=p.max_new_tokens),
    "compliance": lambda p: compliance(p.required_phrases, max_new_tokens=p.max_new_tokens),
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)


def build_task(name: str, params: TaskParams) -> TaskSpec:
    """The validated task ``name``; ``TaskSpecError`` names what is wrong or missing."""
    if name not in TASKS:
        raise TaskSpecError(f"task: unknown task {name!r}; use one of {', '.join(TASK_NAMES)}")
    return TASKS[name](params)
