"""Recognizers that hold whatever Whisper made of a number: PCI-safe by construction.

The recognizers in ``workers.redact.speech`` name a number by its shape and cues (a Luhn-valid
card, 3-2-4 digit groups, "card number" close before it). Whisper does not keep shapes: it
drops and repeats digits, reads "219 09 9999" as "two hundred ninety zero nine thousand ...",
and loops ("$200,000, $10,000, $10,000, ..."). So these rules look at how many digits a run
says, and at nothing the model may have garbled:

- ``card_number`` chosen: any run of 12 or more digits, any run of 8 or more after a card cue
  (within 20 tokens), whatever its Luhn check and however it is split ("1-3-3-3",
  "4,111,111", "$10,000, $10,000", words and digits mixed, repeated), and any run of 5 or
  more right before the card's expiration date or security code is asked for.
- ``ssn`` or ``bank_account`` chosen: any run of 9 or more digits, and every number after an
  SSN, account or routing cue up to the end of its sentence when they say four digits or
  more in all (years, and amounts of money and round numbers under 9 digits, excepted: "the
  account balance is fifty dollars"); where the cue's sentence holds none, the other
  speaker's answer (its first sentence).
- The rest of a long number read over two turns of one speaker (within 15 s), whatever the
  first part was named: both parts together decide its type.
- A segment the worker marked ``degenerate`` (the decoder looped on every attempt) that holds
  digits: from its first digit to its end. What a loop says is no reading of anything, and its
  digits may be the secret's.

A run's digits come from ``workers.redact.numbers`` (text2num for spoken numbers); its type is
the nearest cue's among the chosen types, else what its length says.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from overnight.workers.redact.speech import (
    ANSWER_GAP_S,
    CARD_CONTEXT_WINDOW,
    TURN_GAP_S,
    Found,
    Token,
    asked_for_card_code,
    digit_runs,
    harmless_run,
    is_year,
    money_amount,
    nearest_cue,
    round_amounts,
    token_digits,
)

CARD_ANY = 12  # digits: a card number, wherever it is said
CARD_NEAR_CUE = 8  # digits after a card cue
LONG_NUMBER = 9  # digits: an SSN, an account or a routing number
# Digits read out right before the card's expiration date or security code is asked for.
CARD_BEFORE_ITS_CODE = 5
OTHER_NUMBERS = {"ssn", "phone", "bank_account", "date_of_birth"}
# The numeric types, in the order a run without a cue is given one (by its length below).
NUMERIC = ("card_number", "ssn", "bank_account", "phone")
# Cues after which every number up to the end of the sentence is the entity's.
SENTENCE_CUES = {
    "ssn": ("social", "ssn", "social security", "socials"),
    "bank_account": ("account", "routing", "iban", "sort code", "count number"),
}
_SENTENCE_END = (".", "?", "!")


def safe_entities(
    tokens: Sequence[Token], types: Collection[str], degenerate: Collection[int] = ()
) -> list[Found]:
    """Candidates of the chosen ``types`` only; ``degenerate``: the indices of the segments
    the worker marked degenerate."""
    if not set(types) & {"card_number", "ssn", "bank_account"}:
        return []
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    return [
        *_long_runs(tokens, keys, digits, types),
        *_after_cues(tokens, keys, digits, types),
        *_degenerate_segments(tokens, keys, digits, types, degenerate),
    ]


def _type_of(length: int, cues: dict[str, int], types: Collection[str]) -> str | None:
    """A long run's type: the nearest cue's among the chosen numeric types, else by length
    (a card is 12 digits or more, a phone number 10, an SSN 9)."""
    for cat in sorted(cues, key=cues.__getitem__):
        if cat in types and cat in NUMERIC:
            return cat
    by_length = (
        ("card_number", length >= CARD_ANY),
        ("phone", length in (10, 11)),
        ("ssn", length == LONG_NUMBER),
        ("bank_account", True),
        ("ssn", True),
        ("card_number", True),
    )
    return next((cat for cat, fits in by_length if fits and cat in types), None)


def _long_runs(
    tokens: Sequence[Token], keys: list[str], digits: list[str | None], types: Collection[str]
) -> list[Found]:
    found = []
    long_enough = LONG_NUMBER if {"ssn", "bank_account"} & set(types) else CARD_ANY
    # Per speaker, the last long number read out: (its digits, when it ended, its cues).
    read: dict[str, tuple[int, float, dict[str, int]]] = {}
    for run in digit_runs(tokens, digits):
        if harmless_run(tokens, keys, digits, run.tokens):
            continue
        n = len(run.digits)
        cues = nearest_cue(keys, run.tokens[0])
        opening = tokens[run.tokens[0]]
        earlier = read.get(opening.stream)
        if (
            earlier is not None
            and n >= 4
            and (opening.start_s or 0.0) - earlier[1] <= TURN_GAP_S
            and not money_amount(tokens, keys, run.tokens)
        ):
            # The rest of a number read over two turns ("It is <8 digits>." "Okay, go on."
            # "<8 more>."): what both say together decides its type.
            kind = _type_of(earlier[0] + n, earlier[2], types)
            if kind is not None:
                found.append(Found(kind, run.tokens, 0.7, "long-run"))
                continue
        if "card_number" in types and (
            n >= CARD_ANY
            or (n >= CARD_NEAR_CUE and "card_number" in cues)
            or (
                n >= CARD_BEFORE_ITS_CODE
                and not set(cues) & OTHER_NUMBERS  # an SSN or phone said before the code
                and asked_for_card_code(keys, run.tokens[-1] + 1)
            )
        ):
            found.append(Found("card_number", run.tokens, 0.9, "long-run"))
        elif n >= long_enough:
            kind = _type_of(n, cues, types)
            if kind is None:
                continue
            found.append(Found(kind, run.tokens, 0.8, "long-run"))
        else:
            continue
        read[opening.stream] = (n, tokens[run.tokens[-1]].end_s or 0.0, cues)
    return found


def _sentence_end(tokens: Sequence[Token], k: int) -> int:
    """The index after the last token of the sentence (within its segment) token ``k`` is in."""
    end = k
    while end < len(tokens) and tokens[end].seg == tokens[k].seg:
        end += 1
        if tokens[end - 1].word.rstrip('"”)').endswith(_SENTENCE_END):
            break
    return end


def _after_cues(
    tokens: Sequence[Token], keys: list[str], digits: list[str | None], types: Collection[str]
) -> list[Found]:
    found = []
    for kind, cues in SENTENCE_CUES.items():
        if kind not in types:
            continue
        for cue in cues:
            parts = cue.split()
            for j in range(len(keys) - len(parts) + 1):
                if keys[j : j + len(parts)] != parts:
                    continue
                start = j + len(parts)
                if start < len(tokens) and not tokens[start - 1].word.endswith(_SENTENCE_END):
                    pieces = _numbers(tokens, keys, digits, start, _sentence_end(tokens, start))
                else:
                    pieces = []
                if not pieces:
                    # The cue asked ("... your social security number?", its "?" lost or
                    # not): the number is in the other speaker's answer, its first sentence.
                    answer = _answer_start(tokens, j)
                    if answer is not None:
                        end = _sentence_end(tokens, answer)
                        pieces = _numbers(tokens, keys, digits, answer, end)
                # Four digits or more in all: fewer say no number anybody could use ("had this
                # account for twelve years, press one").
                if sum(said for said, _ in pieces) >= 4:
                    found += [Found(kind, p, 0.75, "after-cue") for _, p in pieces]
    return found


def _numbers(
    tokens: Sequence[Token], keys: list[str], digits: list[str | None], start: int, end: int
) -> list[tuple[int, tuple[int, ...]]]:
    """(digits said, tokens) of each number in tokens ``start..end-1``, leaving out years
    ("since 2015"), and amounts of money and round numbers ("for 20,000 years") under 9
    digits (a loop of them, "$200,000, $10,000, $10,000, ...", is longer)."""
    pieces, piece = [], []
    for i in range(start, end + 1):
        if i < end and digits[i] is not None:
            piece.append(i)
            continue
        said = sum(len(digits[p] or "") for p in piece)
        joined = "".join(digits[p] or "" for p in piece)
        if piece and not (
            (
                said < LONG_NUMBER
                and (money_amount(tokens, keys, piece) or round_amounts(tokens, digits, piece))
            )
            or is_year(joined)
            or harmless_run(tokens, keys, digits, piece)
        ):
            pieces.append((said, tuple(piece)))
        piece = []
    return pieces


def _answer_start(tokens: Sequence[Token], cue: int) -> int | None:
    """The first token of the other speaker's next segment (a one-voice call: the next
    segment) when it starts within ``ANSWER_GAP_S`` of the end of the cue's segment."""
    seg, stream = tokens[cue].seg, tokens[cue].stream
    last = max(i for i, t in enumerate(tokens) if t.seg == seg)
    for i in range(last + 1, len(tokens)):
        if tokens[i].seg != seg and (tokens[i].stream != stream or not stream):
            gap = (tokens[i].start_s or 0.0) - (tokens[last].end_s or 0.0)
            return i if gap <= ANSWER_GAP_S else None
    return None


def _degenerate_segments(
    tokens: Sequence[Token],
    keys: list[str],
    digits: list[str | None],
    types: Collection[str],
    degenerate: Collection[int],
) -> list[Found]:
    found = []
    for seg in sorted(set(degenerate)):
        idx = [i for i, t in enumerate(tokens) if t.seg == seg]
        first = next((i for i in idx if digits[i]), None)
        if first is None:
            continue
        said = sum(len(digits[i] or "") for i in idx)
        kind = _type_of(said, nearest_cue(keys, first, CARD_CONTEXT_WINDOW), types)
        if kind is not None:
            found.append(Found(kind, tuple(i for i in idx if i >= first), 0.7, "degenerate"))
    return found
