"""Text bytes to ``str``: byte-order marks, strict UTF-8, a declared or detected encoding,
and the checks that tell binary data from text."""

from __future__ import annotations

import codecs
import math
import re

from overnight.schemas.errors import ErrorCode
from overnight.workers.text.core import Failure

_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: its BOM starts the same way
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_SAMPLE = 65_536
# Bytes that do not occur in text in any encoding we accept: C0 controls except
# tab, newline, vertical tab, form feed, carriage return and escape.
_CONTROL_BYTES = bytes([*range(0x01, 0x09), 0x0E, *range(0x0F, 0x1B), *range(0x1C, 0x20), 0x7F])


def decode(data: bytes, declared: str | None = None) -> str:
    """Decode text bytes: BOM, then strict UTF-8, then a declared or detected encoding.

    Binary data raises ``unsupported_type``; text in an encoding that cannot be determined
    raises ``invalid_encoding``.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            try:
                return check_printable(data[len(bom) :].decode(encoding))
            except UnicodeDecodeError as exc:
                raise Failure(
                    ErrorCode.INVALID_ENCODING,
                    f"starts with a {encoding} byte order mark but is not valid {encoding}",
                ) from exc
    sample = data[:_SAMPLE]
    nuls = sample.count(0)
    if nuls:
        wide = _wide_encoding(sample)
        if wide is not None:
            try:
                return check_printable(data.decode(wide))
            except UnicodeDecodeError as exc:
                raise Failure(
                    ErrorCode.INVALID_ENCODING, f"looks like {wide} but is not valid {wide}"
                ) from exc
        if nuls > 0.01 * len(sample):  # a stray NUL in text is dropped by normalisation
            raise Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (NUL bytes), not text")
    try:
        return check_printable(data.decode("utf-8"))
    except UnicodeDecodeError:
        pass
    if len(sample.translate(None, _CONTROL_BYTES)) < 0.98 * len(sample):
        raise Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (control bytes), not text")
    if declared:
        try:
            return check_printable(data.decode(declared))
        except (LookupError, UnicodeDecodeError):
            pass  # a wrong declaration is common; detect instead
    detected = _detect_encoding(data)
    if detected is None:
        raise Failure(
            ErrorCode.INVALID_ENCODING,
            "not valid UTF-8 and no other encoding fits; re-encode the file as UTF-8",
        )
    return check_printable(data.decode(detected))


def _wide_encoding(sample: bytes) -> str | None:
    """UTF-32 or UTF-16 without a byte order mark, told by where the NUL bytes sit."""
    usable = len(sample) - len(sample) % 4
    if usable >= 4:
        lanes = [sample[lane:usable:4] for lane in range(4)]
        if lanes[2].count(0) == len(lanes[2]) and lanes[3].count(0) == len(lanes[3]):
            return "utf-32-le"
        if lanes[0].count(0) == len(lanes[0]) and lanes[1].count(0) == len(lanes[1]):
            return "utf-32-be"
    usable = len(sample) - len(sample) % 2
    if usable >= 2:
        even, odd = sample[0:usable:2], sample[1:usable:2]
        half = usable // 2
        if odd.count(0) > 0.3 * half and even.count(0) < 0.05 * half:
            return "utf-16-le"
        if even.count(0) > 0.3 * half and odd.count(0) < 0.05 * half:
            return "utf-16-be"
    return None


def _detect_encoding(data: bytes) -> str | None:
    from charset_normalizer import from_bytes
    from charset_normalizer.md import mess_ratio

    best = from_bytes(data).best()
    # charset-normalizer often misnames short Western text (cp1257, johab, ...); when
    # Windows-1252 reads it about as cleanly, take it: the most common legacy encoding.
    try:
        western = mess_ratio(data[:_SAMPLE].decode("cp1252"), maximum_threshold=1.0)
    except UnicodeDecodeError:
        western = math.inf
    best_chaos = best.chaos if best is not None else 0.0
    if western <= 0.2 and western <= best_chaos + 0.1:
        return "cp1252"
    return best.encoding if best is not None else None


_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f-\x9f]")


def check_printable(text: str) -> str:
    sample = text[:_SAMPLE]
    if len(_CONTROL_CHARS.findall(sample)) > 0.05 * len(sample):
        raise Failure(ErrorCode.UNSUPPORTED_TYPE, "binary data (unprintable characters), not text")
    return text
