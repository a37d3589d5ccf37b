"""One BLAS thread for the numerical work whose bits must not depend on the process.

OpenBLAS splits a matrix product (and LAPACK's eigen decompositions) among its threads and
rounds differently for each split. A Ray task has one BLAS thread (Ray sets
``OMP_NUM_THREADS=1``); an in-process run, an actor or a test has as many as the machine has
cores. So the same samples gave other Whisper features in one than in the other, and at
times other words (``audio.features_of``), and other speaker-encoder mel frames
(``diarize.encoder.mel_frames``: every frame of 24 calls differed in its last bits between one
and two threads). Work that must give the same bits wherever it runs goes under
``one_blas_thread``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any


@functools.cache
def _controller() -> Any:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


# threadpoolctl's limit is process-wide: one holder at a time, so that a thread leaving the
# limit cannot give another thread's product its threads back mid-call. Reentrant, so that a
# function under the limit may call another that takes it.
_LOCK = threading.RLock()


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS and LAPACK calls inside run on one thread (costs about 0.02 ms)."""
    with _LOCK, _controller().limit(limits=1, user_api="blas"):
        yield
