"""Recognizers for how entities come out of Whisper: ours, on the words it wrote.

Whisper writes a spoken card number in many ways: "4111 1111 ...", "4,111,111,...",
"4-1-1-1-...", "four one one one", "double five", "oh nine"; a long number may run over two
segments, or over two turns of the same speaker with the agent's "okay" between them. So the
recognizers here read a token stream (one token a Whisper word), give each token the digits
it says, join digit tokens into *runs* per speaker, and name a run by its length, its Luhn
check and the nearest cue words before it ("card", "social", "phone", "account", "security
code", "expires", "date of birth"). Words that are not digits (names, addresses, spoken
e-mail addresses, dates) are found from cue phrases.

Choices, each one a trade between recall and false alarms on ordinary calls:

- A run of 13-19 digits that passes the Luhn check is a card number with or without a cue.
  A run of 8 or more digits after a card cue is a card number even when the Luhn check fails:
  Whisper drops, repeats and merges digits ("4,111,111,111,111,111,111,111"), and a Luhn-
  invalid number read out on a card call is still the customer's card.
- A CVV is 3-4 digits after a security-code cue; an expiry is a date expression after an
  expiry cue. Both cues are card context by themselves.
- Without a cue only shapes Whisper writes for those types count: 3-2-4 digit groups (SSN),
  3-3-4 groups (a phone number). Quantities, prices, times and "press one" have no cue and
  too few digits, and are left alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from overnight.workers.redact.numbers import TEENS, UNITS, ZEROS, token_digits

ORDINALS = {
    "first": "1",
    "second": "2",
    "third": "3",
    "fourth": "4",
    "fifth": "5",
    "sixth": "6",
    "seventh": "7",
    "eighth": "8",
    "ninth": "9",
    "tenth": "10",
    "eleventh": "11",
    "twelfth": "12",
    "thirteenth": "13",
    "fourteenth": "14",
    "fifteenth": "15",
    "sixteenth": "16",
    "seventeenth": "17",
    "eighteenth": "18",
    "nineteenth": "19",
    "twentieth": "20",
    "thirtieth": "30",
}
# Tokens that do not break a run of digits: fillers and spoken separators.
RUN_GLUE = {"uh", "um", "er", "ah", "dash", "hyphen", "space", "-", "–", ",", "."}
MONTHS = {
    m: i + 1
    for i, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sept", "sep"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ]
    )
    for m in names
}

# Cue words and phrases (lower case, punctuation stripped) that name what a number is.
CUES: dict[str, tuple[str, ...]] = {
    "card_number": (
        "card",
        "visa",
        "mastercard",
        "amex",
        "american express",
        "discover",
        "credit",
        "debit",
        "long number",
        # Whisper's hearing of "card number" on synthesized and telephone speech.
        "car number",
    ),
    "cvv": (
        "cvv",
        "cvc",
        "cv",
        "security code",
        "three digit code",
        "3 digit code",
        "three digit",
        "3 digit",
        "code on the back",
        "verification code",
        "verification",
    ),
    "expiry": (
        "expires",
        "expired",
        "expire",
        "expiry",
        "expiration",
        "expiring",
        "valid through",
        "valid thru",
        # Whisper's hearing of "expiration (date)" on synthesized and telephone speech.
        "exploration",
    ),
    "ssn": ("social", "ssn", "social security", "socials"),
    "phone": (
        "phone",
        "telephone",
        "cell",
        "mobile",
        "call me",
        "reach me",
        "call back",
        "callback",
        "landline",
        "text me",
    ),
    "bank_account": (
        "account",
        "routing",
        "bank",
        "checking",
        "savings",
        "iban",
        "sort code",
        # Whisper's hearing of "account number".
        "count number",
    ),
    "date_of_birth": (
        "date of birth",
        "date on birth",
        "day of birth",
        "birth date",
        "birthday",
        "born",
        "dob",
        "d o b",
        "birth",
    ),
}
CUE_WINDOW = 12  # tokens before a run where a cue counts
# Tokens before a number where a card, CVV or expiry cue makes it part of a card conversation.
CARD_CONTEXT_WINDOW = 40

STREET_TYPES = {
    "street",
    "st",
    "avenue",
    "ave",
    "road",
    "rd",
    "drive",
    "dr",
    "lane",
    "ln",
    "boulevard",
    "blvd",
    "court",
    "ct",
    "way",
    "place",
    "pl",
    "terrace",
    "circle",
    "parkway",
    "highway",
    "square",
    "trail",
}
# Capitalized words that follow "this is" / "my name is" in ordinary calls and are not names.
NOT_NAMES = {
    "i",
    "the",
    "a",
    "an",
    "your",
    "my",
    "our",
    "this",
    "that",
    "it",
    "is",
    "and",
    "okay",
    "ok",
    "yes",
    "no",
    "sure",
    "thank",
    "thanks",
    "hello",
    "hi",
    "good",
    "great",
    "sorry",
    "customer",
    "support",
    "service",
    "billing",
    "sales",
    "team",
    "department",
    "calling",
    "speaking",
    "from",
    "with",
    "here",
    "about",
    "just",
    "not",
    "still",
    "also",
    "regarding",
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
    *MONTHS,
}
NAME_CUES = (
    ("my", "name", "is"),
    ("name", "is"),
    ("name's",),
    ("this", "is"),
    ("speaking", "with"),
    ("talking", "to"),
    ("name", "on", "the", "card", "is"),
    ("it's",),
    ("i'm",),
    ("i", "am"),
    ("mr",),
    ("mrs",),
    ("ms",),
    ("miss",),
    ("dr",),
    ("call", "me"),
)
# Only these cues take a name that is followed by something else than a break or "calling".
STRONG_NAME_CUES = {
    ("my", "name", "is"),
    ("name", "is"),
    ("name's",),
    ("name", "on", "the", "card", "is"),
}
EMAIL_CUES = {"email", "e-mail", "mail", "emails"}
EMAIL_SUFFIXES = ("com", "net", "org", "edu", "gov", "io", "co", "us", "uk", "info", "biz")
STOP_BEFORE_EMAIL = {
    "is",
    "me",
    "at",
    "my",
    "email",
    "e-mail",
    "address",
    "it's",
    "its",
    "the",
    "you",
    "can",
    "reach",
    "or",
    "and",
    "to",
    "it",
    "send",
    "write",
}


@dataclass
class Token:
    """One Whisper word (or a whitespace word of a segment without word timings)."""

    word: str
    seg: int  # index of its segment
    index: int  # index in the segment's words (or in its text's whitespace words)
    char_start: int  # in the row's text
    char_end: int
    start_s: float | None
    end_s: float | None
    stream: str  # speaker (or channel); "" for a one-voice call

    @property
    def key(self) -> str:
        """Lower case, outer punctuation stripped: "Street," → "street"."""
        return self.word.lower().strip('.,;:!?"()[]')


@dataclass(frozen=True)
class Found:
    """A candidate entity over tokens ``first..last`` (inclusive, call order)."""

    type: str
    tokens: tuple[int, ...]
    score: float
    source: str


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


@dataclass(frozen=True)
class Run:
    tokens: tuple[int, ...]  # call-order indices of the run's tokens (glue inside included)
    digits: str
    groups: tuple[int, ...]  # digits per token, for shapes like 3-2-4


# A number continues over the next segment of the same speaker when it starts within this
# many seconds of where the previous one ended (another speaker may talk in between).
TURN_GAP_S = 15.0


def digit_runs(tokens: Sequence[Token], digits: Sequence[str | None]) -> list[Run]:
    """Runs of digit tokens per speaker stream, glue words inside, over segment boundaries
    of the same stream."""
    runs: list[Run] = []
    streams: dict[str, list[int]] = {}
    for i, t in enumerate(tokens):
        streams.setdefault(t.stream, []).append(i)
    for order in streams.values():
        current: list[int] = []
        pending_glue: list[int] = []
        for pos, i in enumerate(order):
            d = digits[i]
            if d is not None:
                if current:
                    prev = tokens[current[-1]]
                    gap = (tokens[i].start_s or 0.0) - (prev.end_s or 0.0)
                    if tokens[i].seg != prev.seg and gap > TURN_GAP_S:
                        runs.append(_run(current, digits))
                        current, pending_glue = [], []
                current.extend(pending_glue)
                current.append(i)
                pending_glue = []
            elif current and tokens[i].key in RUN_GLUE | {""} and len(pending_glue) < 2:
                pending_glue.append(i)
            elif (
                current
                and len(pending_glue) < 2
                and all(tokens[j].key in RUN_GLUE | {""} for j in pending_glue)
                and _short_gap(tokens, digits, order, pos)
            ):
                # One short word Whisper heard inside a read-out number ("... 5, I'm 5, 2"),
                # also after a spoken separator ("4 dash 4 dash I, 2 dash 4").
                pending_glue.append(i)
            else:
                if current:
                    runs.append(_run(current, digits))
                current, pending_glue = [], []
        if current:
            runs.append(_run(current, digits))
    return [r for r in runs if r.digits]


def _short_gap(
    tokens: Sequence[Token], digits: Sequence[str | None], order: list[int], pos: int
) -> bool:
    """Whether token ``order[pos]`` is a short word with a digit after it in its segment, a
    spoken separator in between or not ("0, i dash 9")."""
    i = order[pos]
    if len(tokens[i].key) > 4:
        return False
    for following in order[pos + 1 : pos + 3]:
        if tokens[following].seg != tokens[i].seg:
            return False
        if digits[following] is not None:
            return True
        if tokens[following].key not in RUN_GLUE:
            return False
    return False


def _run(indices: list[int], digits: Sequence[str | None]) -> Run:
    groups = tuple(len(digits[i] or "") for i in indices if digits[i])
    return Run(tuple(indices), "".join(digits[i] or "" for i in indices), groups)


def _phrases(keys: Sequence[str], end: int, window: int) -> list[tuple[int, str]]:
    """(distance back from ``end``, category) of every cue within ``window`` tokens before."""
    found = []
    lo = max(0, end - window)
    for cat, cues in CUES.items():
        for cue in cues:
            parts = cue.split()
            n = len(parts)
            for j in range(lo, end - n + 1):
                if list(keys[j : j + n]) == parts:
                    found.append((end - (j + n), cat))
    return found


# A card number is asked for, then read out in groups over a turn or two: its cue reaches
# further back than the others'.
CUE_WINDOWS = {"card_number": 20}
# "card number" (as Whisper hears it) at most this many tokens before a run of digits: the
# run is that card's reading, however few of its digits Whisper kept.
CARD_READ_OUT = 4
READ_OUT_CUES = ("card number", "car number", "long number")


def reads_out_a_card(keys: Sequence[str], start: int) -> bool:
    lo = max(0, start - CARD_READ_OUT - 1)
    said = " ".join(keys[lo:start])
    return any(cue in said for cue in READ_OUT_CUES)


def nearest_cue(keys: Sequence[str], end: int, window: int = CUE_WINDOW) -> dict[str, int]:
    """Each cue category's distance (tokens) back from ``end``, nearest occurrence."""
    best: dict[str, int] = {}
    for dist, cat in _phrases(keys, end, max(window, *CUE_WINDOWS.values())):
        if dist >= max(window, CUE_WINDOWS.get(cat, window)):
            continue
        # "social security number": "security" is not a CVV cue there.
        best[cat] = min(dist, best.get(cat, dist))
    if "ssn" in best and "cvv" in best and best["ssn"] <= best["cvv"] + 1:
        del best["cvv"]
    return best


