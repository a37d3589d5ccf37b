"""Checks on the driver before Ray starts: the output can be written, the model can be had,
the optional packages a feature asks for are installed (the extras of pyproject.toml).

Both failed late before: an output under ``/sys`` as a raw ``PermissionError`` (exit 1), and a
model name the hub could not serve as a crashed actor (exit 6, some 200 lines of Ray and
httpx tracebacks). Here they stop the job in one paragraph, before anything is written.

Hub models are fetched into the Hugging Face cache on the driver of a local run, and the
actors load that folder; on a cluster (``--address`` or ``RAY_ADDRESS``) the driver only
checks that the hub knows the name, or that the cache holds it, and each node fetches its own
copy, as it did before.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from overnight.jobs.dataset import storage
from overnight.jobs.errors import ConfigError, ModelNotFound, OutputNotWritable, OvernightError
from overnight.jobs.run import console
from overnight.workers.whisper_models import (
    BUNDLED_MODEL,
    ModelLoadError,
    check_model_reference,
    feature_size_for,
)

# One hub request (metadata, not a file download) waits at most this long; an unreachable
# hub usually fails at once (refused, no DNS), a dropped packet after this.
HUB_TIMEOUT_S = 10.0


# -- optional features -----------------------------------------------------------------------

# pyproject.toml's feature extras and the modules each one brings (tests/infra/test_extras.py
# holds the two together). scripts/install.sh installs them all: its lock files hold `full`.
EXTRAS: dict[str, tuple[str, ...]] = {
    "redact": ("presidio_analyzer", "spacy", "text_to_num"),
    "eval": ("jiwer", "whisper_normalizer"),
    "gguf": ("gguf",),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken parent package; a module without a spec
        return False


def extra_missing(
    extra: str,
    feature: str,
    *,
    error: type[OvernightError] = ConfigError,
    missing: list[str] | None = None,
    instead: str = "",
) -> OvernightError:
    """The one-paragraph error for ``feature`` without ``extra`` (``missing``: its modules
    that are not installed; default: those ``find_spec`` cannot find)."""
    if missing is None:
        missing = [m for m in EXTRAS[extra] if not _installed(m)] or list(EXTRAS[extra])
    return error(
        f"{feature} needs the `{extra}` extra, which is not installed here "
        f"({', '.join(missing)} missing): pip install 'overnight[{extra}]' "
        f"('overnight[full]' for every feature; scripts/install.sh installs them all){instead}. "
        "Nothing was run or written."
    )


def speaker_encoder() -> None:
    """Diarization's speaker encoder, prepared once at install (``scripts/install.sh``): a
    missing or damaged one stops the job before work starts (exit 5), naming the command
    that prepares it."""
    from overnight.workers.diarize.prepare import DiarizerModelMissing, load_weights

    try:
        load_weights()
    except DiarizerModelMissing as exc:
        raise ModelNotFound(str(exc)) from None


def require_extra(
    extra: str, feature: str, *, error: type[OvernightError] = ConfigError, instead: str = ""
) -> None:
    """Raise ``error`` (``ConfigError``, exit 2, unless told) naming the extra to install,
    unless every module of ``extra`` can be imported. Finds the modules without importing
    them (spaCy alone takes seconds), so it runs before any work."""
    missing = [m for m in EXTRAS[extra] if not _installed(m)]
    if missing:
        raise extra_missing(extra, feature, error=error, missing=missing, instead=instead)


# -- output ---------------------------------------------------------------------------------

# What the output probe writes: one file-system block.
_PROBE_BYTES = 4096


def check_output(url: str, what: str = "the output") -> None:
    """Raise ``OutputNotWritable`` unless a local output folder can be created and written.

    Writes nothing that stays: the probe is a temporary file in the deepest folder that
    exists (the output itself once it exists). In an object store the bucket must exist (an
    endpoint that does not answer within seconds is ``StorageUnavailable``, see
    ``storage.reach``; one that refuses connections, after retries); whether it takes writes
    shows at the first one. ``what`` names the folder in messages (``export``
    checks its destination).
    """
    loc = storage.resolve(url)
    shown = storage.scrub_secrets(url)
    if loc.scheme != "file":
        _check_bucket(loc, what, shown)
        _check_not_an_object(loc, what, shown)
        return
    path = Path(loc.path)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "it is" if existing == path else f"{existing} is"
        raise OutputNotWritable(
            f"cannot write {what} {shown}: {where} a file, not a folder; choose another folder."
        )
    fd, probe = None, None
    try:
        fd, probe = tempfile.mkstemp(prefix=".overnight-probe-", dir=existing)
        # A full disk still creates an empty file: only a block written and synced shows
        # that it takes data (else the run's first write fails, after its claim).
        os.write(fd, bytes(_PROBE_BYTES))
        os.fsync(fd)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise OutputNotWritable(
            f"cannot write {what} {shown}: {existing} does not take new files ({reason}); "
            "free space there or choose a folder you can write to."
        ) from None
    finally:
        if fd is not None:
            os.close(fd)
        if probe is not None:
            os.unlink(probe)


_MAKE_BUCKET = {"s3": "`aws s3 mb {}`", "gs": "`gcloud storage buckets create {}`"}


def _check_bucket(loc: storage.Location, what: str, shown: str) -> None:
    """The output's bucket exists and these credentials may see it. A job never creates a
    bucket (its region, access and retention are its owner's to choose); without this, the
    first write (the claim) failed with the store's own traceback, and a dry run said all
    was well."""
    bucket = loc.path.split("/", 1)[0]
    where = storage.Location(loc.fs, bucket, loc.scheme)
    # The first request to the endpoint, with short deadlines: a silent one is one paragraph
    # (exit 3) in seconds; under the run's retries it was up to an hour without output.
    storage.reach(loc, f"{what} {shown}")
    try:
        storage.with_retries(f"check the bucket {where.url()}", lambda: loc.fs.info(bucket))
    except FileNotFoundError:
        make = _MAKE_BUCKET.get(loc.scheme, "your storage's console")
        raise OutputNotWritable(
            f"cannot write {what} {shown}: the bucket {where.url()} does not exist. Create it "
            f"({make.format(where.url())}), or fix the name or the endpoint "
            "(AWS_ENDPOINT_URL), then rerun; nothing was written."
        ) from None
    except PermissionError:
        raise OutputNotWritable(
            f"cannot write {what} {shown}: access to the bucket {where.url()} is denied to "
            "these credentials. Grant them access to it (AWS_* / GOOGLE_* environment), or "
            "choose a bucket they may write, then rerun; nothing was written."
        ) from None


def _check_not_an_object(loc: storage.Location, what: str, shown: str) -> None:
    """An object where the folder would go is refused as a local file is (exit 11): files
    written "under" it are keys beside it that no tool shows as its contents."""
    key = loc.path.strip("/")
    if "/" not in key:  # the bucket itself
        return
    try:
        info = storage.with_retries(f"check {loc.url()}", lambda: loc.fs.info(key))
    except (FileNotFoundError, PermissionError):
        return  # nothing there (or not ours to look at): the first write tells
    if info.get("type") == "file":
        raise OutputNotWritable(
            f"cannot write {what} {shown}: it is a file, not a folder; choose another folder."
        )


# -- models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhisperModelRef:
    """A checked Whisper model: ``path`` is a local copy for the actors (None: they resolve
    ``model`` themselves), ``feature_size`` its mel bins (decode tasks need them first)."""

    path: str | None
    feature_size: int


def _looks_like_path(model: str) -> bool:
    """Not a hub repository id (``org/name``): a local path, or a bare unknown name."""
    return model.startswith(("/", ".", "~")) or model.count("/") != 1


_WHISPER_NAMES = (
    "a faster-whisper size (tiny.en, small.en, large-v3, large-v3-turbo, ...) or the hub id "
    "(org/name) of a CTranslate2 Whisper conversion"
)
_LLM_NAMES = "a hub id (org/name), a local model folder or a .gguf file"


def whisper_model(model: str, *, download: bool = True, progress: bool = False) -> WhisperModelRef:
    """Check (and, with ``download``, fetch) the speech model; ``ModelNotFound`` says why not.

    ``model``: ``bundled:tiny.en``, a faster-whisper size name (``small.en``: the hub
    repository faster-whisper maps it to), a hub repository id, a local CTranslate2 folder,
    or a folder in object storage (``s3://...``, fetched by each actor).
    """
    if "://" in model:
        return WhisperModelRef(None, _whisper_in_storage(model))
    from faster_whisper.utils import available_models, download_model

    local = model == BUNDLED_MODEL or Path(model).expanduser().is_dir()
    if local or (model not in available_models() and _looks_like_path(model)):
        try:  # the bundled model, a local folder, or a name that is neither of the hub's
            check_model_reference(model)
        except ModelLoadError as exc:
            raise ModelNotFound(str(exc)) from None
        return WhisperModelRef(None, feature_size_for(model))
    repo = _whisper_repo(model)
    what = f"the Whisper model {model}" + ("" if repo == model else f" (hub repository {repo})")
    if not download:
        _check_hub(repo, what, _WHISPER_NAMES)
        return WhisperModelRef(None, feature_size_for(model))
    path = _fetch_ctranslate2(
        lambda: download_model(model),
        repo,
        what,
        _WHISPER_NAMES,
        progress=progress,
        kind="Whisper model",
        instead="a faster-whisper conversion (e.g. Systran/faster-whisper-small.en)",
    )
    has_preprocessor = (path / "preprocessor_config.json").is_file()
    return WhisperModelRef(str(path), feature_size_for(str(path) if has_preprocessor else model))


def _whisper_repo(model: str) -> str:
    """The hub repository faster-whisper loads for a size name or repository id."""
    from faster_whisper import utils

    # faster-whisper's own size → repository table (its download_model reads it): the
    # repository id makes the advice actionable (``hf download <repo>``).
    return dict(getattr(utils, "_MODELS", {})).get(model, model)


def _whisper_in_storage(model: str) -> int:
    """A CTranslate2 folder in object storage: it must hold model.bin; returns its mel bins."""
    loc = storage.resolve(model)
    if not storage.exists(loc.join("model.bin")):
        raise ModelNotFound(f"model {model!r} not found: no model.bin under that prefix")
    preprocessor = loc.join("preprocessor_config.json")
    if storage.exists(preprocessor):
        return int(json.loads(storage.read_bytes(preprocessor.url())).get("feature_size", 80))
    return 80


def llm_model(
    backend: str,
    model: str | None,
    *,
    download: bool = True,
    progress: bool = False,
    device: str = "auto",
) -> str | None:
    """Check (and for CTranslate2 with ``download``, fetch) the LLM; returns a local copy of
    a hub model for the actors, else None (they resolve ``model`` themselves).

    vLLM fetches a hub model itself (it chooses which weight files to take), so with it the
    driver only checks that the cache holds the name or the hub knows it. A GGUF model (the
    embedded default of ``ctranslate2`` and of vLLM on CPU, or a ``.gguf`` file) needs the
    ``gguf`` extra: without it, ``ModelNotFound`` (exit 5) before anything runs.
    """
    path = Path(model).expanduser() if model is not None else None
    if path is not None and path.is_file() and path.suffix == ".gguf":
        require_extra(
            "gguf",
            f"the LLM model {model} (a GGUF file, converted for the {backend} backend)",
            error=ModelNotFound,
            instead="; or give a CTranslate2 or Hugging Face model folder, or a hub id",
        )
    if model is None and (backend == "ctranslate2" or device == "cpu"):
        require_extra(
            "gguf",
            f"the {backend} backend's default LLM (SmolLM2-135M, bundled as a GGUF file)",
            error=ModelNotFound,
            instead="; or choose a model with --model (a model folder or a hub id)",
        )
    if model is None or path is None:
        return None  # the backend's embedded default
    need = "model.bin" if backend == "ctranslate2" else "config.json"
    kind = "CTranslate2" if backend == "ctranslate2" else "Hugging Face"
    if path.is_file() and path.suffix == ".gguf":
        _check_gguf(path)
        return None
    if path.is_dir():
        if not (path / need).is_file():
            raise ModelNotFound(
                f"the LLM model folder {model} has no {need}: give a {kind} model folder, a "
                ".gguf file or a hub id (org/name)."
            )
        return None
    if _looks_like_path(model):
        raise ModelNotFound(
            f"the LLM model {model} not found: no such file or folder, and not a hub "
            f"repository id (org/name). Give {_LLM_NAMES}."
        )
    what = f"the LLM model {model}"
    if backend != "ctranslate2" or not download:
        _check_hub(model, what, _LLM_NAMES)
        return None
    import huggingface_hub

    local = _fetch_ctranslate2(
        lambda: huggingface_hub.snapshot_download(model, etag_timeout=HUB_TIMEOUT_S),
        model,
        what,
        _LLM_NAMES,
        progress=progress,
        kind="model",
        instead="--backend vllm for a Hugging Face model",
    )
    return str(local)


def _check_gguf(path: Path) -> None:
    """A damaged or truncated ``.gguf`` file stops the job here, before Ray starts (exit 5),
    not in the actors' conversion (it was "the pipeline failed: SystemException: ."). The
    header alone is read (its size, not the weights', sets the time)."""
    from overnight.workers.llm.prepare import ModelPreparationError, check_gguf

    try:
        check_gguf(path)
    except ModelPreparationError as exc:
        raise ModelNotFound(f"{exc} Nothing was run or written.") from None


# -- the hub --------------------------------------------------------------------------------


def _fetch_ctranslate2(
    fetch: Callable[[], str],
    repo: str,
    what: str,
    names: str,
    *,
    progress: bool,
    kind: str,
    instead: str,
) -> Path:
    """The local folder ``fetch()`` downloads ``repo`` into (the Hugging Face cache), which
    must hold a CTranslate2 model (model.bin); else ``ModelNotFound`` says what to use
    ``instead``. ``names``: the model names the message suggests when the hub has none."""
    if progress:
        _announce(repo, what)
    try:
        path = Path(fetch())
    except Exception as exc:
        raise _hub_failure(exc, repo, what, names) from None
    if not (path / "model.bin").is_file():
        raise ModelNotFound(
            f"{what} is on the hub but is not a CTranslate2 {kind} (no model.bin): use "
            f"{instead}, or convert it with ct2-transformers-converter and pass the folder."
        )
    return path


def _announce(repo: str, what: str) -> None:
    """Say so before a download that may take minutes (the hub client's own bars are off)."""
    import huggingface_hub
    from huggingface_hub import constants

    cached = huggingface_hub.try_to_load_from_cache(repo, "model.bin")
    if not constants.HF_HUB_OFFLINE and not isinstance(cached, str):
        console.event(
            "model_download",
            f"fetching {what} from the Hugging Face hub into its cache (once; later runs reuse it)",
            repo=repo,
        )


def _check_hub(repo: str, what: str, names: str) -> None:
    """The cache holds ``repo``, or the hub says it exists; else ``ModelNotFound``."""
    import huggingface_hub
    from huggingface_hub import constants

    if isinstance(huggingface_hub.try_to_load_from_cache(repo, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise _offline(repo, what)
    try:
        huggingface_hub.HfApi().repo_info(repo, timeout=HUB_TIMEOUT_S)
    except Exception as exc:
        raise _hub_failure(exc, repo, what, names) from None


def _predownload(repo: str) -> str:
    return (
        f"To pre-download it where the hub can be reached: `hf download {repo}` (into the "
        "Hugging Face cache, ~/.cache/huggingface or $HF_HOME; copy that to this machine and "
        f"set HF_HUB_OFFLINE=1), or `hf download {repo} --local-dir DIR` and pass that folder "
        "as the model (--model DIR)."
    )


def _offline(repo: str, what: str) -> ModelNotFound:
    from huggingface_hub import constants

    return ModelNotFound(
        f"cannot fetch {what}: HF_HUB_OFFLINE is set and the Hugging Face cache "
        f"({constants.HF_HUB_CACHE}) does not hold it. Unset HF_HUB_OFFLINE to download it. "
        + _predownload(repo)
    )


def _innermost(exc: BaseException) -> BaseException:
    seen = exc
    for _ in range(8):
        if seen.__cause__ is None:
            break
        seen = seen.__cause__
    return seen


def _hub_failure(exc: BaseException, repo: str, what: str, names: str) -> ModelNotFound:
    """One paragraph for a failed hub request: the name, access, or the network at fault.

    Without a connection the hub cannot say whether a name exists, so an unreachable hub is
    never reported as "not found".
    """
    from huggingface_hub import constants, errors

    endpoint = constants.ENDPOINT
    if isinstance(exc, errors.GatedRepoError):
        return ModelNotFound(
            f"cannot fetch {what}: it is a gated repository on the Hugging Face hub. Accept its "
            f"terms at {endpoint}/{repo} and log in here (`hf auth login`, or set HF_TOKEN). "
            + _predownload(repo)
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelNotFound(
            f"no such model: {what} is not on the Hugging Face hub ({endpoint} has no "
            f"repository {repo}). Check the name: give {names}. If the repository is private, "
            "log in (`hf auth login`, or set HF_TOKEN)."
        )
    if isinstance(exc, errors.RevisionNotFoundError):
        return ModelNotFound(f"cannot fetch {what}: the hub has no such revision of {repo}.")
    inner = _innermost(exc)
    if constants.HF_HUB_OFFLINE or isinstance(inner, errors.OfflineModeIsEnabled):
        return _offline(repo, what)
    if isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        status = exc.response.status_code
        if status in (401, 403):
            return ModelNotFound(
                f"cannot fetch {what}: the Hugging Face hub refused access to {repo} (HTTP "
                f"{status}). Log in (`hf auth login`, or set HF_TOKEN) with an account that may "
                "read it. " + _predownload(repo)
            )
        cause = f"HTTP {status}"
    else:
        text = str(inner).strip().splitlines()
        cause = f"{type(inner).__name__}: {text[0]}" if text else type(inner).__name__
        network = (errors.HTTPError, errors.LocalEntryNotFoundError, ConnectionError, TimeoutError)
        if not isinstance(exc, network) and not isinstance(inner, network):
            return ModelNotFound(  # not the network: a full disk, an unwritable cache, ...
                storage.scrub_secrets(
                    f"cannot fetch {what} into the Hugging Face cache ({constants.HF_HUB_CACHE}): "
                    f"{cause[:300]}. " + _predownload(repo)
                )
            )
    return ModelNotFound(
        storage.scrub_secrets(
            f"cannot fetch {what}: could not reach the Hugging Face hub at {endpoint} "
            f"({cause[:300]}), so whether that name exists could not be checked, and the local "
            "cache does not hold it. Check the network (or HF_ENDPOINT). " + _predownload(repo)
        )
    )
