"""The redaction corpus: synthesized two-channel calls (agent left, customer right) with known
PII, and clean calls with innocent numbers, plus the scoring rule. Used by
``scripts/eval_redaction.py`` and by tests/workers/redact/test_redaction_corpus.py.

Every call is made from seeded templates (``build_corpus(seed)``): the same seed, the same
calls. A PII call carries one to three entities, each with its ground-truth value: the digits
of a number, or the words of a name, address, e-mail or date. Numbers are spoken as people
read them out (``number_speech``: digit by digit with "zero" or "oh", "double"/"triple",
pairs, hundreds, thousands, written digits, dashes, commas, or mixed), some cards over two
customer turns with the agent in between, cards without a cue or a valid Luhn check, house
numbers of any length. Each call has its own espeak-ng voices and rates and an audio
condition: wideband, 8 kHz telephone band, either with noise.

Scoring (``score``), per entity type:

- recall: a number (card, CVV, expiry, SSN, account, phone) is found when no 4 of its digits
  in a row (``min(4, len)``) survive anywhere in the redacted row: its text, its segments'
  text and their words, spoken numbers read as digits (``survives``). A name, address, e-mail
  or date of birth is found when none of its words survive there and a tag of its type is in
  the call's redacted text;
- precision: the entities the redactor reports of a type in a call are right up to the
  number of that type the call holds (a card read over two turns: two tags); the rest, and
  every one in a clean call, are false alarms. (Matching by value would count Whisper's
  misheard digits, "483" for "453", as false alarms of the redactor);
- clean calls: the share of clean calls with any entity reported.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # number_speech, beside this file

import number_speech

from overnight.workers.redact.numbers import text_digits
from overnight.workers.redact.speech import luhn_ok

FIRST = [
    "Maria",
    "James",
    "Linda",
    "Robert",
    "Susan",
    "Michael",
    "Karen",
    "David",
    "Nancy",
    "Peter",
]
LAST = [
    "Lopez",
    "Johnson",
    "Miller",
    "Wilson",
    "Anderson",
    "Taylor",
    "Thomas",
    "Moore",
    "Martin",
    "Clark",
]
STREETS, STREET_TYPES, CITIES = (
    number_speech.STREETS,
    number_speech.STREET_TYPES,
    number_speech.CITIES,
)
MONTHS, WORDS = number_speech.MONTHS, number_speech.WORDS
TEENS_WORDS, TENS_WORDS = number_speech.TEENS, number_speech.TENS
DOMAINS = ["gmail", "yahoo", "outlook", "example"]


@dataclass
class Truth:
    type: str
    value: str  # digits for numbers; words for the others


@dataclass
class Call:
    name: str
    turns: list[tuple[str, str]]  # (agent|customer, what espeak says)
    truths: list[Truth] = field(default_factory=list)
    # espeak-ng voice and words per minute of each side, and the line's audio condition
    # (number_speech.CONDITIONS); drawn per call by build_corpus.
    voices: dict[str, tuple[str, int]] = field(
        default_factory=lambda: {"agent": ("en-us", 150), "customer": ("en-gb", 150)}
    )
    condition: str = "wideband"

    @property
    def clean(self) -> bool:
        return not self.truths


def luhn_complete(body: str) -> str:
    for check in "0123456789":
        if luhn_ok(body + check):
            return body + check
    raise AssertionError("unreachable")


def say_digits(digits: str, rng: random.Random, groups: int = 4) -> str:
    """``digits`` in groups of ``groups``, read in any of the ways callers read numbers out
    (``number_speech.STYLES``: digit by digit with "zero" or "oh", "double"/"triple", pairs,
    hundreds or thousands, written digits, dashes, commas, or each group its own way)."""
    sizes = [groups] * (len(digits) // groups) + (
        [len(digits) % groups] if len(digits) % groups else []
    )
    return number_speech.read_number(digits, sizes, rng.choice(number_speech.STYLES), rng)


def _pair(two: str) -> str:
    n = int(two)
    if n < 10:
        return f"oh {WORDS[n]}"
    if n < 20:
        return TEENS_WORDS[n - 10]
    tens, unit = divmod(n, 10)
    return TENS_WORDS[tens] + (f" {WORDS[unit]}" if unit else "")


def _digits(rng: random.Random, n: int) -> str:
    return "".join(
        rng.choice("123456789") if i == 0 else rng.choice("0123456789") for i in range(n)
    )


def _card(rng: random.Random, valid: bool) -> str:
    body = rng.choice("45") + _digits(rng, 14)
    card = luhn_complete(body)
    if not valid:
        card = card[:-1] + str((int(card[-1]) + 1 + rng.randrange(8)) % 10)
        if luhn_ok(card):
            card = card[:-1] + str((int(card[-1]) + 1) % 10)
    return card


def pii_calls(rng: random.Random, n: int) -> list[Call]:
    calls = []
    for k in range(n):
        kind = k % 10
        first, last = rng.choice(FIRST), rng.choice(LAST)
        turns: list[tuple[str, str]] = []
        truths: list[Truth] = []
        if kind in (0, 1, 2):
            card = (
                _card(rng, valid=kind != 2)
                if rng.random() < 0.7
                else number_speech.card_number(rng)
            )
            truths.append(Truth("card_number", card))
            turns.append(("agent", rng.choice(["Sure, what is the card number?", "Go ahead."])))
            if kind == 1:  # over two turns of the customer
                turns.append(("customer", f"It is {say_digits(card[:8], rng)}."))
                turns.append(("agent", "Okay, go on."))
                turns.append(("customer", f"{say_digits(card[8:], rng)}."))
            else:
                lead = rng.choice(["The card number is ", "It is ", "Sure, ", "", "My visa is "])
                said = say_digits(card, rng)
                turns.append(
                    ("customer", f"{lead}{said}." if lead else f"{said[:1].upper()}{said[1:]}.")
                )
            month, year = rng.randrange(1, 13), rng.randrange(26, 31)
            turns.append(("agent", "And the expiration date?"))
            mm = rng.choice(
                [
                    f"zero {WORDS[month]}" if month < 10 else TEENS_WORDS[month - 10],
                    f"oh {WORDS[month]}" if month < 10 else TEENS_WORDS[month - 10],
                    number_speech.number_words(month),
                    f"{month:02d}",
                ]
            )
            yy = rng.choice([_pair(str(year)), f"twenty {_pair(str(year))}", f"20{year}"])
            said = rng.choice([f"{mm}, {yy}", f"{MONTHS[month - 1]} {yy}", f"{mm} slash {yy}"])
            turns.append(
                ("customer", rng.choice([f"It expires {said}.", f"The expiration date is {said}."]))
            )
            truths.append(Truth("expiry", f"{month:02d}{year}"))
            if kind != 1:
                cvv = _digits(rng, 3)
                turns.append(("agent", "And the security code on the back?"))
                turns.append(("customer", f"The security code is {say_digits(cvv, rng)}."))
                truths.append(Truth("cvv", cvv))
        elif kind == 3:
            ssn = _digits(rng, 9)
            truths.append(Truth("ssn", ssn))
            turns.append(("agent", "To verify your identity, what is your social security number?"))
            groups = rng.choice([(3, 2, 4), (3, 2, 4), (9,), (3, 3, 3)])
            said = number_speech.read_number(ssn, groups, rng.choice(number_speech.STYLES), rng)
            lead = rng.choice(["My social is ", "It's ", "My social security number is ", ""])
            turns.append(("customer", f"{lead}{said}."))
        elif kind == 4:
            phone = rng.choice("23456789") + _digits(rng, 9)
            truths.append(Truth("phone", phone))
            turns.append(("agent", "What is the best phone number to reach you?"))
            turns.append(
                (
                    "customer",
                    f"My cell phone is {say_digits(phone[:3], rng)}, "
                    f"{say_digits(phone[3:6], rng)}, {say_digits(phone[6:], rng)}.",
                )
            )
        elif kind == 5:
            domain = rng.choice(DOMAINS)
            truths.append(Truth("email", f"{first} {last} {domain}"))
            turns.append(("agent", "Can I have your email address for the receipt?"))
            turns.append(("customer", f"Sure, my email is {first} dot {last} at {domain} dot com."))
        elif kind == 6:
            truths.append(Truth("person", f"{first} {last}"))
            turns.append(
                (
                    "customer",
                    f"Hello, my name is {first} {last} and I have a question about my bill.",
                )
            )
        elif kind == 7:
            num = str(rng.randrange(1, 100_000))
            said = number_speech.read_number(
                num, (len(num),), rng.choice(number_speech.STYLES), rng
            )
            street, stype, city = rng.choice(STREETS), rng.choice(STREET_TYPES), rng.choice(CITIES)
            truths.append(Truth("address", f"{num} {street} {city}"))
            turns.append(("agent", "What is the address on the account?"))
            turns.append(("customer", f"I live at {said} {street} {stype} in {city}."))
        elif kind == 8:
            month, day, year = rng.choice(MONTHS), rng.randrange(1, 29), rng.randrange(1950, 2001)
            truths.append(Truth("date_of_birth", f"{month} {day} {year}"))
            turns.append(("agent", "Can you confirm your date of birth?"))
            turns.append(("customer", f"My date of birth is {month} {day}, {year}."))
        else:
            account = _digits(rng, rng.choice([8, 10, 12]))
            truths.append(Truth("bank_account", account))
            turns.append(("agent", "What is the bank account number for the refund?"))
            said = f"The account number is {say_digits(account, rng)}"
            if rng.random() < 0.5:
                routing = "0" + _digits(rng, 8)
                truths.append(Truth("bank_account", routing))
                said += f" and the routing number is {say_digits(routing, rng, 9)}"
            turns.append(("customer", said + "."))
        if kind in (3, 4, 9):  # a name too, from the agent's greeting
            truths.append(Truth("person", f"{first} {last}"))
            intro = rng.choice(
                [f"Hi, my name is {first} {last}.", f"Hi, this is {first} {last} calling."]
            )
            turns.insert(0, ("customer", intro))
        calls.append(Call(f"pii_{k:03d}", turns, truths))
    return calls


CLEAN_LINES = [
    ("customer", "I would like to order three boxes of paper for my office."),
    ("customer", "The price was twenty nine dollars and ninety nine cents."),
    ("agent", "Please press one to continue or two to speak to an agent."),
    ("customer", "The store opens at nine thirty on Saturday morning."),
    ("agent", "Your package should arrive in five to seven business days."),
    ("customer", "I have been a customer for about twelve years now."),
    ("agent", "I can offer you a discount of fifteen percent on the next order."),
    ("customer", "The router stopped working two days ago."),
    ("agent", "Let me transfer you to the billing department."),
    ("customer", "I paid the bill last Friday but it still shows as open."),
    ("agent", "The gift card balance is twenty five dollars."),
    ("customer", "Can you call me back in ten minutes?"),
    ("agent", "This is the technical support team, how can I help?"),
    ("customer", "We need four chairs and two tables for the meeting room."),
    ("agent", "The upgrade costs fifty dollars per month."),
    ("customer", "My order from last week had one item missing."),
    ("agent", "I will send you a replacement today."),
    ("customer", "The meeting is at three o'clock on Tuesday."),
]


def clean_line(rng: random.Random) -> tuple[str, str]:
    """A line with numbers that are nobody's secret, drawn fresh: amounts, quantities, times,
    dates, menu choices, the last four digits of a card (PCI lets an agent say them), order
    and room numbers, percentages, years."""
    n = number_speech.number_words
    amount = rng.choice(
        [
            f"{n(rng.randrange(2, 1000))} dollars and {n(rng.randrange(1, 100))} cents",
            f"${rng.randrange(2, 5000):,}.{rng.randrange(100):02d}",
            f"{n(rng.randrange(2, 100))} dollars",
        ]
    )
    return rng.choice(
        [
            ("customer", f"I was charged {amount} on my last bill."),
            ("agent", f"The balance on the account is {amount}."),
            (
                "agent",
                f"Your card ending in {number_speech.read_group(_digits(rng, 4), 'digits')} is on file.",
            ),
            (
                "customer",
                f"I ordered {n(rng.randrange(2, 50))} items and {n(rng.randrange(2, 9))} were missing.",
            ),
            ("agent", f"Your order number is {_digits(rng, 6)}."),
            (
                "customer",
                f"The meeting is at {rng.randrange(1, 13)}:{rng.choice(['00', '15', '30', '45'])} on Tuesday.",
            ),
            (
                "agent",
                f"Press {n(rng.randrange(1, 10))} to continue or {n(rng.randrange(0, 10))} to repeat.",
            ),
            ("customer", f"I have been a customer since {rng.randrange(1990, 2026)}."),
            (
                "agent",
                f"You get {n(rng.choice([5, 10, 15, 20, 25]))} percent off for {n(rng.randrange(2, 13))} months.",
            ),
            (
                "customer",
                f"We are in room {rng.randrange(100, 1000)} on the {rng.choice(['second', 'third', 'fifth'])} floor.",
            ),
            ("agent", f"It will arrive on {rng.choice(MONTHS)} {rng.randrange(1, 29)}."),
            ("customer", f"I have had this account for {n(rng.randrange(2, 30))} years."),
        ]
    )


def clean_calls(rng: random.Random, n: int) -> list[Call]:
    calls = []
    for k in range(n):
        lines = rng.sample(CLEAN_LINES, 2) + [clean_line(rng) for _ in range(2)]
        rng.shuffle(lines)
        calls.append(Call(f"clean_{k:03d}", lines))
    return calls


def build_corpus(seed: int = 17, pii: int = 40, clean: int = 40) -> list[Call]:
    """Calls made from ``seed``: each with its own voices, rates and audio condition."""
    rng = random.Random(seed)
    calls = pii_calls(rng, pii) + clean_calls(rng, clean)
    for call in calls:
        call.voices = {side: number_speech.voice(rng) for side in ("agent", "customer")}
        call.condition = rng.choice(number_speech.CONDITIONS)
    return calls


def synthesize(call: Call, gap_s: float = 0.4, mono: bool = False) -> Any:
    """The call as (2, samples) float32: agent left, customer right, one turn after another,
    each side on its own line; ``mono``: (1, samples), both voices on one line (the sides
    summed before the line's band, noise and level, as one recording of the call hears them;
    rendering each side first would give a silent side full-scale noise of its own)."""
    import numpy as np

    from overnight.jobs.ops.demo import silence, speak

    channels: dict[str, list[Any]] = {"agent": [], "customer": []}
    for speaker, text in call.turns:
        voice, rate = call.voices[speaker]
        clip = np.concatenate([speak(text, voice=voice, speed=rate), silence(gap_s)])
        for label, parts in channels.items():
            parts.append(clip if label == speaker else np.zeros_like(clip))
    raw = [np.concatenate(channels[label]) for label in ("agent", "customer")]
    if mono:
        raw = [raw[0] + raw[1]]
    sides = []
    for k, audio in enumerate(raw):
        audio, rate = number_speech.render(
            audio, call.condition, zlib.crc32(f"{call.name}/{k}".encode())
        )
        if rate != number_speech.SAMPLE_RATE:  # back to 16 kHz samples, the band kept narrow
            x = np.arange(audio.size * 2) / 2
            audio = np.interp(x, np.arange(audio.size), audio).astype(np.float32)
        sides.append(audio)
    n = min(a.size for a in sides)
    return np.stack([a[:n] for a in sides])


# ---- scoring ------------------------------------------------------------------------------


def _grams(digits: str, k: int) -> set[str]:
    k = min(k, len(digits))
    return {digits[i : i + k] for i in range(len(digits) - k + 1)}


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+|\d+", text.lower()) if len(w) > 1}


NUMERIC = {"card_number", "cvv", "expiry", "ssn", "bank_account", "phone"}


def row_texts(fields: Mapping[str, Any]) -> list[str]:
    """Every place of a redacted row a reader sees text: its text, each segment's text, and
    each segment's words."""
    texts = [fields.get("text") or ""]
    for seg in fields.get("segments") or []:
        texts.append(seg.get("text") or "")
        texts.append(" ".join(w.get("word") or "" for w in seg.get("words") or []))
    return texts


