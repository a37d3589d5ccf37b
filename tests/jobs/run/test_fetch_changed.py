"""A file that changes between the listing and its read is its own error row.

Its item id is of the object as listed: stored under it, the new content got a row, and the
next run listed the file as a new item and wrote the same transcript again (two ok rows for
one recording)."""

from __future__ import annotations

from pathlib import Path

from overnight.jobs.dataset import storage
from overnight.jobs.run import on_ray


def _row(path: Path, size: int | None) -> dict:
    return {"item_id": "i1", "uri": str(path), "size": size}


def test_a_file_whose_size_changed_since_the_listing_is_a_changed_since_listed_row(
    tmp_path: Path,
):
    path = tmp_path / "call.wav"
    path.write_bytes(b"RIFF" + bytes(100))
    config = storage.StorageConfig.from_env()
    row = _row(path, 60)  # listed while it was still being written
    assert on_ray.fetch_item(row, 10**6, config) is None
    assert row["status"] == "error" and row["error_code"] == "changed_since_listed"
    assert "60 bytes when listed and 104 when read" in row["error_message"]
    assert row["fetch_s"] >= 0


def test_a_file_read_as_listed_or_listed_without_a_size_is_read(tmp_path: Path):
    path = tmp_path / "call.wav"
    path.write_bytes(b"RIFF" + bytes(100))
    config = storage.StorageConfig.from_env()
    for size in (104, None):
        row = _row(path, size)
        assert on_ray.fetch_item(row, 10**6, config) == path.read_bytes()
        assert row.get("status") is None
