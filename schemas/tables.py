"""pyarrow schemas of the manifest, transcripts, document results, probes and cost ledger."""

import pyarrow as pa

# Bump on any change below. Stored in every file's schema metadata.
# 2: document_results.label_score (null in version 1 files).
# 3: manifest.hotwords, manifest.initial_prompt; transcripts.language_mismatch,
#    transcripts.segments.words and transcripts.analytics (null in older files); the runs table.
# 4: transcripts.entities, redact_s, redact_units (null in older files and when a job does not
#    redact); the transcripts_unredacted table.
# 5: transcripts.degenerate and transcripts.segments.degenerate (null in older files).
# 6: costs.model_stage and costs.work (null in older ledgers: read by stage name).
# 7: transcripts.diarize_s (diarization of mono calls; null in older files and when a job
#    does not diarize).
SCHEMA_VERSION = "7"

_VERSION_KEY = b"overnight.schema_version"


def with_version(schema: pa.Schema, name: str) -> pa.Schema:
    return schema.with_metadata(
        {_VERSION_KEY: SCHEMA_VERSION.encode(), b"overnight.table": name.encode()}
    )


# Metadata a manifest may carry; each one is copied onto the item's output row unchanged.
# Any other manifest column lands in the `metadata` map (string values).
METADATA_COLUMNS: tuple[str, ...] = ("tenant", "submission_id", "external_id")

_METADATA_FIELDS = [
    pa.field("tenant", pa.string()),
    pa.field("submission_id", pa.string()),
    pa.field("external_id", pa.string()),
    pa.field("metadata", pa.map_(pa.string(), pa.string())),
]

MANIFEST = with_version(
    pa.schema(
        [
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("uri", pa.string(), nullable=False),
            pa.field("size", pa.int64()),
            # ETag for object stores, mtime in nanoseconds for local files: what changes when
            # the content changes, so a replaced object gets a new item_id.
            pa.field("etag", pa.string()),
            *_METADATA_FIELDS,
            # Requested language ("" or null: detect / model default).
            pa.field("language", pa.string()),
            # Labels of the channels of a stereo recording, e.g. ["agent", "customer"];
            # non-empty means "transcribe each channel separately".
            pa.field("channel_labels", pa.list_(pa.string())),
            # Per-item decoding vocabulary ("" or null: the job's `hotwords` / `initial_prompt`).
            pa.field("hotwords", pa.string()),
            pa.field("initial_prompt", pa.string()),
        ]
    ),
    "manifest",
)

WORD = pa.struct(
    [
        pa.field("word", pa.string()),
        pa.field("start", pa.float64()),
        pa.field("end", pa.float64()),
        pa.field("probability", pa.float32()),
    ]
)

SEGMENT = pa.struct(
    [
        pa.field("start", pa.float64()),
        pa.field("end", pa.float64()),
        pa.field("text", pa.string()),
        pa.field("channel", pa.int16()),
        pa.field("speaker", pa.string()),
        pa.field("avg_logprob", pa.float32()),
        pa.field("no_speech_prob", pa.float32()),
        # True: the decoder looped here on every attempt (workers.whisper_guard); the text is
        # its best attempt with the repetition cut, not what was said. Null in files before
        # schema version 5.
        pa.field("degenerate", pa.bool_()),
        # Per-word timings (recording time, the segment's channel) when the job asked for
        # word_timestamps; null otherwise.
        pa.field("words", pa.list_(WORD)),
    ]
)

# Call analytics of a split-channel call (workers.analytics defines each measure).
SPEAKER_ANALYTICS = pa.struct(
    [
        pa.field("speaker", pa.string()),
        pa.field("talk_s", pa.float64()),
        pa.field("talk_ratio", pa.float64()),
        pa.field("turns", pa.int32()),
        pa.field("words", pa.int32()),
        pa.field("words_per_minute", pa.float64()),
        pa.field("longest_monologue_s", pa.float64()),
        pa.field("interruptions_made", pa.int32()),
        pa.field("interrupted", pa.int32()),
    ]
)
CALL_ANALYTICS = pa.struct(
    [
        pa.field("duration_s", pa.float64()),
        pa.field("talk_s", pa.float64()),
        pa.field("non_talk_s", pa.float64()),
        pa.field("longest_silence_s", pa.float64()),
        pa.field("overtalk_s", pa.float64()),
        pa.field(
            "interruptions",
            pa.list_(
                pa.struct(
                    [
                        pa.field("by", pa.string()),
                        pa.field("of", pa.string()),
                        pa.field("count", pa.int32()),
                    ]
                )
            ),
        ),
        pa.field("speakers", pa.list_(SPEAKER_ANALYTICS)),
    ]
)

