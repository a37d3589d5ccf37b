"""Speaker diarization of mono recordings (issue #37): who spoke when, their words, roles and
call analytics, on CPU with numpy and onnxruntime (no torch).

- ``prepare``: the GE2E speaker encoder's weights, read out of the ``resemblyzer`` wheel into
  overnight's model cache once at install (no torch).
- ``encoder``: the encoder (numpy mel front end; the LSTM on onnxruntime, or numpy as the
  reference), equal to resemblyzer's to 1e-4.
- ``cluster``: spectral (NME-SC) and agglomerative clustering of window embeddings.
- ``diarize``: ``Diarizer`` (audio + VAD speech regions → speaker turns).
- ``assign``: words → speakers, segment splitting, mono call analytics, first-speaker roles.
"""

from overnight.workers.diarize.assign import (
    OVERTALK_UNMEASURED,
    assign_speakers,
    dialogue_text,
    first_speaker_roles,
    mono_call_analytics,
    relabel,
)
from overnight.workers.diarize.diarize import (
    Diarization,
    DiarizeOptions,
    Diarizer,
    Turn,
    region_mels,
)

# ``prepare`` is not imported here: ``python -m overnight.workers.diarize.prepare`` (the
# install step) would then find it imported before it runs, and runpy warns about that.

__all__ = [
    "OVERTALK_UNMEASURED",
    "Diarization",
    "DiarizeOptions",
    "Diarizer",
    "Turn",
    "assign_speakers",
    "dialogue_text",
    "first_speaker_roles",
    "mono_call_analytics",
    "region_mels",
    "relabel",
]
