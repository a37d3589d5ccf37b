"""Running a task over many documents at once: :func:`run_task`.

Every model call of a phase (map, reduce, retry) carries all items of the call in one
``generate``/``choose``, and every item ends as exactly one :class:`TaskOutput`: a result or
an error row. A task cannot widen what it asked for: ``choose`` scores only the given labels,
and keys outside an extraction's schema are dropped before validation.

Over 600 lines: the four kinds' runs share the per-item state, the batched calls with their
isolation and accounting, and the checks of free-text replies; each kind is one function.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from overnight.schemas.errors import ErrorCode
from overnight.workers.llm.adapter import (
    FINISH_CONTEXT_EXCEEDED,
    FINISH_LENGTH,
    Generation,
    GenerationParams,
    LLMBackend,
)
from overnight.workers.llm.tasks.prompts import (
    classify_messages,
    defuse,
    extract_messages,
    prompt_messages,
    reduce_messages,
    summarize_messages,
)
from overnight.workers.llm.tasks.schemas import (
    bounded_for_decoding,
    conform,
    parse_json_reply,
    validate,
)
from overnight.workers.llm.tasks.spec import (
    STATUS_ERROR,
    STATUS_OK,
    TaskInput,
    TaskOutput,
    TaskSpec,
    template_fields,
)

# Tokens kept free between the prompt and the context limit, for template edge effects.
_CONTEXT_MARGIN = 8
# A call with room for fewer document tokens than this has no room for a document.
MIN_DOCUMENT_TOKENS = 16
_MAX_REDUCE_ROUNDS = 4
_ERROR_SNIPPET = 300


_ECHO_WORDS = 8  # a run this long copied from our scaffolding is an echo, not a summary
_LOOP_WORDS = 6  # a run this long said three times is a loop


def degenerate(reply: str, scaffolding: str) -> str | None:
    """Why a free-text reply is unusable, or None: the model looped (one run of words, or
    one sentence, said over and over until the token cap) or recited the prompt's own
    instructions instead of working on the document."""
    words = re.findall(r"\w+", reply.lower())
    runs: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - _LOOP_WORDS + 1):
        run = tuple(words[i : i + _LOOP_WORDS])
        runs[run] = runs.get(run, 0) + 1
        if runs[run] >= 3:
            return f"the reply repeats itself (a run of {_LOOP_WORDS} words three times)"
    sentences = [" ".join(re.findall(r"\w+", x.lower())) for x in re.split(r"[.!?\n]+", reply)]
    sentences = [x for x in sentences if len(x.split()) >= 4]
    if len(sentences) != len(set(sentences)):
        return "the reply says the same sentence twice"
    ours = re.findall(r"\w+", scaffolding.lower())
    said = {tuple(words[i : i + _ECHO_WORDS]) for i in range(len(words) - _ECHO_WORDS + 1)}
    for i in range(len(ours) - _ECHO_WORDS + 1):
        if tuple(ours[i : i + _ECHO_WORDS]) in said:
            return "the reply recites the task's instructions instead of answering"
    return None


class _Item:
    """Per-item state while a task runs: accounting and the final outcome."""

    __slots__ = (
        "error",
        "input_tokens",
        "label",
        "label_score",
        "llm_s",
        "num_chunks",
        "output_tokens",
        "result_json",
        "result_text",
    )

    def __init__(self) -> None:
        self.input_tokens = 0
        self.output_tokens = 0
        self.llm_s = 0.0
        self.num_chunks = 0
        self.error: tuple[str, str] | None = None
        self.result_text: str | None = None
        self.result_json: str | None = None
        self.label: str | None = None
        self.label_score: float | None = None

    def fail(self, code: ErrorCode, message: str) -> None:
        if self.error is None:
            self.error = (code.value, message)

    def output(self) -> TaskOutput:
        if self.error is not None:
            return TaskOutput(
                status=STATUS_ERROR,
                error_code=self.error[0],
                error_message=self.error[1],
                input_tokens=self.input_tokens,
                output_tokens=self.output_tokens,
                num_chunks=self.num_chunks,
                llm_s=self.llm_s,
            )
        return TaskOutput(
            status=STATUS_OK,
            output_text=self.result_text,
            output_json=self.result_json,
            label=self.label,
            label_score=self.label_score,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            num_chunks=self.num_chunks,
            llm_s=self.llm_s,
        )


_Job = tuple[int, list[dict[str, str]]]  # (item index, conversation)


def _isolate(
    call: Callable[[list[list[dict[str, str]]]], list[Any]], convs: list[list[dict[str, str]]]
) -> list[Any]:
    """Run ``call`` on the whole batch; if it raises, run each conversation alone so one bad
    item cannot fail the others. If every one fails alone too, the engine itself is broken:
    re-raise."""
    try:
        results = call(convs)
    except Exception as batch_error:
        if len(convs) == 1:
            return [batch_error]
        results = []
        for conv in convs:
            try:
                results.append(call([conv])[0])
            except Exception as exc:
                results.append(exc)
        if all(isinstance(r, Exception) for r in results):
            raise batch_error from None
        return results
    if len(results) != len(convs):
        raise RuntimeError(f"backend returned {len(results)} results for {len(convs)} inputs")
    return results


def _charge(
    items: list[_Item],
    jobs: list[_Job],
    counts: list[tuple[int, int]],
    elapsed: float,
    engine_s: list[float | None] | None = None,
) -> None:
    """Add each job's tokens to its item, and its time: the engine's own share of its busy
    time where the backend measures one, else the call's wall time apportioned by tokens."""
    total = sum(i + o for i, o in counts)
    shares = engine_s or [None] * len(jobs)
    for (index, _), (inp, out), own in zip(jobs, counts, shares, strict=True):
        item = items[index]
        item.input_tokens += inp
        item.output_tokens += out
        if own is not None:
            item.llm_s += own
        else:
            item.llm_s += elapsed * ((inp + out) / total if total else 1 / len(jobs))


