"""What a hostile probe of submissions and credentials found (2026-12-07): secrets printed in
clear, inbox reads that left the inbox, and storage failures that were tracebacks or spent a
submission's attempts. Each test states what must hold."""

from __future__ import annotations

import json
import re

import pytest

from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from tests.conftest import secrets_in
from tests.jobs.ops.test_submissions import Buckets, _two_tenants, ledger, write_config

SLASHED = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret


@pytest.mark.parametrize(
    "text",
    [
        f"s3://AKIAIOSFODNN7EXAMPLE:{SLASHED}@calls/tenanta/a.wav",
        f"s3://someuser:{SLASHED}@calls/a.wav",
        "https://acct.blob.core.windows.net/c/a.wav?sv=2021-08-06&sr=b&sig=AZURESIG123abc%3D&se=1",
    ],
)
def test_a_secret_with_slashes_in_a_urls_user_info_and_a_sas_signature_are_scrubbed(text):
    scrubbed = storage.scrub_secrets(text)
    assert "K7MDENG" not in scrubbed and "AZURESIG" not in scrubbed, scrubbed
    assert storage.looks_like_credentials(text)
    # what is not a credential stays as it is
    for plain in ("s3://bucket/agent@example.com.wav", "http://127.0.0.1:5099/bucket/x.wav"):
        assert storage.scrub_secrets(plain) == plain and not storage.looks_like_credentials(plain)