def classify_run(
    run: Run, cues: dict[str, int], read_out: bool = False
) -> tuple[str, float] | None:
    """The entity type of a run of digits, or None (a quantity, a price, a time);
    ``read_out``: the run follows "card number" closely (``reads_out_a_card``)."""
    n = len(run.digits)
    ordered = sorted(cues, key=cues.__getitem__)
    for cat in ordered:
        if cat == "card_number" and n >= 8:
            return "card_number", 1.0 if luhn_ok(run.digits) else 0.85
        if cat == "card_number" and 4 <= n < 8 and read_out:
            # "The card number is 4936.": a card read out right after "card number", of
            # which Whisper kept only a few digits (a model that drops digit groups); what
            # it kept is still the card's.
            return "card_number", 0.6
        if cat == "cvv" and 2 <= n <= 4:  # Whisper drops a digit of three now and then
            return "cvv", 0.9
        if cat == "ssn" and (7 <= n <= 11 or n == 4):
            return "ssn", 0.9
        if cat == "phone" and 7 <= n <= 12:
            return "phone", 0.9
        if cat == "bank_account" and 4 <= n <= 20:
            return "bank_account", 0.85
        if cat == "expiry" and 2 <= n <= 8:  # "oh nine twenty six" heard as "... 26"
            return cat, 0.85
        if cat == "date_of_birth" and 3 <= n <= 8:
            return cat, 0.85
        if cat == "card_number" and 3 <= n <= 4 and "cvv" not in cues:
            continue
    if 13 <= n <= 19 and luhn_ok(run.digits):
        return "card_number", 0.8
    if run.groups == (3, 2, 4):
        return "ssn", 0.6
    if run.groups in ((3, 3, 4), (1, 3, 3, 4)):
        return "phone", 0.6
    return None