def _generate(
    backend: LLMBackend, items: list[_Item], jobs: list[_Job], params: GenerationParams
) -> list[Generation | None]:
    """One ``generate`` call for all jobs; per job a Generation, or None after recording the
    item's error."""
    if not jobs:
        return []
    started = time.perf_counter()
    results = _isolate(lambda convs: backend.generate(convs, params), [conv for _, conv in jobs])
    elapsed = time.perf_counter() - started
    counts = [
        (r.input_tokens, r.output_tokens) if isinstance(r, Generation) else (0, 0) for r in results
    ]
    measured = [r.engine_s if isinstance(r, Generation) else 0.0 for r in results]
    _charge(items, jobs, counts, elapsed, None if None in measured else measured)
    out: list[Generation | None] = []
    for (index, _), result in zip(jobs, results, strict=True):
        if isinstance(result, Exception):
            items[index].fail(
                ErrorCode.MODEL_ERROR, f"{type(result).__name__}: {result}"[:_ERROR_SNIPPET]
            )
            out.append(None)
        elif result.finish_reason == FINISH_CONTEXT_EXCEEDED:
            items[index].fail(
                ErrorCode.CONTEXT_EXCEEDED,
                f"prompt of {result.input_tokens} tokens exceeds the model context",
            )
            out.append(None)
        else:
            out.append(result)
    return out


def _prompt_budget(
    backend: LLMBackend, spec: TaskSpec, overhead: int, *, chunked: bool = False
) -> int:
    """Document tokens that fit next to the prompt scaffolding and the reply: the model's
    context less both, capped by the task's ``chunk_tokens``. The backend's own chunk cap
    (``max_chunk_tokens``: CTranslate2 on CPU keeps a summary's map chunks to 2,048 tokens
    for memory) applies only where the task can cut a document (``chunked``: summarize); a
    task that reads the document whole (extract, classify, prompt) gets the model's context,
    as it does on vLLM."""
    budget = backend.context_length - spec.new_tokens - overhead - _CONTEXT_MARGIN
    for cap in (spec.chunk_tokens, backend.max_chunk_tokens if chunked else None):
        if cap is not None:
            budget = min(budget, cap)
    return budget


