"""What a task does with each document (:class:`TaskSpec`, validated on construction), and
what goes in and comes out for one document (:class:`TaskInput`, :class:`TaskOutput`).

Light (no engine, pyarrow or pydantic), as the registry that builds on it must be: the command
line lists the task names from there. ``jsonschema`` loads when a schema is checked.
"""

from __future__ import annotations

import copy
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from overnight.workers.llm.adapter import GenerationParams

TASK_KINDS = ("summarize", "extract", "classify", "prompt")
STATUS_OK = "ok"
STATUS_ERROR = "error"


class TaskSpecError(ValueError):
    """A task specification is invalid; the message names the field, the value and the fix."""


class NoRoomForDocuments(TaskSpecError):
    """The task's reply cap leaves no room for a document in the model's context: every
    document would fail with ``context_exceeded`` (``tasks.run.reply_room_problem``)."""


def check_schema(schema: Any, path: str = "json_schema") -> None:
    """Raise :class:`TaskSpecError` unless ``schema`` is a valid JSON schema (any draft the
    ``jsonschema`` library knows; 2020-12 when it names none, which is what pydantic's
    ``model_json_schema()`` writes) for an object, with no ``additionalProperties``: keys
    outside the schema are always dropped from a reply."""
    from jsonschema import exceptions, validators

    if not isinstance(schema, Mapping):
        raise TaskSpecError(f"{path}: must be an object, got {type(schema).__name__}")
    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "".join(f"[{p!r}]" for p in exc.absolute_path)
        raise TaskSpecError(f"{path}{where}: not a valid JSON schema: {exc.message}") from None
    for where, ref in _references(schema, path):
        if not ref.startswith("#"):
            # Resolved, it is fetched (a URL: from inside the workers, during the run) or
            # read from a file: what the job reads is the schema it was given.
            raise TaskSpecError(
                f"{where}: {ref!r} refers outside the schema; only references within it "
                "(#/$defs/...) are allowed: put the definition under $defs"
            )
    if schema.get("type") != "object":
        raise TaskSpecError(f"{path}.type={schema.get('type')!r}: an extraction is an object")
    if schema.get("additionalProperties", False) is not False:
        raise TaskSpecError(
            f"{path}.additionalProperties: keys outside the schema are always dropped; "
            "remove it or set it to false"
        )


def _references(node: Any, path: str) -> list[tuple[str, str]]:
    """Every ``$ref``-like keyword in ``node`` and where it is, as (path, value)."""
    found: list[tuple[str, str]] = []
    if isinstance(node, Mapping):
        for key, value in node.items():
            here = f"{path}.{key}"
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and isinstance(value, str):
                found.append((here, value))
            else:
                found += _references(value, here)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _references(value, f"{path}[{i}]")
    return found


def template_fields(template: str) -> list[str]:
    """The names of a prompt template's fields; ``TaskSpecError`` for any but plain names."""
    fields = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise TaskSpecError(f"template: {exc} (write literal braces as {{{{ and }}}})") from exc
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier():
            raise TaskSpecError(
                f"template field {{{name}}}: only plain names such as {{text}} or "
                "{tenant} are allowed (no attribute or index access, no positional fields)"
            )
        if spec or conversion:
            raise TaskSpecError(
                f"template field {{{name}}}: format specs and conversions are not allowed"
            )
        fields.append(name)
    return fields


