"""``overnight demo``'s output is checked as transcribe checks it, before a call is synthesized:
a folder that takes no files or a file in the way is exit 11, a damaged file among the
transcripts already there is exit 4 while nothing was read or changed."""

from __future__ import annotations

import errno

import pytest

import overnight.jobs.ops.demo as demo
import overnight.jobs.preflight as preflight
from overnight.jobs.cli import main


@pytest.fixture
def no_synthesis(monkeypatch):
    def synthesized(folder):
        raise AssertionError("the demo synthesized calls before checking its output")

    monkeypatch.setattr(demo, "make_demo_calls", synthesized)


@pytest.mark.usefixtures("no_synthesis")
def test_demo_into_a_plain_file_exits_11_before_synthesizing(tmp_path, capsys):
    output = tmp_path / "a-file"
    output.write_text("not a folder")
    code = main(["demo", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 11, err
    assert err.startswith("overnight: error: cannot write the output") and "a file" in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.usefixtures("no_synthesis")
def test_demo_into_a_folder_that_takes_no_files_exits_11_before_synthesizing(
    tmp_path, capsys, monkeypatch
):
    # A read-only folder (tests may run as root, whom a mode does not stop): the probe's
    # write fails as it would there.
    def read_only(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(preflight.tempfile, "mkstemp", read_only)
    code = main(["demo", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 11, err
    assert "does not take new files (Permission denied)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.usefixtures("no_synthesis")
def test_demo_into_an_output_holding_a_damaged_transcript_file_exits_4_having_changed_nothing(
    tmp_path, capsys
):
    output = tmp_path / "out"
    damaged = output / "transcripts" / "run_date=2026-01-01" / "part-foreign.parquet"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"junk")
    code = main(["demo", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "part-foreign.parquet is not a readable Parquet file" in err
    assert "Nothing was read or changed" in err
    assert sorted(p.name for p in output.iterdir()) == ["transcripts"]  # no calls/, no runs/


def test_demo_with_a_file_where_its_calls_folder_goes_exits_11(tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "calls").write_text("in the way")
    code = main(["demo", "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 11, err
    assert err.startswith(f"overnight: error: cannot write the demo's calls in {output / 'calls'}")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "espeak",
    [
        None,  # not installed
        "#!/bin/sh\necho 'espeak-ng: no voice data found' >&2\nexit 1\n",  # voice data missing
        "#!/bin/sh\necho not a wav\n",  # a wrapper that prints no WAV
    ],
    ids=["missing", "failing", "no-wav"],
)
def test_demo_without_a_working_espeak_ng_is_exit_2_in_one_line_saying_what_to_install(
    tmp_path, capsys, monkeypatch, espeak
):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if espeak is not None:
        (bin_dir / "espeak-ng").write_text(espeak)
        (bin_dir / "espeak-ng").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    code = main(["demo", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "espeak-ng" in err and "apt-get install espeak-ng" in err
    if espeak is not None and "voice" in espeak:
        assert "no voice data found" in err  # espeak-ng's own words
