"""Number-heavy speech, as callers read numbers: the corpus of the loop benchmark
(``scripts/bench_loops.py``) and the number readings of the redaction corpus
(``scripts/redaction_corpus.py``).

Nothing here is shaped around what the model gets right. A number is read in any of the ways
people read them out:

- digit by digit, with "zero" or "oh", in groups or all at once;
- as pairs ("forty one, eleven"), in hundreds ("two hundred nineteen") or in thousands ("four
  thousand five hundred thirty nine");
- with "double" and "triple" for repeated digits;
- written out for the synthesizer as digits ("5413 3333", which espeak-ng reads its own way),
  with dashes or with commas ("4,111,111");
- mixed: each group its own way.

Utterances put those numbers in what callers say (cards, SSNs, account, routing and phone
numbers, amounts, dates, times, addresses, quantities), with or without a cue word, and are
spoken by several espeak-ng voices at several rates. ``render`` gives each one an audio
condition: wideband, 8 kHz telephone band (300-3,400 Hz, G.711 mu-law), or either with noise
at 10-25 dB SNR. ``real_speech`` adds the recordings in ``../shared/data/audio`` that have a
reference, in the same conditions and spliced before a number utterance.

Every utterance carries its reference (what was said, for the WER) and its secrets (the
digits of each card, SSN, account, routing and phone number, for redaction recall).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from overnight.workers.redact.speech import luhn_ok

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TEENS = [
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
ORDINALS = {
    1: "first",
    2: "second",
    3: "third",
    5: "fifth",
    8: "eighth",
    9: "ninth",
    12: "twelfth",
    20: "twentieth",
    30: "thirtieth",
}
STREETS = ["Oak", "Maple", "Pine", "Cedar", "Elm", "Lake", "Hill", "Park", "Washington", "Lincoln"]
STREET_TYPES = ["Street", "Avenue", "Road", "Drive", "Lane"]
CITIES = ["Springfield", "Portland", "Denver", "Boston", "Austin", "Seattle"]

# espeak-ng voices (accents) and variants (timbre) shipped with the Debian package.
VOICES = ["en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-us-nyc", "en-gb-x-gbclan"]
VARIANTS = ["", "+m3", "+f2", "+f4", "+m5", "+klatt2"]
RATES = [120, 135, 150, 165, 180, 200]
CONDITIONS = ("wideband", "telephone", "noisy", "telephone+noise")

# Ways to read a digit string; "mixed" picks one per group.
STYLES = (
    "digits",
    "oh",
    "double",
    "pairs",
    "hundreds",
    "thousands",
    "written",
    "dashes",
    "commas",
    "mixed",
)


def number_words(n: int) -> str:
    """0 <= n < 1,000,000 in words, as said in American English (no "and")."""
    if n < 10:
        return WORDS[n]
    if n < 20:
        return TEENS[n - 10]
    if n < 100:
        tens, unit = divmod(n, 10)
        return TENS[tens] + (f" {WORDS[unit]}" if unit else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{WORDS[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")
    thousands, rest = divmod(n, 1000)
    return f"{number_words(thousands)} thousand" + (f" {number_words(rest)}" if rest else "")


def _digit_words(group: str, zero: str, repeats: bool) -> str:
    out, i = [], 0
    while i < len(group):
        d = group[i]
        run = 1
        while repeats and i + run < len(group) and group[i + run] == d and run < 3:
            run += 1
        word = zero if d == "0" else WORDS[int(d)]
        if run >= 2:
            out.append(f"{'double' if run == 2 else 'triple'} {word}")
        else:
            out.append(word)
        i += run
    return " ".join(out)


def _pairs(group: str) -> str:
    parts = [group[i : i + 2] for i in range(0, len(group), 2)]
    said = []
    for p in parts:
        if len(p) == 1:
            said.append(WORDS[int(p)])
        elif p[0] == "0":
            said.append(f"oh {WORDS[int(p[1])]}")
        else:
            said.append(number_words(int(p)))
    return " ".join(said)


def _as_number(group: str) -> str:
    """A group read as one number; leading zeros said as "zero" (or "oh") first."""
    zeros = len(group) - len(group.lstrip("0"))
    head = " ".join(["zero"] * zeros)
    rest = group[zeros:]
    said = number_words(int(rest)) if rest else ""
    return " ".join(w for w in (head, said) if w)


def read_group(group: str, style: str) -> str:
    """One group of digits in one style (the text espeak-ng is given)."""
    if style == "digits":
        return _digit_words(group, "zero", repeats=False)
    if style == "oh":
        return _digit_words(group, "oh", repeats=False)
    if style == "double":
        return _digit_words(group, "zero", repeats=True)
    if style == "pairs":
        return _pairs(group)
    if style in ("hundreds", "thousands"):
        return _as_number(group) if len(group) <= 6 else _pairs(group)
    if style == "written":
        return group  # espeak-ng reads "5413" its own way (five thousand four hundred ...)
    if style == "dashes":
        return "-".join(group)
    if style == "commas":
        head = len(group) % 3 or 3
        parts = [group[:head]] + [group[i : i + 3] for i in range(head, len(group), 3)]
        return ",".join(parts)
    raise ValueError(style)


def read_number(digits: str, groups: Sequence[int], style: str, rng: random.Random) -> str:
    """``digits`` cut into ``groups`` (lengths) and read in ``style``; "mixed": each group
    its own style. Groups are separated by a pause (a comma) or not."""
    parts, at = [], 0
    for size in groups:
        parts.append(digits[at : at + size])
        at += size
    if at < len(digits):
        parts.append(digits[at:])
    said = []
    for part in parts:
        s = rng.choice(STYLES[:-1]) if style == "mixed" else style
        said.append(read_group(part, s))
    sep = rng.choice([", ", " ", ", "])
    return sep.join(said)


def _digits(rng: random.Random, n: int, first_nonzero: bool = True) -> str:
    return "".join(
        rng.choice("123456789") if (i == 0 and first_nonzero) else rng.choice("0123456789")
        for i in range(n)
    )


def card_number(rng: random.Random) -> str:
    """16 digits: Luhn-valid or not, and some with a long run of one digit ("5413 3333 ...")
    as test cards and misreadings have."""
    kind = rng.random()
    if kind < 0.15:
        d = rng.choice("0123456789")
        body = rng.choice("3456") + _digits(rng, 3) + d * 12
        return body
    body = rng.choice("3456") + _digits(rng, 14, first_nonzero=False)
    for check in "0123456789":
        if luhn_ok(body + check):
            card = body + check
            break
    if kind < 0.5:  # Luhn-invalid: a misread or mistyped card is still the customer's
        card = card[:-1] + str((int(card[-1]) + 1 + rng.randrange(8)) % 10)
    return card


@dataclass
class Secret:
    type: str  # card_number, ssn, bank_account, phone (what redaction must remove)
    digits: str


@dataclass
class Utterance:
    name: str
    text: str  # what espeak-ng is given
    reference: str  # what was said, for the WER (digits or words; the normaliser maps both)
    secrets: list[Secret] = field(default_factory=list)
    kind: str = ""
    style: str = ""


def _said(text: str) -> str:
    """The reference of a text given to espeak-ng: itself (the WER's normaliser reads digits
    and number words alike)."""
    return text


def _cue(rng: random.Random, options: Sequence[str]) -> str:
    return rng.choice(options)


def _amount(rng: random.Random) -> str:
    dollars, cents = (
        rng.choice([rng.randrange(1, 100), rng.randrange(100, 10000)]),
        rng.randrange(100),
    )
    if rng.random() < 0.5:
        return f"${dollars:,}.{cents:02d}"
    words = f"{number_words(dollars)} dollars"
    return words + (f" and {number_words(cents)} cents" if cents else "")


def _date(rng: random.Random) -> str:
    month, day, year = rng.randrange(1, 13), rng.randrange(1, 29), rng.randrange(1950, 2031)
    return rng.choice(
        [
            f"{MONTHS[month - 1]} {day}, {year}",
            f"{MONTHS[month - 1]} {ORDINALS.get(day, number_words(day))}, "
            f"{_pairs(str(year)) if year < 2000 or year >= 2010 else number_words(year)}",
            f"{month:02d}/{day:02d}/{year}",
            f"{read_group(f'{month:02d}', 'oh')} slash {read_group(str(year)[2:], 'pairs')}",
            f"the {ORDINALS.get(day, number_words(day))} of {MONTHS[month - 1]}",
        ]
    )


def _time(rng: random.Random) -> str:
    h, m = rng.randrange(1, 13), rng.choice([0, 5, 15, 30, 45, 50])
    return rng.choice(
        [
            f"{h}:{m:02d}",
            f"{number_words(h)} {number_words(m) if m else 'o clock'}",
            f"{h}:{m:02d} in the {'morning' if rng.random() < 0.5 else 'afternoon'}",
            "a quarter past three",
        ]
    )


# The kinds that say one secret number after a lead-in: the secret's type, how the number is
# drawn, the groupings it may be read out in, and the lead-ins.
_READ_OUT: dict[
    str, tuple[str, Callable[[random.Random], str], list[tuple[int, ...]], list[str]]
] = {
    "card": (
        "card_number",
        card_number,
        [(4, 4, 4, 4), (16,), (4, 6, 6)],
        [
            "My card number is",
            "The card number is",
            "It is",
            "Sure, it's",
            "Visa,",
            "The long number is",
            "Okay so",
        ],
    ),
    "ssn": (
        "ssn",
        lambda rng: _digits(rng, 9),
        [(3, 2, 4)],
        ["My social security number is", "My social is", "The SSN is", "It's", "Social security,"],
    ),
    "account": (
        "bank_account",
        lambda rng: _digits(rng, rng.choice([8, 10, 12]), first_nonzero=rng.random() < 0.5),
        [(4, 4, 4)],
        ["The account number is", "My checking account is", "Account", "It is", "Savings,"],
    ),
    "phone": (
        "phone",
        lambda rng: rng.choice("23456789") + _digits(rng, 9),
        [(3, 3, 4)],
        ["You can call me at", "My cell is", "Call me back on", "It's"],
    ),
}

# The kinds whose sentence is a template with values of one sort, none of them a secret: each
# {} is a value of its own.
_SENTENCES: dict[str, tuple[Callable[[random.Random], str], list[str]]] = {
    "amount": (
        _amount,
        [
            "I was charged {} twice this month.",
            "The balance is {} and I paid {} on Friday.",
            "Can you refund {}?",
        ],
    ),
    "date": (
        _date,
        ["My date of birth is {}.", "The payment was due on {}.", "It expires {}."],
    ),
    "time": (
        _time,
        [
            "Please call me back at {}.",
            "The store opens at {} on Saturday.",
            "I called at {} and waited until {}.",
        ],
    ),
}


def _sentence(
    rng: random.Random, value: Callable[[random.Random], str], templates: list[str]
) -> str:
    """One of ``templates``, filled. Every template is filled before the choice, in order,
    so that a seed draws what it always drew (the seeded corpora stay the same)."""
    filled = [t.format(*(value(rng) for _ in range(t.count("{}")))) for t in templates]
    return rng.choice(filled)


def utterance(rng: random.Random, name: str) -> Utterance:
    """One caller's sentence with numbers in it, drawn from every kind and style."""
    kind = rng.choice(
        [
            "card",
            "card",
            "ssn",
            "ssn",
            "account",
            "routing",
            "phone",
            "amount",
            "date",
            "time",
            "address",
            "ssn_address",
            "card_expiry",
            "quantity",
        ]
    )
    style = rng.choice(STYLES)
    secrets: list[Secret] = []
    if kind in _READ_OUT:
        secret, number, groupings, leads = _READ_OUT[kind]
        digits = number(rng)
        # A grouping is drawn only where there is a choice (a seed draws what it always drew).
        grouping = rng.choice(groupings) if len(groupings) > 1 else groupings[0]
        said = read_number(digits, grouping, style, rng)
        text = f"{_cue(rng, leads)} {said}."
        secrets.append(Secret(secret, digits))
    elif kind == "routing":
        acct = _digits(rng, 10, first_nonzero=False)
        routing = "0" + _digits(rng, 8, first_nonzero=False)
        text = (
            f"The account number is {read_number(acct, (4, 4, 2), style, rng)} and the routing "
            f"number is {read_number(routing, (9,), rng.choice(STYLES), rng)}."
        )
        secrets += [Secret("bank_account", acct), Secret("bank_account", routing)]
    elif kind in _SENTENCES:
        text = _sentence(rng, *_SENTENCES[kind])
    elif kind == "address":
        house = str(rng.randrange(1, 10000))
        text = (
            f"I live at {read_number(house, (len(house),), rng.choice(STYLES), rng)} "
            f"{rng.choice(STREETS)} {rng.choice(STREET_TYPES)}, {rng.choice(CITIES)}."
        )
    elif kind == "ssn_address":
        ssn = _digits(rng, 9)
        house = str(rng.randrange(1, 1000))
        text = (
            f"My social security number is {read_number(ssn, (3, 2, 4), style, rng)} and I live "
            f"at {house} {rng.choice(STREETS)} {rng.choice(STREET_TYPES)}, {rng.choice(CITIES)}."
        )
        secrets.append(Secret("ssn", ssn))
    elif kind == "card_expiry":
        card = card_number(rng)
        cvv = _digits(rng, 3)
        text = (
            f"The card is {read_number(card, (4, 4, 4, 4), style, rng)}, it expires "
            f"{_date(rng)}, and the security code is {read_number(cvv, (3,), 'digits', rng)}."
        )
        secrets.append(Secret("card_number", card))
    else:  # quantities and menu choices: numbers that are nobody's secret
        text = rng.choice(
            [
                f"I would like to order {number_words(rng.randrange(2, 40))} boxes of paper.",
                "Please press one to continue or two to speak to an agent.",
                f"We have {number_words(rng.randrange(2, 12))} kids and "
                f"{number_words(rng.randrange(1, 4))} dogs.",
                f"Room {rng.randrange(100, 999)} on the {ORDINALS[rng.choice([1, 2, 3, 5])]} "
                "floor.",
            ]
        )
    return Utterance(name, text, _said(text), secrets, kind, style)


