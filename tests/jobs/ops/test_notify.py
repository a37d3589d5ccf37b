"""``--notify URL``: a JSON POST of the run's end to a loopback HTTP server; retried when the
endpoint fails, bounded in time when it hangs, and never a failure of the run."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from overnight.jobs.errors import ErrorRateExceeded, StorageUnavailable
from overnight.jobs.ops import notify


class _Endpoint:
    """A loopback endpoint that answers each POST with the next status of ``answers`` (the
    last one repeats), or sleeps ``hang_s`` first."""

    def __init__(self, answers=(200,), hang_s: float = 0.0):
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                endpoint.bodies.append(json.loads(body))
                endpoint.paths.append(self.path)
                if hang_s:
                    time.sleep(hang_s)
                i = min(len(endpoint.bodies), len(answers)) - 1
                self.send_response(answers[i])
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0KEN-s3cret"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint():
    made: list[_Endpoint] = []

    def make(*args, **kwargs):
        made.append(_Endpoint(*args, **kwargs))
        return made[-1]

    yield make
    for e in made:
        e.close()


SUMMARY = {"run_id": "nightly-2026-12-06", "kind": "transcribe", "items": 12, "failed": 1}


def test_a_finished_run_posts_its_summary_once(endpoint):
    e = endpoint()
    assert notify.post(e.url, notify.payload(summary=SUMMARY))
    assert len(e.bodies) == 1
    body = e.bodies[0]
    assert body["event"] == "run_finished" and body["status"] == "succeeded"
    assert body["run_id"] == "nightly-2026-12-06" and body["summary"]["items"] == 12


def test_a_failing_endpoint_is_tried_again_then_answers(endpoint):
    e = endpoint(answers=(503, 502, 200))
    assert notify.post(e.url, notify.payload(summary=SUMMARY))
    assert len(e.bodies) == 3


def test_a_stopped_run_posts_its_exit_status_without_credentials(endpoint, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY")
    e = endpoint()
    error = StorageUnavailable(
        "cannot reach s3://acme-calls with key wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
    )
    assert notify.post(e.url, notify.payload(error=error, spec_kind="transcribe", run_id="r1"))
    body = e.bodies[0]
    assert body["event"] == "run_failed" and body["exit_code"] == 3
    assert body["error"] == "StorageUnavailable" and body["run_id"] == "r1"
    assert "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY" not in json.dumps(body)


def test_a_run_over_its_error_rate_posts_its_summary_and_exit_12(endpoint):
    e = endpoint()
    error = ErrorRateExceeded("3 of 12 items failed", summary=SUMMARY)
    assert notify.post(e.url, notify.payload(error=error, spec_kind="transcribe"))
    body = e.bodies[0]
    assert body["status"] == "over_error_rate" and body["exit_code"] == 12
    assert body["summary"]["items"] == 12 and body["run_id"] == "nightly-2026-12-06"


def test_an_unreachable_or_hanging_endpoint_costs_a_bounded_time_and_names_no_token(endpoint):
    lines: list[str] = []
    e = endpoint(hang_s=3.0)
    started = time.monotonic()
    ok = notify.post(
        e.url, notify.payload(summary=SUMMARY), timeout_s=0.5, budget_s=2.0, echo=lines.append
    )
    assert not ok and time.monotonic() - started < 3.0
    assert lines and "T0KEN" not in lines[0] and "127.0.0.1" in lines[0]
    dead = e.url.replace(str(e.server.server_address[1]), "9")  # the discard port: refused
    assert not notify.post(dead, notify.payload(summary=SUMMARY), budget_s=2.0, echo=lines.append)


def test_a_refusing_endpoint_is_not_tried_again(endpoint):
    e = endpoint(answers=(404,))
    assert not notify.post(e.url, notify.payload(summary=SUMMARY), echo=lambda line: None)
    assert len(e.bodies) == 1


def test_the_spec_takes_an_http_url_and_never_echoes_a_bad_one():
    from overnight.jobs.errors import ConfigError
    from overnight.jobs.spec import build_spec

    job = {"input": "in", "output": "out"}
    spec = build_spec({}, {"job": {**job, "notify": "https://hooks.example/T0KEN"}})
    assert spec.job.notify == "https://hooks.example/T0KEN"
    with pytest.raises(ConfigError, match="http:// or https://") as caught:
        build_spec({}, {"job": {**job, "notify": "hooks.example/T0KEN"}})
    assert "T0KEN" not in str(caught.value)


def test_a_job_that_stops_notifies_its_error_and_still_raises_it(endpoint, tmp_path):
    """Through the path the command line and the API share (``jobs.api.finish``)."""
    from overnight.jobs.api import finish
    from overnight.jobs.errors import InputNotFound
    from overnight.jobs.spec import build_spec

    e = endpoint()
    job = {"input": str(tmp_path / "missing"), "output": str(tmp_path / "out")}
    spec = build_spec({}, {"job": {**job, "notify": e.url, "run_id": "nightly-x"}})
    with pytest.raises(InputNotFound):
        finish(spec)
    [body] = e.bodies
    assert body["event"] == "run_failed" and body["exit_code"] == 4
    assert body["run_id"] == "nightly-x" and body["error"] == "InputNotFound"


def test_the_environments_webhook_is_told_when_the_spec_names_none(endpoint, tmp_path, monkeypatch):
    """A webhook's token belongs in a Secret the pods read as OVERNIGHT_NOTIFY_URL, not in a
    job file's ConfigMap or a RayJob's entrypoint."""
    from overnight.jobs.api import finish
    from overnight.jobs.errors import InputNotFound
    from overnight.jobs.spec import build_spec

    e = endpoint()
    monkeypatch.setenv("OVERNIGHT_NOTIFY_URL", e.url)
    job = {"input": str(tmp_path / "missing"), "output": str(tmp_path / "out")}
    with pytest.raises(InputNotFound):
        finish(build_spec({}, {"job": {**job, "run_id": "nightly-env"}}))
    [body] = e.bodies
    assert body["event"] == "run_failed" and body["run_id"] == "nightly-env"


def test_a_failed_notification_under_json_logs_is_one_json_event(capsys, monkeypatch):
    from overnight.jobs.run import console

    monkeypatch.setenv("OVERNIGHT_LOG_FORMAT", "json")
    monkeypatch.setattr(console, "_events", None)  # set up again for the format
    try:
        assert not notify.post("http://127.0.0.1:9/hook", {"a": 1}, tries=1, budget_s=2)
        [line] = capsys.readouterr().err.strip().splitlines()
        event = json.loads(line)
        assert event["event"] == "notify_failed" and event["level"] == "warning"
    finally:
        console._events = None