def _overhead(backend: LLMBackend, messages: list[dict[str, str]]) -> int:
    return backend.count_tokens(backend.render_chat(messages))


def scaffolding_tokens(backend: LLMBackend, spec: TaskSpec) -> int:
    """Tokens of the task's own prompt around a document: a summary's largest prompt shape
    (a part's or a reduce round's), the others' prompt with an empty document (a template's
    metadata fields empty too; their values come per item)."""
    if spec.kind == "summarize":
        words = spec.summary_words
        return max(
            _overhead(backend, summarize_messages(spec, "", words, part="Part 99 of 99")),
            _overhead(backend, reduce_messages(spec, ["", ""], words)),
        )
    if spec.kind == "extract":
        return _overhead(backend, extract_messages(spec, ""))
    if spec.kind == "classify":
        return _overhead(backend, classify_messages(spec, ""))
    fields = set(template_fields(spec.template or "")) - {"text"}
    return _overhead(backend, prompt_messages(spec, "", dict.fromkeys(fields, "")))


def reply_room_problem(
    spec: TaskSpec, context_length: int, scaffolding: int = 0, *, context_setting: str = ""
) -> str | None:
    """Why no document fits a call of ``spec`` on a model of ``context_length`` tokens, which
    the prompt (``scaffolding``: its own tokens, where the model's tokenizer is at hand) and
    the reply share; None when one does. ``context_setting``: the job's setting that gave the
    context (``max_model_len = 256``), named and offered as a remedy. The message starts with
    the ``[process]`` setting at fault, so that it reads as ``process.<setting> ...``."""
    room = context_length - spec.new_tokens - scaffolding - _CONTEXT_MARGIN
    if room >= MIN_DOCUMENT_TOKENS:
        return None
    most = spec.new_tokens + room - MIN_DOCUMENT_TOKENS
    # The least context in which a short document fits beside this reply cap and the prompt
    # (the prompt's own tokens only where they are counted).
    least = context_length - room + MIN_DOCUMENT_TOKENS
    context = f"the model's context of {context_length} tokens"
    if context_setting:
        context = f"the context of {context_length} tokens that {context_setting} gives"
    prompt = f"the task's prompt ({scaffolding} tokens)" if scaffolding else "the prompt"
    fixes = []
    if spec.max_new_tokens is None and spec.kind == "summarize":
        fixes.append("lower summary_words")
    if most >= 1:
        far = "" if scaffolding else " (the prompt takes some of that too)"
        fixes.append(f"set max_new_tokens to at most {most}, far less to leave documents room{far}")
    if context_setting:
        name = context_setting.split("=")[0].strip()
        fixes.append(f"raise {name} well above {least}")
    elif most < 1:
        fixes.append("choose a model with a longer context")
    if spec.max_new_tokens is not None:
        setting = f"max_new_tokens = {spec.max_new_tokens}"
    elif spec.kind == "summarize":
        setting = (
            f"summary_words = {spec.summary_words} (replies of up to {spec.new_tokens} tokens)"
        )
    elif context_setting:
        return (
            f"{context_setting} leaves no room for a document beside {prompt} and the "
            f"{spec.task_name} task's replies of up to {spec.new_tokens} tokens: every "
            f"document would fail with context_exceeded; {', or '.join(fixes)}"
        )
    else:
        setting = f"max_new_tokens (unset: the {spec.task_name} task's {spec.new_tokens})"
    return (
        f"{setting} leaves no room for a document in {context}, which {prompt}, the document "
        f"and the reply share: every document would fail with context_exceeded; "
        f"{', or '.join(fixes)}"
    )