def utterances(seed: int, n: int) -> list[Utterance]:
    rng = random.Random(seed)
    return [utterance(rng, f"num_{seed}_{k:04d}") for k in range(n)]


# ---- audio ----------------------------------------------------------------------------------

SAMPLE_RATE = 16_000
TELEPHONE_RATE = 8_000


def band_limit(audio: np.ndarray, low: float, high: float, rate: int = SAMPLE_RATE) -> np.ndarray:
    spectrum = np.fft.rfft(audio)
    freqs = np.fft.rfftfreq(audio.size, 1 / rate)
    spectrum[(freqs < low) | (freqs > high)] = 0
    return np.fft.irfft(spectrum, audio.size).astype(np.float32)


def mu_law(audio: np.ndarray, mu: int = 255) -> np.ndarray:
    """G.711 mu-law: compress, quantize to 8 bits, expand (the telephone codec's noise)."""
    x = np.clip(audio, -1, 1)
    y = np.sign(x) * np.log1p(mu * np.abs(x)) / np.log1p(mu)
    q = np.round((y + 1) / 2 * 255) / 255 * 2 - 1
    return (np.sign(q) * np.expm1(np.abs(q) * np.log1p(mu)) / mu).astype(np.float32)


def add_noise(audio: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """Pink-ish noise (white, one-pole low-passed) at ``snr_db`` below the speech's power."""
    white = rng.standard_normal(audio.size).astype(np.float32)
    # Low-passed white noise (a one-pole filter, truncated): more rumble than hiss, as lines have.
    pink = np.convolve(white, 0.1 * 0.9 ** np.arange(64, dtype=np.float32), mode="same")
    noise = 0.5 * white + pink * 3
    speech_power = float(np.mean(audio[np.abs(audio) > 0.01] ** 2)) if np.any(audio) else 1e-4
    noise *= np.sqrt(speech_power / (10 ** (snr_db / 10)) / float(np.mean(noise**2)))
    return (audio + noise).astype(np.float32)


def telephone(audio: np.ndarray) -> np.ndarray:
    """300-3,400 Hz, 8 kHz samples, mu-law: a phone line (returned at 8 kHz)."""
    narrow = band_limit(audio, 300, 3400)
    return mu_law(narrow[::2] * 0.9)


def render(audio: np.ndarray, condition: str, seed: int) -> tuple[np.ndarray, int]:
    """(samples, rate) of ``audio`` (16 kHz) in an audio condition."""
    rng = np.random.default_rng(seed)
    rate = SAMPLE_RATE
    if "noise" in condition or condition == "noisy":
        audio = add_noise(audio, float(rng.uniform(10, 25)), rng)
    if condition.startswith("telephone"):
        audio, rate = telephone(audio), TELEPHONE_RATE
    peak = float(np.max(np.abs(audio))) or 1.0
    return (audio / peak * 0.8).astype(np.float32), rate


def write_wav(path: Path, audio: np.ndarray, rate: int) -> Path:
    import wave

    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def voice(rng: random.Random) -> tuple[str, int]:
    return rng.choice(VOICES) + rng.choice(VARIANTS), rng.choice(RATES)


@dataclass
class Recording:
    name: str
    path: Path
    reference: str
    secrets: list[Secret]
    voice: str
    rate: int
    condition: str
    kind: str
    style: str
    real: bool = False


def synthesize(
    folder: Path, seed: int, n: int, conditions: Sequence[str] = CONDITIONS
) -> list[Recording]:
    """``n`` number utterances as WAV files in ``folder``, each with a voice, rate and audio
    condition drawn with ``seed``."""
    from overnight.jobs.ops.demo import silence, speak

    rng = random.Random(seed * 7919 + 1)
    out = []
    for k, utt in enumerate(utterances(seed, n)):
        v, rate = voice(rng)
        condition = rng.choice(list(conditions))
        lead, tail = rng.uniform(0.2, 1.0), rng.uniform(0.3, 1.2)
        audio = np.concatenate([silence(lead), speak(utt.text, voice=v, speed=rate), silence(tail)])
        samples, sr = render(audio, condition, seed * 100_003 + k)
        path = write_wav(folder / f"{utt.name}.wav", samples, sr)
        out.append(
            Recording(
                utt.name, path, utt.reference, utt.secrets, v, rate, condition, utt.kind, utt.style
            )
        )
    return out


def real_references(audio_dir: Path) -> dict[str, str]:
    """References of the real recordings in ``audio_dir`` (LibriSpeech's transcript file, and
    the JFK clip every Whisper port ships)."""
    refs: dict[str, str] = {}
    trans = audio_dir / "librispeech_trans.txt"
    if trans.is_file():
        for line in trans.read_text().splitlines():
            if "\t" in line:
                key, text = line.split("\t", 1)
                refs[key] = text.strip()
    if (audio_dir / "jfk.flac").is_file():
        refs["jfk"] = (
            "And so my fellow Americans, ask not what your country can do for you, ask what "
            "you can do for your country."
        )
    return refs


def _load(path: Path) -> np.ndarray:
    from faster_whisper.audio import decode_audio

    return decode_audio(str(path), sampling_rate=SAMPLE_RATE)


def real_speech(
    folder: Path, audio_dir: Path, seed: int, conditions: Sequence[str] = CONDITIONS
) -> list[Recording]:
    """The real recordings with a reference, each in every audio condition, and each spliced
    before a synthesized number utterance (a real voice, then a number read out)."""
    from overnight.jobs.ops.demo import silence, speak

    rng = random.Random(seed * 31 + 5)
    refs = real_references(audio_dir)
    out: list[Recording] = []
    for key, ref in sorted(refs.items()):
        src = next((p for p in audio_dir.glob(f"{key}.*") if p.suffix in (".wav", ".flac")), None)
        if src is None:
            continue
        audio = _load(src)
        for c, condition in enumerate(conditions):
            name = f"real_{key}_{condition.replace('+', '_')}"
            samples, sr = render(audio, condition, seed * 1009 + c)
            out.append(
                Recording(
                    name,
                    write_wav(folder / f"{name}.wav", samples, sr),
                    ref,
                    [],
                    "real",
                    0,
                    condition,
                    "real",
                    "",
                    real=True,
                )
            )
            utt = utterance(rng, name + "_num")
            v, rate = voice(rng)
            spliced = np.concatenate([audio, silence(0.6), speak(utt.text, voice=v, speed=rate)])
            samples, sr = render(spliced, condition, seed * 1013 + c)
            out.append(
                Recording(
                    utt.name,
                    write_wav(folder / f"{utt.name}.wav", samples, sr),
                    f"{ref} {utt.reference}",
                    utt.secrets,
                    f"real+{v}",
                    rate,
                    condition,
                    utt.kind,
                    utt.style,
                    real=True,
                )
            )
    return out


def corpus(folder: Path, seed: int, n: int, audio_dir: Path | None = None) -> Iterator[Recording]:
    """``n`` synthesized utterances, plus the real recordings when ``audio_dir`` has them."""
    folder.mkdir(parents=True, exist_ok=True)
    yield from synthesize(folder, seed, n)
    if audio_dir is not None and audio_dir.is_dir():
        yield from real_speech(folder, audio_dir, seed)
