"""The one documented list of per-item error codes.

A row with ``status="error"`` carries exactly one of these in ``error_code``; the message in
``error_message`` is for humans and never contains credentials.
"""

from enum import StrEnum


class ErrorCode(StrEnum):
    # Fetching the object
    FETCH_FAILED = "fetch_failed"  # the object could not be read (missing, permission denied)
    EMPTY_FILE = "empty_file"  # zero bytes
    TOO_LARGE = "too_large"  # larger than the configured maximum size in bytes
    NOT_A_FILE = "not_a_file"  # a folder, FIFO, device or socket where a file was expected
    FETCH_TIMEOUT = "fetch_timeout"  # reading the object exceeded its time limit
    # the object's size changed between the listing and the read (rewritten, still being
    # uploaded): what was read is not the item listed; the next run lists it as a new item
    CHANGED_SINCE_LISTED = "changed_since_listed"
    # Audio
    NOT_AUDIO = "not_audio"  # bytes are not a media container FFmpeg recognises
    NO_AUDIO_STREAM = "no_audio_stream"  # a media container without an audio stream
    UNSUPPORTED_CODEC = "unsupported_codec"  # an audio stream whose codec has no decoder
    CORRUPT_AUDIO = "corrupt_audio"  # a known audio format whose data cannot be decoded
    TOO_LONG = "too_long"  # longer than the configured maximum duration
    TOO_MANY_CHANNELS = "too_many_channels"  # split channels: more than the configured maximum
    DECODE_TIMEOUT = "decode_timeout"  # decoding exceeded its time limit
    # Documents
    UNSUPPORTED_TYPE = "unsupported_type"  # not a document type overnight reads
    ENCRYPTED = "encrypted"  # an encrypted PDF without a (correct) configured password
    CORRUPT_DOCUMENT = "corrupt_document"  # a known document format that cannot be parsed
    NO_TEXT = "no_text"  # parsed, but no extractable text (a scanned image, a PDF without pages)
    INVALID_ENCODING = "invalid_encoding"  # text whose encoding cannot be determined
    EXTRACT_TIMEOUT = "extract_timeout"  # text extraction exceeded its time limit
    CONTEXT_EXCEEDED = "context_exceeded"  # too long for the model even after chunking limits
    INVALID_OUTPUT = "invalid_output"  # the model's output failed validation after a retry
    INVALID_INPUT = "invalid_input"  # the input row itself is unusable (e.g. bad metadata)
    # a chained task's recording has no transcript: its transcription failed; redone by the
    # next run once the transcript is there (a rerun of the transcription with retry_errors)
    TRANSCRIPT_FAILED = "transcript_failed"
    # Inference
    MODEL_ERROR = "model_error"  # the model raised on this item alone; other items went on
    # the model's process died twice with this item's call in flight; not run again
    WORKER_CRASHED = "worker_crashed"
    # Diarization
    # the speaker diarization of this recording raised (its transcript is not written without
    # the speakers the job asked for); other recordings went on
    DIARIZATION_FAILED = "diarization_failed"
    # Redaction
    # the redacted audio could not be made or written (the recording no longer decodes, a
    # folder is in the way of its file); the text is redacted, the row is not ok
    REDACTION_FAILED = "redaction_failed"


ERROR_CODES: tuple[str, ...] = tuple(code.value for code in ErrorCode)