# A redacted entity (workers.redact): its type, where it was in the original text (characters)
# and in the recording (seconds, from the word timings), and the recognizer's score.
ENTITY = pa.struct(
    [
        pa.field("type", pa.string()),
        pa.field("start_char", pa.int32()),
        pa.field("end_char", pa.int32()),
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("score", pa.float32()),
    ]
)

STATUS_FIELDS = [
    # "ok" | "error"
    pa.field("status", pa.string(), nullable=False),
    # one of schemas.errors.ERROR_CODES when status == "error", else null
    pa.field("error_code", pa.string()),
    pa.field("error_message", pa.string()),
]

PROVENANCE_FIELDS = [
    pa.field("model", pa.string()),
    # JSON object: every option that influenced the result (effective values, not defaults).
    pa.field("options", pa.string()),
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("processed_at", pa.timestamp("us", tz="UTC")),
    # Ray node and actor (or task) that produced the row.
    pa.field("worker", pa.string()),
]

TRANSCRIPTS = with_version(
    pa.schema(
        [
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("source_uri", pa.string(), nullable=False),
            pa.field("source_size", pa.int64()),
            pa.field("source_etag", pa.string()),
            *_METADATA_FIELDS,
            pa.field("channel_labels", pa.list_(pa.string())),
            *STATUS_FIELDS,
            pa.field("text", pa.string()),
            pa.field("language", pa.string()),
            pa.field("language_probability", pa.float32()),
            # True: the item asked for a language (manifest or job `language`) that the
            # English-only model cannot transcribe; it was decoded as English. Null: no clash
            # (and in files before schema version 3).
            pa.field("language_mismatch", pa.bool_()),
            pa.field("duration_s", pa.float64()),
            # Seconds the VAD kept (summed over channels when split).
            pa.field("speech_s", pa.float64()),
            pa.field("segments", pa.list_(SEGMENT)),
            # True: some segment is degenerate (see SEGMENT); null on error rows and in files
            # before schema version 5.
            pa.field("degenerate", pa.bool_()),
            pa.field("num_chunks", pa.int32()),
            # Split-channel calls: talk, silence, overtalk, interruptions (null otherwise).
            pa.field("analytics", CALL_ANALYTICS),
            # What the job's `redact` found (text, segments and words carry its tags); null
            # when the job did not redact.
            pa.field("entities", pa.list_(ENTITY)),
            *PROVENANCE_FIELDS,
            # Timings for accounting. *_s are wall seconds spent on this item alone, or its
            # share of a shared batch (apportioned by audio seconds).
            pa.field("fetch_s", pa.float64()),
            pa.field("decode_s", pa.float64()),
            pa.field("decode_resource", pa.string()),
            pa.field("decode_units", pa.float64()),
            pa.field("asr_s", pa.float64()),
            # What the Whisper actor held, e.g. "h100" or "cpu"; priced per hour in the job.
            pa.field("asr_resource", pa.string()),
            # How many units of asr_resource the actor held (GPUs, or CPU cores).
            pa.field("asr_units", pa.float64()),
            # Mean fill of the model batches this item's chunks rode in (1.0 = full).
            pa.field("batch_fill", pa.float32()),
            # The redaction stage (CPU tasks, after the model): seconds and cores held.
            pa.field("redact_s", pa.float64()),
            pa.field("redact_units", pa.float64()),
            # Diarization of a mono call (`diarize`), in its decode task: seconds, priced at
            # the decode's resource and units; null when the job did not diarize.
            pa.field("diarize_s", pa.float64()),
        ]
    ),
    "transcripts",
)

# `keep_unredacted = true`: the original text and segments of a redacted job's rows, apart
# from transcripts/ so that storage policy can guard them; never written otherwise.
TRANSCRIPTS_UNREDACTED = with_version(
    pa.schema(
        [
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("text", pa.string()),
            pa.field("segments", pa.list_(SEGMENT)),
        ]
    ),
    "transcripts_unredacted",
)

