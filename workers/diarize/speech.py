"""Diarization of a decoded recording's speech, in the decode task that has the samples.

The decode stage cuts the speech out of a recording (VAD clips, packed into chunks) and, with
``AudioOptions.keep_speech``, keeps each chunk's samples beside its features. This runs the
``Diarizer`` on that speech only (WebRTC's speech regions inside the clips) and maps the
turns back to the recording's timeline: silence is never embedded, and the samples are not
decoded twice.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from overnight.workers.audio import Chunk, span_to_original_time
from overnight.workers.diarize.diarize import Diarization, Diarizer, Turn
from overnight.workers.diarize.regions import voice_regions


def diarize_chunks(diarizer: Diarizer, chunks: Sequence[Chunk], channel: int = 0) -> Diarization:
    """Who spoke when in ``channel``'s chunks (``Chunk.speech`` kept), on the recording's
    timeline. A chunk without its samples is left out (its speech counts for nobody)."""
    mine = sorted(
        (c for c in chunks if c.channel == channel and c.speech is not None and c.clips),
        key=lambda c: c.clips[0][0],
    )
    clips = [clip for chunk in mine for clip in chunk.clips]
    if not clips:
        return Diarization()
    audio = np.concatenate([c.speech for c in mine if c.speech is not None])
    # Each clip is a region of the concatenated speech; turns go back through the clips.
    bounds = np.cumsum([0.0, *(end - start for start, end in clips)]).tolist()
    clip_regions = list(itertools.pairwise(bounds))
    found = diarizer(audio, _within(voice_regions(audio), clip_regions) or clip_regions)
    found.turns = _merged(
        [
            # Both ends through the clips they were found in: a turn starting on a seam
            # mapped back to the earlier clip's end and spanned the pause before it.
            Turn(t.speaker, *span_to_original_time(clips, t.start, t.end, whole=True))
            for t in found.turns
        ]
    )
    found.speech_s = bounds[-1]
    return found


def _within(
    regions: list[tuple[float, float]], clips: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The speech regions cut at the clips' bounds (a region must not span two clips, which
    are apart on the recording's timeline)."""
    out = []
    for a, b in regions:
        for c, d in clips:
            if min(b, d) > max(a, c):
                out.append((max(a, c), min(b, d)))
    return out


def _merged(turns: list[Turn]) -> list[Turn]:
    """Consecutive turns of one speaker as one: a pause between two of their clips is not a
    change of speaker (no one else spoke in it)."""
    out: list[Turn] = []
    for t in sorted(turns, key=lambda t: t.start):
        if t.end <= t.start:
            continue
        if out and out[-1].speaker == t.speaker:
            out[-1] = Turn(t.speaker, out[-1].start, max(out[-1].end, t.end))
        else:
            out.append(t)
    return out
