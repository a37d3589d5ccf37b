"""What a user meets when something is wrong: one paragraph, a documented exit status, no
traceback, and for systemic failures, no Ray start.

Each test runs ``overnight`` as a subprocess, as a user would. The hub is made unreachable
deterministically (``HF_ENDPOINT`` at a closed local port), or answered by a small local
server that knows no repository; the Hugging Face cache is an empty temporary folder.
"""

from __future__ import annotations

import http.server
import inspect
import json
import os
import subprocess
import sys
import threading
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from overnight.jobs import errors
from overnight.jobs.ops import remote as submit
from tests.conftest import REPO, SHARED_DATA, _free_port, load_script


def overnight(*args: str, env: dict[str, str] | None = None, **kwargs) -> tuple[int, str]:
    """Run the CLI; (exit status, stdout and stderr together)."""
    proc = subprocess.run(
        [sys.executable, "-m", "overnight.jobs.cli", *args],
        env=env or cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,
    )
    return proc.returncode, proc.stdout + proc.stderr


def cli_env(**extra: str) -> dict[str, str]:
    """The caller's environment without Hugging Face or Ray settings, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE_", "RAY_ADDRESS"))
    }
    return {**env, "PYTHONPATH": str(REPO), **extra}


@pytest.fixture
def no_hub(tmp_path) -> dict[str, str]:
    """A hub that cannot be reached, and an empty cache."""
    return cli_env(
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
        HF_HOME=str(tmp_path / "hf-home"),
    )


class _NoSuchRepository(http.server.BaseHTTPRequestHandler):
    """The hub's answer for a repository it does not have (or may not show)."""

    def _reply(self) -> None:
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _reply

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def empty_hub(tmp_path) -> Iterator[dict[str, str]]:
    """A reachable hub that has no repository at all, and an empty cache."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoSuchRepository)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield cli_env(
            HF_HUB_OFFLINE="0",
            HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
            HF_HOME=str(tmp_path / "hf-home"),
        )
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def recording(tmp_path) -> Path:
    path = tmp_path / "x.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0\0" * 16000)
    return path


@pytest.fixture
def document(tmp_path) -> Path:
    path = tmp_path / "note.txt"
    path.write_text("The customer asked for a refund of the March invoice.")
    return path


def assert_one_clean_paragraph(output: str) -> None:
    """One paragraph (one line), besides overnight's own progress lines, and nothing else."""
    assert "Traceback" not in output, output
    assert "\x1b[" not in output, output  # no raw ANSI codes (Ray's colored logs)
    assert "fix the cause and rerun" not in output, output  # not the crashed-engine message
    lines = [line for line in output.strip().splitlines() if not line.startswith("[overnight] ")]
    assert len(lines) == 1, output


# -- a model that cannot be had: exit 5 before Ray, saying whose fault ------------------------


def test_a_faster_whisper_size_without_network_is_exit_5_saying_the_hub_could_not_be_reached(
    no_hub, recording, tmp_path
):
    out = tmp_path / "out"
    status, output = overnight(
        "transcribe", str(recording), str(out), "--model", "small.en", "--quiet", env=no_hub
    )
    assert status == errors.ModelNotFound.exit_code == 5, output
    assert_one_clean_paragraph(output)
    assert "small.en" in output and "Systran/faster-whisper-small.en" in output
    assert "could not reach the Hugging Face hub" in output
    assert "could not be checked" in output
    # The name is valid; only the network is at fault: never "not found".
    assert "not found" not in output and "no such model" not in output
    assert "hf download Systran/faster-whisper-small.en" in output
    assert "HF_HUB_OFFLINE" in output and "--model DIR" in output