DOCUMENT_RESULTS = with_version(
    pa.schema(
        [
            # Hash of the source item and the task: one row per document and task.
            pa.field("item_id", pa.string(), nullable=False),
            # The document's own item id (for a transcript: the recording's item_id).
            pa.field("source_item_id", pa.string()),
            pa.field("source_uri", pa.string(), nullable=False),
            pa.field("source_size", pa.int64()),
            pa.field("source_etag", pa.string()),
            *_METADATA_FIELDS,
            *STATUS_FIELDS,
            # summarize | extract | classify | prompt | a named ready task
            pa.field("task", pa.string()),
            pa.field("output_text", pa.string()),
            # JSON text matching the requested schema (extract) or null
            pa.field("output_json", pa.string()),
            pa.field("label", pa.string()),
            # classify: the model's probability of the chosen label (vLLM), else null
            pa.field("label_score", pa.float64()),
            pa.field("input_tokens", pa.int64()),
            pa.field("output_tokens", pa.int64()),
            pa.field("document_chars", pa.int64()),
            pa.field("num_chunks", pa.int32()),
            *PROVENANCE_FIELDS,
            pa.field("fetch_s", pa.float64()),
            pa.field("extract_s", pa.float64()),
            pa.field("extract_resource", pa.string()),
            pa.field("llm_s", pa.float64()),
            pa.field("llm_resource", pa.string()),
            pa.field("llm_units", pa.float64()),
        ]
    ),
    "document_results",
)

# One row per recording: what its container header says, read without decoding
# (``overnight probe``); the audio hours a sizing plan (``overnight plan --audio-hours``) needs.
PROBES = with_version(
    pa.schema(
        [
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("source_uri", pa.string(), nullable=False),
            pa.field("source_size", pa.int64()),
            pa.field("source_etag", pa.string()),
            *_METADATA_FIELDS,
            *STATUS_FIELDS,
            # The first audio stream's duration as the container states it (else the
            # container's), in seconds; null when the header does not say.
            pa.field("duration_s", pa.float64()),
            pa.field("channels", pa.int16()),
            pa.field("sample_rate", pa.int32()),
            pa.field("codec", pa.string()),
            # The container format, e.g. "wav", "mov,mp4,m4a,3gp,3g2,mj2".
            pa.field("container", pa.string()),
            pa.field("size_bytes", pa.int64()),
            *PROVENANCE_FIELDS,
            pa.field("probe_s", pa.float64()),
            pa.field("probe_resource", pa.string()),
        ]
    ),
    "probes",
)

COSTS = with_version(
    pa.schema(
        [
            pa.field("item_id", pa.string(), nullable=False),
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("tenant", pa.string()),
            pa.field("submission_id", pa.string()),
            # fetch | decode | transcribe | redact | extract | generate
            pa.field("stage", pa.string(), nullable=False),
            # cpu | h100 | a100 | l4 | ... : a key of the job's price table
            pa.field("resource", pa.string(), nullable=False),
            # units of the resource held (GPUs or CPU cores) during `seconds`
            pa.field("units", pa.float64()),
            pa.field("seconds", pa.float64()),
            pa.field("price_per_hour_usd", pa.float64()),
            pa.field("cost_usd", pa.float64()),
            # What was bought: audio seconds for speech stages, tokens for text stages.
            pa.field("audio_s", pa.float64()),
            pa.field("input_tokens", pa.int64()),
            pa.field("output_tokens", pa.int64()),
            pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
            # Schema 6: the stage's role, from its record (``Stage``/``Cost``), so that readers
            # need no list of stage names: true for the job's model stage (the actor pool,
            # whose seconds are busy time); what its job's unit is, audio or documents.
            pa.field("model_stage", pa.bool_()),
            pa.field("work", pa.string()),  # audio | documents
        ]
    ),
    "costs",
)
# One row per finished run, partitioned by the run's date (OUTPUT/run_table/run_date=YYYY-MM-DD/
# <run_id>.parquet, the partition column in the path only): what `runs/<run_id>.json` holds,
# as a table that DuckDB, Polars, pandas and Spark read and prune by date.
RUNS = with_version(
    pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("kind", pa.string()),
            pa.field("finished_at", pa.timestamp("us", tz="UTC")),
            pa.field("output", pa.string()),
            pa.field("items_listed", pa.int64()),
            pa.field("items_already_done", pa.int64()),
            pa.field("items", pa.int64()),
            pa.field("succeeded", pa.int64()),
            pa.field("failed", pa.int64()),
            pa.field("audio_seconds", pa.float64()),
            pa.field("input_tokens", pa.int64()),
            pa.field("output_tokens", pa.int64()),
            pa.field("wall_seconds", pa.float64()),
            pa.field("accelerator", pa.string()),
            pa.field("device", pa.string()),
            pa.field("cost_usd", pa.float64()),
            pa.field("reserved_cost_usd", pa.float64()),
            # the whole summary, as runs/<run_id>.json holds it
            pa.field("summary_json", pa.string()),
        ]
    ),
    "runs",
)
