"""Specifications for ``jobs.api`` that need no model and no Ray: what the API and the command
line decide from a run's summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import overnight as overnight_api
from overnight.jobs import api
from overnight.jobs.cli import main as cli_main
from overnight.jobs.errors import ErrorRateExceeded


def _stage(kind: str, items: int, failed: int, **extra: Any) -> dict[str, Any]:
    """One stage's summary, with the fields the command line prints."""
    return {
        "run_id": f"night-{extra.get('task') or kind}",
        "kind": kind,
        "items": items,
        "succeeded": items - failed,
        "failed": failed,
        "items_already_done": 0,
        "items_listed": items,
        "errors_by_code": {"fetch_failed": failed} if failed else {},
        "wall_seconds": 1.0,
        "accelerator_seconds": 0.5,
        "accelerator": "cpu",
        "accelerator_reserved_seconds": 1.0,
        "utilization": 0.5,
        "cost_usd": 0.0,
        "reserved_cost_usd": 0.0,
        "output": "/night/out",
        **extra,
    }


# A chained job whose transcription failed on 4 of 10 calls; each task inherits those 4
# as transcript_failed rows, and one task failed on nothing else.
CHAIN = {
    "run_id": "night",
    "kind": "chain",
    "stages": [
        _stage("transcribe", 10, 4),
        _stage("process", 10, 4, task="call_summary"),
        _stage("process", 10, 4, task="disposition"),
    ],
}


def _job_file(tmp_path: Path) -> str:
    path = tmp_path / "night.toml"
    path.write_text(
        f'[job]\nkind = "chain"\ninput = "{tmp_path}"\noutput = "{tmp_path / "out"}"\n'
        "progress = false\n"
    )
    return str(path)