def survives(truth: Truth, fields: Mapping[str, Any]) -> bool:
    """Whether any of ``truth`` is left in the redacted row: for a number, any 4 of its digits
    in a row among the digits of any text of the row (``row_texts``; spoken numbers read as
    digits by ``workers.redact.numbers``); for the other types, any of its words."""
    texts = row_texts(fields)
    if truth.type in NUMERIC:
        grams = _grams(truth.value, 4)
        return any(g in text_digits(t) for t in texts for g in grams)
    return any(bool(_words(truth.value) & _words(t)) for t in texts)


@dataclass
class Scores:
    found: dict[str, int] = field(default_factory=dict)
    truths: dict[str, int] = field(default_factory=dict)
    right: dict[str, int] = field(default_factory=dict)
    reported: dict[str, int] = field(default_factory=dict)
    clean_redacted: int = 0
    clean_calls: int = 0
    misses: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)

    def recall(self, kind: str) -> float | None:
        return self.found.get(kind, 0) / self.truths[kind] if self.truths.get(kind) else None

    def precision(self, kind: str) -> float | None:
        n = self.reported.get(kind, 0)
        return self.right.get(kind, 0) / n if n else None

    @property
    def clean_share(self) -> float:
        return self.clean_redacted / self.clean_calls if self.clean_calls else 0.0

    def add(self, other: Scores) -> None:
        """Pool ``other`` (another corpus) into these scores."""
        for name in ("found", "truths", "right", "reported"):
            mine = getattr(self, name)
            for kind, n in getattr(other, name).items():
                mine[kind] = mine.get(kind, 0) + n
        self.clean_redacted += other.clean_redacted
        self.clean_calls += other.clean_calls
        self.misses += other.misses
        self.false_alarms += other.false_alarms

    def table(self) -> str:
        from overnight.workers.redact import TYPES

        lines = [
            "| type | entities | recall | reported | precision |",
            "| --- | --- | --- | --- | --- |",
        ]
        for kind in TYPES:
            r, p = self.recall(kind), self.precision(kind)
            lines.append(
                f"| {kind} | {self.truths.get(kind, 0)} | "
                f"{'-' if r is None else f'{r:.3f}'} | {self.reported.get(kind, 0)} | "
                f"{'-' if p is None else f'{p:.3f}'} |"
            )
        lines.append(
            f"\nclean calls with any redaction: {self.clean_redacted} of {self.clean_calls} "
            f"({self.clean_share:.1%})"
        )
        return "\n".join(lines)


