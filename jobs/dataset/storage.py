"""URLs → filesystems and paths; listing with size and ETag; object bytes; credentials.

All I/O against storage goes through here. Credentials come from the environment (or the
platform's usual chain: instance profile, IRSA, gcloud ADC) and travel *inside* filesystem
objects so Ray workers on other nodes do not depend on their own environment. They never
appear in messages: every error text leaving this module passes through ``scrub_secrets``.

Every request has a deadline: the first one to a bucket fails within seconds when its
endpoint is silent (``reach``), and any later one within minutes, however the retry layers
multiply (``READ_TIMEOUT_S``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import random
import re
import stat as _stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import fsspec

from overnight.jobs.errors import (
    ConfigError,
    InputNotFound,
    OutputNotWritable,
    StorageUnavailable,
)

# Re-exported: callers name them storage.scrub_secrets and storage.looks_like_credentials.
from overnight.jobs.secrets import USER_INFO
from overnight.jobs.secrets import looks_like_credentials as looks_like_credentials
from overnight.jobs.secrets import scrub_secrets as scrub_secrets
from overnight.schemas import ErrorCode

T = TypeVar("T")
_log = logging.getLogger(__name__)


def one_line(text: str) -> str:
    """``text`` on one line: control characters (a newline in a name) as their escapes."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@dataclass(frozen=True)
class Location:
    """A resolved URL: the fsspec filesystem, the path inside it, and the URL's scheme."""

    fs: fsspec.AbstractFileSystem
    path: str
    scheme: str

    def url(self, path: str | None = None) -> str:
        path = self.path if path is None else path
        return path if self.scheme == "file" else f"{self.scheme}://{path}"

    def join(self, *parts: str) -> Location:
        return Location(self.fs, posixpath.join(self.path, *parts), self.scheme)

    def canonical(self) -> Location:
        """This location as the store names it, so two spellings of one place compare equal:
        on a disk its real path (a symlink or ``..`` is where it leads), in an object store
        its key with ``//`` and ``./`` collapsed. Export's guard, the listing's output-inside-
        input check and the report's one-output-once rule all compare through this."""
        if self.scheme == "file":
            return Location(self.fs, os.path.realpath(self.path), self.scheme)
        return Location(self.fs, posixpath.normpath(self.path).lstrip("/"), self.scheme)


@dataclass(frozen=True)
class StorageConfig:
    """Connection settings captured once on the driver and shipped to Ray tasks.

    Tasks on other nodes must not depend on their own environment, so the driver's view of
    endpoints and credentials travels with the job. ``repr`` never shows it.
    """

    s3: tuple[tuple[str, object], ...] = field(default=(), repr=False)

    @classmethod
    def from_env(cls) -> StorageConfig:
        return cls(s3=tuple(sorted(_s3_options().items())))

    def __repr__(self) -> str:
        return "StorageConfig(<credentials hidden>)"


# One S3 request during a run, and what the three retry layers multiply it to. A read
# timeout is the longest silence between two bytes of an answer, not a limit on a transfer:
# a healthy S3 answers in well under a second, and SlowDown (throttling at scale) is an
# answer, retried by botocore and s3fs whatever these deadlines are. Each layer retries a
# read timeout: botocore 1 + BOTOCORE_RETRIES = 3 attempts, inside s3fs's S3FS_TRIES = 5,
# inside ``with_retries``'s 4, where a read timeout is now final (``_already_retried``). A
# read that never answers stops after 15 requests: 20 s x 15 = 300 s, plus about 12 s of
# the clients' backoff (measured with a 1 s timeout: 15 requests in 27 s). Before, it was
# 60 s x 3 x 5 x 4 = 60 requests, an hour without output. The first contact with a bucket
# is a single request with shorter deadlines (``reach``).
CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 20
BOTOCORE_RETRIES = 2  # legacy mode's max_attempts: retries after the first attempt
S3FS_TRIES = 5  # s3fs's default, set here so that the product above stays true