def number_entities(tokens: Sequence[Token]) -> list[Found]:
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    found = []
    card_ended: dict[str, float] = {}  # per speaker: when the last card number run ended
    for run in digit_runs(tokens, digits):
        opening, closing = tokens[run.tokens[0]], tokens[run.tokens[-1]]
        if len(run.digits) < 9 and money_amount(tokens, keys, run.tokens):
            continue  # "$49.99", "fifty dollars": an amount is nobody's number
        if harmless_run(tokens, keys, digits, run.tokens):
            continue
        if len(run.digits) <= 4 and _last_four(keys, run.tokens[0]):
            continue  # "your card ending in 4421": the digits PCI DSS lets anyone say
        cues = nearest_cue(keys, run.tokens[0])
        # An account or SSN cue names the numbers of its own sentence ("I have had this
        # account for 29 years. I have been a customer since 2000."); a question's answer in
        # the next turn is answer_entities'.
        cues = {
            cat: d
            for cat, d in cues.items()
            if cat not in ("bank_account", "ssn") or _same_sentence(tokens, run.tokens[0], d)
        }
        if is_year(run.digits) and not {"date_of_birth", "expiry"} & set(cues):
            continue  # "since 2015"
        round_amount = len(run.digits) < 9 and round_amounts(tokens, digits, run.tokens)
        if round_amount and not {"date_of_birth", "expiry"} & set(cues):
            continue  # "for 20,000 years": an amount, or noise
        named = classify_run(run, cues, reads_out_a_card(keys, run.tokens[0]))
        if named is None:
            named = _in_card_call(run, nearest_cue(keys, run.tokens[0], CARD_CONTEXT_WINDOW))
        # The rest of a card read over two turns, after words Whisper made of some of its
        # digits ("I hate Nero Nero 2 5 2 1" for "eight zero zero, two five two one").
        ended = card_ended.get(opening.stream)
        continues = ended is not None and (opening.start_s or 0.0) - ended <= TURN_GAP_S
        if named is None and len(run.digits) >= 4 and continues:
            named = "card_number", 0.6
        if named is None:
            continue
        if named[0] == "card_number":
            card_ended[opening.stream] = closing.end_s or 0.0
        indices = run.tokens
        if named[0] in ("expiry", "date_of_birth"):  # "June 26, 1970": the month too
            first = indices[0]
            while first > 0 and (keys[first - 1] in MONTHS or keys[first - 1] in ORDINALS):
                first -= 1
            indices = tuple(range(first, indices[0])) + indices
        found.append(Found(named[0], indices, named[1], "speech-digits"))
    return found


