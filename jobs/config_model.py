"""The base of every validated config model (the job spec, the tenants config), and the one
way their validation errors become a message that names the field, the value and the fix."""

from __future__ import annotations

import datetime
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from overnight.jobs.errors import ConfigError

# Fields whose values are not echoed in a validation message.
_SECRET_FIELDS = frozenset({"notify"})


class ConfigModel(BaseModel):
    """Unknown keys are errors (a typo must not be ignored); a validated config is frozen.
    NaN and infinity are no number a setting takes: ``cpus_per_actor = inf`` overflowed in
    sizing, after the run had claimed its output."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def no_boolean_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return reject_boolean_numbers(cls, value, info)


def reject_boolean_numbers(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A boolean is no count or share: pydantic reads ``true`` as 1, so ``max_items = true``
    ran one item and ``beam_size = true`` decoded greedily, without a word. Every config
    model's fields go through this (the sections declared in ``workers`` too)."""
    field = cls.model_fields.get(info.field_name or "")
    if isinstance(value, bool) and field is not None and _numeric(field.annotation):
        raise ValueError(f"takes a number, not the boolean {str(value).lower()}")
    return value


def _numeric(annotation: Any) -> bool:
    """Whether a field's type is a number (``int``, ``float``, optional or not) and never a
    boolean."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(args) and bool not in args and all(a in (int, float) for a in args)
    return False


def config_error(
    exc: ValidationError, title: str, root: str, show_input: bool = True
) -> ConfigError:
    """Each problem as ``where: message (got value)``, joined by "; ": one line, as the CLI
    prints every error (it escapes control characters, so the newlines this once held came
    out as a literal backslash-n). ``root`` names the top level. ``show_input=False`` leaves
    the values out (the tenants config's are URLs)."""
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or root
        value: Any = err.get("input")
        # A URL field's value can carry a token (a webhook's): never repeated.
        secret = any(str(part) in _SECRET_FIELDS for part in err["loc"])
        shown = "" if isinstance(value, dict) or not show_input or secret else f" (got {value!r})"
        if err["type"] == "string_type" and isinstance(value, bool):
            # YAML reads yes/no/on/off as booleans (Norwegian's ``language: no``).
            shown += "; YAML reads yes, no, on and off as booleans: write the text in quotes"
        elif err["type"] == "string_type" and isinstance(value, (datetime.date, int, float)):
            # YAML reads 2026-12-01 as a date and 1201 as a number: the text needs quotes.
            text = value.isoformat() if isinstance(value, datetime.date) else str(value)
            shown += f"; write it in quotes ({text!r})"
        problems.append(f"{where}: {err['msg']}{shown}")
    return ConfigError(f"{title}: " + "; ".join(problems))
