"""The digits each Whisper word says: numbers normalized before any recognizer looks at them.

Spoken numbers go through a maintained inverse-text-normalization library, ``text2num``
(``text_to_num.find_numbers``, Rust core): it reads a token stream ("four thousand five hundred
thirty nine", "twenty twenty six", "zero zero one two") and says which tokens make which number,
so every digit keeps its map back to the words, characters and times it came from. What it
leaves to its callers is done here, on top:

- written numbers in any shape Whisper writes them: "4,111", "$10,000,", "1-3-3-3", "09/27",
  "3rd", "i0217940" (a word glued onto a number);
- spoken forms text2num does not read: "oh" for zero next to other digits, "double five",
  "triple three", and hyphen-joined words ("41-double-four", "forty-five").

A token that belongs to a number but holds none of its digits ("thousand" in "four thousand
five hundred", "double", "and") says "" (part of the run, no digits); a token that is no number
says None.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from text_to_num import find_numbers

UNITS = {
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
TEENS = {
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "thirteen": "13",
    "fourteen": "14",
    "fifteen": "15",
    "sixteen": "16",
    "seventeen": "17",
    "eighteen": "18",
    "nineteen": "19",
}
TENS = {
    "twenty": "2",
    "thirty": "3",
    "forty": "4",
    "fifty": "5",
    "sixty": "6",
    "seventy": "7",
    "eighty": "8",
    "ninety": "9",
}
ZEROS = {"oh", "o"}  # a zero only next to other digits: "oh nine", not "oh, I see"
REPEAT = {"double": 2, "triple": 3}

# Written digits, with the separators, currency and suffixes Whisper puts around them.
_WRITTEN = re.compile(r"[$€£#]?[\d,.\-/:()]*\d[\d,.\-/:()]*(?:st|nd|rd|th|s|%)?")
_GLUED = re.compile(r"[a-z]{1,2}\d{4,}")  # "import i0217940": Whisper glued a word on


class Keyed(Protocol):
    @property
    def key(self) -> str: ...


class _Word:
    """A token as text2num reads it (its ``Token`` protocol)."""

    def __init__(self, key: str):
        self._key = key

    def text(self) -> str:
        return self._key

    def nt_separated(self, previous: _Word) -> bool:
        return False

    def not_a_number_part(self) -> bool:
        return False


def token_digits(tokens: Sequence[Keyed]) -> list[str | None]:
    """The digits each token says (see the module's docstring): "4,111" → "4111",
    "four thousand five hundred thirty nine" → "4539", "", "", "", "", "" (the first token
    holds the number), "oh nine" → "0", "9", "double five" → "", "55"."""
    keys = [t.key.strip("-–") for t in tokens]
    out: list[str | None] = [None] * len(keys)
    for i, k in enumerate(keys):
        if _WRITTEN.fullmatch(k) or _GLUED.fullmatch(k):
            out[i] = re.sub(r"\D", "", k)
        elif "-" in k.strip("-") or "–" in k:
            out[i] = _hyphenated(k)
    # Spoken numbers, by text2num, over the tokens that hold no written number.
    spoken = [k if out[i] is None else "," for i, k in enumerate(keys)]
    for occ in find_numbers([_Word(k) for k in spoken], "en", 0.0):
        digits = re.sub(r"\D", "", occ.text)
        if not digits or any(out[j] is not None for j in range(occ.start, occ.end)):
            continue
        out[occ.start] = digits
        for j in range(occ.start + 1, occ.end):
            out[j] = ""
    for i, k in enumerate(keys):
        if k in ZEROS and out[i] is None:
            near = [out[j] for j in (i - 1, i + 1) if 0 <= j < len(keys)]
            if any(d for d in near):
                out[i] = "0"
        if k in REPEAT and i + 1 < len(keys):
            nxt = out[i + 1] if out[i + 1] is not None else UNITS.get(keys[i + 1])
            if nxt is not None and len(nxt) == 1:
                out[i] = ""  # "double" is part of the run; its digits go on the next token
                out[i + 1] = nxt * REPEAT[k]
    return out


def _hyphenated(key: str) -> str | None:
    """A token Whisper joined with hyphens, each part a digit: "41-double-four" → "4144",
    "one-two-three" → "123", "forty-five" → "45"; None when a part is not a digit."""
    parts = [p for p in re.split(r"[-–]", key) if p]
    digits, repeat = "", 1
    for k, part in enumerate(parts):
        if part in REPEAT:
            repeat = REPEAT[part]
            continue
        if part.isdigit():
            d = part
        elif part in TENS:  # "forty-five": the unit follows; "forty" alone is 40
            unit = parts[k + 1] if k + 1 < len(parts) else ""
            d = TENS[part] if unit in UNITS and unit != "zero" else TENS[part] + "0"
        elif part in UNITS:
            d = UNITS[part]
        elif part in ZEROS:
            d = "0"
        elif part in TEENS:
            d = TEENS[part]
        else:
            return None
        digits += d * repeat if len(d) == 1 else d
        repeat = 1
    return digits or None


def text_digits(text: str) -> str:
    """Every digit ``text`` says, written or spoken, in order: what a reader of the text
    learns of the numbers in it (the redaction evaluation's leak check)."""

    class _T:
        def __init__(self, word: str):
            self.key = word.lower().strip('.,;:!?"()[]')

    return "".join(d for d in token_digits([_T(w) for w in text.split()]) if d)
