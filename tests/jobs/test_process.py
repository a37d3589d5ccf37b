"""The document job and the chained job, on the real SmolLM2 model: through the default
backend ("auto": vLLM where it is installed, as under .ci/run) where the engine is the
subject, through CTranslate2 where the job's bookkeeping is (an engine that starts in seconds,
where vLLM takes about 20 s a task; tests/workers/llm/test_llm_vllm.py covers vLLM itself)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.dataset as pads
import pytest

from overnight.jobs.cli import main as cli_main
from overnight.jobs.errors import ConfigError
from overnight.jobs.process import run_process
from overnight.jobs.spec import build_spec, read_job_file
from overnight.workers.llm.engine_options import default_llm_backend
from tests.conftest import require_vllm, secrets_in, upload_folder

pytestmark = pytest.mark.usefixtures("ray_local")

CALL = (
    "agent: Hello, this is Anna from Acme billing, am I speaking with John Smith?\n"
    "customer: Yes. I can pay the 120 dollars on Monday.\n"
    "agent: Thank you, I have noted your promise to pay 120 dollars on Monday."
)


def process(input_: str, output: str, **process_opts):
    spec = build_spec(
        overrides={
            "job": {"kind": "process", "input": input_, "output": output, "progress": False},
            "process": {"max_new_tokens": 48, **process_opts},
        }
    )
    return run_process(spec)


def results(output) -> list[dict]:
    return pads.dataset(str(output) + "/results", format="parquet").to_table().to_pylist()


def by_name(rows):
    return {Path(r["source_uri"]).name: r for r in rows}


@pytest.fixture
def docs(tmp_path, shared_docs) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for name in ("minimal-document.pdf", "libreoffice-writer-password.pdf"):
        shutil.copy(shared_docs / name, folder / name)
    (folder / "call.txt").write_text(CALL)
    (folder / "empty.txt").write_text("   \n")
    (folder / "junk.bin").write_bytes(bytes(range(256)) * 4)
    return folder


def test_summarize_covers_real_pdfs_and_text_and_bad_documents_become_error_rows(docs, tmp_path):
    summary = process(str(docs), str(tmp_path / "out"), task="summarize", summary_words=20)
    got = by_name(results(tmp_path / "out"))
    # junk.bin is no document by its name: the folder listing leaves it out and says so.
    assert len(got) == 4 and summary["items"] == 4 and "junk.bin" not in got
    assert summary["skipped"] == {"not_document_extension": 1}
    for name in ("minimal-document.pdf", "call.txt"):
        row = got[name]
        assert row["status"] == "ok" and row["output_text"].strip(), row
        assert row["input_tokens"] > 20 and 0 < row["output_tokens"] <= 48 * row["num_chunks"] * 2
        assert (
            row["task"] == "summarize"
            and row["llm_s"] > 0
            # backend "auto": vLLM where it is installed (as under .ci/run), else CTranslate2
            and row["model"].startswith(f"{default_llm_backend()}:")
        )
    assert got["libreoffice-writer-password.pdf"]["error_code"] == "encrypted"
    assert got["empty.txt"]["error_code"] == "no_text"
    assert summary["cost_per_document_usd"] > 0 and summary["cost_per_million_tokens_usd"] > 0
    costs = pads.dataset(str(tmp_path / "out" / "costs"), format="parquet").to_table().to_pylist()
    assert {c["item_id"] for c in costs} == {
        r["item_id"] for r in got.values()
    }  # every item is priced
    generate = [c for c in costs if c["stage"] == "generate"]
    assert {c["item_id"] for c in generate} == {
        r["item_id"] for r in got.values() if r["status"] == "ok"
    }
    assert sum(c["input_tokens"] or 0 for c in generate) == summary["input_tokens"]


def test_encrypted_pdf_opens_when_its_password_is_configured(docs, tmp_path, monkeypatch):
    monkeypatch.setenv("OVERNIGHT_PDF_PASSWORD", "openpassword")
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"uri\n{docs / 'libreoffice-writer-password.pdf'}\n")
    process(
        str(manifest),
        str(tmp_path / "out"),
        task="summarize",
        summary_words=10,
        max_new_tokens=24,
        backend="ctranslate2",  # the subject is the PDF's password, not the engine
    )
    (row,) = results(tmp_path / "out")
    assert row["status"] == "ok" and row["input_tokens"] > 0
    assert "openpassword" not in json.dumps(row, default=str)


@pytest.mark.slow
def test_extract_returns_json_valid_against_the_schema_and_classify_a_label_from_the_set(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "call.txt").write_text(CALL)
    schema = {
        "type": "object",
        "properties": {"customer_name": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["customer_name", "amount"],
    }
    (tmp_path / "fields.json").write_text(json.dumps(schema))
    process(
        str(folder),
        str(tmp_path / "out"),
        task=["extract", "classify"],
        schema=str(tmp_path / "fields.json"),
        labels=["billing", "technical_support", "sales"],
    )
    rows = {r["task"]: r for r in results(tmp_path / "out")}
    assert set(rows) == {"extract", "classify"}
    extracted = rows["extract"]
    if extracted["status"] == "ok":
        value = json.loads(extracted["output_json"])
        assert set(value) <= {"customer_name", "amount"} and isinstance(
            value["amount"], int | float
        )
    else:  # a 135M model may fail twice; then the row says so with the documented code
        assert extracted["error_code"] == "invalid_output"
    assert rows["classify"]["status"] == "ok" and rows["classify"]["label"] in {
        "billing",
        "technical_support",
        "sales",
    }
    # Two tasks over one document: two rows with distinct ids, one source item.
    assert len({r["item_id"] for r in rows.values()}) == 2
    assert len({r["source_item_id"] for r in rows.values()}) == 1


def test_a_job_of_two_tasks_fetches_and_extracts_each_document_once(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    texts = {
        "a.txt": "The meeting moved to Thursday at noon.",
        "b.txt": "Please pay the invoice of 120 dollars by Friday.",
        "empty.txt": "  \n",  # an error row in both tasks, from its one extraction
    }
    for name, text in texts.items():
        (folder / name).write_text(text)
    summary = process(
        str(folder),
        str(tmp_path / "out"),
        task=["classify", "summarize"],
        labels=["schedule", "billing"],
        summary_words=10,
        backend="ctranslate2",  # the subject is the job's fetches, not the engine
    )
    assert [s["items"] for s in summary["stages"]] == [3, 3]
    rows = results(tmp_path / "out")
    assert sorted((Path(r["source_uri"]).name, r["task"]) for r in rows) == sorted(
        (name, task) for name in texts for task in ("classify", "summarize")
    )
    for name, text in texts.items():
        mine = [r for r in rows if Path(r["source_uri"]).name == name]
        # A fetch and an extraction are timed on the row that did them: one per document.
        assert sum(1 for r in mine if r["fetch_s"] > 0 or r["extract_s"] > 0) == 1, mine
        if text.strip():
            assert {(r["status"], r["document_chars"]) for r in mine} == {("ok", len(text))}
        else:
            assert {r["error_code"] for r in mine} == {"no_text"}
    costs = pads.dataset(str(tmp_path / "out" / "costs"), format="parquet").to_table().to_pylist()
    priced = [c for c in costs if c["stage"] in ("fetch", "extract") and c["seconds"] > 0]
    assert len({c["item_id"] for c in priced}) == len(texts)  # priced once per document


def test_rerun_of_a_document_job_adds_nothing(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("The meeting moved to Thursday at noon.")
    job = {"task": "classify", "labels": ["schedule", "billing"], "backend": "ctranslate2"}
    process(str(folder), str(tmp_path / "out"), **job)
    again = process(str(folder), str(tmp_path / "out"), **job)
    assert again["items"] == 0 and again["items_already_done"] == 1
    assert len(results(tmp_path / "out")) == 1


def test_extract_without_a_schema_is_a_config_error_naming_the_flag(tmp_path):
    with pytest.raises(ConfigError, match="--schema"):
        process(str(tmp_path), str(tmp_path / "out"), task="extract")


def _chain_job(path: Path, input_: str, output: str, backend: str = "ctranslate2") -> Path:
    path.write_text(
        "[job]\n"
        'kind = "chain"\n'
        f'input = "{input_}"\n'
        f'output = "{output}"\n'
        'run_id = "nightly-test"\n'
        "progress = false\n"
        "[process]\n"
        'task = ["call_summary", "disposition"]\n'
        f'backend = "{backend}"\n'
        "max_new_tokens = 40\n"
        "summary_words = 25\n"
    )
    return path


def _check_chain(out_rows: list[dict], transcripts: list[dict]) -> None:
    assert {r["task"] for r in out_rows} == {"call_summary", "disposition"}
    for task in ("call_summary", "disposition"):
        mine = [r for r in out_rows if r["task"] == task]
        assert {r["source_item_id"] for r in mine} == {t["item_id"] for t in transcripts}
    ok_calls = {t["item_id"] for t in transcripts if t["status"] == "ok" and t["text"]}
    for r in out_rows:
        if r["source_item_id"] in ok_calls:
            assert r["status"] == "ok", r
            if r["task"] == "disposition":
                assert r["label"] in {
                    "paid",
                    "promise_to_pay",
                    "dispute",
                    "wrong_number",
                    "callback",
                    "other",
                }
            else:
                assert r["output_text"].strip()
        else:
            assert r["status"] == "error" and r["error_code"] in {"transcript_failed", "no_text"}


def test_chained_job_turns_recordings_into_transcripts_summaries_and_dispositions(
    synth_calls, tmp_path, capsys
):
    folder, refs = synth_calls
    job = _chain_job(tmp_path / "nightly.toml", str(folder), str(tmp_path / "out"))
    assert read_job_file(job)["job"]["kind"] == "chain"
    assert cli_main(["run", str(job)]) == 0
    transcripts = (
        pads.dataset(str(tmp_path / "out" / "transcripts"), format="parquet").to_table().to_pylist()
    )
    assert len(transcripts) == len(refs)
    _check_chain(results(tmp_path / "out"), transcripts)
    printed = capsys.readouterr().out
    assert "nightly-test-call_summary" in printed and "nightly-test-disposition" in printed


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ctranslate2", "vllm"])
def test_chained_job_runs_against_the_s3_endpoint(s3, synth_calls, tmp_path, capsys, backend):
    if backend == "vllm":
        require_vllm()
    folder, refs = synth_calls
    upload_folder(s3, "chain-in", folder, "calls")
    s3.create_bucket(Bucket=f"chain-out-{backend}")
    job = _chain_job(
        tmp_path / "nightly.toml",
        "s3://chain-in/calls/",
        f"s3://chain-out-{backend}/night",
        backend,
    )
    assert cli_main(["run", str(job)]) == 0
    import os

    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    transcripts = (
        pads.dataset(f"chain-out-{backend}/night/transcripts", filesystem=fs, format="parquet")
        .to_table()
        .to_pylist()
    )
    out_rows = (
        pads.dataset(f"chain-out-{backend}/night/results", filesystem=fs, format="parquet")
        .to_table()
        .to_pylist()
    )
    assert len(transcripts) == len(refs)
    _check_chain(out_rows, transcripts)
    assert secrets_in(capsys.readouterr().out + json.dumps(out_rows, default=str)) == []
