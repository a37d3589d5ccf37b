"""Speaker diarization of mono recordings (issue #37)."""