def score(
    calls: Sequence[Call],
    originals: Mapping[str, str],
    redacted: Mapping[str, Mapping[str, Any]],
    entities: Mapping[str, Sequence[Mapping[str, Any]]],
) -> Scores:
    """``originals``: each call's transcript text before redaction; ``redacted``: its row's
    redacted ``text`` and ``segments``; ``entities``: what the redactor reported
    (``start_char``/``end_char`` into the original)."""
    s = Scores()
    for call in calls:
        text, fields, ents = originals[call.name], redacted[call.name], entities[call.name]
        red = fields.get("text") or ""
        if call.clean:
            s.clean_calls += 1
            if ents:
                s.clean_redacted += 1
                s.false_alarms.append(
                    f"{call.name}: {[(e['type'], text[e['start_char'] : e['end_char']]) for e in ents]}"
                )
        for t in call.truths:
            s.truths[t.type] = s.truths.get(t.type, 0) + 1
            # A number is found when none of it is left; the other types need their tag too
            # (their words could be gone because Whisper lost them).
            tagged = t.type in NUMERIC or f"[{t.type.upper()}]" in red
            if tagged and not survives(t, fields):
                s.found[t.type] = s.found.get(t.type, 0) + 1
            else:
                s.misses.append(f"{call.name} {t.type} {t.value!r}: {red!r}")
        for kind in {e["type"] for e in ents}:
            mine = [e for e in ents if e["type"] == kind]
            held = sum(1 for t in call.truths if t.type == kind) * (
                2 if kind == "card_number" else 1
            )
            s.reported[kind] = s.reported.get(kind, 0) + len(mine)
            s.right[kind] = s.right.get(kind, 0) + min(len(mine), held)
            if len(mine) > held and not call.clean:
                spans = [text[e["start_char"] : e["end_char"]] for e in mine]
                s.false_alarms.append(f"{call.name}: {kind} {spans!r} ({held} held)")
    return s


