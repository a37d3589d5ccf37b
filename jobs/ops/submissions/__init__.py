"""Contact-center bulk submissions: tenants drop manifests into an inbox; the nightly job runs them.

A submission is one manifest (CSV, JSONL or Parquet of recording URIs plus metadata) under a
tenant's inbox prefix, dropped there directly or by ``overnight submissions add``. Its id is
the hash of its content, so the same manifest dropped twice is one submission.

``overnight submissions process --config tenants.toml`` handles every new submission once:

1. Validate before any work: every URI must lie under one of the prefixes the central config
   allows for the tenant (compared on normalised scheme, bucket and path segments, so
   ``..``, ``//``, percent-encoding and look-alike buckets cannot escape). One bad URI rejects
   the whole submission; the rejection and its reason go to its record.
2. Run the transcription job on a trusted copy of the manifest: normalised URIs, ``tenant``
   and ``submission_id`` set from the config and the id (whatever the manifest claims), output
   under ``<tenant output>/submissions/<submission id>/``, a path built only from trusted config
   and the hash, never from object keys or metadata.
3. Record status and totals (recordings, audio minutes, failures, cost) in the state: one JSON
   object per submission under ``<state>/<tenant>/<submission id>.json``, each written
   atomically. Done and rejected submissions are never processed again; one that was running
   when the process died, or that failed (storage down, engine died), is resumed by the next
   run, up to ``max_attempts``. A speech model that cannot be found or loaded stops the whole
   step (checked once before any submission starts) and costs no submission an attempt.

Credentials come from the environment only (see ``jobs.dataset.storage``); a manifest column that
looks like a credential rejects the submission rather than being copied into results.

The package: ``urls`` (the tenant boundary), ``config`` (the tenants config), ``manifests``
(parsing and trusted rows), ``state`` (the submission records), ``run`` (processing);
``jobs.cli.submissions`` is the command.
"""

from overnight.jobs.ops.submissions.config import Settings, Tenant, TenantsConfig, load_config
from overnight.jobs.ops.submissions.manifests import (
    Rejected,
    parse_manifest,
    submission_id,
    trusted_rows,
)
from overnight.jobs.ops.submissions.run import add, output_for, process, process_one
from overnight.jobs.ops.submissions.state import DONE, FAILED, REJECTED, RUNNING, SubmissionStore
from overnight.jobs.ops.submissions.urls import ObjectURL, UriRejected, normalize, shown

__all__ = [
    "DONE",
    "FAILED",
    "REJECTED",
    "RUNNING",
    "ObjectURL",
    "Rejected",
    "Settings",
    "SubmissionStore",
    "Tenant",
    "TenantsConfig",
    "UriRejected",
    "add",
    "load_config",
    "normalize",
    "output_for",
    "parse_manifest",
    "process",
    "process_one",
    "shown",
    "submission_id",
    "trusted_rows",
]
