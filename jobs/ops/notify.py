"""``--notify URL`` / ``[job] notify``: a JSON POST when a run ends, for the on-call channel.

A nightly CronJob that fails at 3 a.m. should be known at 3 a.m. The POST carries the run
summary (counts, errors by code, cost, paths with credentials scrubbed) or, for a run that
stopped, the error's class, exit status and message. It holds no transcript or document text
(summaries have none) and no credentials: the message goes through ``scrub_secrets`` and the
URL, which often is itself a secret (a chat webhook's token), is never printed, only its host.

It never fails or holds up the run: a few tries with backoff inside a fixed time budget, then
one line on stderr, and the run's own exit status stands.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from overnight.jobs.dataset.storage import scrub_secrets
from overnight.jobs.errors import ErrorRateExceeded, OvernightError

TRIES = 3
TIMEOUT_S = 5.0  # per try
BUDGET_S = 20.0  # all tries and waits together


def payload(
    *,
    summary: Mapping[str, Any] | None = None,
    error: BaseException | None = None,
    spec_kind: str | None = None,
    run_id: str | None = None,
) -> dict[str, Any]:
    """What is posted: ``event`` finished | failed, and the summary or the error."""
    if error is None:
        return {
            "event": "run_finished",
            "status": "succeeded",
            "run_id": (summary or {}).get("run_id", run_id),
            "kind": (summary or {}).get("kind", spec_kind),
            "summary": dict(summary or {}),
        }
    exit_code = (
        error.exit_code
        if isinstance(error, OvernightError)
        else 130
        if isinstance(error, KeyboardInterrupt)
        else 1
    )
    finished = isinstance(error, ErrorRateExceeded)  # rows and summary are written
    body: dict[str, Any] = {
        "event": "run_finished" if finished else "run_failed",
        "status": "over_error_rate" if finished else "failed",
        "run_id": run_id,
        "kind": spec_kind,
        "exit_code": exit_code,
        "error": type(error).__name__,
        "message": scrub_secrets(str(error))[:2000],
    }
    if finished and isinstance(error, ErrorRateExceeded):
        body["summary"] = dict(error.summary)
        body["run_id"] = error.summary.get("run_id", run_id)
    return body


def where(url: str) -> str:
    """The URL as it may be printed: scheme and host only."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"


def post(
    url: str,
    body: Mapping[str, Any],
    *,
    tries: int = TRIES,
    timeout_s: float = TIMEOUT_S,
    budget_s: float = BUDGET_S,
    echo: Callable[[str], None] | None = None,
) -> bool:
    """POST ``body`` as JSON; True when an endpoint answered 2xx. Never raises."""
    say: Callable[[str], None]
    if echo is None:
        from overnight.jobs.run import console

        def say(line: str) -> None:
            console.say("notify_failed", line, level="warning")
    else:
        say = echo
    data = json.dumps(body, default=str).encode()
    deadline = time.monotonic() + budget_s
    last = "not tried"
    for attempt in range(tries):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        request = urllib.request.Request(
            url,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "overnight-notify"},
        )
        try:
            with urllib.request.urlopen(request, timeout=min(timeout_s, left)) as response:
                if 200 <= response.status < 300:
                    return True
                last = f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                break  # the endpoint refuses this request: trying again will not help
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            last = type(reason).__name__ if not isinstance(reason, str) else reason
        if attempt + 1 < tries:
            time.sleep(min(0.5 * 2**attempt, max(0.0, deadline - time.monotonic())))
    say(f"[overnight] could not notify {where(url)} ({scrub_secrets(last)}); the run is unaffected")
    return False
