"""The redaction contract: ``Redactor(types).redact(row)`` on a transcripts row.

What changes, and how (one rule for text, segments and words, so they agree):

- Each entity is replaced by one tag, ``[CARD_NUMBER]``, in the row's ``text`` and in the
  text of every segment it touches (a number over two turns: one tag in each turn's segment,
  the other speaker's words between them untouched). In ``text`` the pieces of one entity
  with nothing but spaces and punctuation between them (two segments of one speaker's line)
  are one tag. Sentence punctuation after the last word of an entity stays ("... expires
  [EXPIRY].").
- Entities are found over the whole call's words, not per segment or speaker: a number's
  digit words right next to it in the next (or previous) segment of another speaker are
  its own (``extend_over_speaker_changes``): diarization assigns a word by its timestamp,
  and Whisper's timestamp of a number's last word may fall in the next speaker's turn.
- In ``segments[].words`` the words of an entity collapse into one word, the tag, timed from
  the first word's start to the last word's end (probability: the lowest of them); the other
  words are removed, not left empty, so a count of the redacted words sees one word per
  entity. ``analytics`` (talk time, words, words per minute) are not these: the Whisper worker
  computes them from the words as spoken, before redaction, on split-channel and diarized rows
  alike, so a read-out number counts its digit words there (how long and how fast one spoke).
- ``entities``: type, ``start_char``/``end_char`` in the original text (from the first word's
  start to the last one's end), ``start_s``/``end_s`` from the word timings (segment timings
  when the row has no words), and the recognizer's score.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from overnight.workers.redact.numbers import token_digits
from overnight.workers.redact.presidio import presidio_spans
from overnight.workers.redact.safe import safe_entities
from overnight.workers.redact.speech import RUN_GLUE, Found, Token, speech_entities
from overnight.workers.redact.types import resolve_types, tag

_KEEP_AFTER = ",.?!;:"


@dataclass(frozen=True)
class Entity:
    type: str
    start_char: int
    end_char: int
    start_s: float | None
    end_s: float | None
    score: float

    def record(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "start_char": self.start_char,
            "end_char": self.end_char,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "score": round(self.score, 4),
        }


@dataclass(frozen=True)
class _Tok:
    token: Token
    lo: int | None  # in its segment's text
    hi: int | None


def tokenize(
    text: str, segments: Sequence[Mapping[str, Any]]
) -> tuple[list[_Tok], list[int | None]]:
    """Tokens in call order (segment order), and each segment's offset in ``text``."""
    toks: list[_Tok] = []
    bases: list[int | None] = []
    cursor = 0
    for si, seg in enumerate(segments):
        st = seg.get("text") or ""
        base = text.find(st, cursor) if st else -1
        bases.append(base if base >= 0 else None)
        if base >= 0:
            cursor = base + len(st)
        stream = str(seg.get("speaker") or (f"ch{seg['channel']}" if seg.get("channel") else ""))
        words = seg.get("words")
        if words:
            items = [(w["word"], w.get("start"), w.get("end")) for w in words]
        else:
            items = [(w, seg.get("start"), seg.get("end")) for w in st.split()]
        at = 0
        for wi, (word, start, end) in enumerate(items):
            word = (word or "").strip()
            lo = st.find(word, at) if word else -1
            if lo >= 0:
                at = lo + len(word)
            b = bases[-1]
            toks.append(
                _Tok(
                    Token(
                        word=word,
                        seg=si,
                        index=wi,
                        char_start=(b + lo) if (b is not None and lo >= 0) else -1,
                        char_end=(b + lo + len(word)) if (b is not None and lo >= 0) else -1,
                        start_s=start,
                        end_s=end,
                        stream=stream,
                    ),
                    lo if lo >= 0 else None,
                    lo + len(word) if lo >= 0 else None,
                )
            )
    return toks, bases


def _merge_same_type(found: Iterable[Found]) -> list[Found]:
    """Candidates of one type that share tokens become one (a number's first turn found by
    the answer rule, both turns by the digit run)."""
    merged: list[Found] = []
    for f in sorted(found, key=lambda f: (f.type, f.tokens[0] if f.tokens else 0)):
        last = merged[-1] if merged else None
        if last is not None and last.type == f.type and set(last.tokens) & set(f.tokens):
            tokens = tuple(sorted(set(last.tokens) | set(f.tokens)))
            merged[-1] = Found(f.type, tokens, max(last.score, f.score), last.source)
        else:
            merged.append(f)
    return merged


def _choose(found: Iterable[Found]) -> list[Found]:
    """Overlapping candidates: of one type they merge; else the longer span wins, then the
    higher score."""
    found = _merge_same_type(found)
    taken: set[int] = set()
    chosen = []
    for f in sorted(
        found, key=lambda f: (-len(f.tokens), -f.score, f.tokens[0] if f.tokens else 0)
    ):
        if not f.tokens or taken.intersection(f.tokens):
            continue
        taken.update(f.tokens)
        chosen.append(f)
    return sorted(chosen, key=lambda f: f.tokens[0])