def _s3_options() -> dict:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    options: dict = {}
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:
        options.update(key=key, secret=secret, token=os.environ.get("AWS_SESSION_TOKEN"))
    client_kwargs: dict = {}
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client_kwargs["region_name"] = region
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    options["config_kwargs"] = {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "read_timeout": READ_TIMEOUT_S,
        "retries": {"max_attempts": BOTOCORE_RETRIES},
    }
    return options


def resolve(url: str, config: StorageConfig | None = None) -> Location:
    """Parse a local path, ``file://``, ``s3://`` or ``gs://`` URL."""
    if "://" not in url:
        return Location(fsspec.filesystem("file"), os.path.abspath(os.path.expanduser(url)), "file")
    scheme, rest = url.split("://", 1)
    if scheme == "file":
        if rest.startswith("localhost/"):
            # RFC 8089: file://localhost/x is /x, as the tenant checks read it
            # (submissions.urls); read as relative, it was checked at one place and written
            # at ./localhost/x.
            rest = rest[len("localhost") :]
        return Location(fsspec.filesystem("file"), os.path.abspath(rest), "file")
    if scheme in ("s3", "s3a", "gs", "gcs") and re.match(USER_INFO, rest):
        # botocore refused it as a bucket name in a traceback that printed the secret.
        raise ConfigError(
            f"{scrub_secrets(url)!r} carries credentials in the URL, which overnight does not "
            "read: remove them and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE, an instance profile or IRSA; GOOGLE_APPLICATION_CREDENTIALS for gs://)"
        )
    if scheme in ("s3", "s3a"):
        # Fresh instance: fsspec caches instances by arguments, and tests change endpoints.
        options = dict(config.s3) if config is not None else _s3_options()
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.retries = S3FS_TRIES  # an attribute: s3fs's constructor takes no such argument
        _quiet_orphaned_requests()
        return Location(fs, rest.rstrip("/"), "s3")
    if scheme in ("gs", "gcs"):
        try:
            fs = fsspec.filesystem("gcs")
        except ImportError:
            raise StorageUnavailable(
                "gs:// needs the gcs extra: pip install 'overnight[gcs]'"
            ) from None
        _quiet_orphaned_requests()
        return Location(fs, rest, "gs")
    # A scheme we do not read is the spec's mistake, not an outage to retry (it was exit 3).
    raise ConfigError(
        f"unsupported URL scheme {scheme!r} in {url!r}: use a path, file://, s3:// or gs://"
    )


def _quiet_orphaned_requests() -> None:
    """Keep aiohttp's orphaned request tasks off the terminal (see ``_orphaned_request``), in
    fsspec's I/O loop, where s3fs and gcsfs run every request of this process."""
    from fsspec.asyn import get_loop

    loop = get_loop()
    if loop.get_exception_handler() is None:  # not an embedding program's own handler
        loop.set_exception_handler(_orphaned_request)


def _orphaned_request(loop: Any, context: dict[str, Any]) -> None:
    """aiohttp (3.14) writes a request that waits for "100 Continue", as S3's PUT does, in a
    task of its own, which on Python 3.11 starts on the loop's next turn. When the connection
    is gone by then (an endpoint that accepts connections and drops them: an outage behind a
    load balancer), that task fails and nothing awaits it; the request fails with the same
    lost connection, which ``with_retries`` retries and reports. asyncio printed each such
    task's traceback when it was collected ("Task exception was never retrieved"): 55 to 71
    of them beside the one message of a publish that met an outage. Connection errors of
    tasks nobody awaits go to the debug log; anything else is reported as asyncio would."""
    exc = context.get("exception")
    if "never retrieved" in str(context.get("message")) and isinstance(exc, _connection_errors()):
        _log.debug("storage: an abandoned request's connection error: %r", exc)
        return
    loop.default_exception_handler(context)


def _connection_errors() -> tuple[type[BaseException], ...]:
    try:
        from aiohttp import ClientConnectionError
    except ImportError:  # pragma: no cover - s3fs and gcsfs bring aiohttp
        return (ConnectionError,)
    return (ConnectionError, ClientConnectionError)


