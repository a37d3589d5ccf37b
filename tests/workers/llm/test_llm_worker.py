"""LLMWorker, the map_batches callable, on the real SmolLM2 (CTranslate2, CPU)."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pydantic import ValidationError

from overnight.jobs.errors import ConfigError
from overnight.jobs.process import _TaskRows, _worker_config, task_spec
from overnight.jobs.run.sizing import Pool
from overnight.jobs.spec import build_spec
from overnight.schemas import DOCUMENT_RESULTS
from overnight.workers.devices import gpu_kind, resolve_device, worker_id
from overnight.workers.llm.adapter import BackendConfigError, EngineUnavailable, load_backend
from overnight.workers.llm.engine_options import EngineOptions
from overnight.workers.llm.tasks.run import reply_room_problem
from overnight.workers.llm.tasks.spec import NoRoomForDocuments, TaskSpec
from overnight.workers.llm.worker import LLMWorker, LLMWorkerConfig, options_json

LABELS = ("billing", "support")


@pytest.fixture(scope="module")
def worker(model_dir: Path) -> LLMWorker:
    task = TaskSpec(kind="classify", labels=LABELS)
    return LLMWorker(
        LLMWorkerConfig(
            task=task,
            engine=EngineOptions(backend="ctranslate2", model=str(model_dir), device="cpu"),
        )
    )


def _batch() -> pa.Table:
    return pa.table(
        {
            "item_id": ["a", "b", "c", "d"],
            "text": ["My invoice is wrong.", None, "The app crashes on start.", None],
            "status": ["ok", "error", "ok", "ok"],
            "error_code": [None, "corrupt_document", None, None],
            "error_message": [None, "bad xref table", None, None],
            "tenant": ["t1", "t1", "t2", "t2"],
            "document_chars": pa.array([20, None, 25, None], pa.int64()),
        }
    )


def test_worker_returns_the_same_rows_in_order_and_passes_error_rows_through(
    worker: LLMWorker,
) -> None:
    batch = _batch()
    out = worker(batch)
    assert out.num_rows == batch.num_rows
    assert out.column("item_id").to_pylist() == ["a", "b", "c", "d"]
    assert out.column("tenant").to_pylist() == batch.column("tenant").to_pylist()
    rows = out.to_pylist()

    a, b, c, d = rows
    for ok in (a, c):
        assert ok["status"] == "ok" and ok["label"] in LABELS
        assert ok["task"] == "classify" and ok["num_chunks"] == 1
        assert ok["input_tokens"] > 0 and ok["output_tokens"] > 0
        assert ok["llm_s"] > 0  # what it ran on is the runner's to write (jobs.run.stage)
        assert ok["model"].startswith("ctranslate2:") and ok["worker"]
    # Already failed upstream: untouched, and no LLM columns filled in.
    assert (b["status"], b["error_code"], b["error_message"]) == (
        "error",
        "corrupt_document",
        "bad xref table",
    )
    assert b["label"] is None and b["input_tokens"] is None and b["model"] is None
    # No text on a row nobody failed: this stage fails it, the batch goes on.
    assert (d["status"], d["error_code"]) == ("error", "invalid_input")


def test_worker_output_columns_have_the_document_results_types(worker: LLMWorker) -> None:
    out = worker(_batch())
    for name in (
        "task",
        "output_text",
        "output_json",
        "label",
        "input_tokens",
        "output_tokens",
        "num_chunks",
        "model",
        "llm_s",
        "llm_resource",
        "llm_units",
        "worker",
        "status",
    ):
        assert out.schema.field(name).type == DOCUMENT_RESULTS.field(name).type, name


def test_worker_batch_of_only_error_rows_calls_no_model(worker: LLMWorker) -> None:
    batch = _batch().filter(pa.array([False, True, False, False]))
    out = worker(batch)
    assert out.num_rows == 1 and out.column("status").to_pylist() == ["error"]


def test_worker_config_is_validated_and_records_effective_options() -> None:
    task = TaskSpec(kind="summarize", summary_words=30)
    engine = EngineOptions(backend="ctranslate2", engine_kwargs={"seed": 1})
    config = LLMWorkerConfig(task=task, engine=engine, max_new_tokens=12)
    options = json.loads(options_json(config))
    assert options["task"]["max_new_tokens"] == 12 and options["backend"] == "ctranslate2"
    # The engine's settings sit beside the worker's, flat, as rows have always recorded them.
    assert options["engine_kwargs"] == {"seed": 1}
    assert "engine" not in options
    with pytest.raises(ValidationError, match="backend"):
        EngineOptions(backend="openai")
    with pytest.raises(BackendConfigError, match="max_new_tokens"):
        LLMWorkerConfig(task=task, max_new_tokens=0)


def test_the_specs_engine_settings_reach_the_worker_as_they_are_and_load_backend_by_name() -> None:
    settings = {
        "backend": "vllm",
        "model": "org/some-model",
        "compute_type": "float32",
        "max_batch_size": 7,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 1024,
        "gpu_memory_utilization": 0.5,
        "max_model_len": 4096,
        "engine_kwargs": {"seed": 3, "enforce_eager": True},
    }
    spec = build_spec(
        overrides={"job": {"kind": "process", "input": "in", "output": "out"}, "process": settings}
    )
    pool = Pool(
        actors=1, cpus_per_actor=1.5, gpus_per_actor=0, task_cpus=0.25, model_workers=1, threads=2
    )
    config = _worker_config(spec.process, task_spec("summarize", spec.process), "cpu", pool)
    # Every setting as the spec gave it, the device as the job resolved it, nothing else.
    assert config.engine == EngineOptions(**settings, device="cpu")
    assert type(config.engine) is EngineOptions and config.cpu_threads == 2
    # load_backend takes the engine's settings by their own names (LLMWorker passes them so).
    assert set(EngineOptions.model_fields) <= set(inspect.signature(load_backend).parameters)


def test_worker_fails_loudly_when_the_engine_cannot_load(monkeypatch) -> None:
    config = LLMWorkerConfig(task=TaskSpec(kind="summarize"), engine=EngineOptions(backend="vllm"))
    monkeypatch.setitem(sys.modules, "vllm", None)  # as on a machine without vLLM
    with pytest.raises(EngineUnavailable):
        LLMWorker(config)


def test_a_reply_cap_that_leaves_no_room_beside_the_prompt_is_refused_at_load(
    model_dir: Path,
) -> None:
    # 8150 of SmolLM2's 8192 tokens pass the job's check before Ray, which cannot count the
    # prompt's own tokens without the model's tokenizer; the load counts them and stops the
    # actor before any document, instead of a context_exceeded row for every one.
    task = TaskSpec(kind="summarize", max_new_tokens=8150)
    assert reply_room_problem(task, 8192) is None
    engine = EngineOptions(backend="ctranslate2", model=str(model_dir), device="cpu")
    config = LLMWorkerConfig(task=task, engine=engine)
    with pytest.raises(NoRoomForDocuments) as err:
        LLMWorker(config)
    message = str(err.value)
    assert message.startswith("max_new_tokens = 8150 leaves no room for a document in the ")
    assert "model's context of 8192 tokens" in message and "context_exceeded" in message
    assert "set max_new_tokens to at most " in message
    # In the job's actor it is the spec's error, exit 2 as the check before Ray says it
    # (the runner rebuilds it from the actor's traceback by its name).
    with pytest.raises(ConfigError, match=r"^process\.max_new_tokens = 8150 leaves no room"):
        _TaskRows(config)
    # The worker's own cap overrides the task's, and is checked alike.
    classify = TaskSpec(kind="classify", labels=LABELS)
    with pytest.raises(NoRoomForDocuments, match="max_new_tokens = 8180"):
        LLMWorker(LLMWorkerConfig(task=classify, engine=engine, max_new_tokens=8180))


@pytest.mark.slow
def test_worker_runs_as_a_ray_data_actor_pool_stage(ray_local, model_dir: Path) -> None:
    import ray

    config = LLMWorkerConfig(
        task=TaskSpec(kind="classify", labels=LABELS),
        engine=EngineOptions(backend="ctranslate2", model=str(model_dir)),
    )
    ds = ray.data.from_arrow(_batch()).map_batches(
        LLMWorker,
        fn_constructor_kwargs={"config": config},
        batch_format="pyarrow",
        batch_size=4,
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=1,
    )
    rows = sorted(ds.take_all(), key=lambda r: r["item_id"])
    assert [r["status"] for r in rows] == ["ok", "error", "ok", "error"]
    assert rows[0]["label"] in LABELS
    assert "actor=" in rows[0]["worker"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA L4", "l4"),
        ("Tesla T4", "t4"),
        ("NVIDIA GeForce RTX 4090", "gpu"),
    ],
)
def test_gpu_product_names_map_to_price_table_kinds(name: str, kind: str) -> None:
    assert gpu_kind(name) == kind


def test_auto_device_has_one_rule_and_explicit_devices_are_kept() -> None:
    assert resolve_device("auto", lambda: True) == "cuda"
    assert resolve_device("auto", lambda: False) == "cpu"
    assert resolve_device("cpu", lambda: True) == "cpu"
    assert resolve_device("cuda", lambda: False) == "cuda"


def test_outside_ray_the_worker_id_names_the_host_and_process(monkeypatch) -> None:
    import os
    import socket

    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert worker_id() == f"host={socket.gethostname()} pid={os.getpid()}"