def test_a_url_with_credentials_in_it_is_exit_2_in_one_line_without_them(tmp_path, capsys):
    # botocore refused it as a bucket name in a traceback that printed the key and secret.
    url = f"s3://AKIAIOSFODNN7EXAMPLE:{SLASHED}@calls/tenanta/"
    assert main(["transcribe", url, str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "carries credentials in the URL" in err and "Traceback" not in err
    assert "K7MDENG" not in err and "AKIAIOSFODNN7EXAMPLE" not in err


def test_a_manifest_row_with_a_presigned_query_is_refused_before_it_is_written_anywhere(
    tmp_path, capsys
):
    # Its X-Amz-Credential and X-Amz-Signature went into source_uri and the run's manifest.
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "uri\ns3://calls/a.wav?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20261207&"
        "X-Amz-Signature=0123456789abcdef\n"
    )
    assert main(["transcribe", str(manifest), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "row 1: its uri carries credentials" in err and "0123456789abcdef" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("ray_local")
def test_inbox_links_to_files_outside_it_are_rejected_unread_and_other_tenants_run(
    tmp_path, capsys
):
    # A link in acme's inbox to globex's manifest was read: acme's record listed globex's
    # recordings (to /etc/passwd: its first line); a dangling link stopped every tenant's
    # step in a traceback.
    config = _two_tenants(tmp_path, "bundled:tiny.en")
    private = tmp_path / "globex-private.csv"
    private.write_text("uri\nsecret-customer-recording.wav\n")
    acme = tmp_path / "inbox" / "acme"
    (acme / "night.csv").unlink()
    (acme / "steal.csv").symlink_to(private)
    (acme / "dangling.csv").symlink_to(tmp_path / "nowhere.csv")
    status = main(["submissions", "process", "--config", str(config), "--quiet"])
    err = capsys.readouterr().err
    assert status != 1 and "Traceback" not in err, err
    records = ledger(config, capsys)
    assert sorted((r["tenant"], r["status"]) for r in records) == [
        ("acme", "rejected"),
        ("acme", "rejected"),
        ("globex", "done"),
    ]
    shown = json.dumps(records)
    assert "secret-customer-recording" not in shown
    assert all("cannot be read" in r["reason"] for r in records if r["status"] == "rejected"), (
        records
    )
    # the next run skips what it rejected
    assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
    assert len(ledger(config, capsys)) == 3


def test_a_state_bucket_that_does_not_exist_is_one_paragraph_in_list_and_add(s3, tmp_path, capsys):
    # list showed an empty table, add queued a submission whose record process then failed to
    # write, in a traceback.
    b = Buckets(s3)
    config = write_config(tmp_path / "tenants.toml", b)
    text = config.read_text().replace(f"s3://{b['state']}/", "s3://ovn-no-such-state/")
    config.write_text(text)
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"uri\ns3://{b['acme-calls']}/rec/a.wav\n")
    for argv in (["list"], ["add", "acme", str(manifest)]):
        assert main(["submissions", *argv, "--config", str(config)]) == 11
        err = capsys.readouterr().err
        assert "the bucket s3://ovn-no-such-state does not exist" in err and "Traceback" not in err
        assert not secrets_in(err)
    assert b.keys("inbox") == []  # nothing queued


def test_add_of_a_manifest_that_is_missing_or_a_folder_is_exit_4_in_one_line(tmp_path, capsys):
    config = _two_tenants(tmp_path, "bundled:tiny.en")
    (tmp_path / "folder.csv").mkdir()
    for name in ("missing.csv", "folder.csv"):
        assert (
            main(["submissions", "add", "acme", str(tmp_path / name), "--config", str(config)]) == 4
        )
        err = capsys.readouterr().err
        assert re.search(r"manifest .* (does not exist|cannot be read)", err), err
        assert "Traceback" not in err


@pytest.mark.usefixtures("ray_local")
def test_a_tenants_output_bucket_that_does_not_exist_spends_no_attempt(
    s3, synth_calls, tmp_path, capsys
):
    # Each run counted an attempt, and after max_attempts the submission never ran again,
    # though the bucket was made the next morning.
    folder, _ = synth_calls
    b = Buckets(s3)
    s3.upload_file(str(folder / "call_billing.wav"), b["acme-calls"], "rec/a.wav")
    config = write_config(tmp_path / "tenants.toml", b)
    text = config.read_text().replace(f"s3://{b['acme-out']}/", "s3://ovn-no-such-out/")
    config.write_text(text)
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"uri\ns3://{b['acme-calls']}/rec/a.wav\n")
    assert main(["submissions", "add", "acme", str(manifest), "--config", str(config)]) == 0
    for _ in range(4):
        main(["submissions", "process", "--config", str(config), "--quiet"])
        err = capsys.readouterr().err
        assert "Traceback" not in err
    [record] = ledger(config, capsys)
    assert (record["status"], record["attempts"]) == ("failed", 0)
    assert "ovn-no-such-out does not exist" in record["reason"]
    s3.create_bucket(Bucket="ovn-no-such-out")
    try:
        assert main(["submissions", "process", "--config", str(config), "--quiet"]) == 0
        [record] = ledger(config, capsys)
        assert (record["status"], record["attempts"]) == ("done", 1)
    finally:
        for key in s3.list_objects_v2(Bucket="ovn-no-such-out").get("Contents", []):
            s3.delete_object(Bucket="ovn-no-such-out", Key=key["Key"])
        s3.delete_bucket(Bucket="ovn-no-such-out")


@pytest.mark.parametrize(
    "column",
    ["api_key", "apiKey", "x_api_key", "private_key", "bearer", "auth_header", "sas_sig"],
)
def test_manifest_columns_named_like_other_credentials_are_rejected(column):
    # These were queued, and their values copied into the results' metadata.
    from overnight.jobs.ops.submissions import Rejected, trusted_rows
    from tests.jobs.ops.test_submissions import ACME

    rows = [{"uri": "s3://acme-calls/rec/a.wav", column: "value-that-is-a-credential"}]
    with pytest.raises(Rejected, match="look like credentials"):
        trusted_rows(rows, "acme", ACME, "sub-" + "0" * 24, max_recordings=10)


@pytest.mark.parametrize("column", ["author", "agent", "queue", "signup_date", "design"])
def test_ordinary_metadata_columns_are_kept(column):
    from overnight.jobs.ops.submissions import trusted_rows
    from tests.jobs.ops.test_submissions import ACME

    rows = [{"uri": "s3://acme-calls/rec/a.wav", column: "x"}]
    [row] = trusted_rows(rows, "acme", ACME, "sub-" + "0" * 24, max_recordings=10)
    assert row[column] == "x"


def test_a_ray_address_nothing_answers_at_is_exit_10_before_any_record_is_written(tmp_path, capsys):
    # ray.init retried it for minutes, printing its core's reconnect lines, and the
    # submission's record stayed "running" with an attempt spent.
    from tests.conftest import _free_port

    config = _two_tenants(tmp_path, "bundled:tiny.en")
    address = f"127.0.0.1:{_free_port()}"
    argv = ["submissions", "process", "--config", str(config), "--quiet", "--address", address]
    assert main(argv) == 10
    err = capsys.readouterr().err
    assert f"cannot reach the Ray cluster at '{address}'" in err and "Traceback" not in err
    assert ledger(config, capsys) == []
    # a job joining it: the same check before ray.init (in a process whose Ray is not up yet)
    from overnight.jobs.errors import ClusterUnreachable
    from overnight.jobs.run.on_ray import check_reachable

    with pytest.raises(ClusterUnreachable, match="cannot reach the Ray cluster"):
        check_reachable(address)


def test_file_localhost_is_the_path_the_tenant_checks_compare(tmp_path, monkeypatch):
    # The checks (submissions.urls) read file://localhost/x as /x; storage read it as
    # ./localhost/x, so an inbox or state given so was written under the working directory.
    from overnight.jobs.ops.submissions import normalize

    monkeypatch.chdir(tmp_path)
    url = f"file://localhost{tmp_path}/inbox/acme"
    assert storage.resolve(url).path == f"{tmp_path}/inbox/acme" == normalize(url).url()
    storage.write_bytes_atomic(storage.resolve(url + "/m.csv"), b"uri\n")
    assert (tmp_path / "inbox" / "acme" / "m.csv").exists()
    assert not (tmp_path / "localhost").exists()