def extend_over_speaker_changes(chosen: Sequence[Found], tokens: Sequence[Token]) -> list[Found]:
    """Each entity that ends (starts) with a digit word, grown by the digit words that follow
    (precede) it across a speaker change: the start (end) of the other speaker's segment,
    spoken separators between digits included, up to the first other word.

    The recognizers join digits per speaker, so a number stops where the speaker changes. On
    a diarized mono call a speaker change is an estimate: each word goes to the speaker whose
    turn its timestamp overlaps, and Whisper's timestamp of a number's last word (often its
    first or last digit) can lie past the turn's end ("6, 7, 8," | "9. Great, ..."). What
    the caller was reading does not stop there. Words another entity holds stay its own; an
    entity of the same type right there across the change is the same number (the first
    digits in the asker's turn), and the two become one."""
    if not chosen:
        return []
    digits = token_digits(tokens)
    taken = {i for f in chosen for i in f.tokens}
    out = []
    for f in chosen:
        grown = set(f.tokens)
        for edge, step in ((max(f.tokens), 1), (min(f.tokens), -1)):
            grown.update(_digits_across(tokens, digits, edge, step, taken))
        taken |= grown
        out.append(
            f
            if len(grown) == len(f.tokens)
            else Found(f.type, tuple(sorted(grown)), f.score, f.source)
        )
    joined: list[Found] = []
    for f in sorted(out, key=lambda f: f.tokens[0]):
        last = joined[-1] if joined else None
        if last is not None and last.type == f.type and _adjoin(tokens, digits, last, f):
            tokens_ = tuple(sorted({*last.tokens, *f.tokens}))
            joined[-1] = Found(f.type, tokens_, max(last.score, f.score), last.source)
        else:
            joined.append(f)
    return joined


def _adjoin(tokens: Sequence[Token], digits: Sequence[str | None], a: Found, b: Found) -> bool:
    """Whether ``b`` starts right after ``a`` across a speaker change, digit to digit, with
    at most two spoken separators between."""
    end, start = max(a.tokens), min(b.tokens)
    between = range(end + 1, start)
    return (
        end < start
        and digits[end] is not None
        and digits[start] is not None
        and tokens[end].stream != tokens[start].stream
        and len(between) <= 2
        and all(tokens[i].key in RUN_GLUE | {""} for i in between)
    )


def _digits_across(
    tokens: Sequence[Token],
    digits: Sequence[str | None],
    edge: int,
    step: int,
    taken: Collection[int],
) -> list[int]:
    """The digit words (and separators between them) from ``edge + step`` on in direction
    ``step``, when ``edge`` is a digit word and that next word is another speaker's."""
    first = edge + step
    if digits[edge] is None or not 0 <= first < len(tokens):
        return []
    if tokens[first].stream == tokens[edge].stream or tokens[first].seg == tokens[edge].seg:
        return []
    found: list[int] = []
    pending: list[int] = []
    j = first
    while 0 <= j < len(tokens) and tokens[j].seg == tokens[first].seg and j not in taken:
        if digits[j] is not None:
            found += [*pending, j]
            pending = []
        elif tokens[j].key in RUN_GLUE | {""} and len(pending) < 2:
            pending.append(j)
        else:
            break
        j += step
    return found


