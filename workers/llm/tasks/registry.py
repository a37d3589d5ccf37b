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


def _ready(name: str, instructions: str = "", **fields: Any) -> TaskSpec:
    """The ready task ``name``; the job's own ``instructions`` come after the task's."""
    kind, own = _READY[name]
    joined = " ".join(part for part in (own, instructions.strip()) if part)
    return TaskSpec(kind=kind, name=name, instructions=joined, **fields)


# A call's summary is shorter than a document's (``TaskSpec.summary_words``, 100).
CALL_SUMMARY_WORDS = 80


def call_summary(words: int = CALL_SUMMARY_WORDS, **options: Any) -> TaskSpec:
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
        raise TaskSpecError(
            "required_phrases: the compliance task needs the phrases the agent must say; set "
            'required_phrases = ["this call is recorded", ...] under [process] in a job file '
            "and give it with --config FILE"
        )
    seen: dict[str, str] = {}
    for phrase in phrases:
        # Each phrase is a key of the model's reply: two that differ only in case ask the
        # same question twice, under two keys that a reader and the model must keep apart.
        same = seen.setdefault(phrase.casefold(), phrase)
        if same != phrase:
            raise TaskSpecError(
                f"required_phrases: {same!r} and {phrase!r} differ only in case; give each "
                "phrase once"
            )
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
    summary_words: int | None = None  # None: the task's own length
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
            **({} if value is None else {field: value}),
        )

    return build


def _common(p: TaskParams) -> dict[str, Any]:
    """What every ready task takes from the job: its reply cap and its instructions."""
    return {"max_new_tokens": p.max_new_tokens, "instructions": p.instructions}


# Name → constructor. The one list of task names: the spec's help, the command line and the
# document job read it from here.
TASKS: dict[str, Callable[[TaskParams], TaskSpec]] = {
    **{kind: _kind_task(kind) for kind in TASK_KINDS},
    "call_summary": lambda p: call_summary(
        CALL_SUMMARY_WORDS if p.summary_words is None else p.summary_words, **_common(p)
    ),
    "disposition": lambda p: disposition(**_common(p)),
    "promise_to_pay": lambda p: promise_to_pay(**_common(p)),
    "compliance": lambda p: compliance(p.required_phrases, **_common(p)),
}
TASK_NAMES: tuple[str, ...] = tuple(TASKS)


def build_task(name: str, params: TaskParams) -> TaskSpec:
    """The validated task ``name``; ``TaskSpecError`` names what is wrong or missing."""
    if name not in TASKS:
        raise TaskSpecError(f"task: unknown task {name!r}; use one of {', '.join(TASK_NAMES)}")
    return TASKS[name](params)
