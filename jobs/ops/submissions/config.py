"""The central tenants config: what each tenant may read, where it drops manifests, where results go."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, ValidationError, field_validator, model_validator

from overnight.jobs.config_model import ConfigModel, config_error
from overnight.jobs.ops.submissions.urls import ObjectURL, UriRejected, normalize, shown
from overnight.jobs.spec import TranscribeOptions, read_job_file

_TENANT = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


class Tenant(ConfigModel):
    """``[tenants.NAME]``: what one tenant may read, where it drops manifests, where results go."""

    allowed_input_prefixes: list[str] = Field(
        ..., min_length=1, description="URL prefixes its recordings may be under"
    )
    inbox: str = Field(..., description="URL prefix where its manifests are dropped")
    output: str = Field(
        ..., description="URL prefix for its results: <output>/submissions/<submission id>/"
    )

    @field_validator("allowed_input_prefixes")
    @classmethod
    def _prefixes_parse(cls, prefixes: list[str]) -> list[str]:
        for p in prefixes:
            try:
                normalize(p)
            except UriRejected as exc:
                raise ValueError(f"allowed prefix {shown(p)!r} is not usable: {exc}") from None
        return prefixes


class Settings(ConfigModel):
    """``[submissions]``."""

    state: str = Field(
        ..., description="URL prefix of the submissions state (one JSON per submission)"
    )
    max_recordings: int = Field(100_000, ge=1, description="larger submissions are rejected")
    max_attempts: int = Field(
        3, ge=1, description="runs of one submission before a failure is final"
    )
    ray_address: str | None = Field(
        None, description="join this Ray cluster; default: local Ray or RAY_ADDRESS"
    )
    shared_input_prefixes: list[str] = Field(
        default_factory=list,
        description="prefixes more than one tenant may read; elsewhere one tenant's "
        "allowed_input_prefixes must not overlap another's",
    )


class TenantsConfig(ConfigModel):
    submissions: Settings
    tenants: dict[str, Tenant] = Field(..., min_length=1)
    transcribe: TranscribeOptions = Field(default_factory=TranscribeOptions)
    prices: dict[str, float] = Field(default_factory=dict)

    @field_validator("tenants")
    @classmethod
    def _names(cls, tenants: dict[str, Tenant]) -> dict[str, Tenant]:
        for name in tenants:
            if not _TENANT.match(name):
                raise ValueError(
                    f"tenant name {name!r}: use 1-63 lowercase letters, digits, '-' or '_'"
                )
        return tenants

    @model_validator(mode="after")
    def _isolated(self) -> TenantsConfig:
        """No place a tenant's results, manifests or the submissions state live may lie
        inside another: their prefixes would mix. Nor inside any other tenant's input
        prefixes (the state: anyone's): that tenant could submit them as its own recordings
        and read another's results (redacted audio included) or every tenant's records."""
        places: list[tuple[str, str | None, ObjectURL]] = [
            (f"tenants.{name}.{what}", name, _usable(f"tenants.{name}.{what}", getattr(t, what)))
            for name, t in self.tenants.items()
            for what in ("inbox", "output")
        ]
        places.append(
            ("submissions.state", None, _usable("submissions.state", self.submissions.state))
        )
        for i, (w1, _, u1) in enumerate(places):
            for w2, _, u2 in places[i + 1 :]:
                if _overlap(u1, u2) is not None:
                    raise ValueError(f"{w1} and {w2} overlap: give each its own prefix")
        inputs = [
            (name, p, normalize(p))
            for name, t in self.tenants.items()
            for p in t.allowed_input_prefixes
        ]
        for where, owner, url in places:
            for name, p, prefix in inputs:
                if name != owner and _overlap(url, prefix) is not None:
                    raise ValueError(
                        f"{where} and tenants.{name}.allowed_input_prefixes {shown(p)!r} "
                        f"overlap: {name} could submit what is there as its own recordings. "
                        "Keep results, inboxes and the state outside every other tenant's "
                        "input prefixes"
                    )
        self._inputs_isolated(inputs)
        return self

    def _inputs_isolated(self, inputs: list[tuple[str, str, ObjectURL]]) -> None:
        """One tenant may not read another's recordings: input prefixes of two tenants must
        not overlap, except inside a prefix the config declares shared."""
        try:
            shared = [normalize(p) for p in self.submissions.shared_input_prefixes]
        except UriRejected as exc:
            raise ValueError(f"submissions.shared_input_prefixes: {exc}") from None
        for i, (n1, p1, u1) in enumerate(inputs):
            for n2, p2, u2 in inputs[i + 1 :]:
                common = _overlap(u1, u2) if n1 != n2 else None
                if common is None or any(_under(common, s) for s in shared):
                    continue
                raise ValueError(
                    f"tenants.{n1}.allowed_input_prefixes {shown(p1)!r} and "
                    f"tenants.{n2}.allowed_input_prefixes {shown(p2)!r} overlap: each tenant could "
                    "read the other's recordings. Give each its own prefix, or list the common "
                    "one in submissions.shared_input_prefixes if both may read it."
                )


def _usable(where: str, url: str) -> ObjectURL:
    try:
        return normalize(url)
    except UriRejected as exc:
        raise ValueError(f"{where} {shown(url)!r} is not usable: {exc}") from None


def _under(url: ObjectURL, prefix: ObjectURL) -> bool:
    """``url`` is ``prefix`` or lies below it (segment boundaries)."""
    n = len(prefix.segments)
    return (url.scheme, url.bucket) == (prefix.scheme, prefix.bucket) and (
        url.segments[:n] == prefix.segments
    )


def _overlap(a: ObjectURL, b: ObjectURL) -> ObjectURL | None:
    """What two prefixes both cover (the deeper one), or None."""
    if _under(a, b):
        return a
    if _under(b, a):
        return b
    return None


def load_config(path: str | Path) -> TenantsConfig:
    data = read_job_file(path)
    try:
        return TenantsConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error(
            exc, f"invalid tenants config {str(path)!r}", "(config)", show_input=False
        ) from None