def test_max_error_rate_applies_to_every_stage_of_a_chained_job_in_the_api_and_the_cli(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(api, "execute", lambda spec: CHAIN)  # the CLI runs jobs through it too
    with pytest.raises(ErrorRateExceeded, match="4 of 10 items failed in the transcribe stage"):
        overnight_api.run({"job": _job(tmp_path, 0.2)})
    assert cli_main(["run", _job_file(tmp_path), "--max-error-rate", "0.2"]) == 12
    assert "more than the 20.0% that max_error_rate allows" in capsys.readouterr().err
    assert cli_main(["run", _job_file(tmp_path), "--max-error-rate", "0.4"]) == 0


def test_one_stage_over_the_limit_fails_the_check_although_the_pooled_rate_is_within_it(
    tmp_path,
):
    # 2 of 10 calls failed in transcription; classify failed on 6 more: pooled 10/30 = 33%.
    summary = {
        "kind": "chain",
        "stages": [
            _stage("transcribe", 10, 2),
            _stage("process", 10, 2, task="summarize"),
            _stage("process", 10, 8, task="classify"),
        ],
    }
    spec = api._spec("chain", str(tmp_path), str(tmp_path / "out"), None, {"max_error_rate": 0.5})
    with pytest.raises(ErrorRateExceeded) as raised:
        api.check_error_rate(spec, summary)
    assert "8 of 10 items failed in the classify stage (80.0%" in str(raised.value)
    assert "summarize stage" not in str(raised.value)  # only the stages over the limit
    assert raised.value.summary == summary


def _job(tmp_path: Path, max_error_rate: float) -> dict[str, Any]:
    return {
        "kind": "chain",
        "input": str(tmp_path),
        "output": str(tmp_path / "out"),
        "progress": False,
        "max_error_rate": max_error_rate,
    }


# Every option a job command's flags set, as the command line spells it and as the API takes
# it; the common [job] options with each kind's.
JOB_OPTIONS = (
    [
        *("--address", "auto", "--run-id", "night-1", "--max-items", "3"),
        *("--max-error-rate", "0.1", "--retry-errors", "--quiet", "--verbose"),
        *("--include", "*.wav", "--exclude", "tmp/*"),
        *("--notify", "https://hooks.example/T0KEN"),
    ],
    {
        "ray_address": "auto",
        "run_id": "night-1",
        "max_items": 3,
        "max_error_rate": 0.1,
        "retry_errors": ["all"],
        "progress": False,
        "verbose": True,
        "include": ["*.wav"],
        "exclude": ["tmp/*"],
        "notify": "https://hooks.example/T0KEN",
    },
)
KIND_OPTIONS = {
    "transcribe": (
        [
            *("--model", "small", "--device", "cpu", "--compute-type", "int8"),
            *("--batch-size", "8", "--beam-size", "2", "--language", "de", "--actors", "2"),
            *("--engine", "ctranslate2"),
            *("--diarize", "--speakers", "2", "--min-speakers", "1", "--max-speakers", "4"),
            *("--speaker-roles", "agent,customer"),
            *("--split-channels", "--channel-labels", "agent, customer"),
            *("--initial-prompt", "Acme", "--hotwords", "Vexorium", "--task", "translate"),
            *("--redact", "pci,ssn", "--keep-unredacted", "--redact-audio", "--no-vad"),
        ],
        {
            "model": "small",
            "device": "cpu",
            "compute_type": "int8",
            "batch_size": 8,
            "beam_size": 2,
            "language": "de",
            "actors": 2,
            "engine": "ctranslate2",
            "diarize": True,
            "speakers": 2,
            "min_speakers": 1,
            "max_speakers": 4,
            "speaker_roles": ["agent", "customer"],
            "split_channels": True,
            "channel_labels": ["agent", "customer"],
            "initial_prompt": "Acme",
            "hotwords": "Vexorium",
            "task": "translate",
            "redact": ["pci", "ssn"],
            "keep_unredacted": True,
            "redact_audio": True,
            "vad": False,
        },
    ),
    "process": (
        [
            *("--task", "classify", "--task", "extract", "--task", "prompt"),
            *("--labels", "paid, unpaid", "--schema", "fields.json"),
            *("--prompt", "prompt.txt", "--model", "org/model", "--backend", "ctranslate2"),
            *("--device", "cpu", "--summary-words", "50"),
        ],
        {
            "task": ["classify", "extract", "prompt"],
            "labels": ["paid", "unpaid"],
            "schema": "fields.json",
            "prompt": "prompt.txt",
            "model": "org/model",
            "backend": "ctranslate2",
            "device": "cpu",
            "summary_words": 50,
        },
    ),
}


@pytest.mark.parametrize("kind", KIND_OPTIONS)
def test_the_cli_and_the_api_build_the_same_overrides_and_spec_from_the_same_options(
    kind, monkeypatch
):
    from overnight.jobs.cli import parse_args
    from overnight.jobs.cli.job import _NOT_OPTIONS, _overrides
    from overnight.jobs.spec import build_spec, overrides

    flags, options = KIND_OPTIONS[kind]
    options = {**JOB_OPTIONS[1], **options}
    args = parse_args([kind, "calls/", "out/", *JOB_OPTIONS[0], *flags])
    # Every flag of the command is here: a new one must join this list.
    assert {name for name in vars(args) if name not in _NOT_OPTIONS} == set(options)

    from_cli = _overrides(args, kind)
    from_api = overrides(kind, options, input="calls/", output="out/", who="test")
    assert from_cli == from_api

    monkeypatch.setattr(api, "run", lambda spec: spec)  # the spec the API would run
    api_spec = getattr(overnight_api, kind)("calls/", "out/", **options)
    assert build_spec(overrides=from_cli) == api_spec


def test_a_chained_jobs_summary_adds_up_its_stages_and_keeps_each():
    from overnight.jobs.api import RunSummary

    stage = {"run_id": "r", "items": 10, "succeeded": 9, "failed": 1, "items_already_done": 0}
    summary = {
        "stages": [
            {
                **stage,
                "kind": "transcribe",
                "cost_usd": 0.5,
                "errors_by_code": {"corrupt_audio": 1},
            },
            {
                **stage,
                "kind": "process",
                "cost_usd": 0.25,
                "errors_by_code": {"upstream_failed": 1},
            },
        ]
    }
    got = RunSummary.from_dict(summary)
    assert (got.items, got.succeeded, got.failed, got.cost_usd) == (20, 18, 2, 0.75)
    assert got.errors_by_code == {"corrupt_audio": 1, "upstream_failed": 1}
    assert [s.kind for s in got.stages] == ["transcribe", "process"]
    assert got.to_dict() == summary and got.error_rate == 0.1


def test_the_top_level_package_exports_the_api_and_its_errors():
    import overnight

    for name in ("transcribe", "process", "run", "submit", "status", "wait", "logs"):
        assert callable(getattr(overnight, name)), name
    assert overnight.ErrorRateExceeded.exit_code == 12
    assert issubclass(overnight.ModelNotFound, overnight.OvernightError)


def test_a_spec_submitted_as_a_mapping_is_named_by_its_kind(tmp_path, monkeypatch):
    """``overnight.submit`` takes the spec itself, not only a file: validated on this machine,
    its submission id made from its kind and night (the cluster is not reached here)."""
    from overnight.jobs.ops import remote

    seen = {}

    def unreachable(address):
        seen["address"] = address
        raise overnight_errors().ClusterUnreachable("no cluster in this test")

    monkeypatch.setattr(remote, "client", unreachable)
    import overnight

    job = {"job": {"kind": "transcribe", "input": str(tmp_path), "output": str(tmp_path / "o")}}
    with pytest.raises(overnight.ClusterUnreachable):
        overnight.submit(job, "http://127.0.0.1:9", date="2026-12-01")
    assert seen["address"] == "http://127.0.0.1:9"
    assert remote.submission_id_for("transcribe", date="2026-12-01") == (
        "overnight-transcribe-20261201"
    )
    with pytest.raises(overnight.ConfigError):
        overnight.submit({"job": {"kind": "transcribe"}}, "http://127.0.0.1:9")


def overnight_errors():
    from overnight.jobs import errors

    return errors


def test_typed_settings_build_the_same_spec_as_keyword_options(monkeypatch):
    """``settings=TranscribeOptions(...)``: the section as its typed model (a type checker
    sees its fields); the fields it sets give the same spec as the keyword options."""
    import overnight
    from overnight.jobs import api

    built = []
    monkeypatch.setattr(api, "run", lambda spec: built.append(spec))
    typed = overnight.TranscribeOptions(batch_size=8, beam_size=1, diarize=True)
    overnight.transcribe("in", "out", settings=typed, run_id="night-1")
    overnight.transcribe("in", "out", batch_size=8, beam_size=1, diarize=True, run_id="night-1")
    assert built[0] == built[1]
    assert built[0].transcribe.word_timestamps  # diarize's own consequence, as either way
    overnight.process("in", "out", settings=overnight.ProcessOptions(max_new_tokens=64))
    assert built[2].process.max_new_tokens == 64 and built[2].process.task == "summarize"


def test_a_chained_jobs_error_rate_is_its_worst_stages_as_max_error_rate_judges_it():
    from overnight.jobs.api import RunSummary

    stage = {"run_id": "r", "items": 100, "items_already_done": 0}
    summary = {
        "stages": [
            {**stage, "kind": "transcribe", "succeeded": 100, "failed": 0},
            {**stage, "kind": "process", "succeeded": 70, "failed": 30},
        ]
    }
    assert RunSummary.from_dict(summary).error_rate == pytest.approx(0.30)  # pooled: 0.15


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: overnight_api.transcribe(None, "out/"), "input must be a path or URL"),
        (lambda: overnight_api.process("docs/", 7), "output must be a path or URL"),
        (lambda: overnight_api.run(42), "overnight.run() takes a JobSpec"),
        (lambda: overnight_api.transcribe("in/", "out/", prices=1.0), "prices must be a mapping"),
        (lambda: overnight_api.transcribe("in/", "out/", settings=[4]), "settings must be"),
        (
            lambda: overnight_api.transcribe("in/", "out/", ray_address="http://127.0.0.1:8265"),
            "overnight submit",
        ),
        (
            lambda: overnight_api.transcribe("ftp://alice:S3cretPw@host/calls/", "out/"),
            "unsupported URL scheme 'ftp'",
        ),
    ],
)
def test_bad_api_arguments_are_config_errors_that_say_what_to_give(call, says):
    from overnight.jobs.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        call()
    assert says in str(caught.value), str(caught.value)
    assert "S3cretPw" not in str(caught.value)


def test_settings_given_as_a_mapping_are_the_sections_fields(monkeypatch):
    monkeypatch.setattr(api, "run", lambda spec: spec)  # the spec the API would run
    spec = overnight_api.transcribe("calls/", "out/", settings={"batch_size": 4})
    assert spec.transcribe.batch_size == 4


def test_an_error_scrubs_the_credentials_its_message_quotes_where_it_is_raised():
    from overnight.jobs.errors import InputNotFound

    # The API raises to a scheduler, which logs str(exc): not only the CLI's print scrubs.
    exc = InputNotFound("input 's3://AKIAABCDEFGHIJKLMNOP:sEcReT/x+y@bucket/in' does not exist")
    assert "AKIA" not in str(exc) and "sEcReT" not in str(exc) and "bucket/in" in str(exc)
