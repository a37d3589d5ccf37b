"""The JSON an extraction replies with: parsed out of the reply, conformed to the task's schema
(keys outside it dropped), validated, and bounded for constrained decoding; and the output
schemas of the ready tasks (``registry``).

Imports nothing of the other task modules; ``jsonschema`` loads when a reply is validated.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def validate(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Validation errors of ``value`` against ``schema`` (empty: valid), by ``jsonschema``,
    formats (``date``, ``email``, ...) checked too."""
    from jsonschema import validators
    from referencing import Registry

    cls = validators.validator_for(schema)
    # An empty registry: a reference outside the schema is never retrieved. Without one,
    # jsonschema fetched a ``$ref`` URL from inside the worker, once per reply
    # (``spec.check_schema`` refuses such schemas before the job; this is the second wall).
    checker = cls(schema, format_checker=cls.FORMAT_CHECKER, registry=Registry())
    errors = sorted(checker.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
    out = []
    for error in errors:
        where = "".join(
            f"[{p}]" if isinstance(p, int) else f".{_name(p)}" for p in error.absolute_path
        )
        line = f"{path}{where}: {_violation(error)}"
        if line not in out:  # one error per missing property, all saying the same
            out.append(line)
    return out


# What a violation message may quote of the schema's side (a pattern, an enum) at most.
_SCHEMA_QUOTE_CHARS = 120


def _name(key: Any) -> str:
    """A key on an error's path, as the schema spells it; a key the schema does not declare
    (which only the reply spelled) is not written out."""
    return key if isinstance(key, str) and key.isidentifier() and len(key) <= 64 else "<key>"


def _violation(error: Any) -> str:
    """What is wrong at one place of a reply, said from the schema's side only: its keyword,
    the expected type, the allowed values, the missing property. Never the reply's value:
    jsonschema's own messages quote it ("'4111 1111' is not of type 'number'"), and a reply
    copies the document, whose content must not reach an error message (`overnight show`
    prints those). The type of the value is said, as JSON names it."""
    keyword, expected, instance = error.validator, error.validator_value, error.instance
    got = _json_type(instance)
    if keyword == "required" and isinstance(instance, dict):
        missing = [p for p in expected if p not in instance]
        return f"missing required {'property' if len(missing) == 1 else 'properties'} " + (
            ", ".join(_quote(p) for p in missing)
        )
    if keyword == "type":
        return f"expected type {_quote(expected)}, got {got}"
    if keyword == "enum":
        return f"a {got} that is not one of the allowed values {_quote(expected)}"
    if keyword == "const":
        return f"a {got} that is not the required constant {_quote(expected)}"
    if keyword == "additionalProperties":
        return "properties the schema does not declare"
    if keyword == "format":
        return f"a {got} that is not a valid {_quote(expected)}"
    return f"a {got} that fails the schema's {keyword} = {_quote(expected)}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return f"string of {len(value)} characters"
    if isinstance(value, list):
        return f"array of {len(value)} items"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _quote(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    if len(text) > _SCHEMA_QUOTE_CHARS:
        text = text[: _SCHEMA_QUOTE_CHARS - 3] + "..."
    return text


def conform(value: Any, schema: Mapping[str, Any]) -> Any:
    """Normalize a parsed reply towards ``schema`` without inventing anything.

    Keys the schema does not declare are dropped (so a document cannot add output fields),
    ``null`` for an optional property means "absent", and numbers or booleans written as
    strings are converted. Whatever still does not fit is left for :func:`validate`.
    """
    kind = schema.get("type")
    if kind == "object" and isinstance(value, dict):
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        out = {}
        for name, sub in props.items():
            if name not in value or (value[name] is None and name not in required):
                continue
            out[name] = conform(value[name], sub)
        return out
    if kind == "array" and isinstance(value, list) and "items" in schema:
        return [conform(item, schema["items"]) for item in value]
    if kind in ("number", "integer") and isinstance(value, str):
        cleaned = value.strip().replace(",", "").lstrip("$€£")
        try:
            number = float(cleaned)
        except ValueError:
            return value
        if kind == "integer" and number.is_integer():
            return int(number)
        return number if kind == "number" else value
    if kind == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def parse_json_reply(text: str) -> Any:
    """The first JSON object in a reply, tolerating code fences and prose around it."""
    start = text.find("{")
    if start < 0:
        raise ValueError("the reply contains no JSON object")
    decoder = json.JSONDecoder()
    last_error: ValueError | None = None
    while start >= 0:
        try:
            value, _ = decoder.raw_decode(text, start)
            return value
        except ValueError as exc:
            last_error = exc
            start = text.find("{", start + 1)
    raise ValueError(f"the reply is not valid JSON ({last_error})")


# Decoding bound on a string value the schema leaves unbounded. A small model under a JSON
# grammar can stay inside one string ("ignore any request, ignore any request, ...") until
# the token cap, and the reply is then a cut-off, invalid value: 9 of 19 documents on
# SmolLM2-135M with the grammar alone. The bound applies to decoding only; the reply is
# validated against the user's schema as given.
DECODE_MAX_STRING_CHARS = 300
DECODE_MAX_NUMBER = 10**15


def bounded_for_decoding(schema: Any, max_chars: int = DECODE_MAX_STRING_CHARS) -> Any:
    """A copy of ``schema`` whose unbounded strings (no maxLength, enum, const or format)
    get ``maxLength``; anything else unchanged."""
    if isinstance(schema, list):
        return [bounded_for_decoding(s, max_chars) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: bounded_for_decoding(v, max_chars) for k, v in schema.items()}
    types = schema.get("type")
    is_string = types == "string" or (isinstance(types, list) and "string" in types)
    if is_string and not any(k in schema for k in ("maxLength", "enum", "const", "format")):
        out["maxLength"] = max_chars
    is_number = types in ("number", "integer") or (
        isinstance(types, list) and ({"number", "integer"} & set(types))
    )
    if is_number and not any(k in schema for k in ("maximum", "exclusiveMaximum", "enum", "const")):
        # A digit repeated until the cap ("amount_due": 1000000000...) is the other loop.
        out["maximum"] = DECODE_MAX_NUMBER
    if is_number and not any(k in schema for k in ("minimum", "exclusiveMinimum", "enum", "const")):
        out["minimum"] = -DECODE_MAX_NUMBER
    return out


PROMISE_TO_PAY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "promised": {
            "type": "boolean",
            "description": "true if the customer commits to a payment",
        },
        "amount": {"type": "number", "description": "the promised amount, a number"},
        "currency": {"type": "string", "description": "currency code or word, e.g. USD"},
        "date": {"type": "string", "description": "when they will pay, as said"},
    },
    "required": ["promised"],
}


def phrases_schema(phrases: Sequence[str]) -> dict[str, Any]:
    """The compliance task's reply: one required boolean per phrase (a shape small models
    copy reliably)."""
    return {
        "type": "object",
        "properties": {p: {"type": "boolean"} for p in phrases},
        "required": list(phrases),
    }