def _same_sentence(tokens: Sequence[Token], start: int, distance: int) -> bool:
    """Whether a cue ending ``distance`` tokens before token ``start`` is in its sentence."""
    return not any(
        tokens[k].word.rstrip('"”)').endswith((".", "?", "!"))
        for k in range(max(0, start - distance - 1), start)
    )


_ROUND = re.compile(r"[1-9]\d?0{3,}")


def round_amounts(
    tokens: Sequence[Token], digits: Sequence[str | None], run: Sequence[int]
) -> bool:
    """Whether every number a run writes is round ("7,000,000,000,000 with 60,000"): one or
    two significant digits, then three zeros or more. Whisper writes amounts so, or makes
    them of noise; they hold no four digits in a row of a card or an account. A written
    number goes on over the words Whisper split it into (",000", ".15")."""
    written = ["".join(digits[i] or "" for i in n) for n in written_numbers(tokens, digits, run)]
    said = [w for w in written if w]
    return bool(said) and all(_ROUND.fullmatch(w) for w in said)


def written_numbers(
    tokens: Sequence[Token], digits: Sequence[str | None], run: Sequence[int]
) -> list[list[int]]:
    """The tokens of each number a run writes: a written number goes on over the words
    Whisper split it into ("3", ",175", ".94")."""
    numbers: list[list[int]] = []
    for i in run:
        if digits[i] is None:
            continue
        if numbers and tokens[i].word[:1] in ",.":
            numbers[-1].append(i)
        else:
            numbers.append([i])
    return numbers


def is_year(digits: str) -> bool:
    """Four digits from 1900 to 2099: a year ("since 2015"), not four digits of a number."""
    return len(digits) == 4 and 1900 <= int(digits) <= 2099


MONEY_WORDS = {"dollar", "dollars", "cent", "cents", "bucks", "percent", "pounds", "euros"}


# Dollars and cents, the thousands grouped as Whisper groups them ("1,7001.51" for $1,701.51).
_CENTS = re.compile(r"[$€£]?\d{1,3}(?:,\d{3,4})*\.\d\d")


def money_amount(tokens: Sequence[Token], keys: Sequence[str], run: Sequence[int]) -> bool:
    """Whether the tokens ``run`` say an amount: a currency sign, a money word after, or
    dollars and cents written without the sign ("3,175.94": no account number has cents)."""
    after = run[-1] + 1
    # Whisper's words split a written amount ("3", ",175", ".94."): read them joined.
    written = "".join(tokens[i].word.strip() for i in run).strip('.,;:!?"()')
    return (
        any(tokens[i].word.lstrip('"(')[:1] in ("$", "€", "£") for i in run)
        or bool(_CENTS.fullmatch(written))
        or (after < len(keys) and keys[after] in MONEY_WORDS)
    )


def every_amount(
    tokens: Sequence[Token], keys: Sequence[str], digits: Sequence[str | None], run: Sequence[int]
) -> bool:
    """Whether every number a run writes is an amount of money ("$1,000, $3,400, $4,500"):
    its currency sign, its cents, or a money word after it (``written_numbers``)."""
    numbers = written_numbers(tokens, digits, run)
    return bool(numbers) and all(money_amount(tokens, keys, n) for n in numbers)


# "Your order number is ...": a number that names an order, a ticket or a case is nobody's
# secret, however long it is.
IDENTIFIER_CUES = tuple(
    (kind, "number")
    for kind in (
        "order",
        "confirmation",
        "reference",
        "tracking",
        "ticket",
        "case",
        "invoice",
        "claim",
        "booking",
    )
)
IDENTIFIER_REACH = 3  # tokens between "order number" and its number ("is", "in", "was")
# Asked for or said right after a number: its card's expiration date or security code.
NEXT_CUES = (
    ("expiration",),
    ("exploration",),  # Whisper's hearing of it (CUES)
    ("expiry",),
    ("security", "code"),
    ("cvv",),
    ("cvc",),
    ("code", "on", "the", "back"),
)
NEXT_WINDOW = 30


