"""scripts/bench_diarize.py's short recordings (``--crop``): a call cut to its first seconds
keeps the reference speech inside them, and a 2-speaker call whose second party has not yet
spoken is left out rather than scored as a 2-speaker recording. (The scores are not
tested here; the diarizer's own tests hold them.)"""

from __future__ import annotations

import numpy as np

from tests.conftest import load_script

SR = 16_000


def _bench():
    return load_script("bench_diarize")


def _call(bench, reference, speakers=2, seconds=30.0):
    audio = np.arange(int(seconds * SR), dtype=np.float32)
    return bench.Call("c", audio, reference, speakers)


def test_a_cropped_call_keeps_the_reference_speech_inside_its_first_seconds():
    bench = _bench()
    call = _call(bench, [("A", 0.5, 6.0), ("B", 6.5, 9.0), ("A", 9.5, 14.0), ("B", 15.0, 20.0)])
    cut = bench.crop_call(call, 12.0)
    assert cut is not None
    assert cut.reference == [("A", 0.5, 6.0), ("B", 6.5, 9.0), ("A", 9.5, 12.0)]
    assert len(cut.audio) == 12 * SR and cut.audio[-1] == call.audio[12 * SR - 1]
    assert cut.speakers == 2 and cut.name == "c@12s"


def test_a_two_speaker_call_cut_before_its_second_party_speaks_a_second_is_left_out():
    bench = _bench()
    call = _call(bench, [("A", 0.5, 6.0), ("B", 6.2, 7.5), ("A", 8.0, 14.0)])
    assert bench.crop_call(call, 7.0) is None  # B has spoken 0.8 s by then
    assert bench.crop_call(call, 7.5) is not None
    one = _call(bench, [("A", 0.5, 6.0)], speakers=1)
    assert bench.crop_call(one, 3.0) is not None


def test_a_cropped_set_draws_each_length_from_the_range_and_repeats_with_its_seed():
    bench = _bench()
    calls = [_call(bench, [("A", 0.2, 4.0), ("B", 4.2, 30.0)]) for _ in range(20)]
    first = bench.crop_set(calls, 8.0, 20.0, seed=3)
    again = bench.crop_set(calls, 8.0, 20.0, seed=3)
    assert len(first) == 20
    lengths = [len(c.audio) / SR for c in first]
    assert all(8.0 <= x <= 20.0 for x in lengths)
    assert len(set(lengths)) > 10
    assert lengths == [len(c.audio) / SR for c in again]


def test_long_recordings_time_each_part_and_cluster_the_same_with_shared_decompositions():
    from tests.jobs.test_diarize_job import _model_prepared

    _model_prepared()
    bench = _bench()
    sets = "real" if bench.DATA.is_dir() else "espeak"
    rows = bench.main(
        ["--long", "0.75", "--turns", "1", "--calls", "2", "--sets", sets, "--speakers", "2"]
    )
    shared, unshared = (r for r in rows if r["minutes"] == 0.75)
    assert (shared["variant"], unshared["variant"]) == ("shared", "unshared")
    assert shared["windows"] == unshared["windows"] > 50
    assert shared["speakers"] == unshared["speakers"]
    for r in rows:
        assert r["embed_s"] > 0 and r["cluster_s"] > 0 and r["total_s"] >= r["embed_s"]