@pytest.mark.parametrize("backend", ["ctranslate2", "vllm"])
def test_an_llm_hub_model_without_network_is_exit_5_and_not_called_not_found(
    no_hub, document, tmp_path, backend
):
    status, output = overnight(
        "process",
        str(document),
        str(tmp_path / "out"),
        "--model",
        "no-such-org/no-such-model",
        "--backend",
        backend,
        "--quiet",
        env=no_hub,
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert "no-such-org/no-such-model" in output
    assert "could not reach the Hugging Face hub" in output and "could not be checked" in output
    assert "not found" not in output
    assert "hf download no-such-org/no-such-model" in output


def test_a_name_the_hub_does_not_know_is_exit_5_no_such_model(empty_hub, recording, document):
    out = recording.parent / "out"
    status, output = overnight(
        "transcribe",
        str(recording),
        str(out),
        "--model",
        "no-such-org/no-such-model",
        "--quiet",
        env=empty_hub,
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert "no such model" in output and "no-such-org/no-such-model" in output
    assert "could not reach" not in output

    status, output = overnight(
        "process", str(document), str(out), "--model", "no-such-org/no-such-model", env=empty_hub
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert "no such model" in output and "the LLM model no-such-org/no-such-model" in output


def test_a_local_model_folder_that_does_not_exist_is_exit_5_not_found(
    no_hub, recording, document, tmp_path
):
    missing = str(tmp_path / "models" / "whisper-small")
    status, output = overnight(
        "transcribe", str(recording), str(tmp_path / "out"), "--model", missing, env=no_hub
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert missing in output and "not found" in output and "no such folder" in output

    status, output = overnight(
        "process", str(document), str(tmp_path / "out"), "--model", "./no/such/llm", env=no_hub
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert "./no/such/llm not found" in output


def _cut_short(source: Path, folder: Path, weights: str) -> Path:
    """A copy of a model folder whose weights file stops after its first bytes, as an
    interrupted download leaves it."""
    folder.mkdir()
    for f in source.iterdir():
        if f.is_file() and f.name != weights:
            (folder / f.name).write_bytes(f.read_bytes())
    with open(source / weights, "rb") as whole:
        (folder / weights).write_bytes(whole.read(100_000))
    return folder


def test_a_whisper_model_that_fails_to_load_in_its_actor_is_exit_5_in_one_paragraph(
    recording, tmp_path
):
    """The model is found on the driver and fails in the Ray actor's constructor: Ray keeps
    only the text of that error (and printed the remote traceback, "(raylet)", on stdout)."""
    from overnight.workers.whisper_models import bundled_model_path

    broken = _cut_short(Path(bundled_model_path()), tmp_path / "whisper", "model.bin")
    status, output = overnight(
        "transcribe", str(recording), str(tmp_path / "out"), "--model", str(broken)
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert f"cannot load Whisper model '{broken}'" in output


def test_an_llm_that_fails_to_load_in_its_actor_is_exit_5_in_one_paragraph(document, tmp_path):
    from overnight.workers.llm.prepare import prepare_hf_from_gguf, smollm2_gguf_path
    from tests.conftest import require_vllm

    require_vllm()
    source = prepare_hf_from_gguf(smollm2_gguf_path())
    broken = _cut_short(source, tmp_path / "llm", "model.safetensors")
    status, output = overnight(
        "process", str(document), str(tmp_path / "out"), "--backend", "vllm", "--model", str(broken)
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert f"vLLM could not load the model '{broken}'" in output
    assert "complete Hugging Face model folder" in output


def test_rays_echo_of_a_remote_traceback_stays_off_the_terminal_and_other_reports_do_not(
    monkeypatch, capsys
):
    from ray._private import worker

    from overnight.jobs.run import on_ray

    printed: list[list[str]] = []
    monkeypatch.setattr(
        worker, "print_to_stdstream", lambda data, **kw: printed.append(data["lines"])
    )
    on_ray._quiet_raylet_echo()
    on_ray._quiet_raylet_echo()  # a second job in the process: wrapped once
    traceback = ["Task X.get_location failed. Error: Traceback (most recent call last):", "..."]
    memory = ["Task was killed due to the node running low on memory."]
    # As Ray 2.60 reported a model actor killed with SIGKILL mid-run, then each of its calls.
    died = [
        "A worker died or was killed while executing a task by an unexpected system error. "
        "To troubleshoot the problem, check the logs for the dead worker. Lease ID: 0100 "
        "Worker ID: 1cea Node ID: d583 Worker IP address: 192.0.2.2 Worker port: 39279 "
        "Worker PID: 21257 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
        "unexpectedly exits with a connection error code 2. End of file."
    ]
    retry = [
        "Task MapWorker(MapBatches(CommittingActor)).submit failed. There are infinite retries "
        "remaining, so the task will be retried. Error: The actor is temporarily unavailable: "
        "RpcError: RPC error: Socket closed rpc_code: 14 [repeated 12x across cluster]"
    ]
    for lines in (traceback, memory, died, retry):
        worker.print_to_stdstream({"lines": lines, "pid": "raylet"}, ignore_prefix=False)
    worker.print_to_stdstream({"lines": ["a worker's own output"], "pid": 42}, ignore_prefix=False)
    assert printed == [memory, ["a worker's own output"]]
    ours = capsys.readouterr().err.strip().splitlines()
    assert len(ours) == 1 and ours[0].startswith("[overnight] a Ray worker process (pid 21257) ")
    assert "restarts it and runs its unfinished items again" in ours[0]


def test_offline_mode_without_the_model_in_the_cache_says_so(recording, tmp_path):
    env = cli_env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf-home"))
    status, output = overnight(
        "transcribe", str(recording), str(tmp_path / "out"), "--model", "small.en", env=env
    )
    assert status == 5, output
    assert_one_clean_paragraph(output)
    assert (
        "HF_HUB_OFFLINE is set" in output
        and "hf download Systran/faster-whisper-small.en" in output
    )


def _cache_tiny_en(hf_home: Path) -> Path:
    """The Hugging Face cache as ``hf download Systran/faster-whisper-tiny.en`` leaves it, made
    of the bundled tiny.en (the same CTranslate2 files)."""
    from overnight.workers.whisper_models import ModelLoadError, bundled_model_path

    try:
        source = Path(bundled_model_path())
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    repo = hf_home / "hub" / "models--Systran--faster-whisper-tiny.en"
    revision = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for f in source.iterdir():
        (snapshot / f.name).symlink_to(f)
    return snapshot


@pytest.mark.parametrize("offline", ["1", "0"])
def test_a_cached_hub_model_is_resolved_on_the_driver_without_network(tmp_path, offline):
    """Pre-downloaded, the model needs no network: the driver hands the actors the cached
    folder (with the hub unreachable too, not only with HF_HUB_OFFLINE=1)."""
    snapshot = _cache_tiny_en(tmp_path / "hf-home")
    env = cli_env(
        HF_HUB_OFFLINE=offline,
        HF_ENDPOINT=f"http://127.0.0.1:{_free_port()}",
        HF_HOME=str(tmp_path / "hf-home"),
    )
    code = (
        "from overnight.jobs import preflight, transcribe; from overnight.jobs.dataset.storage import StorageConfig\n"
        "from overnight.workers.whisper import WhisperOptions, WhisperWorkerConfig\n"
        "ref = preflight.whisper_model('tiny.en')\n"
        "import faster_whisper.transcribe as ft\n"
        "def no_fetch(*a, **k): raise SystemExit('the actor fetched the model itself')\n"
        "ft.download_model = no_fetch\n"
        "options = WhisperOptions(model='tiny.en', device='cpu')\n"
        "config = WhisperWorkerConfig(whisper=options)\n"
        "worker = transcribe.whisper_worker(config, StorageConfig.from_env(), ref.path)\n"
        "print(ref.path, ref.feature_size)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(snapshot), "80"]


# -- an output that cannot be written: one line, exit 11, before Ray ------------------------


@pytest.mark.parametrize("where", ["/sys/x", "/proc/x", "a file/out"])
@pytest.mark.parametrize("command", ["transcribe", "process"])
def test_an_unwritable_output_is_one_line_and_exit_11_before_ray(
    where, command, recording, tmp_path
):
    if where.startswith("a file"):
        (tmp_path / "a file").write_text("in the way")
        where = str(tmp_path / where)
    status, output = overnight(command, str(recording), where, "--quiet")
    assert status == errors.OutputNotWritable.exit_code == 11, output
    assert_one_clean_paragraph(output)
    assert f"cannot write the output {where}" in output
    assert "PermissionError" not in output and "NotADirectoryError" not in output


# -- process settings that cannot mean what they say: exit 2, before any work ---------------


def _process_job(path: Path, document: Path, out: Path, **process: object) -> Path:
    lines = [f"{k} = {json.dumps(v)}" for k, v in {"backend": "ctranslate2", **process}.items()]
    path.write_text(
        f'[job]\nkind = "process"\ninput = "{document}"\noutput = "{out}"\n[process]\n'
        + "\n".join(lines)
        + "\n"
    )
    return path


@pytest.mark.parametrize(
    ("process", "setting"),
    [
        ({"max_new_tokens": 100_000}, "max_new_tokens = 100000"),
        ({"summary_words": 6000}, "summary_words = 6000"),
    ],
)
def test_a_reply_cap_beyond_the_models_context_is_exit_2_before_ray_naming_both(
    process, setting, document, tmp_path
):
    # Accepted, it made every document a context_exceeded row, each counted done.
    out = tmp_path / "out"
    job = _process_job(tmp_path / "job.toml", document, out, task="summarize", **process)
    status, output = overnight("run", str(job))
    assert status == errors.ConfigError.exit_code == 2, output
    assert_one_clean_paragraph(output)
    assert f"process.{setting}" in output and "model's context of 8192 tokens" in output
    assert "[overnight] summarize on ctranslate2" not in output  # no actor was started
    assert not out.exists(), sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize(
    ("tasks", "setting", "task"),
    [
        (["summarize"], ("--labels", "billing,support"), "classify"),
        (["disposition"], ("--labels", "billing,support"), "classify"),
        (["summarize"], ("--schema", "{schema}"), "extract"),
        (["classify"], ("--prompt", "{prompt}"), "prompt"),
    ],
)
def test_a_setting_of_a_task_the_job_does_not_run_is_exit_2_and_with_it_accepted(
    tasks, setting, task, document, tmp_path
):
    # --task summarize --labels a,b summarized and ignored the labels without a word; so
    # were a schema and a prompt template.
    out = tmp_path / "out"
    schema, prompt = tmp_path / "fields.json", tmp_path / "prompt.txt"
    schema.write_text('{"type": "object", "properties": {"name": {"type": "string"}}}')
    prompt.write_text("Name the sender of {text}")
    option, value = setting[0], setting[1].format(schema=schema, prompt=prompt)
    given = [arg for t in tasks for arg in ("--task", t)]
    args = (option, value, "--backend", "ctranslate2")
    status, output = overnight("process", str(document), str(out), *given, *args)
    assert status == errors.ConfigError.exit_code == 2, output
    assert_one_clean_paragraph(output)
    assert f"applies to the {task} task only" in output and f"({', '.join(tasks)})" in output
    assert not out.exists()
    given += ["--task", task]
    if "classify" in given and option != "--labels":
        given += ["--labels", "billing,support"]  # classify needs its own
    status, output = overnight("process", str(document), str(out), *given, *args, "--dry-run")
    assert status == 0, output


@pytest.mark.parametrize(
    ("labels", "position"), [("billing,,support", 2), ("billing,support,", 3), (" ", 1)]
)
def test_an_empty_label_is_exit_2_naming_its_position(labels, position, document, tmp_path):
    # "billing,,support" classified into billing and support without a word.
    out = tmp_path / "out"
    args = ("--task", "classify", "--labels", labels, "--backend", "ctranslate2")
    status, output = overnight("process", str(document), str(out), *args)
    assert status == errors.ConfigError.exit_code == 2, output
    assert_one_clean_paragraph(output)
    assert f"process.labels: Value error, label {position} is empty" in output
    assert not out.exists()
    # A job file's list is read alike.
    job = _process_job(tmp_path / "job.toml", document, out, task="classify", labels=["a", " "])
    status, output = overnight("run", str(job))
    assert status == 2 and "label 2 is empty" in output, output


# -- bookkeeping in OUTPUT --------------------------------------------------------------------


def test_a_run_stopped_by_its_checks_leaves_no_claims_or_manifests(no_hub, recording, tmp_path):
    out = tmp_path / "out"
    status, output = overnight(
        "transcribe", str(recording), str(out), "--model", "small.en", env=no_hub
    )
    assert status == 5, output
    assert not out.exists(), sorted(p.name for p in out.iterdir())


def test_the_docs_say_claims_and_manifests_are_harmless_bookkeeping():
    layout = (REPO / "docs" / "reference" / "outputs.md").read_text()
    assert "| `_claims/<dataset>.json` |" in layout
    assert "| `_manifests/<run_id>.parquet` |" in layout
    assert "`_manifests/` and `_claims/` are bookkeeping" in layout and "harmless" in layout


# -- exit codes -------------------------------------------------------------------------------


def test_every_systemic_failure_has_its_own_exit_code_and_the_docs_list_it():
    classes = {
        cls
        for module in (errors, submit)
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, errors.OvernightError) and cls is not errors.OvernightError
    }
    codes = {cls.__name__: cls.exit_code for cls in classes}
    codes.update({name: getattr(errors, name) for name in dir(errors) if name.startswith("EXIT_")})
    assert set(errors.OUTCOME_EXIT_CODES) <= set(codes.values())
    assert len(set(codes.values())) == len(codes), codes
    assert 1 not in codes.values()  # 1 is an unexpected error only
    assert errors.Superseded.exit_code == 8 and errors.ClusterUnreachable.exit_code == 10
    # The docs' exit-code page is generated from the classes' docstrings and the EXIT_*
    # comments (scripts/gen_docs.py): each code must be there with a meaning.
    gen_docs = load_script("gen_docs")
    page = gen_docs.exit_codes_reference()
    for code in codes.values():
        row = next((line for line in page.splitlines() if line.startswith(f"| {code} | ")), "")
        assert row, f"exit status {code} is not in the docs' exit-code table"
        assert row.rstrip(" |").split("|")[-1].strip(), f"exit status {code} has no meaning"


def test_an_unreachable_cluster_is_exit_10_not_the_superseded_8():
    address = f"http://127.0.0.1:{_free_port()}"
    status, output = overnight("status", "overnight-nightly", "--address", address)
    assert status == 10, output
    assert_one_clean_paragraph(output)
    assert f"cannot reach the Ray Jobs API at {address}" in output


# -- flags, printing --------------------------------------------------------------------------


def test_a_mistyped_option_prints_the_subcommands_usage_and_the_option_it_meant(tmp_path):
    status, output = overnight("transcribe", "in", "out", "--batchsize", "8")
    assert status == 2, output
    assert "Traceback" not in output
    assert output.startswith("usage: overnight transcribe ")
    assert "overnight transcribe: error: unrecognized arguments: --batchsize 8" in output
    assert "did you mean --batch-size?" in output

    status, output = overnight("process", "in", "out", "--tsak=summarize")
    assert status == 2 and output.startswith("usage: overnight process "), output
    assert "did you mean --task?" in output


def test_config_prints_the_value_of_defaults_made_by_a_factory():
    status, output = overnight("config")
    assert status == 0, output
    assert "PydanticUndefined" not in output
    assert "  labels = []  #" in output and "  required_phrases = []  #" in output
    assert "  engine_kwargs = {}  #" in output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["config"], 141),  # as a shell reports a writer stopped by SIGPIPE
        (
            [
                "plan",
                "--audio-hours",
                "10",
                "--deadline",
                "6h",
                "--gpu",
                "h100",
                "--throughput",
                "50",
            ],
            141,
        ),
        (["transcribe", "--help"], 0),  # argparse drops its own failed write and exits 0
    ],
)
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(args, expected):
    """``overnight config | head``: the reader is gone before the first line is written."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "overnight.jobs.cli", *args],
            env=cli_env(),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr  # no BrokenPipeError, no traceback
    assert proc.returncode == expected


def test_plan_without_a_profile_suggests_stating_a_gpu_throughput():
    status, output = overnight("plan", "--audio-hours", "1000", "--deadline", "6h")
    assert status == 2, output
    assert_one_clean_paragraph(output)
    assert "--profile" in output and "--gpu h100 --throughput N" in output


def test_the_encrypted_pdf_message_names_the_environment_variable_the_job_reads(monkeypatch):
    """The document is read as the process job reads it (its TextOptions from the spec);
    running the whole job would load the LLM for a row that never reaches it."""
    from overnight.jobs.documents import text_options
    from overnight.jobs.spec import build_spec
    from overnight.workers.text import extract_text

    pdf = SHARED_DATA / "docs" / "libreoffice-writer-password.pdf"
    if not pdf.is_file():
        pytest.skip("../shared/data/docs is absent (fresh clone outside the workplace)")
    monkeypatch.delenv("OVERNIGHT_PDF_PASSWORD", raising=False)
    monkeypatch.delenv("ACME_PDF_PASSWORD", raising=False)
    job = {"job": {"input": "in", "output": "out", "kind": "process"}}

    spec = build_spec(job)
    result = extract_text(pdf.read_bytes(), pdf.name, text_options(spec.process))
    assert result.error_code == "encrypted"
    assert "$OVERNIGHT_PDF_PASSWORD" in (result.error_message or "")
    assert "set pdf_password" not in (result.error_message or "")

    spec = build_spec({**job, "process": {"pdf_password_env": "ACME_PDF_PASSWORD"}})
    monkeypatch.setenv("ACME_PDF_PASSWORD", "not-the-password")
    result = extract_text(pdf.read_bytes(), pdf.name, text_options(spec.process))
    assert result.error_code == "encrypted"
    assert "$ACME_PDF_PASSWORD" in (result.error_message or "")
    assert "not-the-password" not in json.dumps(result.error_message)


def test_an_error_of_ours_raised_in_a_ray_task_keeps_its_class_status_and_one_line(
    caplog, capsys, monkeypatch
):
    # Ray makes RayTaskError(<our class>) of an error raised in a task; our classes required
    # their exit status as a class argument, so it could not, and printed "User exception
    # type ... can't be subclassed!" on the terminal before our own message.
    import logging

    from ray.exceptions import RayTaskError

    from overnight.jobs import cli
    from overnight.jobs.errors import Superseded

    remote = RayTaskError("task", "Traceback (most recent call last):\n  ...", Superseded("taken"))
    with caplog.at_level(logging.WARNING, logger="ray.exceptions"):
        copy = remote.as_instanceof_cause()
    assert isinstance(copy, Superseded) and copy.exit_code == Superseded.exit_code
    assert not [r for r in caplog.records if "subclassed" in r.getMessage()]

    def handler(args):
        raise copy

    monkeypatch.setattr(
        cli, "parse_args", lambda argv: type("A", (), {"handler": staticmethod(handler)})()
    )
    assert cli._main([]) == Superseded.exit_code
    assert capsys.readouterr().err == "overnight: error: taken\n"