def asked_for_card_code(keys: Sequence[str], after: int) -> bool:
    """Whether the card's expiration date or security code is asked for or said within
    ``NEXT_WINDOW`` tokens after token ``after``: the number read out just before is the card,
    whatever Whisper made of its cue ("Go ahead." ... "I need them in time 1, 1, 8, 6, 4")."""
    said = keys[after : after + NEXT_WINDOW]
    return any(
        list(said[k : k + len(cue)]) == list(cue)
        for cue in NEXT_CUES
        for k in range(len(said) - len(cue) + 1)
    )


def _after_identifier(keys: Sequence[str], start: int) -> bool:
    before = keys[max(0, start - IDENTIFIER_REACH - 2) : start]
    return any(
        list(before[k : k + 2]) == list(cue)
        for cue in IDENTIFIER_CUES
        for k in range(len(before) - 1)
    )


# Words near a bank-account cue that make it a number's ("the account number is"), not an
# amount's ("the balance on the account is").
ACCOUNT_NUMBER_WORDS = {"number", "routing", "iban", "sort"}


def _names_a_secret(keys: Sequence[str], start: int, near: dict[str, int]) -> bool:
    """Whether a cue within ``CUE_WINDOW`` before token ``start`` asks for a secret number:
    an SSN, a phone number, a date of birth, or an account's number."""
    if {"ssn", "phone", "date_of_birth"} & set(near):
        return True
    return "bank_account" in near and bool(
        ACCOUNT_NUMBER_WORDS & set(keys[max(0, start - CUE_WINDOW) : start])
    )


def harmless_run(
    tokens: Sequence[Token], keys: Sequence[str], digits: Sequence[str | None], run: Sequence[int]
) -> bool:
    """Whether the digits of tokens ``run`` say no secret, however many they are. Never in a
    card conversation (a card, security-code or expiry cue within ``CARD_CONTEXT_WINDOW``
    tokens before, or the card's code asked for right after): a card read out loops into
    amounts and round numbers too, and then its digits are what the loop repeats. Elsewhere:

    - every number it writes is round ("1,000,000,000,000", "7,000,000,000,000 with 60,000"),
      or an amount of money ("$4,500 by $1,65.15", "$1,000, $3,400, $4,500, ..."), and no cue
      before it asks for a secret number (an SSN's, a phone's, an account's: "the account
      number is $200,000, $10,000, ..." is its reading, looped);
    - an order, confirmation, ticket or case number names it ("Your order number in 400,
      2021, 3006"), no other cue is nearer, and it is no Luhn-valid 13-19 digits (a card's
      number, whatever it is called).

    A loop of one digit is not harmless ("1-3-3-3-3-3-3-3-3-3-3-3-3-3-3-3" is tiny.en's loop on
    a card read out without a cue), though clean calls' loops pay for it."""
    start, end = run[0], run[-1]
    context = nearest_cue(keys, start, CARD_CONTEXT_WINDOW)
    if {"card_number", "cvv", "expiry"} & set(context) or asked_for_card_code(keys, end + 1):
        return False
    near = nearest_cue(keys, start)
    if (
        round_amounts(tokens, digits, run) or every_amount(tokens, keys, digits, run)
    ) and not _names_a_secret(keys, start, near):
        return True
    said = "".join(digits[i] or "" for i in run)
    return (
        _after_identifier(keys, start)
        and not any(d <= IDENTIFIER_REACH for d in near.values())
        and not (13 <= len(said) <= 19 and luhn_ok(said))
    )


LAST_FOUR = (("ending", "in"), ("ends", "in"), ("ending", "with"), ("last", "four"))


def _last_four(keys: Sequence[str], start: int) -> bool:
    """Whether a number starting at token ``start`` is a card's or account's last four
    digits as an agent names them ("ending in", "the last four digits are")."""
    before = keys[max(0, start - 4) : start]
    return any(
        list(before[k : k + len(cue)]) == list(cue)
        for cue in LAST_FOUR
        for k in range(len(before) - len(cue) + 1)
    )


def _in_card_call(run: Run, cues: dict[str, int]) -> tuple[str, float] | None:
    """Later in a card conversation (a card, CVV or expiry cue within
    ``CARD_CONTEXT_WINDOW`` tokens): four digits that read as MMYY are the expiry, three or
    four after a security-code cue the CVV, even when Whisper lost the cue words nearby."""
    if not {"card_number", "cvv", "expiry"} & set(cues):
        return None
    n = len(run.digits)
    if n == 4 and 1 <= int(run.digits[:2]) <= 12:
        return "expiry", 0.7
    if "cvv" in cues and 2 <= n <= 4:
        return "cvv", 0.7
    return None


def _is_date_word(key: str, digit: str | None) -> bool:
    return (
        digit is not None
        or key in MONTHS
        or key in ORDINALS
        or key in ZEROS
        or key in {"slash", "/", "of", "the", "hundred", "thousand"}
        or bool(re.fullmatch(r"\d+(st|nd|rd|th)", key))
    )


