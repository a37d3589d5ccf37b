"""The contract between the text-generation engines and their users: what a backend offers
(:class:`LLMBackend`), what a call asks for (:class:`GenerationParams`) and returns
(:class:`Generation`), and the helpers both backends share.

The backends (``ct2_backend``, ``vllm_backend``) and the tasks import this module;
``adapter`` loads a backend. Nothing here imports an engine or another module of ours, so the
backends never import the module that loads them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args, runtime_checkable

# The engines ``adapter.load_backend`` loads: the one list the spec and the command line read.
Backend = Literal["ctranslate2", "vllm"]
BACKENDS: tuple[str, ...] = get_args(Backend)
DEFAULT_VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# Generation.finish_reason values.
FINISH_STOP = "stop"  # the model ended its turn
FINISH_LENGTH = "length"  # max_new_tokens (or the context) cut it off
FINISH_CONTEXT_EXCEEDED = "context_exceeded"  # the prompt alone does not fit; nothing ran


class EngineUnavailable(RuntimeError):
    """An inference engine or model cannot be used here; the message says what to install."""


class BackendConfigError(ValueError):
    """An option given to :func:`load_backend` is invalid; the message names it and the fix."""


@dataclass(frozen=True)
class GenerationParams:
    """What to generate for every conversation of one ``generate`` call.

    ``json_schema``: the reply must be a JSON value matching it. vLLM enforces it while
    decoding; CTranslate2 has no constrained decoding, so the caller validates (and
    retries). ``choices``: the reply is exactly one of these strings on both backends.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    json_schema: dict[str, Any] | None = None
    choices: tuple[str, ...] | None = None
    # Above 1, tokens already in the prompt or the reply become less likely: free-text tasks
    # set it so that a small model does not repeat one sentence until the token cap.
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise BackendConfigError(
                f"max_new_tokens={self.max_new_tokens!r}: must be a positive integer"
            )
        if self.temperature < 0:
            raise BackendConfigError(f"temperature={self.temperature!r}: must be >= 0")
        if self.repetition_penalty <= 0:
            raise BackendConfigError(
                f"repetition_penalty={self.repetition_penalty!r}: must be positive"
            )
        if self.json_schema is not None and self.choices is not None:
            raise BackendConfigError("json_schema and choices are exclusive: set one of them")
        if self.json_schema is not None:
            # Never share (or mutate) the caller's dict.
            object.__setattr__(self, "json_schema", copy.deepcopy(dict(self.json_schema)))
        if self.choices is not None:
            choices = tuple(self.choices)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise BackendConfigError(
                    f"choices={self.choices!r}: must be a non-empty sequence of non-empty strings"
                )
            if len(set(choices)) != len(choices):
                raise BackendConfigError(f"choices={choices!r}: labels must be distinct")
            object.__setattr__(self, "choices", choices)


@dataclass(frozen=True)
class Generation:
    """One reply. Token counts are the engine's own counts (prompt after the chat template;
    generated tokens including the end-of-turn token when the model produced one)."""

    text: str
    input_tokens: int
    output_tokens: int
    finish_reason: str
    # The engine's busy time that this reply's share comes to, where the engine runs the
    # requests of several calls at once (vLLM): the wall time of one call would count the
    # time it shared with the others again. None: apportion the call's wall time.
    engine_s: float | None = None


@runtime_checkable
class LLMBackend(Protocol):
    name: str  # "ctranslate2" | "vllm"
    model_id: str  # provenance: what was loaded, recorded on every row
    context_length: int  # prompt + generated tokens the model accepts
    # Document tokens per model call at most, below what the context allows (None: no cap).
    max_chunk_tokens: int | None
    device: str  # "cpu" | "cuda"
    # True when json_schema/choices constrain decoding itself (vLLM); False when replies are
    # generated freely and only validated afterwards (CTranslate2), so a retry can help.
    structured_outputs: bool

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` as the model sees it (no special tokens added)."""
        ...

    def split_by_tokens(self, text: str, max_tokens: int) -> list[str]:
        """Consecutive pieces of ``text`` of at most ``max_tokens`` tokens each; their
        concatenation is ``text``. Cuts fall on token boundaries, preferably after a line
        or sentence end."""
        ...

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt the model's own chat template makes of ``messages``, ready for the
        assistant's reply."""
        ...

    def generate(
        self, conversations: list[list[dict[str, str]]], params: GenerationParams
    ) -> list[Generation]:
        """One reply per conversation, same length and order, run as one batch."""
        ...

    def choose(
        self, conversations: list[list[dict[str, str]]], choices: Sequence[str]
    ) -> list[str]:
        """The most likely of ``choices`` as the reply to each conversation; always a member."""
        ...


def split_on_offsets(
    text: str,
    starts: Sequence[int],
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> list[str]:
    """Split ``text`` into pieces of at most ``max_tokens`` tokens.

    ``starts`` are the character offsets where each token begins. A cut goes before a token
    start; within the last fifth of a window it prefers the position right after a newline
    or a sentence end. Each piece is re-counted, because tokenizing a piece on its own can
    differ at its edges from tokenizing the whole text.
    """
    if max_tokens < 1:
        raise BackendConfigError(f"max_tokens={max_tokens}: must be >= 1")
    n = len(starts)
    if n <= max_tokens:
        return [text] if text else []
    pieces: list[str] = []
    first = 0
    lookback = max(1, max_tokens // 5)
    while first < n:
        window = max_tokens
        while True:
            end = min(first + window, n)
            if end < n:
                for cut in range(end, max(first + 1, end - lookback) - 1, -1):
                    before = text[starts[cut - 1] : starts[cut]]
                    if "\n" in before or before.rstrip().endswith((".", "?", "!")):
                        end = cut
                        break
            lo = starts[first] if first > 0 else 0
            hi = starts[end] if end < n else len(text)
            piece = text[lo:hi]
            if window == 1 or count_tokens(piece) <= max_tokens:
                break
            window -= max(1, count_tokens(piece) - max_tokens)
        pieces.append(piece)
        first = end
    return pieces