def run_task(backend: LLMBackend, spec: TaskSpec, items: Sequence[TaskInput]) -> list[TaskOutput]:
    """Run ``spec`` on every item; one output per input, in order. Per-item problems become
    error outputs; only a failure of the engine itself raises."""
    states = [_Item() for _ in items]
    specials = tuple(getattr(backend, "special_tokens", ()))
    if specials:  # the model's own added tokens, which the generic markers may miss
        items = [
            TaskInput(
                i.item_id,
                defuse(i.text, specials),
                {k: defuse(str(v), specials) for k, v in i.metadata.items()},
            )
            for i in items
        ]
    if items:
        runner = {
            "summarize": _run_summarize,
            "extract": _run_extract,
            "classify": _run_classify,
            "prompt": _run_prompt,
        }[spec.kind]
        runner(backend, spec, list(items), states)
    return [state.output() for state in states]


def _fits(backend: LLMBackend, spec: TaskSpec, text: str, overhead: int) -> bool:
    return backend.count_tokens(defuse(text)) <= _prompt_budget(backend, spec, overhead)


def _too_long(
    state: _Item,
    backend: LLMBackend,
    spec: TaskSpec,
    text: str,
    overhead: int,
    *,
    chunked: bool = False,
) -> None:
    state.num_chunks = 0
    context = getattr(backend, "context_length", None)
    of = f" of the model's {context}" if context else ""
    remedy = (
        f"lower max_new_tokens (replies take up to {spec.new_tokens}{of} tokens) or raise "
        "max_model_len (vLLM)"
    )
    if spec.kind == "summarize":
        remedy = f"lower summary_words, {remedy}"
    else:
        remedy += ", or run call_summary or summarize, which read a long document in chunks"
    state.fail(
        ErrorCode.CONTEXT_EXCEEDED,
        f"document of {backend.count_tokens(text)} tokens does not fit the "
        f"{_prompt_budget(backend, spec, overhead, chunked=chunked)}-token budget of task "
        f"{spec.task_name}; {remedy}, then rerun with --retry-errors context_exceeded",
    )


def _whole_documents(
    backend: LLMBackend,
    spec: TaskSpec,
    items: list[TaskInput],
    states: list[_Item],
    messages: Callable[[str], list[dict[str, str]]],
) -> list[_Job]:
    """One conversation (``messages(text)``) per document that fits next to the prompt's
    scaffolding (``messages("")``); a document that does not fails with context_exceeded."""
    overhead = _overhead(backend, messages(""))
    jobs: list[_Job] = []
    for index, item in enumerate(items):
        if _fits(backend, spec, item.text, overhead):
            states[index].num_chunks = 1
            jobs.append((index, messages(item.text)))
        else:
            _too_long(states[index], backend, spec, item.text, overhead)
    return jobs


