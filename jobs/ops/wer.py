"""The one word error rate: tests, benchmarks, the demo and ``overnight tune`` all score with it.

Whisper's English text normaliser (``whisper-normalizer``, the one OpenAI published with
Whisper's paper) lower-cases, strips punctuation, spells British words the American way and
writes numbers and currency as digits ("fifty dollars" and "$50" both become "$50"), so that a
transcript is not charged for spelling what it heard differently. jiwer counts the word edits
(substitutions + deletions + insertions, a minimum edit alignment in C++ through RapidFuzz:
9 ms on a 3,000-word pair where a pure-Python edit distance took seconds).

It lives in ``jobs/`` because no worker scores itself: jobs (tune, demo), scripts and tests
import it, and none of them may be imported by a worker.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping


def _missing(exc: ImportError) -> Exception:
    from overnight.jobs.preflight import extra_missing

    return extra_missing("eval", "the word error rate (jobs.ops.wer)", missing=[str(exc.name)])


@functools.cache
def _normaliser() -> Callable[[str], str]:
    # Built once: it loads its British-to-American spelling table from a JSON file.
    try:
        from whisper_normalizer.english import EnglishTextNormalizer
    except ImportError as exc:
        raise _missing(exc) from None

    return EnglishTextNormalizer()


def normalize(text: str) -> str:
    """``text`` as Whisper's English normaliser writes it (the words the WER compares)."""
    return _normaliser()(text)


def words(text: str) -> list[str]:
    return normalize(text).split()


def word_errors(references: list[str], hypotheses: list[str]) -> tuple[int, int]:
    """(word edits, reference words) summed over aligned pairs of texts, after normalising."""
    try:
        import jiwer
    except ImportError as exc:
        raise _missing(exc) from None

    if not references:
        return 0, 0
    out = jiwer.process_words(
        [normalize(r) for r in references], [normalize(h) for h in hypotheses]
    )
    edits = out.substitutions + out.deletions + out.insertions
    return edits, out.hits + out.substitutions + out.deletions


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one transcript; an empty reference scores 1.0 against any words."""
    edits, n = word_errors([reference], [hypothesis])
    return edits / n if n else float(edits > 0)


def corpus_wer(
    references: Mapping[str, str], hypotheses: Mapping[str, str]
) -> tuple[float | None, int]:
    """All word edits / all reference words over the items that have a reference, and how
    many items that is. An item with a reference but no transcript (it failed) counts as all
    its words deleted."""
    keys = list(references)
    edits, n = word_errors([references[k] for k in keys], [hypotheses.get(k, "") for k in keys])
    return (edits / n if n else None), len(keys)
