"""Job spec validation, manifests and item ids, storage errors and redaction (no Ray needed)."""

from __future__ import annotations

import copy
import json
import os
import re

import pytest

from overnight.jobs.cli import main as cli_main
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.manifest import item_id, list_items
from overnight.jobs.errors import ConfigError, InputNotFound, StorageUnavailable
from overnight.jobs.spec import build_spec, read_job_file
from tests.conftest import loaded_by


def test_flags_override_the_job_file_which_overrides_defaults(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\ninput = "in"\noutput = "out"\n[transcribe]\nbatch_size = 8\nbeam_size = 2\n'
    )
    data = read_job_file(job)
    before = copy.deepcopy(data)
    spec = build_spec(data, {"transcribe": {"beam_size": 1, "language": None}})
    assert (
        spec.transcribe.batch_size,
        spec.transcribe.beam_size,
        spec.transcribe.chunk_length_s,
    ) == (8, 1, 30)
    assert data == before  # the caller's dict is never mutated
    assert spec.run_id.startswith("transcribe-")


def test_invalid_spec_message_names_the_field_and_the_value():
    with pytest.raises(ConfigError) as err:
        build_spec(
            {"job": {"input": "a", "output": "b"}, "transcribe": {"batch_size": 0, "bogus": 1}}
        )
    text = str(err.value)
    assert "transcribe.batch_size" in text and "got 0" in text and "transcribe.bogus" in text


