"""The probe job, for the runner (``jobs.run.runner``): each recording's container
header (duration, channels, sample rate, codec, size) into OUTPUT/probes/, without decoding.

    manifest blocks (recorded in OUTPUT/_manifests/)
      → Prober, a few CPU actors          opens each object, reads its header only
      → OUTPUT/probes, costs, runs/<run_id>.json (``audio_hours``: what
        ``overnight plan --audio-hours`` needs)

The durations are the ones the transcription job reads from the same headers, so a plan
sized from a probe prices the audio the transcription will see.
"""

from __future__ import annotations

import io
import json
import time
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc

from overnight.jobs import preflight
from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.dataset import commits, storage
from overnight.jobs.dataset.manifest import Selection, select_items
from overnight.jobs.run import on_ray, runner, sizing
from overnight.jobs.run.job import Build, Job, Prepared, Resolved
from overnight.jobs.run.stage import Stage
from overnight.jobs.spec import JobSpec
from overnight.schemas import MANIFEST, PROBES, ErrorCode
from overnight.schemas.stages import PROBE_OUTPUT
from overnight.workers.audio import MEDIA_EXTENSIONS
from overnight.workers.devices import worker_id
from overnight.workers.probe import ProbeError, read_header

_SLIM = ["item_id", "status", "error_code", "duration_s", "probe_s", "probe_resource"]
# Header reads wait on storage, not on a core: small actors, a few of them.
_ACTOR_CPUS = 0.25
_MAX_ACTORS = 4


class Prober:
    """``map_batches`` callable: manifest rows in, their header columns out (same order)."""

    def __init__(
        self,
        storage_config: storage.StorageConfig,
        max_bytes: int,
        allowed_input_prefixes: list[str] | None = None,
    ):
        self.storage_config, self.max_bytes = storage_config, max_bytes
        self.within = allowed_input_prefixes
        self.worker = worker_id()

    def __call__(self, batch: pa.Table) -> pa.Table:
        return pa.Table.from_pylist(
            [self._probe(row) for row in batch.to_pylist()], schema=PROBE_OUTPUT
        )

    def _probe(self, row: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "item_id": row["item_id"],
            "status": "ok",
            "size_bytes": row["size"],
            "worker": self.worker,
        }
        t0 = time.perf_counter()
        try:
            if row["size"] is not None and row["size"] > self.max_bytes:
                raise ProbeError(
                    ErrorCode.TOO_LARGE,
                    f"file is {row['size']} bytes; the job's maximum is {self.max_bytes}",
                )
            # Opened before its size is read, as the transcription job fetches before it
            # decodes: a FIFO or /dev/zero lists as 0 bytes, and is not_a_file there.
            with storage.open_object(row["uri"], self.storage_config, within=self.within) as f:
                if _is_empty(f):
                    raise ProbeError(ErrorCode.EMPTY_FILE, "the file is empty (0 bytes)")
                header = read_header(f)
            out.update(
                duration_s=header.duration_s,
                channels=header.channels,
                sample_rate=header.sample_rate,
                codec=header.codec,
                container=header.container,
            )
        except (ProbeError, storage.Unreadable) as exc:
            out.update(
                status="error",
                error_code=exc.code.value,
                error_message=storage.scrub_secrets(str(exc)),
            )
        except on_ray.READ_ERRORS as exc:
            out.update(on_ray.read_failed(exc))
        out["probe_s"] = time.perf_counter() - t0
        return out


def _is_empty(f: IO[bytes]) -> bool:
    """The open object holds no byte (seeking to its end reads nothing)."""
    end = f.seek(0, io.SEEK_END)
    f.seek(0)
    return end == 0


def probe_pool(nodes: list[sizing.Node]) -> sizing.Pool:
    cpus = sum(n.cpus for n in nodes)
    actors = max(1, min(_MAX_ACTORS, int(cpus)))
    return sizing.Pool(
        actors=actors,
        cpus_per_actor=_ACTOR_CPUS,
        gpus_per_actor=0.0,
        task_cpus=_ACTOR_CPUS,
        model_workers=1,
        threads=1,
        auto=("actors",),
        basis=f"{cpus:g} CPUs",
    )


class ProbeJob(Job[Prepared]):
    """Recordings → their container headers, read by a few small CPU actors."""

    kind = "probe"
    dataset = "probes"
    schema = PROBES
    slim = _SLIM
    device = "cpu"

    def prepare(self, dry: bool) -> Prepared:
        job = self.spec.job
        preflight.check_output(job.output)
        selection = Selection.of(MEDIA_EXTENSIONS, "media", job.include, job.exclude)
        listing = select_items(job.input, selection, output=job.output)
        return Prepared(listing.items, listing.skipped, listing.skipped_examples)

    def pool(self, device: str, nodes: list[sizing.Node]) -> sizing.Pool:
        return probe_pool(nodes)

    def describe(self, pool: sizing.Pool) -> str:
        return f"{pool.actors} probe actor(s) of {_ACTOR_CPUS:g} CPU"

    def stages(self, at: Resolved, prepared: Prepared) -> Build:
        max_file_mb = self.spec.transcribe.max_file_mb
        prober = Stage.on_pool(
            "probe",
            Prober,
            at.pool,
            consumes=MANIFEST,
            produces=PROBE_OUTPUT,
            kwargs={
                "storage_config": storage.StorageConfig.from_env(),
                "max_bytes": int(max_file_mb * 2**20),
                "allowed_input_prefixes": self.spec.job.allowed_input_prefixes,
            },
            rows_per_call=16,
            # Each header's own read: finer than the batch of 16 the runner times. It reads
            # headers, not audio (bought nothing): its ledger rows carrying the recordings'
            # duration made ``report`` over an output that was also transcribed count each
            # recording's audio twice and halve the cost per minute. Its cost is still audio work.
            cost=Cost("probe", "probe", timed_by_worker=True, bought=None, work="audio"),
        )
        return Build(
            [prober],
            model_units=_ACTOR_CPUS,
            options={"max_file_mb": max_file_mb},
            row_options=json.dumps({"max_file_mb": max_file_mb}),
        )

    def summarize(self, rows: list[dict[str, Any]], prepared: Prepared) -> dict[str, Any]:
        job = self.spec.job
        return {
            "input": storage.scrub_secrets(job.input),
            "audio_hours": audio_hours(job.output, [r["item_id"] for r in prepared.records]),
            "skipped": prepared.skipped,
            "skipped_examples": prepared.skipped_examples,
        }


def run_probe(spec: JobSpec) -> dict[str, Any]:
    """Probe every recording of the input; returns the run summary, with ``audio_hours``."""
    return runner.run(ProbeJob(spec))


def audio_hours(output: str, item_ids: list[str]) -> float:
    """Hours of audio in the probed items ``item_ids`` (committed by this run or earlier)."""
    table = commits.CommittedDataset(storage.resolve(output).join("probes")).read_results(
        ["item_id", "status", "duration_s"],
    )
    if table is None:
        return 0.0
    mine = table.filter(pc.is_in(table["item_id"], pa.array(item_ids, pa.string())))
    seconds = pc.sum(mine.filter(pc.equal(mine["status"], "ok"))["duration_s"]).as_py()
    return round((seconds or 0.0) / 3600.0, 6)