def _date_filler(
    keys: Sequence[str], digits: Sequence[str | None], k: int, fillers: set[str]
) -> bool:
    """Whether token ``k`` between a date cue and its date is a word to step over: a filler,
    or "may" that is the verb ("the expiration may be April 2026"), i.e. not followed by a
    number."""
    if keys[k] == "may":
        nxt = k + 1 < len(keys) and (digits[k + 1] is not None or keys[k + 1] in ORDINALS)
        return not nxt
    return keys[k] in fillers


def date_entities(tokens: Sequence[Token]) -> list[Found]:
    """A date expression right after an expiry or date-of-birth cue: "expires oh nine twenty
    seven", "09/27", "date of birth is March 3rd, 1985", "born on the fifth of May"."""
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    found: list[Found] = []
    fillers = {
        "is",
        "on",
        "the",
        "it",
        "it's",
        "its",
        "was",
        "in",
        "date",
        "my",
        "at",
        "be",
        "will",
        "",
    }
    for cat in ("expiry", "date_of_birth"):
        for cue in CUES[cat]:
            parts = cue.split()
            n = len(parts)
            for j in range(len(keys) - n + 1):
                if list(keys[j : j + n]) != parts:
                    continue
                k = j + n
                skipped = 0
                while k < len(keys) and skipped < 4 and _date_filler(keys, digits, k, fillers):
                    k += 1
                    skipped += 1
                span: list[int] = []
                while k < len(keys) and len(span) < 10 and _is_date_word(keys[k], digits[k]):
                    span.append(k)
                    k += 1
                while span and keys[span[-1]] in {"of", "the", "slash", "/"}:
                    span.pop()
                if any(digits[i] is not None or keys[i] in MONTHS for i in span):
                    found.append(Found(cat, tuple(span), 0.85, "speech-date"))
    return found


def slash_dates(tokens: Sequence[Token]) -> list[Found]:
    """An expiry said without its cue ("... zero nine slash 27", "09/27") while a card is
    being discussed: a month, a slash, a year, within ``CARD_CONTEXT_WINDOW`` tokens after a
    card, CVV or expiry cue."""
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    found = []
    for i, k in enumerate(keys):
        if re.fullmatch(r"\d{1,2}/\d{2,4}", k):
            span: tuple[int, ...] = (i,)
        elif k in ("slash", "/") and 0 < i < len(keys) - 1 and digits[i + 1]:
            lo = i - 1
            while lo > 0 and digits[lo - 1] is not None and i - lo < 2:
                lo -= 1
            if digits[lo] is None:
                continue
            span = tuple(range(lo, i + 2))
        else:
            continue
        cues = nearest_cue(keys, span[0], CARD_CONTEXT_WINDOW)
        if {"card_number", "cvv", "expiry"} & set(cues):
            found.append(Found("expiry", span, 0.8, "speech-date"))
    return found


def _capitalized_name(word: str) -> bool:
    w = word.strip('.,;:!?"')
    return (
        bool(re.fullmatch(r"[A-Z][A-Za-z]+(?:[-'][A-Z]?[a-z]+)?", w)) and w.lower() not in NOT_NAMES
    )


def after_cues(
    keys: Sequence[str], cues: Iterable[tuple[str, ...]]
) -> Iterator[tuple[tuple[str, ...], int, int]]:
    """(cue, its first token, the token after it) for every place a cue phrase is said."""
    for cue in cues:
        n = len(cue)
        for j in range(len(keys) - n + 1):
            if tuple(keys[j : j + n]) == cue:
                yield cue, j, j + n


def person_entities(tokens: Sequence[Token]) -> list[Found]:
    """Names after cue phrases: "my name is Maria Lopez", "this is Dan from billing"."""
    keys = [t.key for t in tokens]
    found = []
    for cue, _, k in after_cues(keys, NAME_CUES):
        span: list[int] = []
        while k < len(tokens) and len(span) < 3 and _capitalized_name(tokens[k].word):
            span.append(k)
            if tokens[k].word.rstrip()[-1:] in ",.?!":
                break
            k += 1
        if not span:
            continue
        # A weak cue ("this is", "I'm") takes a name only where a name fits: the
        # sentence breaks after it, or "calling", "from", "speaking", "here" follow.
        if cue not in STRONG_NAME_CUES:
            last = tokens[span[-1]].word
            after = keys[span[-1] + 1] if span[-1] + 1 < len(keys) else ""
            if not (
                last[-1:] in ",.?!" or after in {"calling", "from", "speaking", "here", "with", ""}
            ):
                continue
        found.append(Found("person", tuple(span), 0.85, "speech-name"))
    return found


# The words right before a house number that make the rest of its sentence an address.
ANSWERED_ADDRESS = (("live", "at"), ("lives", "at"), ("address", "is"), ("is", "at"))