_TRANSIENT = (ConnectionError, TimeoutError, OSError)


def _is_missing(exc: BaseException) -> bool:
    return isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | Unreadable)


def with_retries(
    what: str,
    fn: Callable[[], T],
    *,
    attempts: int = 4,
    base_delay_s: float = 0.5,
) -> T:
    """Run a storage call, retrying transient failures with jittered exponential backoff.

    Missing objects and permission errors are not transient and propagate at once. When every
    attempt fails the job cannot go on: StorageUnavailable says what to check.
    """
    last: BaseException | None = None
    tried = f"{attempts} attempts"
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if isinstance(exc, _credential_errors()):
                # Not transient, and not the item's fault: no object can be read this way.
                raise StorageUnavailable(
                    scrub_secrets(
                        f"no credentials to {what}: {type(exc).__name__}: {exc}. Set "
                        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance "
                        "profile or IRSA; GOOGLE_APPLICATION_CREDENTIALS for gs://), then "
                        "rerun: finished items are kept."
                    )
                ) from None
            if _is_missing(exc) or not isinstance(exc, (*_TRANSIENT, *_botocore_errors())):
                raise
            last, tried = exc, f"{attempt + 1} attempts"
            if _already_retried(exc):
                tried = "no answer, after the storage client's own retries"
                break
            if attempt < attempts - 1:
                time.sleep(base_delay_s * (2**attempt) * (0.5 + random.random()))
    raise StorageUnavailable(
        scrub_secrets(
            f"storage unreachable while trying to {what} ({tried}): "
            f"{type(last).__name__}: {last}. Check the endpoint, network and credentials "
            "(AWS_* / GOOGLE_* environment), then rerun: finished items are kept."
        )
    ) from None


def _already_retried(exc: BaseException) -> bool:
    """A read that timed out: the storage client retried it before it got here (for S3,
    botocore inside s3fs: 15 requests, ``READ_TIMEOUT_S``). Retrying it again multiplied a
    silent endpoint's wait by ``attempts``, to an hour; an endpoint that refuses or drops
    connections fails fast, and is still retried here, to bridge a brief outage."""
    return isinstance(exc, _silent_errors(connect=False))


def _botocore_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import (
            ConnectionClosedError,
            EndpointConnectionError,
            ReadTimeoutError,
        )
    except ImportError:  # pragma: no cover - s3fs brings botocore
        return ()
    return (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError)


def _credential_errors() -> tuple[type[BaseException], ...]:
    try:
        from botocore.exceptions import NoCredentialsError, PartialCredentialsError
    except ImportError:  # pragma: no cover - s3fs brings botocore
        return ()
    return (NoCredentialsError, PartialCredentialsError)


# -- first contact --------------------------------------------------------------------------

# The first request of this process to a bucket: one attempt (no botocore, s3fs or
# ``with_retries`` retries), short deadlines. An endpoint that accepts connections and never
# answers (a hung server, a black-holed proxy) is then reported within PROBE_READ_TIMEOUT_S
# (a firewall that drops connections: PROBE_CONNECT_TIMEOUT_S), before any work starts,
# instead of after a run's 5 minutes of retries. PROBE_DEADLINE_S bounds the whole call,
# credential lookup and gs:// (whose client has no such settings here) included.
PROBE_CONNECT_TIMEOUT_S = 5
PROBE_READ_TIMEOUT_S = 10
PROBE_DEADLINE_S = 20

_reached: set[tuple[str, str, str]] = set()
_reaching = threading.Lock()


