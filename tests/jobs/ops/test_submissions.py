"""Contact-center bulk submissions: tenant isolation, once-only processing, outages.

The URI and config checks run without Ray or storage; the end-to-end tests use moto's real S3
endpoint, the session's local Ray and the bundled tiny.en model.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import tomli_w
from pydantic import ValidationError

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.submissions import (
    Rejected,
    Tenant,
    UriRejected,
    load_config,
    normalize,
    trusted_rows,
)
from tests.conftest import _free_port, secrets_in, wer

# --- URIs: the whole tenant boundary rests on these ------------------------------------------


def allowed(uri: str, prefix: str) -> bool:
    try:
        return normalize(uri).within(normalize(prefix))
    except UriRejected:
        return False


@pytest.mark.parametrize(
    ("uri", "prefix", "ok"),
    [
        ("s3://acme-calls/rec/a.wav", "s3://acme-calls/rec/", True),
        ("s3://acme-calls/rec/2026/12/a.wav", "s3://acme-calls/rec", True),
        ("S3A://ACME-CALLS/rec/a.wav", "s3://acme-calls/rec/", True),
        ("s3://acme-calls/rec//a.wav", "s3://acme-calls/rec/", True),
        ("s3://acme-calls/rec/./x/../a.wav", "s3://acme-calls/rec/", True),
        ("s3://acme-calls/a.wav", "s3://acme-calls", True),
        # Look-alike buckets and folders: segment boundaries, not string prefixes.
        ("s3://acme-calls-evil/a.wav", "s3://acme-calls", False),
        ("s3://acme-calls/records/a.wav", "s3://acme-calls/rec", False),
        ("s3://acme-calls/rec", "s3://acme-calls/rec/", False),
        # Traversal, plain and percent-encoded (once or twice).
        ("s3://acme-calls/rec/../globex/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/../../globex-calls/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/%2e%2e/globex/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/%252E%252E/globex/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/..%2f..%2fglobex/a.wav", "s3://acme-calls/rec/", False),
        # Other schemes, user-info, ports, queries, relative paths, control characters.
        ("gs://acme-calls/rec/a.wav", "s3://acme-calls/rec/", False),
        ("https://acme-calls.s3.amazonaws.com/rec/a.wav", "s3://acme-calls/rec/", False),
        ("s3://AKIAXX:secret@acme-calls/rec/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls:9000/rec/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/a.wav?versionId=1", "s3://acme-calls/rec/", False),
        ("rec/a.wav", "s3://acme-calls/rec/", False),
        ("s3://acme-calls/rec/a\n.wav", "s3://acme-calls/rec/", False),
        ("file:///data/acme/../globex/a.wav", "file:///data/acme", False),
        ("/data/acme/a.wav", "file:///data/acme/", True),
    ],
)
def test_uri_is_allowed_only_strictly_inside_a_prefix_after_normalisation(uri, prefix, ok):
    assert allowed(uri, prefix) is ok


def test_symlink_out_of_an_allowed_folder_is_not_inside_it(tmp_path):
    (tmp_path / "acme").mkdir()
    (tmp_path / "globex").mkdir()
    (tmp_path / "globex" / "a.wav").write_bytes(b"x")
    (tmp_path / "acme" / "link").symlink_to(tmp_path / "globex")
    assert not allowed(str(tmp_path / "acme" / "link" / "a.wav"), str(tmp_path / "acme"))


ACME = Tenant(
    allowed_input_prefixes=["s3://acme-calls/rec/"],
    inbox="s3://inbox/acme/",
    output="s3://acme-results/out",
)


def test_manifest_cannot_claim_another_tenant_or_submission():
    rows = [
        {"uri": "s3://acme-calls/rec/a.wav", "tenant": "globex", "submission_id": "x", "agent": "7"}
    ]
    got = trusted_rows(rows, "acme", ACME, "sub-" + "0" * 24, max_recordings=10)
    assert got == [
        {
            "uri": "s3://acme-calls/rec/a.wav",
            "tenant": "acme",
            "submission_id": "sub-" + "0" * 24,
            "agent": "7",
        }
    ]


def test_one_foreign_uri_rejects_the_whole_submission_with_the_reason():
    rows = [{"uri": "s3://acme-calls/rec/a.wav"}, {"uri": "s3://globex-calls/rec/b.wav"}]
    with pytest.raises(Rejected, match=r"1 of 2 rows .*globex-calls/rec/b.wav.*outside"):
        trusted_rows(rows, "acme", ACME, "sub-" + "0" * 24, max_recordings=10)


def test_manifest_carrying_credentials_is_rejected_and_the_value_never_shown():
    rows = [{"uri": "s3://acme-calls/rec/a.wav", "aws_secret_access_key": "hunter2-very-secret"}]
    with pytest.raises(Rejected, match="look like credentials") as err:
        trusted_rows(rows, "acme", ACME, "sub-" + "0" * 24, max_recordings=10)
    assert "hunter2" not in str(err.value)


def _load_tenants(tmp_path, data: dict):
    path = tmp_path / "tenants.toml"
    path.write_text(tomli_w.dumps(data))
    return load_config(path)


def test_tenants_config_refuses_overlapping_inboxes_and_credentials_in_prefixes(tmp_path):
    def load(data: dict):
        return _load_tenants(tmp_path, data)

    base = {
        "submissions": {"state": "s3://state/subs"},
        "tenants": {
            "acme": {
                "allowed_input_prefixes": ["s3://acme-calls/"],
                "inbox": "s3://inbox/acme",
                "output": "s3://acme-out/",
            },
            "globex": {
                "allowed_input_prefixes": ["s3://globex-calls/"],
                "inbox": "s3://inbox/acme/globex",
                "output": "s3://globex-out/",
            },
        },
    }
    with pytest.raises(ConfigError, match="overlap"):
        load(base)
    base["tenants"]["globex"]["inbox"] = "s3://inbox/globex"
    assert sorted(load(base).tenants) == ["acme", "globex"]
    base["tenants"]["globex"]["allowed_input_prefixes"] = ["s3://AKIAKEY:secret@globex-calls/"]
    with pytest.raises(ConfigError, match="user-info") as err:
        load(base)
    assert "secret" not in str(err.value)


def test_tenants_config_names_a_misspelt_key_and_cannot_be_changed_once_loaded(tmp_path):
    data = {
        "submissions": {"state": "s3://state/subs", "max_attempt": 3},
        "tenants": {
            "acme": {
                "allowed_input_prefixes": ["s3://acme-calls/"],
                "inbox": "s3://inbox/acme",
                "output": "s3://acme-out/",
            }
        },
    }
    with pytest.raises(ConfigError, match=r"invalid tenants config .*: submissions\.max_attempt: "):
        _load_tenants(tmp_path, data)
    del data["submissions"]["max_attempt"]
    config = _load_tenants(tmp_path, data)
    with pytest.raises(ValidationError):
        config.tenants["acme"].inbox = "s3://inbox/globex"  # type: ignore[misc]


# --- end to end on the S3 endpoint -----------------------------------------------------------


class Buckets:
    """Fresh bucket names per test: the moto server lives for the whole session."""

    def __init__(self, client):
        tag = uuid.uuid4().hex[:8]
        self.client = client
        self.names = {
            k: f"ovn-{k}-{tag}"
            for k in ("acme-calls", "globex-calls", "inbox", "state", "acme-out", "globex-out")
        }
        for name in self.names.values():
            client.create_bucket(Bucket=name)

    def __getitem__(self, key: str) -> str:
        return self.names[key]

    def keys(self, key: str, prefix: str = "") -> list[str]:
        listing = self.client.list_objects_v2(Bucket=self.names[key], Prefix=prefix)
        return [o["Key"] for o in listing.get("Contents", [])]

    def text(self, key: str, object_key: str) -> str:
        return (
            self.client.get_object(Bucket=self.names[key], Key=object_key)["Body"].read().decode()
        )


def write_config(path: Path, b: Buckets, **transcribe) -> Path:
    lines = [
        "[submissions]",
        f'state = "s3://{b["state"]}/submissions"',
        "",
        "[transcribe]",
        "cpus_per_actor = 1",
        *(f"{k} = {v}" for k, v in transcribe.items()),
        "",
    ]
    for tenant in ("acme", "globex"):
        lines += [
            f"[tenants.{tenant}]",
            f'allowed_input_prefixes = ["s3://{b[tenant + "-calls"]}/rec/"]',
            f'inbox = "s3://{b["inbox"]}/{tenant}/"',
            f'output = "s3://{b[tenant + "-out"]}/overnight"',
            "",
        ]
    path.write_text("\n".join(lines))
    return path


def upload(b: Buckets, bucket: str, folder: Path, names: list[str]) -> list[str]:
    for name in names:
        b.client.upload_file(str(folder / name), b[bucket], f"rec/{name}")
    return [f"s3://{b[bucket]}/rec/{name}" for name in names]


def ledger(config: Path, capsys) -> list[dict]:
    capsys.readouterr()
    assert main(["submissions", "list", "--config", str(config), "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # one JSON list, nothing else


def results(b: Buckets, bucket: str, sid: str) -> list[dict]:
    # Published rows, and those committed but not yet published (a run that stopped).
    root = f"overnight/submissions/{sid}"
    keys = b.keys(bucket, f"{root}/transcripts/") + b.keys(bucket, f"{root}/_staging/transcripts/")
    out = []
    for key in keys:
        body = b.client.get_object(Bucket=b[bucket], Key=key)["Body"].read()
        out += pq.read_table(io.BytesIO(body)).to_pylist()
    return out


@pytest.mark.usefixtures("ray_local")
def test_two_tenants_run_once_and_a_cross_tenant_submission_is_rejected_and_recorded(
    s3, synth_calls, tmp_path, capsys, caplog
):
    folder, refs = synth_calls
    b = Buckets(s3)
    acme_uris = upload(b, "acme-calls", folder, ["call_billing.wav", "call_refund.wav"])
    globex_uris = upload(b, "globex-calls", folder, ["call_cancel.wav"])
    config = write_config(tmp_path / "tenants.toml", b)

    # acme posts through the CLI; globex drops a JSONL into its inbox and claims to be acme.
    acme_manifest = tmp_path / "acme.csv"
    # External ids that look like paths decide nothing about where output goes.
    ids = [f"../../{b['globex-out']}/a{i}" for i in range(len(acme_uris))]
    acme_manifest.write_text(
        "uri,external_id\n" + "".join(f"{u},{x}\n" for u, x in zip(acme_uris, ids, strict=True))
    )
    assert main(["submissions", "add", "acme", str(acme_manifest), "--config", str(config)]) == 0
    acme_sid = json.loads(capsys.readouterr().out)["submission_id"]
    globex_body = "".join(json.dumps({"uri": u, "tenant": "acme"}) + "\n" for u in globex_uris)
    s3.put_object(Bucket=b["inbox"], Key="globex/batch-1.jsonl", Body=globex_body.encode())
    # acme references globex's bucket: rejected before any work, whatever the key looks like.
    evil = (
        f"uri\n{acme_uris[0]}\n{globex_uris[0]}\n"
        f"s3://{b['acme-calls']}/rec/../../{b['globex-calls']}/rec/call_cancel.wav\n"
    )
    s3.put_object(Bucket=b["inbox"], Key="acme/2026-12-01/evil.csv", Body=evil.encode())

    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    records = {(r["tenant"], r["status"]): r for r in ledger(config, capsys)}
    assert sorted(records) == [("acme", "done"), ("acme", "rejected"), ("globex", "done")]

    acme, globex, rejected = (
        records["acme", "done"],
        records["globex", "done"],
        records["acme", "rejected"],
    )
    assert acme["submission_id"] == acme_sid
    assert (acme["recordings"], acme["failures"], globex["recordings"]) == (2, 0, 1)
    assert acme["audio_minutes"] > 0.05 and acme["cost_usd"] > 0
    assert rejected["reason"].startswith("2 of 3 rows cannot be run")
    assert (
        f"{globex_uris[0]}': outside the prefixes allowed for tenant 'acme'" in rejected["reason"]
    )
    assert "climbs above the bucket" in rejected["reason"]
    assert rejected["recordings"] == 0 and "output" not in rejected

    acme_rows, globex_rows = (
        results(b, "acme-out", acme_sid),
        results(b, "globex-out", globex["submission_id"]),
    )
    assert {r["tenant"] for r in acme_rows} == {"acme"} and {r["tenant"] for r in globex_rows} == {
        "globex"
    }
    assert {r["submission_id"] for r in globex_rows} == {globex["submission_id"]}
    assert {r["external_id"] for r in acme_rows} == set(ids)
    text = {Path(r["source_uri"]).name: r["text"] for r in acme_rows}
    assert wer(refs["call_billing.wav"], text["call_billing.wav"]) <= 0.1
    # Every output object is under the tenant's own prefix and submission; nothing for the rejected one.
    assert all(k.startswith(f"overnight/submissions/{acme_sid}/") for k in b.keys("acme-out"))
    assert all(
        k.startswith(f"overnight/submissions/{globex['submission_id']}/")
        for k in b.keys("globex-out")
    )
    assert not any(
        rejected["submission_id"] in k
        for bucket in ("acme-out", "globex-out")
        for k in b.keys(bucket)
    )

    # The nightly rerun finds nothing new and changes nothing.
    before = {k: b.text("state", k) for k in b.keys("state")}
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "0 submission(s) handled" in captured.err
    assert {k: b.text("state", k) for k in b.keys("state")} == before
    assert main(["submissions", "list", "--config", str(config)]) == 0
    listing = capsys.readouterr().out
    assert acme_sid in listing and "rejected" in listing

    # Credentials from the environment appear nowhere: ledger, results, summaries, logs.
    everything = [captured.out, captured.err, listing, caplog.text, *before.values()]
    for bucket in ("acme-out", "globex-out"):
        for key in b.keys(bucket):
            body = b.client.get_object(Bucket=b[bucket], Key=key)["Body"].read()
            rows = (
                pq.read_table(io.BytesIO(body)).to_pylist()
                if key.endswith(".parquet")
                else body.decode()
            )
            everything.append(str(rows))
    assert not [s for text in everything for s in secrets_in(text)]


class SwitchableEndpoint:
    """A TCP proxy in front of the S3 endpoint that can go down and come back on the same port.

    ``trip_on``: go down right after relaying the response to the first request whose head
    contains these bytes, i.e. after that write succeeded.
    """

    def __init__(self, upstream: str, trip_on: bytes | None = None):
        self.upstream = ("127.0.0.1", int(upstream.rsplit(":", 1)[1]))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trip_on = trip_on
        self.tripped = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._sockets = self._sockets, set()
        for s in [listener, *sockets]:
            if s is not None:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._sockets.update((client, server))
            state = {"armed": False}
            threading.Thread(
                target=self._pump, args=(client, server, state, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, state, False), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, state: dict, upstream: bool) -> None:
        try:
            while chunk := src.recv(65536):
                if (
                    upstream
                    and self.trip_on
                    and not self.tripped.is_set()
                    and self.trip_on in chunk
                ):
                    state["armed"] = True
                dst.sendall(chunk)
                if not upstream and state["armed"] and chunk.startswith(b"HTTP/1.1 2"):
                    self.tripped.set()
                    self.down()
                    return
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()


def test_brief_storage_outage_is_retried_with_backoff(s3, s3_server, monkeypatch):
    b = Buckets(s3)
    s3.put_object(Bucket=b["inbox"], Key="acme/m.csv", Body=b"uri\n")
    proxy = SwitchableEndpoint(s3_server)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    proxy.down()
    # Longer than botocore's own retries: jobs.dataset.storage.with_retries must bridge it.
    threading.Timer(3.0, proxy.up).start()
    started = time.monotonic()
    assert [o.uri for o in storage.list_objects(f"s3://{b['inbox']}/acme/")] == [
        f"s3://{b['inbox']}/acme/m.csv"
    ]
    assert time.monotonic() - started >= 2.9
    proxy.down()


@pytest.mark.usefixtures("ray_local")
def test_storage_down_stops_the_run_with_a_clear_message_and_the_next_run_resumes(
    s3, s3_server, synth_calls, tmp_path, capsys, monkeypatch
):
    folder, _ = synth_calls
    b = Buckets(s3)
    names = ["call_billing.wav", "call_refund.wav"]
    uris = upload(b, "acme-calls", folder, names)
    # One recording per actor call, so the first commit lands while others are pending.
    config = write_config(tmp_path / "tenants.toml", b, items_per_call=1, batch_size=1)
    s3.put_object(
        Bucket=b["inbox"], Key="acme/night.csv", Body=("uri\n" + "\n".join(uris) + "\n").encode()
    )

    # Storage down from the start: stop at once, say what to check, record nothing.
    dead = _free_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{dead}")
    capsys.readouterr()
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert "storage unreachable" in err and "rerun" in err and not secrets_in(err)
    assert b.keys("state") == []

    # Storage goes away right after the first recording is committed.
    proxy = SwitchableEndpoint(s3_server, trip_on=b"/part-")  # the first commit
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 3
    err = capsys.readouterr().err
    assert proxy.tripped.is_set()
    assert "storage unreachable" in err and not secrets_in(err)
    [key] = b.keys("state")
    assert json.loads(b.text("state", key))["status"] == "running"
    sid = json.loads(b.text("state", key))["submission_id"]
    committed = len(results(b, "acme-out", sid))
    assert 1 <= committed < len(names)

    # Back up: the next run resumes the submission and does only what was left.
    proxy.up()
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    record = json.loads(b.text("state", key))
    assert (record["status"], record["attempts"], record["recordings"]) == ("done", 2, len(names))
    rows = results(b, "acme-out", sid)
    assert sorted(r["item_id"] for r in rows) == sorted({r["item_id"] for r in rows})
    assert len(rows) == len(names)
    summary = json.loads(b.text("acme-out", f"overnight/submissions/{sid}/runs/{sid}-2.json"))
    assert summary["items_already_done"] == committed
    assert summary["items"] == len(names) - committed
    proxy.down()


def test_tenants_config_refuses_overlapping_input_prefixes_unless_declared_shared(tmp_path):
    def load(data: dict):
        return _load_tenants(tmp_path, data)

    data = {
        "submissions": {"state": "s3://state/subs"},
        "tenants": {
            "acme": {
                "allowed_input_prefixes": ["s3://calls/acme/", "s3://common/library/"],
                "inbox": "s3://inbox/acme",
                "output": "s3://acme-out/",
            },
            # globex may read all of calls/, acme's folder included
            "globex": {
                "allowed_input_prefixes": ["s3://CALLS/", "s3://common/library/"],
                "inbox": "s3://inbox/globex",
                "output": "s3://globex-out/",
            },
        },
    }
    with pytest.raises(ConfigError, match="overlap") as err:
        load(data)
    assert "tenants.acme.allowed_input_prefixes 's3://calls/acme/'" in str(err.value)
    assert "shared_input_prefixes" in str(err.value)
    data["tenants"]["globex"]["allowed_input_prefixes"] = [
        "s3://calls/globex/",
        "s3://common/library/",
    ]
    with pytest.raises(ConfigError, match="common/library"):
        load(data)
    data["submissions"]["shared_input_prefixes"] = ["s3://common/"]
    assert sorted(load(data).tenants) == ["acme", "globex"]


@pytest.mark.usefixtures("ray_local")
def test_a_bad_tenant_row_or_a_failing_submission_never_stops_another_tenants(tmp_path, capsys):
    from overnight.jobs.ops.demo import noise, write_wav

    def folder(*parts: str) -> Path:
        path = tmp_path.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    for tenant in ("acme", "globex"):
        write_wav(folder("calls", tenant) / "a.wav", noise(1.0))
        folder("inbox", tenant)
    config = local_tenants(tmp_path)
    acme_wav = tmp_path / "calls" / "acme" / "a.wav"
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"uri": str(acme_wav), "channel_labels": 5}) + "\n")
    assert main(["submissions", "add", "acme", str(bad), "--config", str(config)]) == 7
    err = capsys.readouterr().err
    assert "channel_labels must be text such as 'agent,customer'" in err and "row 1" in err
    # The same row dropped straight into the inbox is rejected there, with the same reason.
    (tmp_path / "inbox" / "acme" / "dropped.jsonl").write_text(
        json.dumps({"uri": str(acme_wav), "channel_labels": 7}) + "\n"
    )
    # acme's good submission fails at run time: its output folder is blocked by a file.
    (tmp_path / "inbox" / "acme" / "good.csv").write_text(f"uri\n{acme_wav}\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "acme").write_text("not a folder")
    (tmp_path / "inbox" / "globex" / "batch.csv").write_text(
        f"uri\n{tmp_path}/calls/globex/a.wav\n"
    )

    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 14
    records = {(r["tenant"], r["status"]): r for r in ledger(config, capsys)}
    assert sorted(records) == [("acme", "failed"), ("acme", "rejected"), ("globex", "done")]
    assert records["globex", "done"]["recordings"] == 1
    assert "channel_labels must be text" in records["acme", "rejected"]["reason"]
    failed = records["acme", "failed"]["reason"]
    # The storage layer's own words for a file in the way of a folder (exit 11's), not the OS
    # error's class name.
    assert "a file is in the way of the folder" in failed, failed


def test_a_submission_naming_two_channels_alike_is_rejected_at_intake_naming_the_row(
    tmp_path, capsys
):
    # Two channels under one name become one speaker in the transcript and its analytics;
    # the job's manifest reader refuses such a row, so intake says so before the job runs.
    from overnight.jobs.ops.demo import noise, write_wav

    (tmp_path / "calls" / "acme").mkdir(parents=True)
    (tmp_path / "inbox" / "acme").mkdir(parents=True)
    wav = tmp_path / "calls" / "acme" / "a.wav"
    write_wav(wav, noise(1.0))
    config = local_tenants(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text(f"uri,channel_labels\n{wav},agent;Agent\n")
    assert main(["submissions", "add", "acme", str(bad), "--config", str(config)]) == 7
    err = capsys.readouterr().err
    assert "speaker names must differ" in err and "row 1" in err, err


def _two_tenants(tmp_path: Path, model: str) -> Path:
    """acme and globex, one one-recording submission each in their inbox."""
    from overnight.jobs.ops.demo import noise, write_wav

    for tenant in ("acme", "globex"):
        (tmp_path / "calls" / tenant).mkdir(parents=True, exist_ok=True)
        write_wav(tmp_path / "calls" / tenant / "a.wav", noise(1.0))
        (tmp_path / "inbox" / tenant).mkdir(parents=True, exist_ok=True)
        (tmp_path / "inbox" / tenant / "night.csv").write_text(
            f"uri\n{tmp_path}/calls/{tenant}/a.wav\n"
        )
    return local_tenants(tmp_path, {"max_attempts": 1}, {"model": model})


def local_tenants(tmp_path: Path, submissions: dict | None = None, transcribe: dict | None = None):
    """acme and globex on local folders: each may read tmp_path/calls/<name>/ only."""
    config = tmp_path / "tenants.toml"
    config.write_text(
        tomli_w.dumps(
            {
                "submissions": {"state": str(tmp_path / "state"), **(submissions or {})},
                "transcribe": {"cpus_per_actor": 1, **(transcribe or {})},
                "tenants": {
                    name: {
                        "allowed_input_prefixes": [f"file://{tmp_path}/calls/{name}/"],
                        "inbox": str(tmp_path / "inbox" / name),
                        "output": str(tmp_path / "out" / name),
                    }
                    for name in ("acme", "globex")
                },
            }
        )
    )
    return config


def test_a_missing_model_stops_the_step_before_any_submission_starts(tmp_path, capsys):
    config = _two_tenants(tmp_path, str(tmp_path / "no-such-model"))
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 5
    err = capsys.readouterr().err
    assert "no-such-model" in err and "No submission was started" in err
    assert "Traceback" not in err
    assert ledger(config, capsys) == []  # no record written, no attempt spent


@pytest.mark.usefixtures("ray_local")
def test_a_model_that_fails_to_load_stops_the_step_without_spending_an_attempt(tmp_path, capsys):
    # It passes the driver's check (a folder with a model.bin) and fails in the actor's load:
    # every submission would fail the same way, and with max_attempts = 1 each would be lost.
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "model.bin").write_bytes(b"not a CTranslate2 model")
    config = _two_tenants(tmp_path, str(broken))
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 5
    err = capsys.readouterr().err
    assert "cannot load Whisper model" in err and "did not count against" in err
    [stopped] = ledger(config, capsys)  # acme's ran into it; globex's was not reached
    assert (stopped["tenant"], stopped["status"], stopped["attempts"]) == ("acme", "failed", 0)
    assert stopped["reason"].startswith("not run: cannot load Whisper model")

    # The model fixed (the bundled default): both run, each on its first counted attempt.
    config = _two_tenants(tmp_path, "bundled:tiny.en")
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    records = ledger(config, capsys)
    assert [(r["tenant"], r["status"], r["attempts"], r["recordings"]) for r in records] == [
        ("acme", "done", 1, 1),
        ("globex", "done", 1, 1),
    ]


@pytest.mark.usefixtures("ray_local")
def test_a_folder_swapped_for_a_link_after_the_check_does_not_lead_to_another_tenants_file(
    tmp_path, capsys, monkeypatch
):
    from overnight.jobs.ops.demo import noise, write_wav
    from overnight.jobs.ops.submissions import run as submissions

    for tenant, seconds in (("acme", 1.0), ("globex", 3.0)):
        (tmp_path / "calls" / tenant / "batch").mkdir(parents=True)
        write_wav(tmp_path / "calls" / tenant / "batch" / "a.wav", noise(seconds))
        (tmp_path / "inbox" / tenant).mkdir(parents=True)
    config = local_tenants(tmp_path)
    checked = tmp_path / "calls" / "acme" / "batch"
    (tmp_path / "inbox" / "acme" / "m.csv").write_text(f"uri\n{checked}/a.wav\n")
    write_trusted = submissions._write_trusted_manifest

    def swap_after_the_check(out, rows):
        # acme's rows have passed the tenant check; acme now swaps the checked folder for a
        # link to globex's folder before the job reads it.
        checked.rename(checked.with_name("batch-old"))
        checked.symlink_to(tmp_path / "calls" / "globex" / "batch")
        return write_trusted(out, rows)

    monkeypatch.setattr(submissions, "_write_trusted_manifest", swap_after_the_check)
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    (record,) = ledger(config, capsys)
    assert record["status"] == "done" and record["failures"] == 1
    (row,) = results_local(tmp_path / "out" / "acme", record["submission_id"])
    assert (row["status"], row["error_code"]) == ("error", "fetch_failed")
    assert "resolves outside the folders this job may read" in row["error_message"]
    assert "globex" not in row["error_message"] and row["duration_s"] is None


def results_local(out: Path, sid: str) -> list[dict]:
    return pq.read_table(out / "submissions" / sid / "transcripts").to_pylist()
