"""The base of every validated config model (the job spec, the tenants config), and the one
way their validation errors become a message that names the field, the value and the fix."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

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
        problems.append(f"{where}: {err['msg']}{shown}")
    return ConfigError(f"{title}: " + "; ".join(problems))