def _run_summarize(
    backend: LLMBackend, spec: TaskSpec, items: list[TaskInput], states: list[_Item]
) -> None:
    words = spec.summary_words
    params = spec.free_text_params()
    overhead = scaffolding_tokens(backend, spec)
    budget = _prompt_budget(backend, spec, overhead, chunked=True)
    if budget < MIN_DOCUMENT_TOKENS:
        for state in states:
            state.fail(
                ErrorCode.CONTEXT_EXCEEDED,
                f"the model context ({backend.context_length}) leaves no room for a document",
            )
        return

    jobs: list[_Job] = []
    owners: list[tuple[int, int]] = []  # (item, chunk number or -1 for a whole document)
    for index, item in enumerate(items):
        text = defuse(item.text)
        if backend.count_tokens(text) <= budget:
            states[index].num_chunks = 1
            jobs.append((index, summarize_messages(spec, item.text, words)))
            owners.append((index, -1))
            continue
        chunks = backend.split_by_tokens(text, budget)
        if len(chunks) > spec.max_chunks:
            states[index].fail(
                ErrorCode.CONTEXT_EXCEEDED,
                f"document needs {len(chunks)} chunks of {budget} tokens; max_chunks is {spec.max_chunks}",
            )
            continue
        states[index].num_chunks = len(chunks)
        for n, chunk in enumerate(chunks):
            part = f"Part {n + 1} of {len(chunks)}"
            jobs.append((index, summarize_messages(spec, chunk, words, part=part)))
            owners.append((index, n))

    partials: dict[int, list[str]] = {}
    replies = _generate_free(backend, states, jobs, params, sentences=True)
    for (index, n), (_, conv), result in zip(owners, jobs, replies, strict=True):
        reply = _free_text(states[index], conv, result, sentences=True)
        if reply is None:
            continue
        if n < 0:
            states[index].result_text = reply
        else:
            partials.setdefault(index, []).append(reply)

    # Reduce: combine part summaries, grouping them when together they do not fit.
    pending = {i: parts for i, parts in partials.items() if states[i].error is None}
    for _ in range(_MAX_REDUCE_ROUNDS):
        if not pending:
            break
        jobs, owners = [], []
        for index, parts in pending.items():
            if not parts:
                states[index].fail(
                    ErrorCode.INVALID_OUTPUT, "the model returned empty part summaries"
                )
                continue
            groups = _group(backend, parts, budget)
            if len(groups) >= len(parts) and len(parts) > 1:
                _too_long(states[index], backend, spec, "\n\n".join(parts), overhead, chunked=True)
                continue
            for g, group in enumerate(groups):
                jobs.append((index, reduce_messages(spec, group, words)))
                owners.append((index, g if len(groups) > 1 else -1))
        next_round: dict[int, list[str]] = {}
        replies = _generate_free(backend, states, jobs, params, sentences=True)
        for (index, g), (_, conv), result in zip(owners, jobs, replies, strict=True):
            reply = _free_text(states[index], conv, result, sentences=True)
            if reply is None:
                next_round.pop(index, None)
            elif g < 0:
                states[index].result_text = reply
            elif states[index].error is None:
                next_round.setdefault(index, []).append(reply)
        pending = {i: p for i, p in next_round.items() if states[i].error is None}
    for index in pending:
        states[index].fail(
            ErrorCode.CONTEXT_EXCEEDED, "summaries did not converge within the reduce rounds"
        )


# A free-text reply that loops or recites the prompt is decoded once more with this penalty
# before it becomes invalid_output: 2 of 19 summaries on SmolLM2-135M looped at 1.1.
RETRY_REPETITION_PENALTY = 1.3


def _generate_free(
    backend: LLMBackend,
    items: list[_Item],
    jobs: list[_Job],
    params: GenerationParams,
    *,
    sentences: bool = False,
) -> list[Generation | None]:
    """``_generate`` for free text, with one retry of the unusable replies (see
    ``_unusable``)."""
    replies = _generate(backend, items, jobs, params)
    if params.repetition_penalty >= RETRY_REPETITION_PENALTY:
        return replies
    again = [
        k
        for k, (reply, (_, conv)) in enumerate(zip(replies, jobs, strict=True))
        if reply is not None and _unusable(reply, conv, sentences=sentences)[1] is not None
    ]
    if again:
        stronger = dataclasses.replace(params, repetition_penalty=RETRY_REPETITION_PENALTY)
        redone = _generate(backend, items, [jobs[k] for k in again], stronger)
        for k, reply in zip(again, redone, strict=True):
            if reply is not None:
                replies[k] = reply
    return replies


# The end of a sentence: . ! or ? with any closing quotes or brackets, then a space or the end
# (so "3.5" and "e.g.x" are not ends).
_SENTENCE_END = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=\s|$)")