class Redactor:
    """Finds the chosen entity types in a transcripts row and replaces them by tags.

    types: type names and presets (``workers.redact.types``); unknown ones raise
    ``RedactionConfigError`` here, before any row.
    """

    def __init__(self, types: Iterable[str]):
        self.types = resolve_types(types)

    def find(
        self, text: str, toks: Sequence[_Tok], degenerate: Collection[int] = ()
    ) -> list[Found]:
        """Entities of the chosen types; ``degenerate``: indices of the segments the worker
        marked degenerate (``workers.redact.safe``)."""
        tokens = [t.token for t in toks]
        found = [f for f in speech_entities(tokens) if f.type in self.types]
        found += safe_entities(tokens, self.types, degenerate)
        for kind, start, end, score in presidio_spans(text, self.types):
            covered = tuple(
                i
                for i, t in enumerate(tokens)
                if t.char_start >= 0 and t.char_start < end and t.char_end > start
            )
            if covered:
                found.append(Found(kind, covered, score, "presidio"))
        return extend_over_speaker_changes(_choose(found), tokens)

    def redact(self, row: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(``{"text", "segments"}`` redacted, the entities found). The row is not changed."""
        text = row.get("text") or ""
        segments = copy.deepcopy(list(row.get("segments") or []))
        if not text and not segments:
            return {"text": row.get("text"), "segments": row.get("segments")}, []
        if not segments:  # text without segments: one pseudo-segment over it
            segments = [{"text": text, "start": None, "end": None, "words": None}]
            only_text = True
        else:
            only_text = False
        toks, bases = tokenize(text, segments)
        entities: list[Entity] = []
        text_edits: list[tuple[int, int, str]] = []  # row text: (lo, hi, tag)
        seg_edits: dict[int, list[tuple[int, int, str]]] = {}
        word_edits: dict[int, list[tuple[list[int], str, float | None]]] = {}
        degenerate = {si for si, seg in enumerate(segments) if seg.get("degenerate")}
        for f in self.find(text, toks, degenerate):
            label = tag(f.type)
            members = [toks[i] for i in f.tokens]
            in_text: list[tuple[int, int, str]] = []  # this entity's pieces in the row text
            pieces: dict[int, list[_Tok]] = {}
            for t in members:
                pieces.setdefault(t.token.seg, []).append(t)
            for si, piece in pieces.items():
                located = [t for t in piece if t.lo is not None and t.hi is not None]
                if located:
                    lo = min(t.lo for t in located if t.lo is not None)
                    hi = max(t.hi for t in located if t.hi is not None)
                    last = max(located, key=lambda t: t.hi or 0).token.word
                    if last[-1:] in _KEEP_AFTER and hi - lo > 1:
                        hi -= 1
                    seg_edits.setdefault(si, []).append((lo, hi, label))
                    base = bases[si]
                    if base is not None:
                        in_text.append((base + lo, base + hi, label))
                # A degenerate segment's words are what was left of a loop, not a timing of
                # the speech: its tag runs to the segment's end, where the number may still be.
                until = segments[si].get("end") if f.source == "degenerate" else None
                word_edits.setdefault(si, []).append(([t.token.index for t in piece], label, until))
            text_edits += _joined(text, in_text)
            starts = [t.token.char_start for t in members if t.token.char_start >= 0]
            ends = [t.token.char_end for t in members if t.token.char_end >= 0]
            times_a = [t.token.start_s for t in members if t.token.start_s is not None]
            times_b = [t.token.end_s for t in members if t.token.end_s is not None]
            if f.source == "degenerate":
                times_b += [segments[t.token.seg].get("end") for t in members[-1:]]
                times_b = [x for x in times_b if x is not None]
            entities.append(
                Entity(
                    f.type,
                    min(starts) if starts else -1,
                    max(ends) if ends else -1,
                    round(min(times_a), 3) if times_a else None,
                    round(max(times_b), 3) if times_b else None,
                    f.score,
                )
            )
        new_text = _apply(text, text_edits)
        for si, seg in enumerate(segments):
            if si in seg_edits:
                seg["text"] = _apply(seg.get("text") or "", seg_edits[si])
                if bases[si] is None:  # not found in the row text: replace its old text there
                    new_text = new_text.replace(segments_text(row, si), seg["text"])
            if si in word_edits and seg.get("words"):
                seg["words"] = _collapse(seg["words"], word_edits[si])
        out_segments = [] if only_text else segments
        if only_text:
            new_text = segments[0]["text"]
        if not row.get("segments"):
            out_segments = row.get("segments")  # type: ignore[assignment]
        return {"text": new_text, "segments": out_segments}, [e.record() for e in entities]


def segments_text(row: Mapping[str, Any], si: int) -> str:
    return (row.get("segments") or [])[si].get("text") or ""


def _joined(text: str, pieces: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """One entity's pieces in the row text, those with only spaces and punctuation between
    them (two segments of one speaker's line) joined into one."""
    out: list[tuple[int, int, str]] = []
    for lo, hi, label in sorted(pieces):
        if out and not text[out[-1][1] : lo].strip(_KEEP_AFTER + " "):
            out[-1] = (out[-1][0], max(hi, out[-1][1]), label)
        else:
            out.append((lo, hi, label))
    return out


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Replace char ranges by tags, right to left; ranges that overlap merge into the first."""
    out = text
    last_lo = len(text) + 1
    for lo, hi, label in sorted(edits, reverse=True):
        if hi > last_lo:
            hi = last_lo
        if hi <= lo:
            continue
        out = out[:lo] + label + out[hi:]
        last_lo = lo
    return out


def _collapse(
    words: list[dict[str, Any]], edits: list[tuple[list[int], str, float | None]]
) -> list[dict[str, Any]]:
    drop: set[int] = set()
    replace: dict[int, dict[str, Any]] = {}
    for indices, label, until in edits:
        indices = sorted(i for i in indices if i < len(words))
        if not indices:
            continue
        first, last = words[indices[0]], words[indices[-1]]
        probs = [
            float(words[i]["probability"])
            for i in indices
            if words[i].get("probability") is not None
        ]
        replace[indices[0]] = {
            "word": label,
            "start": first.get("start"),
            "end": max(last.get("end") or 0.0, until) if until is not None else last.get("end"),
            "probability": min(probs) if probs else None,
        }
        drop.update(indices[1:])
    return [replace.get(i, w) for i, w in enumerate(words) if i not in drop]