def address_entities(tokens: Sequence[Token]) -> list[Found]:
    """A house number, one to three capitalized words and a street type ("42 Oak Street"),
    then a city (up to two capitalized words, after "in" or not) when one follows in the same
    sentence."""
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    found = []
    for i in range(len(tokens)):
        house = digits[i] or (keys[i] if re.fullmatch(r"\d+[a-z]", keys[i]) else None)
        if not house:  # a number, or one with a letter: "47B"
            continue
        start = i
        while start > 0 and digits[start - 1] is not None and i - start < 3:
            start -= 1  # "one two three Main Street": the whole spoken house number
        k = i + 1
        words = 0
        # After "I live at" / "the address is" the street name may come out in lower case.
        cued = any(
            keys[j] in ("live", "address", "moved", "located", "lives")
            for j in range(max(0, i - 6), i)
        )
        while (
            k < len(tokens)
            and words < 3
            and (cued or tokens[k].word[:1].isupper())
            and keys[k] not in NOT_NAMES  # "at 5.51 Tuesday": a day or month is no street
        ):
            if keys[k] in STREET_TYPES and words:
                break
            words += 1
            k += 1
        if not (words and k < len(tokens) and keys[k] in STREET_TYPES):
            if words and tuple(keys[max(0, start - 2) : start]) in ANSWERED_ADDRESS:
                # Asked for an address, the customer says a house number and words whose
                # street type Whisper misheard ("42 Lincoln driving Boston"): the rest of
                # the sentence, up to six words, is the address.
                end = _rest_of_sentence(tokens, i, 6)
                found.append(Found("address", tuple(range(start, end + 1)), 0.7, "speech-address"))
            continue
        end = _with_city(tokens, keys, k)
        found.append(Found("address", tuple(range(start, end + 1)), 0.85, "speech-address"))
    # "I live at I-T-Wanno Avenue in Seattle": the house number lost (or never said), the
    # street type heard after one to four capitalized words or "27mm" (a name or a garbled
    # number, not "on the way").
    for _, j, k in after_cues(keys, ANSWERED_ADDRESS):
        if k < len(tokens) and digits[k] is not None:
            continue  # a house number: the loop above
        for m in range(k + 1, min(k + 5, len(tokens))):
            previous = tokens[m - 1].word
            if previous.endswith((".", "?", "!")) and not re.fullmatch(
                r"\.?(?:[A-Za-z]\.)+", previous
            ):
                break  # the sentence ended ("I.D." does not end it)
            if keys[m] in STREET_TYPES and all(_name_or_number(t.word) for t in tokens[k:m]):
                span = tuple(range(k, _with_city(tokens, keys, m) + 1))
                found.append(Found("address", span, 0.7, "speech-address"))
                break
        else:
            if k < len(tokens) and _answers_question_about(tokens, j, "address"):
                # Asked for the address, "I live at United States, Washington, driving
                # Portland": Whisper garbled it; the rest of the sentence is the address.
                end = _rest_of_sentence(tokens, k, 8)
                found.append(Found("address", tuple(range(k, end + 1)), 0.6, "speech-address"))
    return found


def _answers_question_about(tokens: Sequence[Token], j: int, word: str) -> bool:
    """Whether token ``j``'s segment comes right after another speaker's question (a
    segment ending in "?") that says ``word``."""
    seg, stream = tokens[j].seg, tokens[j].stream
    before = [t for t in tokens if t.seg < seg]
    if not before:
        return False
    last = max(t.seg for t in before)
    question = [t for t in before if t.seg == last]
    return (
        question[-1].word.endswith("?")
        and (question[0].stream != stream or not stream)
        and any(t.key == word for t in question)
    )


def _name_or_number(word: str) -> bool:
    """A word of a street name as Whisper splits them: "Oak", "-Wanno", ".D.", "27mm"."""
    first = word.lstrip("-.'\" ")[:1]
    return first.isupper() or first.isdigit()


def _rest_of_sentence(tokens: Sequence[Token], k: int, words: int) -> int:
    """The last token of the sentence token ``k`` is in, at most ``words`` tokens on and
    within its segment."""
    end = k
    while (
        end + 1 < len(tokens)
        and end - k < words
        and tokens[end + 1].seg == tokens[k].seg
        and not tokens[end].word.endswith((".", "?", "!"))
    ):
        end += 1
    return end


def _with_city(tokens: Sequence[Token], keys: Sequence[str], k: int) -> int:
    """The last token of an address whose street type is token ``k``: a city (up to two
    capitalized words, after "in" or not) when one follows in the same sentence."""
    end = k
    if not tokens[k].word.endswith((".", "?", "!")):
        m = k + 1
        if m + 1 < len(tokens) and keys[m] == "in" and tokens[m + 1].word[:1].isupper():
            m += 1  # "... Oak Street in Springfield"
        while (
            m < len(tokens)
            and m - k <= 2
            and tokens[m].word[:1].isupper()
            and keys[m] not in NOT_NAMES
        ):
            end = m
            if tokens[m].word.endswith((".", "?", "!")):
                break
            m += 1
    return end


