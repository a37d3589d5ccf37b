"""scripts/bench_transcribe.py's real-speech corpus: clips of 5-30 s cut from the shared
recordings, each with a telephone-band 8 kHz twin, and references that are runs of the
source references' words, in order. (The timing is not tested.)"""

from __future__ import annotations

import wave

import pytest

from tests.conftest import SHARED_DATA, load_script


def _bench():
    return load_script("bench_transcribe")


def test_real_corpus_clips_bands_and_references(tmp_path):
    audio_dir = SHARED_DATA / "audio"
    if not (audio_dir / "librispeech_trans.txt").is_file():
        pytest.skip("../shared/data/audio is absent (fresh clone outside the workplace)")
    bench = _bench()
    meta = bench.make_real_corpus(tmp_path / "corpus", audio_dir, 6, seed=3)
    clips, sources = meta["clips"], meta["sources"]
    assert len(clips) == 6
    assert {c["band"] for c in clips.values()} == {"16k", "8k"}
    for name, clip in clips.items():
        with wave.open(str(tmp_path / "corpus" / name)) as w:
            rate, seconds = w.getframerate(), w.getnframes() / w.getframerate()
        assert 5.0 <= seconds <= 30.0, (name, seconds)
        assert rate == clip["sample_rate"] == (8000 if name.endswith("_8k.wav") else 16000)
        if name.endswith("_16k.wav"):
            assert name.replace("_16k", "_8k") in clips  # each window has its telephone twin
        # The reference: non-empty runs of consecutive words of the source references.
        words = clip["reference"].split()
        assert words
        joined: list[str] = []
        for seg in clip["segments"]:
            source_words = sources[seg["source"]].split()
            assert 0 <= seg["start"] < seg["stop"] <= len(source_words)
            joined += source_words[seg["start"] : seg["stop"]]
        assert joined == words, name
    # A second call reads the cache instead of building anew.
    assert bench.make_real_corpus(tmp_path / "corpus", audio_dir, 6, seed=3) == meta