# ---- transcription and redaction ---------------------------------------------------------


CHANNEL_MODES = ("split", "mono", "diarized")


def transcribe(
    calls: Sequence[Call], batch_size: int = 16, threads: int = 2, channels: str = "split"
) -> dict[str, dict]:
    """Each call synthesized and transcribed in one cross-call batched run of the real
    Whisper worker (the bundled tiny.en, word timestamps on): the transcripts rows, by call
    name. ``channels``: ``split``, decoded as a split-channel call (agent, customer);
    ``mono``, both voices on one line (``synthesize(mono=True)``); ``diarized``, that with
    the job's ``--diarize`` (its decode stage's speaker turns, then the worker's words by
    speaker), so that the redactor sees speakers only as diarization found them."""
    import io

    import pyarrow as pa

    from overnight.jobs.ops.demo import write_wav
    from overnight.schemas.stages import DECODED
    from overnight.workers.audio import AudioChunker, AudioOptions
    from overnight.workers.whisper import WhisperOptions, WhisperWorker, WhisperWorkerConfig

    if channels not in CHANNEL_MODES:
        raise ValueError(f"channels={channels!r}: one of {', '.join(CHANNEL_MODES)}")
    diarize = None
    if channels == "diarized":
        from overnight.jobs.transcribe import _diarize
        from overnight.workers.diarize import DiarizeOptions

        diarize = DiarizeOptions()
    chunker = AudioChunker(AudioOptions(keep_speech=diarize is not None))
    rows = []
    for call in calls:
        buf = io.BytesIO()
        audio = synthesize(call, mono=channels != "split")
        if channels == "split":
            write_wav(buf, audio)
            decoded = chunker(buf.getvalue(), split_channels=True)
            rows.append(
                decoded.record(
                    call.name,
                    f"corpus://{call.name}",
                    split=True,
                    channel_labels=["agent", "customer"],
                )
            )
            continue
        write_wav(buf, audio[0])
        decoded = chunker(buf.getvalue(), split_channels=False)
        row = decoded.record(call.name, f"corpus://{call.name}")
        if diarize is not None:
            _diarize(row, decoded, diarize)
        rows.append(row)
    worker = WhisperWorker(
        WhisperWorkerConfig(
            whisper=WhisperOptions(batch_size=batch_size, cpu_threads=threads, word_timestamps=True)
        )
    )
    out = worker(pa.Table.from_pylist(rows, schema=DECODED)).to_pylist()
    return {row["item_id"]: row for row in out}


def save_rows(rows: Mapping[str, Mapping[str, Any]], path: Path) -> None:
    """Transcripts as gzipped JSON (``transcribe``'s rows by call name): tiny.en's words for
    the same audio differ by CPU and BLAS build, so a recorded set is what scores the same
    everywhere."""
    path.write_bytes(gzip.compress(json.dumps(rows, sort_keys=True).encode(), mtime=0))


def load_rows(path: Path) -> dict[str, dict]:
    return json.loads(gzip.decompress(path.read_bytes()))


def evaluate(
    calls: Sequence[Call], rows: Mapping[str, Mapping[str, Any]], types=("all",)
) -> Scores:
    from overnight.workers.redact import Redactor

    redactor = Redactor(types)
    originals, redacted, entities = {}, {}, {}
    for call in calls:
        row = rows[call.name]
        fields, found = redactor.redact(row)
        originals[call.name] = row["text"] or ""
        redacted[call.name] = fields
        entities[call.name] = found
    return score(calls, originals, redacted, entities)
