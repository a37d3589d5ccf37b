"""Object URLs as the tenant boundary compares them: normalised scheme, bucket and path segments."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from urllib.parse import unquote

from overnight.jobs.dataset import storage

_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "file": "file"}
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")


class UriRejected(ValueError):
    """A URI that cannot be read safely; the message is the reason."""


@dataclass(frozen=True)
class ObjectURL:
    """A normalised object URL: scheme, bucket and path segments (no ``.``, ``..`` or empty).

    ``decoded`` holds the segments after percent-decoding, in case some layer decodes: a URI
    is allowed only if both readings lie under the prefix.
    """

    scheme: str
    bucket: str
    segments: tuple[str, ...]
    decoded: tuple[str, ...]

    def url(self) -> str:
        path = "/".join(self.segments)
        if self.scheme == "file":
            return "/" + path
        return f"{self.scheme}://{self.bucket}/{path}" if path else f"{self.scheme}://{self.bucket}"

    def within(self, prefix: ObjectURL) -> bool:
        """Strictly below ``prefix`` on path-segment boundaries, in both readings."""
        if (self.scheme, self.bucket) != (prefix.scheme, prefix.bucket):
            return False
        n = len(prefix.segments)
        return all(
            len(segs) > n and segs[:n] == prefix.segments for segs in (self.segments, self.decoded)
        )


def shown(uri: str, limit: int = 160) -> str:
    """A URI as it may appear in messages: no user-info, no control characters, redacted."""
    text = re.sub(r"(?<=://)[^/@]*@", "***@", str(uri))
    text = "".join(ch if ch.isprintable() else "?" for ch in text)
    text = storage.scrub_secrets(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _segments(path: str) -> tuple[str, ...]:
    out: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if not out:
                raise UriRejected("its path climbs above the bucket or root with '..'")
            out.pop()
            continue
        out.append(seg)
    return tuple(out)


def _decoded(path: str) -> str:
    for _ in range(4):  # double (or deeper) encoding counts too
        nxt = unquote(path)
        if nxt == path:
            return path
        path = nxt
    raise UriRejected("it is percent-encoded more than three times")


def normalize(uri: str) -> ObjectURL:
    """Parse and normalise one URI or prefix; UriRejected with the reason otherwise."""
    if not isinstance(uri, str) or not uri.strip():
        raise UriRejected("it is empty")
    uri = uri.strip()
    if any(not ch.isprintable() for ch in uri) or "\\" in uri:
        raise UriRejected("it contains control characters or backslashes")
    if "?" in uri or "#" in uri:
        raise UriRejected("it has a query or fragment ('?', '#')")
    if "://" not in uri:
        if not uri.startswith("/"):
            raise UriRejected("it is relative: use an absolute URI such as s3://bucket/key")
        scheme, rest = "file", uri
    else:
        raw_scheme, rest = uri.split("://", 1)
        if raw_scheme.lower() not in _SCHEMES:
            raise UriRejected(f"scheme {raw_scheme!r} is not accepted (s3://, gs://, file://)")
        scheme = _SCHEMES[raw_scheme.lower()]
    if scheme == "file":
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
        if not rest.startswith("/"):
            raise UriRejected("a file URI must be absolute (file:///path)")
        bucket, path = "", rest
        # Symlinks must not lead out of an allowed folder: compare real paths.
        literal = _segments(os.path.realpath("/" + "/".join(_segments(path))))
        decoded = _segments(os.path.realpath("/" + "/".join(_segments(_decoded(path)))))
        return ObjectURL(scheme, bucket, literal, decoded)
    netloc, _, path = rest.partition("/")
    if "@" in netloc or ":" in netloc:
        raise UriRejected("it carries user-info or a port in the bucket name")
    bucket = netloc.lower()
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise UriRejected(f"bucket {shown(netloc)!r} is not a valid bucket name")
    return ObjectURL(scheme, bucket, _segments(path), _segments(_decoded(path)))