def whole_sentences(text: str) -> str:
    """``text`` up to its last finished sentence or line: what is usable of a reply that the
    token cap cut off mid-sentence ('' when nothing was finished)."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    cut = max(ends[-1] if ends else 0, text.rfind("\n"))
    return text[:cut].rstrip() if cut > 0 else ""


def _unusable(
    result: Generation, conv: list[dict[str, str]], *, sentences: bool
) -> tuple[str, str | None]:
    """The reply's text to keep, and why it is unusable (None when it is usable). With
    ``sentences`` (summaries), a reply that the token cap cut off is kept up to its last
    finished sentence: its unfinished tail is where a small model drifts."""
    text = result.text.strip()
    if not text:
        return text, "the model returned an empty reply"
    problem = degenerate(text, conv[0]["content"])
    if problem is None and sentences and result.finish_reason == FINISH_LENGTH:
        text = whole_sentences(text)
        if not text:
            problem = (
                f"the reply reached the token cap ({result.output_tokens} tokens) before it "
                "finished a sentence"
            )
    return text, problem


def _reply_size(result: Generation) -> str:
    """What an error message says of a reply: its size, never its text (a reply copies the
    document, and error messages are shown by `overnight show` and kept in the results)."""
    return f"the reply had {result.output_tokens} tokens, {len(result.text)} characters"


def _free_text(
    state: _Item,
    conv: list[dict[str, str]],
    result: Generation | None,
    *,
    sentences: bool = False,
) -> str | None:
    """A free-text reply fit to keep, or None after recording why it is not."""
    if result is None:
        return None  # the item's error is recorded already
    text, problem = _unusable(result, conv, sentences=sentences)
    if problem is not None:
        state.fail(ErrorCode.INVALID_OUTPUT, f"{problem}; {_reply_size(result)}")
        return None
    return text


def _group(backend: LLMBackend, parts: list[str], budget: int) -> list[list[str]]:
    """Consecutive parts packed greedily into groups whose joined text fits ``budget``."""
    groups: list[list[str]] = []
    current: list[str] = []
    used = 0
    for part in parts:
        size = backend.count_tokens(defuse(part)) + 8  # "Part N: " and the blank line
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(part)
        used += size
    if current:
        groups.append(current)
    return groups


def _run_extract(
    backend: LLMBackend, spec: TaskSpec, items: list[TaskInput], states: list[_Item]
) -> None:
    schema = spec.json_schema or {}
    params = GenerationParams(
        max_new_tokens=spec.new_tokens,
        temperature=spec.temperature,
        json_schema=bounded_for_decoding(schema) if backend.structured_outputs else schema,
        # Loops inside a value (a digit or a phrase repeated until the cap) are what cut a
        # reply short under the grammar; the penalty ends them (see DECODE_MAX_STRING_CHARS).
        repetition_penalty=spec.free_text_penalty,
    )
    jobs = _whole_documents(backend, spec, items, states, lambda text: extract_messages(spec, text))

    retries: list[_Job] = []
    for (index, conv), result in zip(jobs, _generate(backend, states, jobs, params), strict=True):
        if result is None:
            continue
        problem = _accept_json(states[index], spec, result.text)
        if problem is not None and backend.structured_outputs:
            # Decoding followed the schema, so the reply was cut short: a retry would be too.
            states[index].fail(
                ErrorCode.INVALID_OUTPUT,
                f"reply failed validation: {problem}; {_reply_size(result)}",
            )
        elif problem is not None:
            # One retry with the validation error in the prompt, after the model's own reply.
            retry = [
                *conv,
                {"role": "assistant", "content": result.text},
                {
                    "role": "user",
                    "content": f"That reply is not valid: {problem}. Reply again with one "
                    "JSON object only, using only the keys listed in the instructions.",
                },
            ]
            retries.append((index, retry))
    for (index, _), result in zip(
        retries, _generate(backend, states, retries, params), strict=True
    ):
        if result is None:
            continue
        problem = _accept_json(states[index], spec, result.text)
        if problem is not None:
            states[index].fail(
                ErrorCode.INVALID_OUTPUT,
                f"reply failed validation after a retry: {problem}; {_reply_size(result)}",
            )


def _accept_json(state: _Item, spec: TaskSpec, reply: str) -> str | None:
    """Store a valid extraction on the item; otherwise return what is wrong with it."""
    schema = spec.json_schema or {}
    try:
        value = parse_json_reply(reply)
    except ValueError as exc:
        return str(exc)
    value = conform(value, schema)
    errors = validate(value, schema)
    if errors:
        return "; ".join(errors[:5])
    if spec.required_phrases:
        said = [p for p in spec.required_phrases if value.get(p) is True]
        value = {"said": said, "missing": [p for p in spec.required_phrases if p not in said]}
    state.result_json = json.dumps(value, ensure_ascii=False)
    return None


def _run_classify(
    backend: LLMBackend, spec: TaskSpec, items: list[TaskInput], states: list[_Item]
) -> None:
    jobs = _whole_documents(
        backend, spec, items, states, lambda text: classify_messages(spec, text)
    )
    if not jobs:
        return
    labels = spec.labels
    started = time.perf_counter()
    convs = [conv for _, conv in jobs]
    scored = getattr(backend, "choose_scored", None)
    results: list[Any]
    if scored is not None:
        # (label, probability, Generation): the engine's own counts and time.
        results = _isolate(lambda c: scored(c, labels), convs)
    else:
        results = _isolate(lambda c: backend.choose(c, labels), convs)
    elapsed = time.perf_counter() - started
    # choose() returns labels only: the counts are those of the prompt the backend renders
    # and of the chosen label plus its end-of-turn token, as scored or generated.
    counts: list[tuple[int, int]] = []
    measured: list[float | None] = []
    for conv, result in zip(convs, results, strict=True):
        if isinstance(result, Exception):
            counts.append((0, 0))
            measured.append(0.0)
        elif isinstance(result, tuple):
            generation = result[2]
            counts.append((generation.input_tokens, generation.output_tokens))
            measured.append(generation.engine_s)
        else:
            counts.append(
                (backend.count_tokens(backend.render_chat(conv)), backend.count_tokens(result) + 1)
            )
            measured.append(None)
    _charge(states, jobs, counts, elapsed, None if None in measured else measured)
    for (index, _), result in zip(jobs, results, strict=True):
        label, score = result[:2] if isinstance(result, tuple) else (result, None)
        if isinstance(result, Exception):
            states[index].fail(
                ErrorCode.MODEL_ERROR, f"{type(result).__name__}: {result}"[:_ERROR_SNIPPET]
            )
        elif label not in labels:
            # Both backends guarantee membership; never let a broken engine write a new label.
            states[index].fail(
                ErrorCode.INVALID_OUTPUT,
                f"backend chose a label of {len(str(label))} characters, not one of {list(labels)}",
            )
        else:
            states[index].label, states[index].label_score = label, score


def _run_prompt(
    backend: LLMBackend, spec: TaskSpec, items: list[TaskInput], states: list[_Item]
) -> None:
    params = spec.free_text_params()
    fields = set(template_fields(spec.template or "")) - {"text"}
    jobs: list[_Job] = []
    for index, item in enumerate(items):
        missing = sorted(f for f in fields if f not in item.metadata)
        if missing:
            states[index].fail(
                ErrorCode.INVALID_INPUT, f"template fields without a value for this item: {missing}"
            )
            continue
        empty_meta = {f: item.metadata[f] for f in fields}
        overhead = _overhead(backend, prompt_messages(spec, "", empty_meta))
        if _fits(backend, spec, item.text, overhead):
            states[index].num_chunks = 1
            jobs.append((index, prompt_messages(spec, item.text, item.metadata)))
        else:
            _too_long(states[index], backend, spec, item.text, overhead)
    for (index, conv), result in zip(
        jobs, _generate_free(backend, states, jobs, params), strict=True
    ):
        text = _free_text(states[index], conv, result)
        if text is not None:
            states[index].result_text = text
