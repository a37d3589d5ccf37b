"""Arrow contracts of the in-flight stage rows (never written as datasets) and of the probe
dataset: what each stage consumes and produces, declared once, beside the datasets.

A stage record (``jobs.run.stage.Stage``) names these as its ``consumes``/``produces``; the
decode stage builds ``DECODED`` rows and the Whisper worker reads them, the extraction stage
builds ``DOC_INPUT`` rows and the LLM worker reads them.
"""

import pyarrow as pa

from overnight.schemas.tables import DOCUMENT_RESULTS, MANIFEST, PROBES, STATUS_FIELDS, TRANSCRIPTS

# Before extraction a document's status is still unknown: in flight, status may be null.
_IN_FLIGHT_STATUS = [f.with_nullable(True) for f in STATUS_FIELDS]

# One chunk of a channel's speech (``workers.audio.Chunk``): ``clips`` are its (start, end)
# seconds on the recording's timeline; ``features`` its log-mel features, float32
# (feature_size, frames), or, where ``feature_size`` is 0, its 16 kHz float32 speech samples,
# which the Whisper worker turns into features with its engine's front end
# (``AudioOptions.features_on_model``: the torch engine's ``torch.stft`` on its GPU).
CHUNK = pa.struct(
    [
        pa.field("channel", pa.int16()),
        pa.field("clips", pa.list_(pa.list_(pa.float64()))),
        pa.field("feature_size", pa.int32()),
        pa.field("features", pa.large_binary()),
    ]
)

# Who spoke when in a mono call (`diarize`), found in the decode task from the speech it cut
# out, on the recording's timeline; the Whisper worker gives each word the speaker it
# overlaps most.
SPEAKER_TURN = pa.struct(
    [
        pa.field("speaker", pa.string()),
        pa.field("start", pa.float64()),
        pa.field("end", pa.float64()),
    ]
)

# Decode → Whisper: the manifest row, its decode timings, and the feature chunks. The
# decode stage times each item (fetch_s, decode_s); the runner writes its resource and units.
DECODED = pa.schema(
    [
        *MANIFEST,
        *_IN_FLIGHT_STATUS,
        TRANSCRIPTS.field("fetch_s"),
        TRANSCRIPTS.field("decode_s"),
        TRANSCRIPTS.field("decode_resource"),
        TRANSCRIPTS.field("decode_units"),
        TRANSCRIPTS.field("duration_s"),
        TRANSCRIPTS.field("speech_s"),
        # Channels transcribed apart (labels given, or split_channels): speakers named.
        pa.field("_split", pa.bool_()),
        pa.field("chunks", pa.list_(CHUNK)),
        TRANSCRIPTS.field("diarize_s"),
        # A diarized mono call's turns; null when the job does not diarize or the call is split.
        pa.field("_speaker_turns", pa.list_(SPEAKER_TURN)),
    ]
)

# Manifest (documents, or transcript rows) → extraction → LLM. For transcript inputs the
# text is already there and extraction is skipped.
DOC_INPUT = pa.schema(
    [
        *MANIFEST,
        DOCUMENT_RESULTS.field("source_item_id"),
        pa.field("text", pa.large_string()),
        *_IN_FLIGHT_STATUS,
        DOCUMENT_RESULTS.field("fetch_s"),
        DOCUMENT_RESULTS.field("extract_s"),
        DOCUMENT_RESULTS.field("extract_resource"),
        DOCUMENT_RESULTS.field("document_chars"),
    ]
)

# The columns the LLM worker adds to a DOC_INPUT row (typed as in DOCUMENT_RESULTS).
LLM_OUTPUT = pa.schema(
    [
        DOCUMENT_RESULTS.field(name)
        for name in (
            "task",
            "output_text",
            "output_json",
            "label",
            "label_score",
            "input_tokens",
            "output_tokens",
            "num_chunks",
            "model",
            "llm_s",
            "llm_resource",
            "llm_units",
            "worker",
        )
    ]
)

# What the Whisper worker returns per DECODED row: its own columns only. The runner adds
# the provenance (source_*, metadata, run_id, processed_at) and the decode stage's columns
# when it commits; asr_resource and asr_units are the runner's (jobs.run.stage), asr_s the
# worker's (a model batch's time shared by the recordings in it, by their audio).
WHISPER_OUTPUT = pa.schema(
    [
        TRANSCRIPTS.field(name)
        for name in (
            "item_id",
            "status",
            "error_code",
            "error_message",
            "text",
            "language",
            "language_probability",
            "language_mismatch",
            "duration_s",
            "speech_s",
            "segments",
            "degenerate",
            "num_chunks",
            "analytics",
            "model",
            "options",
            "worker",
            "asr_s",
            "asr_resource",
            "asr_units",
            "batch_fill",
        )
    ]
)

# What the probe stage returns per manifest row: its own columns only.
PROBE_OUTPUT = pa.schema(
    [
        PROBES.field(name)
        for name in (
            "item_id",
            "status",
            "error_code",
            "error_message",
            "duration_s",
            "channels",
            "sample_rate",
            "codec",
            "container",
            "size_bytes",
            "worker",
            "probe_s",
            "probe_resource",
        )
    ]
)