def test_a_job_file_with_two_problems_is_one_readable_line_naming_both(tmp_path, capsys):
    # The CLI escapes control characters to keep an error on one line; the message held
    # newlines, so it printed "invalid job spec:\n  transcribe.seed: ...".
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\nkind = "transcribe"\ninput = "in"\noutput = "out"\nmax_error_rate = 7\n'
        "[transcribe]\nseed = -1\n"
    )
    assert cli_main(["run", str(job)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\n" not in err, err
    assert "job.max_error_rate: Input should be less than or equal to 1 (got 7); " in err
    assert "transcribe.seed: Input should be greater than or equal to 0 (got -1)" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--diarize", "--speaker-roles", "agent,Agent"],
        ["--channel-labels", "agent,agent"],
    ],
)
def test_two_speakers_given_one_name_is_refused_before_work(tmp_path, capsys, args):
    # A 2-speaker call with roles agent,agent came out as one speaker's single turn, exit 0:
    # analytics and the dialogue are keyed by name.
    (tmp_path / "in").mkdir()
    assert cli_main(["transcribe", str(tmp_path / "in"), str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert "speaker names must differ" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, named",
    [
        (["--min-speakers", "3"], "min_speakers is an option of `diarize`"),
        (["--max-speakers", "3"], "max_speakers is an option of `diarize`"),
        (["--min-speakers", "2", "--max-speakers", "4"], "min_speakers and max_speakers are"),
    ],
)
def test_speaker_bounds_without_diarize_are_refused_before_work(tmp_path, capsys, args, named):
    # Accepted, they were recorded in the run's options and changed nothing.
    (tmp_path / "in").mkdir()
    assert cli_main(["transcribe", str(tmp_path / "in"), str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["--diarize", "--speaker-roles", "agent,,customer"],
        ["--channel-labels", "agent,customer,"],
        ["--channel-labels", ""],
    ],
)
def test_an_empty_speaker_name_on_the_command_line_is_refused_as_in_a_job_file(
    tmp_path, capsys, args
):
    # The command line dropped blanks: agent,,customer named the first two speakers, and the
    # third first speaker kept SPEAKER_02 where the user meant customer.
    (tmp_path / "in").mkdir()
    assert cli_main(["transcribe", str(tmp_path / "in"), str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err
    assert "a speaker name is empty" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_job_file_speaker_names_are_trimmed_and_an_empty_one_is_refused(tmp_path, capsys):
    job = tmp_path / "job.toml"
    head = '[job]\nkind = "transcribe"\ninput = "in"\noutput = "out"\n[transcribe]\n'
    job.write_text(head + 'channel_labels = [" agent", "customer "]\n')
    spec = build_spec(read_job_file(job))
    assert spec.transcribe.channel_labels == ["agent", "customer"]
    job.write_text(head + 'diarize = true\nspeaker_roles = ["agent", " "]\n')
    assert cli_main(["run", str(job)]) == 2
    assert "a speaker name is empty" in capsys.readouterr().err


def test_unparseable_job_file_is_a_config_error(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_text("[job\ninput=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        read_job_file(bad)


def test_item_id_is_stable_and_changes_with_the_object():
    a = item_id("s3://b/x.wav", 10, "etag1")
    assert a == item_id("s3://b/x.wav", 10, "etag1")
    assert a != item_id("s3://b/x.wav", 10, "etag2") != item_id("s3://b/x.wav", 11, "etag1")
    assert a != item_id("s3://b/x.wav", 10, "etag1", submission_id="s1")


def test_manifest_metadata_is_carried_and_relative_uris_resolve_next_to_the_manifest(tmp_path):
    (tmp_path / "calls").mkdir()
    (tmp_path / "calls" / "a.wav").write_bytes(b"RIFF")
    manifest = tmp_path / "calls" / "m.jsonl"
    rows = [
        {
            "uri": "a.wav",
            "tenant": "acme",
            "external_id": "c-1",
            "channel_labels": "agent, customer",
            "queue": "billing",
        },
        {
            "uri": "a.wav",
            "tenant": "acme",
            "external_id": "c-1",
            "channel_labels": "agent, customer",
            "queue": "billing",
        },
        {"uri": "missing.wav", "tenant": "acme"},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in rows))
    items = list_items(str(manifest))
    assert len(items) == 2  # the exact duplicate is one item
    first = items[0]
    assert first["uri"] == str(tmp_path / "calls" / "a.wav") and first["size"] == 4
    assert (first["tenant"], first["external_id"], first["channel_labels"]) == (
        "acme",
        "c-1",
        ["agent", "customer"],
    )
    assert first["metadata"] == [("queue", "billing")]
    assert items[1]["size"] is None  # listed, and will become a fetch_failed row


def test_relative_and_absolute_manifest_paths_give_the_same_absolute_uris_and_item_ids(
    tmp_path, monkeypatch
):
    (tmp_path / "calls").mkdir()
    (tmp_path / "calls" / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "calls" / "b.wav").write_bytes(b"RIFFRIFF")
    manifest = tmp_path / "calls" / "m.csv"
    manifest.write_text(f"uri\na.wav\n./sub/../b.wav\nfile://{tmp_path}/calls/a.wav\n")
    monkeypatch.chdir(tmp_path)
    spellings = [str(manifest), "calls/m.csv", "./calls/../calls/m.csv", f"file://{manifest}"]
    listed = [[(i["uri"], i["item_id"]) for i in list_items(m)] for m in spellings]
    expected = [str(tmp_path / "calls" / "a.wav"), str(tmp_path / "calls" / "b.wav")]
    # The file:// row is the same recording as the first: one item.
    assert [uri for uri, _ in listed[0]] == expected
    assert all(other == listed[0] for other in listed[1:]), listed


def test_a_manifest_column_of_the_wrong_type_is_refused_naming_the_row(tmp_path):
    manifest = tmp_path / "m.jsonl"
    rows = [
        {"uri": "a.wav", "channel_labels": "agent,customer"},
        {"uri": "b.wav", "channel_labels": 5},
    ]
    manifest.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(ConfigError, match="row 2: channel_labels must be text"):
        list_items(str(manifest))


def test_a_manifest_row_naming_two_channels_alike_is_refused_naming_the_row(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("uri,channel_labels\na.wav,agent;customer\nb.wav,agent;AGENT\n")
    with pytest.raises(ConfigError, match="row 2: channel_labels: speaker names must differ"):
        list_items(str(manifest))


def test_manifest_without_uri_column_is_refused(tmp_path):
    manifest = tmp_path / "m.csv"
    manifest.write_text("path\nx.wav\n")
    with pytest.raises(ConfigError, match="'uri' column"):
        list_items(str(manifest))


def test_listing_skips_hidden_and_bookkeeping_files_and_an_empty_input_is_an_error(tmp_path):
    for name in ("a.wav", ".hidden.wav", "_tmp/b.wav", "sub/c.wav"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    names = sorted(os.path.relpath(i["uri"], tmp_path) for i in list_items(str(tmp_path)))
    assert names == ["a.wav", "sub/c.wav"]
    with pytest.raises(InputNotFound):
        list_items(str(tmp_path / "nothing-here"))


def test_redact_removes_secret_values_and_key_shaped_strings(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sup3r-s3cret-value")
    text = storage.scrub_secrets(
        "failed with sup3r-s3cret-value and AKIAABCDEFGHIJKLMNOP at https://x/?X-Amz-Signature=abc123&y=1 password=hunter2"
    )
    assert "sup3r-s3cret-value" not in text and "AKIAABCDEFGHIJKLMNOP" not in text
    assert "abc123" not in text and "hunter2" not in text


def test_transient_storage_errors_are_retried_then_stop_the_job_with_advice():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("reset by peer")
        return "ok"

    assert storage.with_retries("read x", flaky, base_delay_s=0.001) == "ok" and len(calls) == 3

    def down():
        raise ConnectionError("connection refused")

    with pytest.raises(StorageUnavailable, match="rerun"):
        storage.with_retries("list s3://b/", down, attempts=2, base_delay_s=0.001)

    def missing():
        raise FileNotFoundError("nope")

    with pytest.raises(FileNotFoundError):
        storage.with_retries("read x", missing)


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    loc = storage.resolve(str(tmp_path / "d" / "f.bin"))
    storage.write_bytes_atomic(loc, b"abc")
    storage.write_bytes_atomic(loc, b"def")
    assert (tmp_path / "d" / "f.bin").read_bytes() == b"def"
    assert os.listdir(tmp_path / "d") == ["f.bin"]


def test_cli_reports_systemic_failures_with_exit_status_and_advice(tmp_path, capsys):
    assert cli_main(["transcribe", str(tmp_path / "absent"), str(tmp_path / "out")]) == 4
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.wav").write_bytes(b"x")
    assert (
        cli_main(
            [
                "transcribe",
                str(tmp_path / "in"),
                str(tmp_path / "out"),
                "--model",
                str(tmp_path / "nomodel"),
            ]
        )
        == 5
    )
    assert "not found" in capsys.readouterr().err
    assert (
        cli_main(["transcribe", str(tmp_path / "in"), str(tmp_path / "out"), "--batch-size", "0"])
        == 2
    )
    assert "transcribe.batch_size" in capsys.readouterr().err


def test_cli_stops_cleanly_when_object_storage_is_unreachable(tmp_path, capsys, clean_env):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    clean_env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    clean_env.setenv("AWS_ACCESS_KEY_ID", "AKIAOVERNIGHTTEST000")
    clean_env.setenv("AWS_SECRET_ACCESS_KEY", "overnight-test-secret-key-do-not-log")
    assert cli_main(["transcribe", "s3://calls/2026-12-01/", str(tmp_path / "out")]) == 3
    err = capsys.readouterr().err
    assert "storage unreachable" in err and "rerun" in err
    assert "overnight-test-secret-key-do-not-log" not in err and "AKIAOVERNIGHTTEST000" not in err


def test_reads_are_bounded_in_size_and_time_while_reading(tmp_path):
    path = tmp_path / "grown.wav"
    path.write_bytes(b"x" * 100)  # listed smaller, or a device that reports size 0
    with pytest.raises(storage.Unreadable) as err:
        storage.read_bytes(str(path), max_bytes=50)
    assert err.value.code == "too_large"
    with pytest.raises(storage.Unreadable) as err:
        storage.read_bytes(str(path), timeout_s=1e-9)
    assert err.value.code == "fetch_timeout" and "limit" in str(err.value)
    assert storage.read_bytes(str(path), max_bytes=100, timeout_s=60) == b"x" * 100


def test_an_s3_manifest_row_without_credentials_exits_3_with_advice_not_a_traceback(
    tmp_path, clean_env
):
    import subprocess
    import sys

    from tests.conftest import REPO

    manifest = tmp_path / "m.csv"
    manifest.write_text(f"uri\n{tmp_path}/local.wav\ns3://calls-in/2026-12-01/a.wav\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "HOME": str(tmp_path),  # no ~/.aws/credentials either
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",  # nor an instance profile
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "overnight.jobs.cli",
            "transcribe",
            str(manifest),
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert "no credentials" in result.stderr and "AWS_ACCESS_KEY_ID" in result.stderr
    assert "Traceback" not in result.stderr and "botocore" not in result.stderr


def test_the_spec_and_the_task_names_load_without_an_engine_or_pyarrow():
    """Every command builds a spec: it must not drag PyAV, faster-whisper, CTranslate2, Ray
    or pyarrow in (the Whisper model's default and the task names are light modules)."""
    code = "import overnight.jobs.spec, overnight.workers.llm.tasks.registry"
    heavy = ["av", "faster_whisper", "ctranslate2", "ray", "pyarrow", "overnight.workers.whisper"]
    assert loaded_by(code, heavy) == []


def test_manifest_prompt_columns_are_read_per_item_and_blank_ones_leave_the_jobs(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"RIFF")
    (tmp_path / "b.wav").write_bytes(b"RIFFF")
    manifest = tmp_path / "m.csv"
    manifest.write_text(
        "uri,hotwords,initial_prompt,language,queue\n"
        "a.wav,Vexorium,Kwiatkowski Plumbing,de,billing\n"
        "b.wav,,,,sales\n"
    )
    a, b = list_items(str(manifest))
    assert (a["hotwords"], a["initial_prompt"], a["language"]) == (
        "Vexorium",
        "Kwiatkowski Plumbing",
        "de",
    )
    assert (b["hotwords"], b["initial_prompt"], b["language"]) == (None, None, None)
    # Known columns, not free metadata.
    assert a["metadata"] == [("queue", "billing")]


def test_the_cli_takes_channel_labels_prompts_and_task_into_the_spec():
    from overnight.jobs.cli import parse_args
    from overnight.jobs.cli.job import _overrides

    argv = [
        "transcribe",
        "in",
        "out",
        "--channel-labels",
        "agent, customer",
        "--initial-prompt",
        "Kwiatkowski Plumbing",
        "--hotwords",
        "Vexorium",
    ]
    spec = build_spec(overrides=_overrides(parse_args(argv), "transcribe"))
    t = spec.transcribe
    assert t.channel_labels == ["agent", "customer"] and t.split_channels  # labels imply split
    assert (t.initial_prompt, t.hotwords, t.task) == (
        "Kwiatkowski Plumbing",
        "Vexorium",
        "transcribe",
    )
    assert not build_spec(
        overrides={"job": {"input": "a", "output": "b"}}
    ).transcribe.split_channels


def test_translate_with_an_english_only_model_is_a_config_error_naming_the_fix():
    job = {"input": "a", "output": "b"}
    with pytest.raises(ConfigError, match=r"transcribe.*multilingual.*English-only"):
        build_spec(overrides={"job": job, "transcribe": {"task": "translate"}})
    with pytest.raises(ConfigError, match="English-only"):
        build_spec(
            overrides={"job": job, "transcribe": {"task": "translate", "model": "distil-small.en"}}
        )
    spec = build_spec(overrides={"job": job, "transcribe": {"task": "translate", "model": "small"}})
    assert spec.transcribe.task == "translate"


JOB = {"input": "calls/", "output": "out/"}


@pytest.mark.parametrize(
    ("section", "values", "named"),
    [
        # "" (an unset variable) read as the working directory: datasets written into it
        ("job", {"output": ""}, "job.output"),
        ("job", {"input": "  "}, "job.input"),
        # redaction silently off
        ("transcribe", {"redact": ""}, "transcribe.redact"),
        ("transcribe", {"redact": [""]}, "transcribe.redact"),
        # an overflow in sizing or in the decode stage, after the claim
        ("transcribe", {"cpus_per_actor": float("inf")}, "transcribe.cpus_per_actor"),
        ("transcribe", {"max_file_mb": float("inf")}, "transcribe.max_file_mb"),
        # NaN costs, and JSON no parser reads
        ("prices", {"cpu": float("nan")}, "prices.cpu"),
        # a typo priced nothing
        ("prices", {"cpuu": 0.5}, "did you mean 'cpu'"),
        # failed in the actor's load after Ray started
        ("transcribe", {"compute_type": "bogus"}, "compute_type 'bogus'"),
        # ray.init's traceback, after the claim
        ("job", {"ray_address": "notahost:xx"}, "job.ray_address"),
    ],
)
def test_a_setting_that_cannot_mean_what_it_says_is_refused_naming_it(section, values, named):
    job = {**JOB, **values} if section == "job" else JOB
    overrides = {"job": job} if section == "job" else {"job": job, section: values}
    with pytest.raises(ConfigError, match=re.escape(named)):
        build_spec(overrides=overrides)


def test_redact_left_out_or_empty_list_is_no_redaction_and_named_types_are_kept():
    assert build_spec(overrides={"job": JOB}).transcribe.redact == []
    spec = build_spec(overrides={"job": JOB, "transcribe": {"redact": "pci, ssn"}})
    assert "ssn" in spec.transcribe.redact and "card_number" in spec.transcribe.redact
    spec = build_spec(overrides={"job": JOB, "prices": {"l40s": 1.2}})  # a GPU kind we know
    assert spec.prices["l40s"] == 1.2


def test_redact_given_empty_on_the_command_line_is_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error, as for any bad flag
        cli_main(["transcribe", str(tmp_path), str(tmp_path / "o"), "--redact", ""])
    assert exit_.value.code == 2
    assert "names no entity type" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["job.json", "job.YAML", "job.Toml"])
def test_a_job_file_is_read_by_its_suffix_whatever_its_case(tmp_path, name):
    # a .json file was parsed as TOML, and the error said "not valid JSON"
    path = tmp_path / name
    if name.endswith("json"):
        path.write_text(json.dumps({"job": JOB}))
    elif name.lower().endswith("yaml"):
        path.write_text("job:\n  input: calls/\n  output: out/\n")
    else:
        path.write_text('[job]\ninput = "calls/"\noutput = "out/"\n')
    assert read_job_file(path) == {"job": JOB}


def test_one_place_spelt_two_ways_is_one_canonical_location(tmp_path):
    real = tmp_path / "out"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    by_link = storage.resolve(str(tmp_path / "link")).canonical()
    by_dots = storage.resolve(str(tmp_path / "x" / ".." / "out")).canonical()
    assert by_link.url() == by_dots.url() == storage.resolve(str(real)).canonical().url()
    s3 = storage.resolve("s3://bucket//calls/./out/").canonical()
    assert s3.url() == "s3://bucket/calls/out"
    assert storage.resolve("s3://bucket/calls/out2").canonical().url() != s3.url()


def test_a_boolean_is_no_number_in_any_section_of_a_job_file(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\ninput = "in"\noutput = "out"\nmax_items = true\n'
        "[transcribe]\nbeam_size = true\n[process]\nmax_new_tokens = false\n"
    )
    with pytest.raises(ConfigError) as caught:
        build_spec(read_job_file(job))
    message = str(caught.value)
    for field in ("job.max_items", "transcribe.beam_size", "process.max_new_tokens"):
        assert f"{field}: Value error, takes a number, not the boolean" in message, message


def test_yaml_text_read_as_a_date_or_a_boolean_is_told_to_be_quoted(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("job:\n  input: in\n  output: out\n  run_id: 2026-12-01\n")
    with pytest.raises(ConfigError, match=r"write it in quotes \('2026-12-01'\)"):
        build_spec(read_job_file(job))
    job.write_text("job:\n  input: in\n  output: out\ntranscribe:\n  language: no\n")
    with pytest.raises(ConfigError, match="YAML reads yes, no, on and off as booleans"):
        build_spec(read_job_file(job))


def test_a_missing_relative_input_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputNotFound) as caught:
        list_items("calls")
    assert f"relative to the working directory: {tmp_path / 'calls'}" in str(caught.value)
    with pytest.raises(InputNotFound) as caught:
        list_items(str(tmp_path / "calls"))
    assert "relative to" not in str(caught.value)


def test_list_fields_given_as_one_text_in_a_job_file_read_as_their_flags_do(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(
        '[job]\ninput = "in"\noutput = "out"\nretry_errors = "fetch_failed,corrupt_audio"\n'
        'include = "*.flac"\n[transcribe]\nchannel_labels = "agent,customer"\n'
    )
    spec = build_spec(read_job_file(job))
    assert spec.job.retry_errors == ["fetch_failed", "corrupt_audio"]
    assert spec.job.include == ["*.flac"]
    assert spec.transcribe.channel_labels == ["agent", "customer"]
    with pytest.raises(ConfigError, match="channel_labels"):
        build_spec(read_job_file(job), overrides={"transcribe": {"channel_labels": "a,,b"}})