@dataclass(frozen=True)
class TaskSpec:
    """What to do with each document. Validated on construction; immutable.

    kind: ``summarize`` | ``extract`` | ``classify`` | ``prompt``.
    name: the value of the ``task`` column (default: ``kind``; ready tasks set their name).
    instructions: trusted guidance appended to the system prompt (e.g. label meanings).
    summary_words: target length of a summary, in words.
    json_schema: for ``extract``, the output's JSON schema (see :func:`check_schema`).
    labels: for ``classify``, the label set.
    template: for ``prompt``, the user message with ``{text}`` and metadata fields.
    max_new_tokens: cap on generated tokens per model call (default depends on ``kind``).
    max_chunks: a ``summarize`` document needing more chunks than this fails with
        ``context_exceeded``.
    chunk_tokens: cap on document tokens per model call (default: whatever fits).
    temperature: 0 is greedy (reproducible).
    required_phrases: for ``compliance``, the phrases whose presence the model judges (one
        boolean property each in ``json_schema``); the output becomes ``said``/``missing``.
    """

    kind: str
    name: str | None = None
    instructions: str = ""
    summary_words: int = 100
    json_schema: dict[str, Any] | None = None
    labels: tuple[str, ...] = ()
    template: str | None = None
    max_new_tokens: int | None = None
    max_chunks: int = 16
    chunk_tokens: int | None = None
    temperature: float = 0.0
    required_phrases: tuple[str, ...] = ()
    # Free-text kinds (summarize, prompt) only: above 1 discourages the loops small models
    # fall into (one sentence until the token cap); structured kinds are constrained anyway.
    repetition_penalty: float = 1.1

    def __post_init__(self) -> None:
        if self.kind not in TASK_KINDS:
            raise TaskSpecError(f"kind={self.kind!r}: use one of {', '.join(TASK_KINDS)}")
        if self.summary_words < 5:
            raise TaskSpecError(f"summary_words={self.summary_words}: must be at least 5")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise TaskSpecError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.max_chunks < 1:
            raise TaskSpecError(f"max_chunks={self.max_chunks}: must be >= 1")
        if self.chunk_tokens is not None and self.chunk_tokens < 16:
            raise TaskSpecError(f"chunk_tokens={self.chunk_tokens}: must be at least 16")
        if self.temperature < 0:
            raise TaskSpecError(f"temperature={self.temperature}: must be >= 0")
        if not 1 <= self.repetition_penalty <= 2:
            raise TaskSpecError(
                f"repetition_penalty={self.repetition_penalty}: must be between 1 and 2"
            )
        object.__setattr__(self, "labels", tuple(self.labels))
        object.__setattr__(self, "required_phrases", tuple(self.required_phrases))
        if self.kind == "extract":
            if self.json_schema is None:
                raise TaskSpecError("json_schema: required for kind=extract")
            # A private deep copy: the caller's dict is never shared or mutated.
            object.__setattr__(self, "json_schema", copy.deepcopy(dict(self.json_schema)))
            check_schema(self.json_schema)
        elif self.json_schema is not None:
            raise TaskSpecError(f"json_schema: only used by kind=extract, not {self.kind}")
        if self.kind == "classify":
            labels = self.labels
            if len(labels) < 2 or not all(isinstance(x, str) and x.strip() for x in labels):
                raise TaskSpecError(f"labels={labels!r}: give at least two non-empty labels")
            if len(set(labels)) != len(labels):
                raise TaskSpecError(f"labels={labels!r}: labels must be distinct")
        elif self.labels:
            raise TaskSpecError(f"labels: only used by kind=classify, not {self.kind}")
        if self.kind == "prompt":
            if not self.template:
                raise TaskSpecError("template: required for kind=prompt, e.g. '... {text} ...'")
            if "text" not in template_fields(self.template):
                raise TaskSpecError("template: must contain the {text} field")
        elif self.template is not None:
            raise TaskSpecError(f"template: only used by kind=prompt, not {self.kind}")

    @property
    def task_name(self) -> str:
        return self.name or self.kind

    @property
    def new_tokens(self) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        if self.kind == "summarize":
            # About 1.4 tokens per English word, plus room to finish the sentence.
            return int(self.summary_words * 1.6) + 32
        if self.kind == "classify":
            return 16
        return 256

    def options(self) -> dict[str, Any]:
        """Every field that influences the result, for the row's provenance."""
        return {
            "task": self.task_name,
            "kind": self.kind,
            "instructions": self.instructions or None,
            "summary_words": self.summary_words if self.kind == "summarize" else None,
            "json_schema": self.json_schema,
            "labels": list(self.labels) or None,
            "template": self.template,
            "max_new_tokens": self.new_tokens,
            "max_chunks": self.max_chunks,
            "chunk_tokens": self.chunk_tokens,
            "temperature": self.temperature,
            "required_phrases": list(self.required_phrases) or None,
            "repetition_penalty": self.free_text_penalty,
        }

    @property
    def free_text_penalty(self) -> float:
        """The penalty the task decodes with: free text and JSON values; none for a label."""
        return self.repetition_penalty if self.kind in ("summarize", "prompt", "extract") else 1.0

    def free_text_params(self) -> GenerationParams:
        return GenerationParams(
            max_new_tokens=self.new_tokens,
            temperature=self.temperature,
            repetition_penalty=self.free_text_penalty,
        )


@dataclass(frozen=True)
class TaskInput:
    item_id: str
    text: str
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskOutput:
    status: str
    error_code: str | None = None
    error_message: str | None = None
    output_text: str | None = None
    output_json: str | None = None
    label: str | None = None
    label_score: float | None = None  # the model's probability of ``label``, where known
    input_tokens: int = 0
    output_tokens: int = 0
    num_chunks: int = 0
    # This item's share of the measured time of every model call it rode in, in seconds
    # (apportioned by its tokens in each call).
    llm_s: float = 0.0