def email_entities(tokens: Sequence[Token]) -> list[Found]:
    """A spoken e-mail address as Whisper writes it: "jon dot smith at example dot com",
    "david .Marty at example .com", "answer .tanderson .outlook .com" (no "at" heard, after
    an e-mail cue)."""
    keys = [t.key for t in tokens]
    raw = [t.word.lower().rstrip(',;:!?"()') for t in tokens]
    found = []
    for i, w in enumerate(raw):
        if "@" in w:
            continue  # a written address: Presidio's
        bare = w.rstrip(".")  # "com." at a sentence's end
        tail = bare.rsplit(".", 1)
        suffix = tail[-1] if len(tail) == 2 else (bare if i > 0 and keys[i - 1] == "dot" else None)
        if suffix not in EMAIL_SUFFIXES:
            continue
        at = next((j for j in range(i - 1, max(-1, i - 8), -1) if keys[j] in ("at", "@")), None)
        if at is not None:
            start = at
            while start - 1 >= 0 and at - start < 4 and keys[start - 1] not in STOP_BEFORE_EMAIL:
                start -= 1
            if start < at:
                found.append(Found("email", tuple(range(start, i + 1)), 0.85, "speech-email"))
            continue
        if any(keys[j] in EMAIL_CUES for j in range(max(0, i - 10), i)):
            start = i
            while start - 1 >= 0 and i - start < 6 and keys[start - 1] not in STOP_BEFORE_EMAIL:
                start -= 1
            found.append(Found("email", tuple(range(start, i + 1)), 0.75, "speech-email"))
    return found


# A question asks for one of these when it names it and says "number", "code" or "social".
ASKED = ("card_number", "cvv", "ssn", "bank_account", "phone")
ASKING_WORDS = {"number", "code", "social", "ssn", "cvv", "digits"}
ANSWER_GAP_S = 10.0


def _numberish(key: str, digit: str | None) -> bool:
    """A token that says digits, or a hyphen-joined token with a spoken digit in it
    ("six-year-old": Whisper's hearing of "six oh oh")."""
    if digit is not None:
        return True
    parts = [p for p in re.split(r"[-–]", key) if p]
    return len(parts) > 1 and any(p in UNITS or p in TEENS or p in ZEROS for p in parts)


def answer_entities(tokens: Sequence[Token]) -> list[Found]:
    """The answer to a question that asks for a number ("what is your social security
    number?"): in the other speaker's next segment (a one-voice call: the next segment),
    from the first to the last token that says digits, when there are at least three (or two
    saying five digits or more). What Whisper makes of a read-out number is sometimes no
    number at all ("for 25 made, 26 won"), and the question says what the answer holds."""
    keys = [t.key for t in tokens]
    digits = token_digits(tokens)
    segments: dict[int, list[int]] = {}
    for i, t in enumerate(tokens):
        segments.setdefault(t.seg, []).append(i)
    order = sorted(segments)
    found = []
    for n, seg in enumerate(order):
        idx = segments[seg]
        words = {keys[i] for i in idx}
        if not words & ASKING_WORDS or not tokens[idx[-1]].word.endswith("?"):
            continue
        cues = nearest_cue(keys, idx[-1] + 1, len(idx))
        asked = [c for c in sorted(cues, key=cues.__getitem__) if c in ASKED]
        if not asked:
            continue
        asker = tokens[idx[0]].stream
        answer = next(
            (
                segments[s]
                for s in order[n + 1 :]
                if tokens[segments[s][0]].stream != asker or not asker
            ),
            None,
        )
        if answer is None:
            continue
        gap = (tokens[answer[0]].start_s or 0.0) - (tokens[idx[-1]].end_s or 0.0)
        if gap > ANSWER_GAP_S:
            continue
        said = [i for i in answer if _numberish(keys[i], digits[i])]
        # Three number tokens, or fewer that say five digits or more ("515 for Nero, Nero
        # 112": Whisper's "five one five, four oh, oh one one two").
        if len(said) >= 3 or (len(said) >= 2 and sum(len(digits[i] or "") for i in said) >= 5):
            found.append(Found(asked[0], tuple(range(said[0], said[-1] + 1)), 0.6, "answer"))
    return found


CODE_IS = (
    ("security", "code", "is"),
    # Whisper's hearing of it on synthesized speech ("The security code in free free").
    ("security", "code", "in"),
    ("cvv", "is"),
    ("code", "on", "the", "back", "is"),
)


def said_code(tokens: Sequence[Token]) -> list[Found]:
    """The one to three words after "the security code is", up to the sentence's end: a
    CVV is at most four digits, and what Whisper makes of them may be no digits at all."""
    keys = [t.key for t in tokens]
    found = []
    for _, j, k in after_cues(keys, CODE_IS):
        span: list[int] = []
        while k < len(tokens) and len(span) < 3 and tokens[k].seg == tokens[j].seg:
            span.append(k)
            if tokens[k].word[-1:] in ".?!,":
                break
            k += 1
        if span:
            found.append(Found("cvv", tuple(span), 0.55, "speech-code"))
    return found


def speech_entities(tokens: Sequence[Token]) -> list[Found]:
    return [
        *said_code(tokens),
        *answer_entities(tokens),
        *number_entities(tokens),
        *date_entities(tokens),
        *slash_dates(tokens),
        *person_entities(tokens),
        *address_entities(tokens),
        *email_entities(tokens),
    ]
