"""The submissions' state: one JSON record per submission, each file replaced atomically."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from overnight.jobs.dataset import storage

# The version of the records' format (the key keeps its first name: records on disk have it).
RECORD_VERSION = 1
DONE, REJECTED, RUNNING, FAILED = "done", "rejected", "running", "failed"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SubmissionStore:
    """``<state>/<tenant>/<submission id>.json``, each file replaced atomically.

    Opening it checks that the state can be written (its bucket exists and these credentials
    may see it): a missing bucket read as an empty state, so ``list`` showed nothing and
    ``add`` queued a submission whose record ``process`` then failed to write, in a
    traceback; refused credentials were a traceback in ``list`` and ``add``."""

    def __init__(self, state: str):
        from overnight.jobs import preflight

        preflight.check_output(state, "the submissions state")
        self.root = storage.resolve(state)

    def _loc(self, tenant: str, sid: str) -> storage.Location:
        return self.root.join(tenant, f"{sid}.json")

    def get(self, tenant: str, sid: str) -> dict | None:
        loc = self._loc(tenant, sid)
        try:
            data = storage.with_retries(f"read {loc.url()}", lambda: loc.fs.cat_file(loc.path))
        except FileNotFoundError:
            return None
        return json.loads(data)

    def put(self, record: dict) -> dict:
        record = {**record, "ledger_version": RECORD_VERSION, "updated_at": _now()}
        data = json.dumps(record, sort_keys=True, indent=1).encode()
        storage.write_bytes_atomic(self._loc(record["tenant"], record["submission_id"]), data)
        return record

    def all(self, tenant: str | None = None) -> list[dict]:
        where = self.root.join(tenant) if tenant else self.root
        files = storage.list_files(where, ".json")

        def read(path: str) -> dict:
            return json.loads(
                storage.with_retries(
                    f"read {self.root.url(path)}", lambda: self.root.fs.cat_file(path)
                )
            )

        return sorted(
            storage.map_threads(read, files),
            key=lambda r: (r["tenant"], r.get("received_at", ""), r["submission_id"]),
        )
