"""Diarization of a decoded recording's speech, in the decode task that has the samples.

The decode stage cuts the speech out of a recording (VAD clips, packed into chunks) and, with
``AudioOptions.keep_speech``, keeps each chunk's samples beside its features. This runs the
``Diarizer`` on that speech only, each clip one region, and maps the turns back to the
recording's timeline: silence is never embedded, and the samples are not decoded twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from overnight.workers.audio import Chunk
from overnight.workers.diarize.diarize import Diarization, Diarizer, Turn


def diarize_chunks(diarizer: Diarizer, chunks: Sequence[Chunk], channel: int = 0) -> Diarization:
    """Who spoke when in ``channel``'s chunks (``Chunk.speech`` kept), on the recording's
    timeline. A chunk without its samples is left out (its speech counts for nobody)."""
    mine = sorted(
        (c for c in chunks if c.channel == channel and c.speech is not None and c.clips),
        key=lambda c: c.clips[0][0],
    )
    # Each clip's place in the concatenated speech and in the recording: (at, start, end).
    places: list[tuple[float, float, float]] = []
    at = 0.0
    for chunk in mine:
        for start, end in chunk.clips:
            places.append((at, start, end))
            at += end - start
    if not places:
        return Diarization()
    audio = np.concatenate([c.speech for c in mine if c.speech is not None])
    regions = [(a, a + (end - start)) for a, start, end in places]
    found = diarizer(audio, regions)
    found.turns = _merged(
        [Turn(t.speaker, _orig(places, t.start), _orig(places, t.end)) for t in found.turns]
    )
    found.speech_s = sum(end - start for _, start, end in places)
    return found


def _orig(places: list[tuple[float, float, float]], t: float) -> float:
    """A time in the concatenated speech, on the recording's timeline."""
    for at, start, end in places:
        if t <= at + (end - start) + 1e-9:
            return start + max(0.0, t - at)
    _, _, end = places[-1]
    return end


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
