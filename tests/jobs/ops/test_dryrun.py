"""Specifications for ``--dry-run`` that need no model: what it must not do.

The dry runs of tests/jobs/test_scheduling.py count and price on the bundled model; here a
hub model name is given, which a real local run would download.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# Runs in a child: this process's Ray (the session's ray_local) must not answer for it. The
# hub's download functions and ray.init are replaced by recorders; the hub's metadata
# (repo_info, what a cluster run asks too) answers as if the model existed.
_CHILD = """
import json, sys
import faster_whisper.utils, huggingface_hub, ray

calls = []

def recorder(name):
    def call(*args, **kwargs):
        calls.append(name)
        raise RuntimeError(name + " called by a dry run")
    return call

faster_whisper.utils.download_model = recorder("download_model")
huggingface_hub.snapshot_download = recorder("snapshot_download")
huggingface_hub.hf_hub_download = recorder("hf_hub_download")
ray.init = recorder("ray.init")
huggingface_hub.HfApi.repo_info = lambda self, repo, **kw: calls.append("repo_info:" + repo)

from overnight.jobs.cli import main

codes = [main(argv) for argv in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "calls": calls, "ray": ray.is_initialized()}))
"""


def test_a_dry_run_with_a_hub_model_downloads_nothing_and_starts_no_ray(tmp_path):
    calls, docs = tmp_path / "calls", tmp_path / "docs"
    calls.mkdir()
    docs.mkdir()
    (calls / "a.wav").write_bytes(b"RIFF" + bytes(60))
    (docs / "a.txt").write_text("The meeting moved to Thursday.")
    runs = [
        ["transcribe", str(calls), str(tmp_path / "t"), "--dry-run", "--model", "small.en"],
        [
            "process",
            str(docs),
            str(tmp_path / "p"),
            "--dry-run",
            "--task",
            "summarize",
            "--backend",
            "ctranslate2",
            "--model",
            "acme/llm-ct2",
        ],
    ]
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # an empty cache: all from the hub
    env.pop("RAY_ADDRESS", None)
    env.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(runs)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 0], done.stderr[-3000:]
    # The model references were checked (the hub's metadata), nothing was fetched or started.
    assert got["calls"] == ["repo_info:Systran/faster-whisper-small.en", "repo_info:acme/llm-ct2"]
    assert got["ray"] is False
    assert not any(Path(tmp_path, name).exists() for name in ("t", "p"))  # nothing written


def test_a_dry_run_states_short_audio_in_seconds_or_minutes_not_as_zero_hours(tmp_path, capsys):
    from overnight.jobs.cli import main
    from overnight.jobs.ops.demo import noise, write_wav
    from overnight.jobs.ops.dryrun import render

    calls = tmp_path / "calls"
    calls.mkdir()
    write_wav(calls / "short.wav", noise(16.0))
    argv = ["transcribe", str(calls), str(tmp_path / "out"), "--dry-run"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "about 16.0 s of audio (headers of 1 sampled recording(s))" in printed, printed
    assert "0.00 h" not in printed
    assert main([*argv, "--json"]) == 0
    [stage] = json.loads(capsys.readouterr().out)["stages"]
    assert stage["pending_audio_seconds_estimate"] == 16.0
    assert not (tmp_path / "out").exists()
    # Longer totals read in minutes, then hours.
    for seconds, says in ((150.0, "about 2.5 min of audio"), (5400.0, "about 1.50 h of audio")):
        stage.update(pending_audio_seconds_estimate=seconds)
        text = render({"kind": "transcribe", "output": "out", "stages": [stage]})
        assert says in text, text


def test_a_dry_run_says_how_many_files_it_leaves_out_for_a_name_starting_with_dot_or_underscore(
    tmp_path, capsys
):
    from overnight.jobs.cli import main
    from overnight.jobs.ops.demo import noise, write_wav

    calls = tmp_path / "calls"
    for name in ("call.wav", "_agent_0042.wav", "_staging/b.wav"):
        (calls / name).parent.mkdir(parents=True, exist_ok=True)
        write_wav(calls / name, noise(1.0))
    (calls / ".DS_Store").write_bytes(b"\0")
    argv = ["transcribe", str(calls), str(tmp_path / "out"), "--dry-run"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 listed" in printed, printed
    assert (
        "skipped 3 file(s) whose name or folder starts with . or _ (e.g. .DS_Store, "
        "_agent_0042.wav, _staging/b.wav)"
    ) in printed, printed
    assert main([*argv, "--json"]) == 0
    [stage] = json.loads(capsys.readouterr().out)["stages"]
    assert stage["skipped"] == {"hidden": 3}