def reach(target: str | Location, what: str | None = None) -> None:
    """Raise ``StorageUnavailable`` when the endpoint of ``target``'s bucket does not answer
    one request within seconds; a local path needs nothing.

    Any answer will do, a missing bucket or a refusal included: those are the caller's to
    report. An endpoint that refuses or drops connections fails fast and is left to the
    caller's retries (``with_retries`` bridges a brief outage); only silence is reported
    here. An answer is remembered for the process, so a bucket costs one probe (in a Ray
    worker too, once). The preflight calls it, and so do the listing and reading helpers
    below that the driver's commands (show, report, export, submissions) start with; a
    per-item read does not (``read_bytes``: its limit is ``READ_TIMEOUT_S``'s). ``what``
    names the location in the message (default: its URL)."""
    loc = resolve(target) if isinstance(target, str) else target
    if loc.scheme == "file":
        return
    bucket = loc.path.split("/", 1)[0]
    key = (loc.scheme, _configured_endpoint(loc) or "", bucket)
    with _reaching:
        if key in _reached:
            return
        probe = _probe_filesystem(loc)
        started = time.monotonic()
        try:
            probe.info(bucket, timeout=PROBE_DEADLINE_S)
        except Exception as exc:
            if isinstance(exc, _silent_errors()):
                waited = time.monotonic() - started
                raise StorageUnavailable(_silence(loc, probe, what, waited, exc)) from None
            if isinstance(exc, (*_connection_errors(), *_botocore_errors(), *_credential_errors())):
                return  # not silent, not answered: the caller's own call and retries decide
            if not isinstance(exc, OSError):  # s3fs's errors for an answer are OSErrors
                return
        _reached.add(key)


def _probe_filesystem(loc: Location) -> fsspec.AbstractFileSystem:
    if loc.scheme != "s3":
        return loc.fs
    options = dict(loc.fs.storage_options)
    options["config_kwargs"] = {
        **(options.get("config_kwargs") or {}),
        "connect_timeout": PROBE_CONNECT_TIMEOUT_S,
        "read_timeout": PROBE_READ_TIMEOUT_S,
        "retries": {"total_max_attempts": 1},
    }
    probe = fsspec.filesystem("s3", skip_instance_cache=True, **options)
    probe.retries = 1  # s3fs's tries (an attribute: its constructor takes no such argument)
    return probe


def _configured_endpoint(loc: Location) -> str | None:
    client_kwargs = loc.fs.storage_options.get("client_kwargs") or {}
    return client_kwargs.get("endpoint_url")


def _silent_errors(connect: bool = True) -> tuple[type[BaseException], ...]:
    """An endpoint's silence: no answer in time (``connect``: no connection either)."""
    # fsspec's deadline (FSTimeoutError) is a TimeoutError.
    try:
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError
    except ImportError:  # pragma: no cover - s3fs brings botocore
        return (TimeoutError,)
    return (TimeoutError, ReadTimeoutError, *((ConnectTimeoutError,) if connect else ()))


_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _silence(
    loc: Location, probe: fsspec.AbstractFileSystem, what: str | None, waited: float, exc: Exception
) -> str:
    """The one paragraph for an endpoint that did not answer: which endpoint (and proxy),
    for what, and what to check; never a credential."""
    if loc.scheme == "s3":
        client = getattr(probe, "_s3", None)
        endpoint = _configured_endpoint(loc) or getattr(
            getattr(client, "meta", None), "endpoint_url", "AWS S3"
        )
        settings = "AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3), AWS_REGION"
    else:
        endpoint, settings = "Google Cloud Storage", "the GOOGLE_* environment"
    proxy = next((os.environ[v] for v in _PROXY_ENV if os.environ.get(v)), None)
    via = f" (through the proxy {proxy})" if proxy else ""
    shown = what or loc.url()
    return one_line(
        scrub_secrets(
            f"storage unreachable: the endpoint {endpoint}{via} did not answer within "
            f"{max(waited, 1):.0f} s when asked for the bucket of {shown} "
            f"({type(exc).__name__}): something there accepts connections and never replies "
            "(a hung server, or a firewall, VPN or proxy that swallows the traffic). Check that "
            f"the endpoint is up and reachable from this machine and that {settings} and any "
            "proxy settings are right, then rerun: finished items are kept."
        )
    )


@dataclass(frozen=True)
class ObjectInfo:
    uri: str
    size: int | None
    etag: str | None


