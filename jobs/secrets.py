"""Credentials in text: what ``scrub_secrets`` removes from every message, log line, summary
and error before anyone reads it, and ``looks_like_credentials``, which storage and the views
refuse URLs by. Here, at the base of ``jobs``, so that an error scrubs its message where it is
raised (``jobs.errors``) without importing the storage layer above it."""

from __future__ import annotations

import os
import re

_SECRET_ENV = (
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "OVERNIGHT_PDF_PASSWORD",
    "RAY_AUTH_TOKEN",
    "HF_TOKEN",
)
# A URL's user-info after its ``scheme://``: ``user:secret@`` (the secret may hold ``/``) or
# ``user@`` (no ``/`` before the ``@``, so that a path's ``agent@example.com.wav`` is not one).
USER_INFO = r"(?:[^\s/@:\"']+:[^\s@\"']*|[^\s/@\"']+)@"
# Looks like a key even when we did not get it from the environment.
# (pattern, replacement): whole access-key ids go; for key=value pairs the name stays.
_SECRET_PATTERNS = (
    (re.compile(r"(?:AKIA|ASIA)[0-9A-Z]{16}"), "***"),
    (
        re.compile(
            r"(?i)((?:secret|token|password|signature|credential)[\"']?\s*[=:]\s*)[^\s&,;\"']+"
        ),
        r"\1***",
    ),
    (re.compile(r"(?i)(X-Amz-[A-Za-z-]+=)[^&\s]+"), r"\1***"),
    # An Azure SAS token's signature (``?sv=...&sig=...``).
    (re.compile(r"(?i)([?&]sig=)[^&\s\"']+"), r"\1***"),
    # A URL's user-info (``s3://KEY:SECRET@bucket``), whole: a secret access key holds ``/``
    # and ``+``, so it ends at the ``@`` only; a user name alone goes too.
    (re.compile(r"(?<=://)" + USER_INFO), "***@"),
)


def looks_like_credentials(text: str) -> bool:
    """``text`` holds something shaped like a credential (a key id, a signature, a URL's
    user-info): the patterns ``scrub_secrets`` removes, not the environment's values, which
    can be short words that a path holds too."""
    return any(pattern.search(text) for pattern, _ in _SECRET_PATTERNS)


def scrub_secrets(text: str) -> str:
    """Remove credentials from a message: known secret values and key-like patterns."""
    for name in _SECRET_ENV:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    for pattern, replacement in _SECRET_PATTERNS:
        text = pattern.sub(replacement, text)
    return text
