"""Cost reports over the ledgers and run summaries of one or many runs.

The package: ``aggregate`` (sources, grouping, sums), ``text``, ``svg`` and ``html``
(rendering), ``files`` (csv, parquet, html on storage); ``jobs.cli.report`` is the command.

``overnight report OUTPUT... [--by day|tenant|submission|model|run] [--since DATE] [--until DATE]
[--tenant T]
[--format table|html|csv|parquet] [--out PATH]``

Sources, per OUTPUT (a folder or an object-storage prefix):

* ``costs/*.parquet``: the cost ledger (``schemas.COSTS``), one row per item and stage. Every
  money figure of a report is a sum of its ``cost_usd``; nothing is re-priced.
* ``transcripts/`` and ``results/``: the result rows, for status, error codes, ``model`` and
  ``source_uri``.
* ``runs/*.json``: the run summaries, for what the ledger cannot know: the reserved
  accelerator time (actors x pipeline wall), the reserved cost and the pipeline wall time.

Definitions (each figure is computed per group and once more for the totals):

* items: the items each run did, each (run, item) once: what was processed and paid for. An
  item redone by a later run (``--retry-errors``) counts in both runs; so does a recording
  deleted and put back, or uploaded again: its id hashes the URI with the object's size and
  ETag (mtime on a local disk), so a replaced object is new work by design
  (``jobs.dataset.manifest``), and its second transcription is a second item.
* sources: the distinct recordings and documents behind those items, by ``source_uri`` (the
  tasks of one document, a recording redone or replaced under the same URI: one source). A
  group's figure counts distinct sources within it, so the TOTAL's is not the sum of the
  rows'. An item without a result row takes its URI from its run's manifest
  (``_manifests/<run_id>.parquet``: the "missing" id of a recording that was missing when
  listed, whose retry wrote its row under its real id), else counts by its id.
* succeeded, failed, the failures by error code: each result row's status. A retry removes
  the error rows it redoes (one row per item); the run that wrote them keeps its ledger rows
  and its summary, so an item of a run's ledger without a result row of that run, where the
  run's summary counts more failures than its rows, counts as failed in that run, with the
  error code the summary has over its rows (``a or b`` when it has more than one). Where
  that cannot be placed (more such items than missing failures, or failures without ledger
  rows), a note says so. A run's succeeded and failed then agree with its summary's.
* audio: each item's audio counts once, from its ``transcribe`` ledger row (an item's
  fetch/decode rows repeat the same ``audio_s``); an item without one counts the largest
  ``audio_s`` among its rows.
* audio cost: the ``decode`` and ``transcribe`` rows, and the ``fetch`` rows of items that
  have speech rows; document cost: the ``extract`` and ``generate`` rows and the other
  ``fetch`` rows. Together they are exactly the ledger's total.
* cost per audio minute = audio cost / audio minutes; per document = document cost /
  documents (items with document rows); per million tokens = document cost / (input +
  output tokens) x 1e6.
* accelerator busy hours: the ``transcribe`` and ``generate`` rows' seconds; reserved hours,
  reserved cost and pipeline wall come from each run's summary and are split between groups
  in proportion to the busy seconds each group has in that run (by items when the run was
  never busy). Utilization = busy / reserved, counted over runs that have a summary (a run
  killed before its summary has priced rows but no reserved time).
* rtfx = audio seconds / pipeline wall seconds (of transcription runs); busy_rtfx = audio seconds / speech-model busy
  seconds (what one worker does while busy: the number ``plan`` sizes with).
* day: a row's run date (its ``run_date=`` partition: the night it belongs to, which a
  backfill sets); in the flat files of older outputs, the UTC date the ledger row was
  recorded (the end of its run), and result rows take their item's ledger day, else their
  ``processed_at``. ``--since``/``--until`` count rows of those days the same way; a bound
  that cuts a day (a date-time, a span) keeps, of that day's rows, those recorded inside it
  (result rows by their item's ledger time), so the window the header states is the one
  counted. ``--tenant '(none)'`` selects the items without a tenant, as the groups label them.
* run: a run is told apart by its output and run id; runs of one id in two outputs (the
  user's ``--run-id``) are two runs, keyed "<run id> (<output>)", each priced by its own
  summary. A summary with a figure out of range (text, NaN, negative) is skipped with a
  warning naming it, and its run has no reserved figures.

Sums use ``math.fsum``, which is exact up to the final rounding and independent of order, so
a group's figure equals any independent ``fsum`` of the same ledger rows bit for bit.
Ledger rows repeated across the given outputs (the same output given twice, by another path
too) count once. A selection that holds no row says so in one line, in the notes.

Formats: ``table`` prints the grouped table, failures and totals; ``csv`` and ``parquet``
write every table of the report into the folder ``--out`` (``by_<group>``, ``failures``,
``by_day``, ``by_tenant``, ``by_run``, ``totals``); ``html`` writes one self-contained file
(inline CSS and SVG charts, no script, no network) to ``--out`` (an ``--out`` ending in
``.html`` needs no ``--format``). ``--json`` prints the totals, the main table and the notes,
and writes no file: with ``--format`` other than table or ``--out`` it is exit 2.
"""

from overnight.jobs.choices import REPORT_FORMATS as FORMATS
from overnight.jobs.choices import REPORT_GROUPS as GROUPS
from overnight.jobs.ops.report.aggregate import (
    FAILURES_SCHEMA,
    REPORT_SCHEMA,
    Report,
    Sources,
    build_report,
    load,
    parse_since,
    parse_until,
)
from overnight.jobs.ops.report.files import write
from overnight.jobs.ops.report.html import render_html
from overnight.jobs.ops.report.text import render_table

__all__ = [
    "FAILURES_SCHEMA",
    "FORMATS",
    "GROUPS",
    "REPORT_SCHEMA",
    "Report",
    "Sources",
    "build_report",
    "load",
    "parse_since",
    "parse_until",
    "render_html",
    "render_table",
    "write",
]