def _etag(info: dict) -> str | None:
    for key in ("ETag", "etag", "md5Hash", "generation"):
        if info.get(key):
            return str(info[key]).strip('"')
    mtime = info.get("mtime") or info.get("LastModified") or info.get("created")
    if mtime is None:
        return None
    if hasattr(mtime, "timestamp"):
        mtime = mtime.timestamp()
    return f"mtime:{int(float(mtime) * 1e9)}"


def refuse_a_file_as_output(loc: Location, shown: str, command: str = "") -> None:
    """``InputNotFound`` when an OUTPUT given to a reading command (report, vacuum, views) is
    a local file: listed as a folder, it was NotADirectoryError retried as storage trouble
    (exit 3, "check the endpoint, network") when the command was only given the wrong path."""
    if loc.scheme == "file" and os.path.isfile(loc.path):
        raise InputNotFound(
            f"{command + ': ' if command else ''}{shown!r} is a file: OUTPUT must be an output "
            "folder (or prefix) that a run wrote, holding transcripts/, results/, costs/, "
            "probes/ or runs/"
        )


def _where_relative(url: str) -> str:
    """`` (in /abs/path)`` for a relative local path: a job file's paths are read from the
    working directory (as the shell reads them), not from the file's folder, and a cron job's
    working directory is seldom the one its author tried it in."""
    if "://" in url or os.path.isabs(os.path.expanduser(url)):
        return ""
    return f" (relative to the working directory: {os.path.abspath(url)})"


