"""overnight: batch transcription and document processing on Ray Data at the lowest cost per unit.

``overnight`` is the one import name the distribution installs. In the repository its
subpackages ``jobs``, ``workers`` and ``schemas`` are the top-level folders of the design
layout, linked here (``overnight/jobs -> ../jobs``); a wheel carries them as real folders, so
nothing but ``overnight`` lands in site-packages and PyPI's own ``schemas`` or ``workers``
packages cannot shadow ours.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("overnight")
except PackageNotFoundError:  # a source checkout run without installing
    __version__ = "0+unknown"

# The errors every call can raise, each with the ``exit_code`` the command line exits with:
# light (no dependency), so ``except overnight.ErrorRateExceeded`` costs nothing to import.
from overnight.jobs.errors import (
    AccessDenied,
    ClusterJobFailed,
    ClusterUnreachable,
    ConfigError,
    EngineFailed,
    ErrorRateExceeded,
    InputNotFound,
    ModelNotFound,
    OutputNotWritable,
    OvernightError,
    StorageUnavailable,
    Superseded,
)

# The Python API (jobs/api.py), loaded on first use: ``import overnight`` stays light, as the
# command line (``overnight.jobs.cli``) imports this package first. ``transcribe``,
# ``process`` and ``run`` run a job in this process; ``submit``, ``status``, ``wait`` and
# ``logs`` run it on a Ray cluster through the Ray Jobs API, for orchestrators.
_API = ("transcribe", "process", "run", "RunSummary", "submit", "status", "wait", "logs")
__all__ = [
    *_API,
    "JobSpec",
    "ProcessOptions",
    "TranscribeOptions",
    "__version__",
    "AccessDenied",
    "ClusterJobFailed",
    "ClusterUnreachable",
    "ConfigError",
    "EngineFailed",
    "ErrorRateExceeded",
    "InputNotFound",
    "ModelNotFound",
    "OutputNotWritable",
    "OvernightError",
    "StorageUnavailable",
    "Superseded",
]


# The typed models of a job spec and its sections (``settings=`` of transcribe and process).
_SPEC = ("JobSpec", "TranscribeOptions", "ProcessOptions")


def __getattr__(name: str):
    if name in _SPEC:
        from overnight.jobs import spec

        return getattr(spec, name)
    if name == "submit":
        from overnight.jobs.ops import remote

        return remote.submit
    if name in _API:
        from overnight.jobs import api

        return getattr(api, name)
    raise AttributeError(f"module 'overnight' has no attribute {name!r}")
