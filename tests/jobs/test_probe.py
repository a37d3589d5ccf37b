"""The probe job: container headers into OUTPUT/probes/, on the same runner as the other jobs;
its durations are the transcription rows' (real Ray, real recordings)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as pads
import pytest

from overnight.jobs.ops.demo import noise, silence, write_wav
from overnight.jobs.probe import run_probe
from overnight.jobs.spec import build_spec
from overnight.jobs.transcribe import run_transcribe
from overnight.schemas import PROBES

pytestmark = pytest.mark.usefixtures("ray_local")

# A header states the duration the decoder then delivers, to the sample for PCM and FLAC;
# MP3 headers may differ by the encoder's padding (a frame, 26 ms at 44.1 kHz).
TOLERANCE_S = 0.05


def spec(input_: str, output: str, kind: str):
    return build_spec(
        overrides={"job": {"kind": kind, "input": input_, "output": output, "progress": False}}
    )


def by_name(output: Path, name: str) -> dict[str, dict]:
    table = pads.dataset(str(output / name), format="parquet").to_table()
    return {Path(r["source_uri"]).name: r for r in table.to_pylist()}


def assert_probes_match_transcripts(folder: Path, tmp_path: Path) -> dict:
    probed = run_probe(spec(str(folder), str(tmp_path / "probe"), "probe"))
    run_transcribe(spec(str(folder), str(tmp_path / "transcribe"), "transcribe"))
    probes = by_name(tmp_path / "probe", "probes")
    transcripts = by_name(tmp_path / "transcribe", "transcripts")
    assert probes.keys() == transcripts.keys()
    for name, row in probes.items():
        heard = transcripts[name]
        assert (row["status"], row["error_code"]) == (heard["status"], heard["error_code"]), name
        if heard["status"] == "ok":
            assert abs(row["duration_s"] - heard["duration_s"]) <= TOLERANCE_S, name
    ok = [r["duration_s"] for r in probes.values() if r["status"] == "ok"]
    assert probed["audio_hours"] == pytest.approx(sum(ok) / 3600, abs=1e-6)
    assert probed["kind"] == "probe" and probed["items"] == len(probes)
    return probed


def test_probe_of_synthesized_audio_gives_the_transcription_rows_durations(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_wav(folder / "short.wav", np.concatenate([silence(0.4), noise(2.3)]))
    write_wav(folder / "long.wav", noise(7.125, seed=3))
    stereo = np.stack([noise(3.0, seed=1), silence(3.0)])
    write_wav(folder / "stereo.wav", stereo)
    (folder / "broken.mp3").write_bytes(b"this is no audio at all" * 40)
    summary = assert_probes_match_transcripts(folder, tmp_path)
    assert summary["failed"] == 1 and summary["errors_by_code"] == {"not_audio": 1}
    probes = by_name(tmp_path / "probe", "probes")
    assert (probes["stereo.wav"]["channels"], probes["stereo.wav"]["sample_rate"]) == (2, 16000)
    assert probes["long.wav"]["codec"] == "pcm_s16le"
    assert probes["long.wav"]["size_bytes"] == (folder / "long.wav").stat().st_size


def test_probe_of_the_shared_audio_gives_the_transcription_rows_durations(shared_audio, tmp_path):
    assert_probes_match_transcripts(shared_audio, tmp_path)


def test_a_probe_rerun_does_no_work_and_still_reports_the_inputs_audio_hours(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    write_wav(folder / "a.wav", noise(1.5))
    first = run_probe(spec(str(folder), str(tmp_path / "out"), "probe"))
    again = run_probe(spec(str(folder), str(tmp_path / "out"), "probe"))
    assert (again["items"], again["items_already_done"]) == (0, 1)
    assert again["audio_hours"] == first["audio_hours"] == pytest.approx(1.5 / 3600, abs=1e-6)
    table = pads.dataset(str(tmp_path / "out" / "probes"), format="parquet").to_table()
    assert table.num_rows == 1
    assert table.schema.remove_metadata().equals(PROBES.remove_metadata())
    assert table.schema.metadata[b"overnight.table"] == b"probes"


def test_a_probe_reads_no_file_outside_the_folders_the_job_may_read(tmp_path: Path):
    allowed, other = tmp_path / "tenant", tmp_path / "elsewhere"
    allowed.mkdir()
    other.mkdir()
    write_wav(allowed / "mine.wav", noise(1.0))
    write_wav(other / "theirs.wav", noise(1.0))
    (allowed / "link.wav").symlink_to(other / "theirs.wav")  # a link out of the tenant's folder
    job = build_spec(
        overrides={
            "job": {
                "kind": "probe",
                "input": str(allowed),
                "output": str(tmp_path / "out"),
                "progress": False,
                "allowed_input_prefixes": [str(allowed)],
            }
        }
    )
    run_probe(job)
    rows = by_name(tmp_path / "out", "probes")
    assert rows["mine.wav"]["status"] == "ok"
    assert rows["link.wav"]["status"] == "error"
    assert rows["link.wav"]["error_code"] == "fetch_failed"
    assert "elsewhere" not in rows["link.wav"]["error_message"]  # the real path is not shown


def test_a_short_listing_gives_each_actor_a_block_and_starts_no_actor_without_an_item(
    tmp_path: Path,
):
    import warnings

    folder = tmp_path / "in"
    folder.mkdir()
    for n in range(5):
        write_wav(folder / f"call{n}.wav", noise(0.5, seed=n))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        five = run_probe(spec(str(folder), str(tmp_path / "five"), "probe"))
        one = run_probe(spec(str(folder / "call0.wav"), str(tmp_path / "one"), "probe"))
    # Ray Data warns when a pool has more actors than the inputs it received.
    assert not [w for w in caught if "concurrent actors" in str(w.message)]
    assert (five["succeeded"], five["options"]["actors"]) == (5, 2)  # 2 cores: 2 actors
    assert (one["succeeded"], one["options"]["actors"]) == (1, 1)