def stat(uri: str, config: StorageConfig | None = None) -> ObjectInfo:
    """Size and ETag (or mtime) of one object; (None, None) when it does not exist."""
    loc = resolve(uri, config)

    def info() -> dict:
        try:
            return loc.fs.info(loc.path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                # A link that loops back on itself is the item's (fetch_failed when it is
                # read, as in a listed folder), not an outage to retry and stop the job on.
                raise FileNotFoundError(errno.ELOOP, os.strerror(errno.ELOOP), uri) from None
            raise

    try:
        found = with_retries(f"stat {uri}", info)
    except (FileNotFoundError, PermissionError):
        return ObjectInfo(uri, None, None)
    return ObjectInfo(uri, int(found.get("size") or 0), _etag(found))


def is_hidden(relative: str) -> bool:
    """Whether a path under the input has a name or folder starting with ``.`` or ``_``:
    never an item. Our own bookkeeping is named so (``_manifests``, ``_staging``,
    ``_SUCCESS``), and so are a desktop's (``.DS_Store``)."""
    return any(part.startswith((".", "_")) for part in relative.split("/") if part)


def list_objects(url: str, hidden: list[str] | None = None) -> list[ObjectInfo]:
    """Every file under a folder or prefix (recursively), or the one file ``url`` names.

    Files ``is_hidden`` names are skipped; their paths under ``url`` go to ``hidden`` when
    it is given, so that the run can say how many it left out.
    """
    loc = resolve(url)
    reach(loc)
    loc.fs.invalidate_cache(loc.path)
    try:
        found = with_retries(f"list {url}", lambda: loc.fs.find(loc.path, detail=True))
    except FileNotFoundError:
        found = {}
    except PermissionError as exc:
        raise StorageUnavailable(scrub_secrets(f"permission denied listing {url}: {exc}")) from None
    if not found:
        try:
            info = with_retries(f"stat {url}", lambda: loc.fs.info(loc.path))
        except FileNotFoundError:
            raise InputNotFound(
                f"input {url!r}{_where_relative(url)} does not exist or is empty"
            ) from None
        if info.get("type") == "file":
            found = {loc.path: info}
        else:
            raise InputNotFound(f"input {url!r} holds no files")
    objects = []
    for path, info in sorted(found.items()):
        kind = info.get("type", "file")
        # fsspec lists a local symlink (to a file, to a folder, dangling or looping) and a
        # FIFO, device or socket as "other". Each is kept, so that it ends as a row: a link
        # to a file is read through, anything else becomes an error row at fetch.
        if kind != "file" and not (kind == "other" and loc.scheme == "file"):
            continue
        rel = path[len(loc.path) :].lstrip("/") if path.startswith(loc.path) else path
        if is_hidden(rel):
            if hidden is not None:
                hidden.append(printable_name(rel) if loc.scheme == "file" else rel)
            continue
        uri = loc.url(printable_name(path) if loc.scheme == "file" else path)
        if kind == "other":
            objects.append(_local_object(uri, path))
        else:
            objects.append(ObjectInfo(uri, int(info.get("size") or 0), _etag(info)))
    return objects


# A local name that is not UTF-8 (a Latin-1 or Shift-JIS name copied from an old PBX export)
# comes from the OS with its bad bytes as lone surrogates, which no UTF-8 text column (Parquet,
# Arrow, JSON) can hold: the whole job stopped at its item id with a UnicodeEncodeError.
# Its URI writes each such byte as ``\xNN``, and reading maps that back (``_on_disk``).
_ESCAPED_BYTE = re.compile(rb"\\x([0-9a-f]{2})")


def printable_name(path: str) -> str:
    """``path`` as UTF-8 text: bytes that are not UTF-8 written as ``\\xNN``."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


def _on_disk(path: str) -> str:
    """The local name ``printable_name`` gave ``path``: itself when it exists, else the name
    with its ``\\xNN`` escapes as bytes when that exists (a name holding a literal ``\\x``
    and one holding the byte are told apart only by which exists)."""
    if "\\x" not in path or os.path.lexists(path):
        return path
    raw = os.fsdecode(_ESCAPED_BYTE.sub(lambda m: bytes([int(m[1], 16)]), os.fsencode(path)))
    return raw if os.path.lexists(raw) else path


def _local_object(uri: str, path: str) -> ObjectInfo:
    """A local entry that is not a plain file, described by what it leads to: a link to a
    file gets its target's size and mtime (a replaced target is new work)."""
    try:
        st = os.stat(path)
    except OSError:  # dangling, a loop, or a target we may not see: fails at fetch
        return ObjectInfo(uri, None, None)
    if not _stat.S_ISREG(st.st_mode):
        return ObjectInfo(uri, None, None)
    return ObjectInfo(uri, st.st_size, _etag({"mtime": st.st_mtime}))


class Unreadable(Exception):
    """One object that can never be read as it stands (per item, not transient): the item
    becomes an error row with ``code``; the message names no credentials."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


def read_bytes(
    uri: str,
    config: StorageConfig | None = None,
    *,
    max_bytes: int | None = None,
    timeout_s: float | None = None,
    within: Sequence[str] | None = None,
) -> bytes:
    """Whole object bytes. FileNotFoundError/PermissionError or Unreadable for a per-item
    failure (``too_large`` past ``max_bytes``, ``fetch_timeout`` past ``timeout_s``, and for
    a local file whose opened real path is outside the folders ``within``); raises
    StorageUnavailable when storage itself is down."""
    loc = resolve(uri, config)
    if loc.scheme == "file":
        folders = _local_folders(within)
        return with_retries(
            f"read {uri}", lambda: _read_local(loc.path, max_bytes, timeout_s, folders)
        )
    if max_bytes is None and timeout_s is None:
        return with_retries(f"read {uri}", lambda: loc.fs.cat_file(loc.path))

    def bounded() -> bytes:
        with loc.fs.open(loc.path, "rb", block_size=_READ_BLOCK) as f:
            return _read_bounded(f, max_bytes, timeout_s)

    return with_retries(f"read {uri}", bounded)


# Reads go in blocks so that a limit on size or time is checked while reading, not after.
_READ_BLOCK = 16 * 2**20
_FILE_KINDS = (
    (_stat.S_ISDIR, "a folder"),
    (_stat.S_ISFIFO, "a FIFO (named pipe)"),
    (_stat.S_ISCHR, "a character device"),
    (_stat.S_ISBLK, "a block device"),
    (_stat.S_ISSOCK, "a socket"),
)


def _read_bounded(f: Any, max_bytes: int | None, timeout_s: float | None) -> bytes:
    started = time.monotonic()
    parts: list[bytes] = []
    size = 0
    while block := f.read(_READ_BLOCK):
        parts.append(block)
        size += len(block)
        if max_bytes is not None and size > max_bytes:
            raise Unreadable(
                ErrorCode.TOO_LARGE, f"it holds more than the job's maximum of {max_bytes} bytes"
            )
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise Unreadable(
                ErrorCode.FETCH_TIMEOUT,
                f"reading it took longer than the job's limit of {timeout_s:.0f} s",
            )
    return b"".join(parts)


def _confined(path: str, fd: int, folders: Sequence[str]) -> bool:
    """The file open at ``fd`` is, now, at a real path inside one of ``folders``.

    Checked on the open file, not on the name checked earlier: a folder swapped for a link
    to another tenant's folder in between must not lead there. The real path names the
    same inode as the descriptor, or the name changed again while we looked.
    """
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return False
    opened = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (opened.st_dev, opened.st_ino):
        return False
    for folder in folders:
        root = os.path.realpath(folder).rstrip("/")
        if real.startswith(root + "/"):
            return True
    return False


def _open_local(path: str, within: Sequence[str] | None = None) -> int:
    """A descriptor of the regular file at ``path``, checked on the open file (kind, and
    confinement to ``within``); ``Unreadable`` with the item's error code otherwise."""
    # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting forever;
    # what was opened is then checked before a single byte is read.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    path = _on_disk(path)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable(
                ErrorCode.FETCH_FAILED, "it is a symbolic link that loops back on itself"
            ) from None
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise Unreadable(
                ErrorCode.FETCH_FAILED,
                f"it is a symbolic link to {os.readlink(path)!r}, which does not exist",
            ) from None
        if exc.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
            raise Unreadable(ErrorCode.NOT_A_FILE, "it is a socket or device, not a file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not _stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        raise Unreadable(ErrorCode.NOT_A_FILE, f"it is {kind}, not a regular file")
    if within is not None and not _confined(path, fd, within):
        os.close(fd)
        # The real path is not shown: it may name another tenant's file.
        raise Unreadable(
            ErrorCode.FETCH_FAILED,
            "when opened, it resolves outside the folders this job may read (a folder on its "
            "path was replaced by a link?); it was not read",
        )
    return fd


def _read_local(
    path: str,
    max_bytes: int | None = None,
    timeout_s: float | None = None,
    within: Sequence[str] | None = None,
) -> bytes:
    with open(_open_local(path, within), "rb", buffering=0) as f:
        return _read_bounded(f, max_bytes, timeout_s)


def _local_folders(within: Sequence[str] | None) -> list[str] | None:
    if within is None:
        return None
    return [resolve(w).path for w in within if w.startswith("/") or "file://" in w]


@contextlib.contextmanager
def open_object(
    uri: str, config: StorageConfig | None = None, *, within: Sequence[str] | None = None
) -> Iterator[IO[bytes]]:
    """The object as a seekable binary file, for readers that take only what they need (a
    container header). A local file gets the same checks as ``read_bytes`` (a regular file,
    confined to ``within``)."""
    loc = resolve(uri, config)
    if loc.scheme == "file":
        with open(_open_local(loc.path, _local_folders(within)), "rb") as f:
            yield f
        return
    with loc.fs.open(loc.path, "rb") as f:
        yield f


# Bytes in one file name: ext4, XFS, Btrfs and APFS refuse longer ones (ENAMETOOLONG). Object
# keys may be longer, but a name derived from a recording's must also fit a local folder.
NAME_MAX = 255


def _cut(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, at a character boundary."""
    return text.encode("utf-8")[: max(0, max_bytes)].decode("utf-8", "ignore")


def fitted_name(stem: str, suffix: str, tag: str = "") -> str:
    """``stem + suffix`` as a file name of at most ``NAME_MAX`` bytes. A stem too long is cut
    and followed by ``tag`` (an item id), so that two names cut to the same start stay apart."""
    name = stem + suffix
    if len(name.encode("utf-8")) <= NAME_MAX:
        return name
    return _cut(stem, NAME_MAX - len((tag + suffix).encode("utf-8"))) + tag + suffix


# A local write failing with one of these is the output's, not the file's: every other
# write would fail the same way, so the job stops (exit 11) instead of failing item by item.
_UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}


def write_bytes_atomic(loc: Location, data: bytes) -> None:
    """Make ``loc`` appear whole or not at all.

    Object stores publish a PUT atomically; on a local disk we write a temporary sibling and
    rename it, which is atomic on POSIX. The sibling's name starts with "." and does not end
    in ".parquet": stock readers (pyarrow datasets, DuckDB and Polars globs) skip it, where a
    finished one named "part-x.parquet.tmp-..." was read beside the file it was replacing,
    every row twice, until the rename. It is cut to fit ``NAME_MAX`` (any name that fits
    can be written), and removed when the write fails: a full disk leaves nothing behind.
    A full, read-only or forbidden disk raises ``OutputNotWritable``.
    """
    if loc.scheme == "file":
        folder, name = os.path.split(loc.path)
        suffix = f".tmp-{os.getpid()}-{random.getrandbits(32):08x}"
        tmp = os.path.join(folder, "." + _cut(name, NAME_MAX - 1 - len(suffix)) + suffix)
        try:
            os.makedirs(folder, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OutputNotWritable(
                f"cannot write {loc.path}: a file is in the way of the folder {folder}; move "
                "it or choose another output."
            ) from None
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, loc.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if exc.errno in _UNWRITABLE:
                raise OutputNotWritable(
                    f"cannot write {loc.path}: {exc.strerror}; free space or choose an output "
                    "you can write to, then rerun: finished items are kept."
                ) from None
            raise
        return
    with_retries(f"write {loc.url()}", lambda: loc.fs.pipe_file(loc.path, data))


def read_location(loc: Location) -> bytes:
    """The bytes of one object at a resolved location (the filesystem carries the credentials)."""
    reach(loc)
    return bytes(with_retries(f"read {loc.url()}", lambda: loc.fs.cat_file(loc.path)))


def delete(loc: Location) -> None:
    """Remove one object; one that is already gone is not an error."""
    with contextlib.suppress(FileNotFoundError):
        with_retries(f"delete {loc.url()}", lambda: loc.fs.rm_file(loc.path))


def exists(loc: Location) -> bool:
    reach(loc)
    return bool(with_retries(f"check {loc.url()}", lambda: loc.fs.exists(loc.path)))


def list_files(loc: Location, suffix: str = "") -> list[str]:
    """Paths of the files directly or recursively under ``loc`` (no error when absent)."""
    # Other processes (Ray workers) write here: never answer from fsspec's listing cache, which
    # would also make info()/open() deny files added since an earlier listing.
    reach(loc)
    loc.fs.invalidate_cache(loc.path)
    try:
        found = with_retries(f"list {loc.url()}", lambda: loc.fs.find(loc.path))
    except FileNotFoundError:
        return []
    return sorted(p for p in found if p.endswith(suffix))


def _entries(loc: Location) -> list[dict]:
    reach(loc)
    loc.fs.invalidate_cache(loc.path)  # as in list_files
    try:
        return with_retries(f"list {loc.url()}", lambda: loc.fs.ls(loc.path, detail=True))
    except FileNotFoundError:
        return []


def list_dirs(loc: Location) -> list[str]:
    """Paths of the folders directly under ``loc`` (prefixes on object stores)."""
    return sorted(e["name"].rstrip("/") for e in _entries(loc) if e["type"] == "directory")


def list_top_files(loc: Location, suffix: str = "") -> list[str]:
    """Paths of the files directly under ``loc``, not in its folders."""
    return sorted(
        e["name"] for e in _entries(loc) if e["type"] == "file" and e["name"].endswith(suffix)
    )


def map_threads(fn: Callable[[T], object], items: Iterable[T], workers: int = 16) -> list:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))
