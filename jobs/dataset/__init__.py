"""The committed dataset: where results live and how they get there.

``storage`` (URL -> filesystem, listing, credentials), ``manifest`` (the run's input list) and
``commits`` (the committed-Parquet protocol: commit, read, committed ids, claims, staging and
publishing, the done-index, retries, duplicate repair, compaction). The lowest layer of
``jobs``: it imports nothing above it, and pricing lives elsewhere (``jobs.accounting``).
"""
