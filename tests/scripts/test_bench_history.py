"""The history benchmark at a tiny size: it writes the real layout and times both outputs."""

from __future__ import annotations

from tests.conftest import load_script


def _bench():
    return load_script("bench_history")


def test_bench_history_writes_compacted_nights_and_times_a_new_night_on_disk_and_moto():
    figures = _bench().main(
        [
            "--nights",
            "3",
            "--items",
            "1500",
            "--new",
            "20",
            "--rows-per-commit",
            "100",
            "--repeats",
            "1",
        ]
    )
    # One compacted file per night and dataset, however many commits made it.
    assert figures["files_per_night"]["transcripts"] == [1]
    assert figures["files_per_night"]["costs"] == [1]
    for where in ("local", "moto"):
        for output in ("empty", "history"):
            assert figures[where][output]["median_s"] > 0
        assert "history_adds_s" in figures[where]
    assert figures["duckdb_one_day"]["pruned_s"] > 0
