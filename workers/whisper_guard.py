"""Degenerate decodes: text a model batch wrote that no speech says, found and cut.

Whisper, greedy or beam-searched, sometimes falls into a loop: "$10,000, $10,000, ..." to the
token limit, or "free free free ...". faster-whisper's sequential ``transcribe`` catches most of
these with a temperature fallback (a decode whose text compresses too well is sampled again
at rising temperatures); its ``BatchedInferencePipeline``, whose forward pass the worker
batches across recordings, decodes once at temperature 0 and keeps whatever comes out. The
worker's batches therefore loop where the sequential path does not. ``workers.whisper`` runs
this check on every chunk of every model batch and decodes the chunks that fail again, the way
the sequential path does (``FALLBACK_TEMPERATURES``, best of ``BEST_OF`` samples each), the
batch-mates that need it batched together. A chunk that still fails keeps its best attempt with
the repetition cut, and its segments say so (``degenerate``).

A decode fails when any of these holds (``check``):

- its text compresses better than ``COMPRESSION_RATIO_THRESHOLD`` (zlib, as faster-whisper and
  OpenAI's Whisper measure it);
- a run of words repeats back to back more than speech does (``repeated_run``);
- it has more tokens than the chunk's speech can hold (``MAX_TOKENS_PER_SPEECH_S`` a second of
  speech, plus ``TOKEN_SLACK``).

Light on purpose (no model): the benchmark scores plain faster-whisper's text with the same
``looks_degenerate`` as the job's.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

COMPRESSION_RATIO_THRESHOLD = 2.4
# The sequential transcribe's temperatures after 0 and its samples per temperature.
FALLBACK_TEMPERATURES = (0.2, 0.4, 0.6, 0.8, 1.0)
BEST_OF = 5
# Whisper tokens a second of speech can hold. Measured on the loop benchmark's corpus
# (scripts/number_speech.py, seed 100, 182 recordings; not the seed the README reports on):
# the decodes of faster-whisper's sequential and batched transcribe that do not loop reach
# 6.2 and 8.3 tokens a second of speech at most (median 2.8: digits read fast, each "-3" of
# "1-3-3-3" a token of its own); loops that run to the token limit reach 15-67. Half as much
# again as the fastest clean decode leaves room for every way of writing numbers.
MAX_TOKENS_PER_SPEECH_S = 12.0
TOKEN_SLACK = 16  # short chunks: a few words in under a second are not a loop

# A repetition is a run of pieces (words, and the parts of "1-3-3-3" or "200,000,000") said
# back to back at least this many times, by length of the repeated unit: one word ten times,
# two words five times, three four, longer units three times. One digit may be said more
# often: a card number read digit by digit ("4-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1", the test card
# every agent knows) holds up to 18 of one digit in a row.
_MIN_REPEATS = {1: 10, 2: 5, 3: 4}
_MIN_REPEATS_LONGER = 3
_MIN_REPEATS_DIGIT = 19
_MAX_UNIT = 12  # words in the longest repeated unit looked for

_PIECE = re.compile(r"[\w']+")


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class Repetition:
    start: int  # index of the run's first piece
    unit: int  # pieces in the repeated unit
    repeats: int  # times the unit is said back to back

    @property
    def end(self) -> int:  # index after the run's last piece
        return self.start + self.unit * self.repeats


def repeated_run(pieces: list[str]) -> Repetition | None:
    """The longest back-to-back repetition of a unit of pieces that is more than speech
    does (``_MIN_REPEATS``); None when there is none."""
    best: Repetition | None = None
    n = len(pieces)
    for unit in range(1, min(_MAX_UNIT, n // 2) + 1):
        need = _MIN_REPEATS.get(unit, _MIN_REPEATS_LONGER)
        if unit * need > n:
            break
        i = 0
        while i + unit <= n:
            if _periodic(pieces[i : i + unit]):  # "1 1" is "1" twice: its run is the unit 1's
                i += 1
                continue
            repeats = 1
            while (
                i + (repeats + 1) * unit <= n
                and pieces[i + repeats * unit : i + (repeats + 1) * unit] == pieces[i : i + unit]
            ):
                repeats += 1
            one_digit = unit == 1 and len(pieces[i]) == 1 and pieces[i].isdigit()
            if repeats >= (_MIN_REPEATS_DIGIT if one_digit else need):
                found = Repetition(i, unit, repeats)
                if best is None or found.unit * found.repeats > best.unit * best.repeats:
                    best = found
                i += unit * repeats
            else:
                i += 1
    return best


def _periodic(unit: list[str]) -> bool:
    n = len(unit)
    return any(n % p == 0 and unit == unit[:p] * (n // p) for p in range(1, n))


def _pieces(text: str) -> list[re.Match[str]]:
    return list(_PIECE.finditer(text.lower()))


def token_cap(speech_s: float) -> int:
    """The most tokens a decode of ``speech_s`` seconds of speech may have."""
    return int(MAX_TOKENS_PER_SPEECH_S * max(speech_s, 0.0) + TOKEN_SLACK)


def check(text: str, tokens: int | None, speech_s: float) -> str | None:
    """Why a chunk's decode is degenerate ("compression", "repetition", "too_many_tokens"),
    or None. ``tokens``: the decode's token count (None: counted from the text, about 1.3
    pieces a word); ``speech_s``: the seconds of speech the chunk holds."""
    text = text.strip()
    if not text:
        return None
    if compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD:
        return "compression"
    pieces = [m.group(0) for m in _pieces(text)]
    if repeated_run(pieces) is not None:
        return "repetition"
    count = tokens if tokens is not None else round(len(pieces) * 1.3)
    if count > token_cap(speech_s):
        return "too_many_tokens"
    return None


def looks_degenerate(text: str, speech_s: float) -> bool:
    """``check`` on text alone (the benchmark applies it to any transcript)."""
    return check(text, None, speech_s) is not None


def cut_repetition(text: str) -> str:
    """``text`` with every back-to-back repetition (``repeated_run``) said once: "It is
    $200,000, $10,000, $10,000, ... $10,000." becomes "It is $200,000, $10,000." The text
    after a run, if the decode found its way out of the loop, stays."""
    while True:
        found = _pieces(text)
        pieces = [m.group(0) for m in found]
        run = repeated_run(pieces)
        if run is None:
            return text
        unit = run.unit
        # Start the run where a written word starts ("$10,000, $10,000" repeats "10 000", not
        # "000 10"), and take it over a last, partial unit ("... $10,000, $10").
        start = next(
            (
                s
                for s in range(run.start, run.start + unit)
                if not re.search(
                    r"\w", text[_word_start(text, found[s].start()) : found[s].start()]
                )
            ),
            run.start,
        )
        end = start
        while end < len(pieces) and pieces[end] == pieces[start + (end - start) % unit]:
            end += 1
        # Keep the first unit to the end of its written word ("$10,000," not "$10") unless
        # that word holds the repetition itself ("1-3-3-3-3").
        keep_to = found[start + unit - 1].end()
        word_end = _word_end(text, keep_to)
        if word_end <= found[start + unit].start():
            keep_to = word_end
        head = text[:keep_to].rstrip(" ,;")
        if end >= len(found):  # the loop ran to the end: keep the sentence's closing mark
            text = head + text[found[-1].end() :].strip(" ,;")
        else:
            resume = max(_word_start(text, found[end].start()), keep_to)
            text = head + " " + text[resume:].lstrip(" ,;")


def _word_end(text: str, i: int) -> int:
    """The end of the whitespace-delimited word that character ``i - 1`` is in."""
    while i < len(text) and not text[i].isspace():
        i += 1
    return i


def _word_start(text: str, i: int) -> int:
    while i > 0 and not text[i - 1].isspace():
        i -= 1
    return i
