"""A call task over a transcripts dataset keeps one row per call and task: the newest
transcript's, whatever ids the call's recording had while it failed; and what the job
refuses before Ray starts, with the setting to change."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from overnight.jobs import documents
from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.manifest import item_id
from overnight.jobs.errors import ConfigError
from overnight.jobs.process import ProcessJob, check_reply_room, task_spec
from overnight.jobs.run import runner, sizing
from overnight.jobs.spec import build_spec
from overnight.schemas import DOCUMENT_RESULTS, TRANSCRIPTS

URI = "/calls/late.wav"


def _publish(dataset: storage.Location, schema: pa.Schema, run: str, rows: list[dict]) -> None:
    staged = commits.CommittedDataset(dataset).staging_dir(date(2026, 12, 7), run)
    full = [{"run_id": run, "source_uri": URI, **row} for row in rows]
    commits.CommittedDataset(staged).write_table(pa.Table.from_pylist(full, schema=schema))
    commits.CommittedDataset(dataset).publish(schema, run)


def _transcript(item: str, status: str, hour: int) -> dict[str, Any]:
    failed = status != "ok"
    return {
        "item_id": item,
        "external_id": "late",
        "status": status,
        "error_code": "fetch_failed" if failed else None,
        "text": None if failed else "agent: hello\ncustomer: I will pay on Friday",
        "processed_at": datetime(2026, 12, 7, hour, tzinfo=UTC),
    }


def _result(item: str, code: str | None) -> dict[str, Any]:
    return {
        "item_id": documents.result_id(item, "disposition"),
        "source_item_id": item,
        "status": "error" if code else "ok",
        "error_code": code,
    }


def _left_to_do(output: Path) -> tuple[list[dict], dict[str, list[str]], ProcessJob]:
    spec = build_spec(
        overrides={
            "job": {"kind": "process", "input": str(output), "output": str(output)},
            "process": {"task": "disposition", "backend": "ctranslate2"},
        }
    )
    job = ProcessJob(spec, "disposition", check=lambda dry: None)
    prepared = job.prepare(dry=True)
    dataset = commits.CommittedDataset(storage.resolve(str(output / "results")))
    todo, redo = runner.left_to_do(job, prepared, dataset)
    return todo, redo, job


def test_a_call_transcribed_after_its_recording_came_back_retires_its_transcript_failed_row(
    tmp_path,
):
    missing = item_id(URI, None, None, None, "late")
    # The transcription's --retry-errors replaced the missing recording's row: only the ok
    # transcript is left, under the recording's new id.
    _publish(storage.resolve(str(tmp_path / "transcripts")), TRANSCRIPTS, "t2",
             [_transcript("readable", "ok", 2)])  # fmt: skip
    _publish(storage.resolve(str(tmp_path / "results")), DOCUMENT_RESULTS, "p1",
             [_result(missing, "transcript_failed")])  # fmt: skip

    todo, redo, _ = _left_to_do(tmp_path)

    assert [r["source_item_id"] for r in todo] == ["readable"]
    assert sorted(i for rows in redo.values() for i in rows) == [
        documents.result_id(missing, "disposition")
    ]


def test_a_broken_recording_fixed_in_place_leaves_one_record_per_call_the_newest_transcript(
    tmp_path,
):
    transcripts = storage.resolve(str(tmp_path / "transcripts"))
    _publish(transcripts, TRANSCRIPTS, "t1", [_transcript("broken", "error", 1)])
    _publish(transcripts, TRANSCRIPTS, "t2", [_transcript("fixed", "ok", 2)])
    _publish(storage.resolve(str(tmp_path / "results")), DOCUMENT_RESULTS, "p1",
             [_result("broken", "transcript_failed")])  # fmt: skip

    todo, redo, _ = _left_to_do(tmp_path)

    assert [r["source_item_id"] for r in todo] == ["fixed"]
    assert sorted(i for rows in redo.values() for i in rows) == [
        documents.result_id("broken", "disposition")
    ]


def test_a_call_whose_newest_transcript_failed_again_keeps_its_one_error_row(tmp_path):
    missing = item_id(URI, None, None, None, "late")
    _publish(storage.resolve(str(tmp_path / "transcripts")), TRANSCRIPTS, "t2",
             [_transcript("still-broken", "error", 2)])  # fmt: skip
    _publish(storage.resolve(str(tmp_path / "results")), DOCUMENT_RESULTS, "p1",
             [_result(missing, "transcript_failed")])  # fmt: skip

    todo, redo, _ = _left_to_do(tmp_path)

    assert todo == [] and redo == {}


def _process(**options: Any):
    spec = build_spec(
        overrides={"job": {"kind": "process", "input": "in", "output": "out"}, "process": options}
    )
    return spec.process


def test_a_vllm_max_model_len_past_the_models_context_is_refused_before_ray() -> None:
    opts = _process(task="disposition", backend="vllm", device="cpu", max_model_len=100000)
    with pytest.raises(ConfigError) as err:
        check_reply_room(opts, None)
    assert str(err.value).startswith(
        "process.max_model_len: 100000 exceeds the model's 8192-token context; lower it"
    )


def test_a_max_model_len_too_small_for_the_tasks_reply_is_named_with_its_remedy() -> None:
    opts = _process(task="promise_to_pay", backend="vllm", device="cpu", max_model_len=256)
    with pytest.raises(ConfigError) as err:
        check_reply_room(opts, None)
    message = str(err.value)
    assert message.startswith("process.max_model_len = 256 leaves no room for a document")
    assert "raise max_model_len" in message and "set max_new_tokens to at most" in message


def test_call_summary_keeps_its_own_length_and_every_task_gets_the_jobs_instructions() -> None:
    opts = _process(task=["call_summary", "compliance"], instructions="Answer in French.")
    opts = opts.model_copy(update={"required_phrases": ["this call is recorded"]})
    assert task_spec("call_summary", opts).summary_words == 80
    assert task_spec("compliance", opts).instructions.endswith(" Answer in French.")
    assert task_spec("call_summary", _process(summary_words=40)).summary_words == 40


def test_a_gpu_pool_on_a_machine_without_a_gpu_says_to_run_on_the_cpu(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    pool = sizing.Pool(
        actors=1, cpus_per_actor=1, gpus_per_actor=1, task_cpus=1, model_workers=1, threads=1
    )
    with pytest.raises(ConfigError) as err:
        runner._within_nodes(pool, [sizing.Node(cpus=2)], None)
    message = str(err.value)
    assert "this machine's Ray has no GPU" in message and "--device cpu" in message
    assert "gpus_per_actor" not in message
