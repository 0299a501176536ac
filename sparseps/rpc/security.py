"""Authenticated, encrypted transport: ZeroMQ CURVE with a one-key ZAP allow-list.

One key pair per job. Every server-side socket of a job (parameter servers, the
rendezvous and control stores) is a CURVE server with the job's secret key; every client
socket is a CURVE client that expects the job's public key as the server key and presents
the job's own pair. A ZAP handler on each server context admits exactly one client key,
the job's public key, so only a holder of the job's *secret* key (CURVE proves possession)
gets past the handshake. libzmq accepts no message from a peer before its handshake and
ZAP reply succeed, so an unauthenticated peer cannot make a server buffer anything.

Keys live in a folder written by ``sparseps keys DIR``::

    DIR/            mode 0700
      job.public    mode 0600, 40 z85 characters + newline
      job.secret    mode 0600, 40 z85 characters + newline

Only the folder's path travels (``SPARSEPS_KEY_DIR``); keys never appear in argv or in
environment values.

Example::

    keys = JobKeys.load("keys/")
    security = Security(keys)
    with security.authenticator(context):     # before bind
        sock = context.socket(zmq.ROUTER)
        security.server_socket(sock)
        sock.bind("tcp://0.0.0.0:6000")
        ...
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import zmq
from zmq.utils import z85

from .. import env
from ..errors import ConfigError

__all__ = [
    "PUBLIC_FILE",
    "SECRET_FILE",
    "JobKeys",
    "Security",
    "ZapAuthenticator",
    "handshake_failed_events",
    "security_from_env",
    "security_from_key_dir",
    "write_job_keys",
]

log = logging.getLogger(__name__)

PUBLIC_FILE = "job.public"
SECRET_FILE = "job.secret"
ZAP_DOMAIN = "sparseps"
_ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27
_FIX = "create a fresh key folder with `sparseps keys DIR`"
_KEY_CHARS = 40  # z85 of a 32-byte curve25519 key


def _fail(path: Path, problem: str, fix: str = _FIX) -> ConfigError:
    return ConfigError(f"job keys {path}: {problem}; {fix}")


def _check_mode(path: Path, wanted: int, what: str) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise _fail(path, f"{what} does not exist") from None
    if what == "folder" and not stat.S_ISDIR(info.st_mode):
        raise _fail(path, "is not a folder")
    if what != "folder" and not stat.S_ISREG(info.st_mode):
        raise _fail(path, "is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode != wanted:
        raise _fail(
            path,
            f"{what} has mode {mode:04o}, must be {wanted:04o} (readable by its owner only)",
            f"run `chmod {wanted:o} {path}` or {_FIX}",
        )


def _read_key(path: Path) -> bytes:
    _check_mode(path, 0o600, "key file")
    text = path.read_bytes().strip()
    if len(text) != _KEY_CHARS:
        raise _fail(path, f"malformed key: expected {_KEY_CHARS} z85 characters, got {len(text)}")
    try:
        z85.decode(text)
    except Exception:  # z85 raises ValueError/KeyError on foreign characters
        raise _fail(path, "malformed key: not z85 text") from None
    return text


@dataclass(frozen=True)
class JobKeys:
    """The job's CURVE key pair (z85-encoded, as :func:`zmq.curve_keypair` returns).

    ``source`` is the folder the keys came from (named in errors); the secret never
    appears in ``repr``.
    """

    public: bytes
    secret: bytes = field(repr=False)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name in ("public", "secret"):
            value = getattr(self, name)
            if not isinstance(value, bytes) or len(value) != _KEY_CHARS:
                raise ConfigError(f"JobKeys.{name}: expected {_KEY_CHARS} z85 bytes")
        if zmq.curve_public(self.secret) != self.public:
            where = self.source or "JobKeys"
            raise ConfigError(
                f"job keys {where}: the public key does not belong to the secret key; {_FIX}"
            )

    @classmethod
    def load(cls, key_dir: str | os.PathLike) -> JobKeys:
        """Read the pair from ``key_dir``, refusing loose permissions.

        Raises:
            ConfigError: the folder is missing or not 0700, a file is missing, not 0600
                or malformed, or the two keys do not belong together (each names the path
                and how to fix it).
        """
        path = Path(key_dir).expanduser()
        _check_mode(path, 0o700, "folder")
        public = _read_key(path / PUBLIC_FILE)
        secret = _read_key(path / SECRET_FILE)
        return cls(public=public, secret=secret, source=str(path))


def write_job_keys(key_dir: str | os.PathLike, *, force: bool = False) -> JobKeys:
    """Create a fresh job key pair in ``key_dir`` (folder 0700, files 0600).

    Args:
        key_dir: the folder; created (with parents) if missing.
        force: replace keys already there (otherwise refuse).

    Raises:
        ConfigError: keys already exist (without ``force``), or the folder exists with
            a mode other than 0700 (it is not silently tightened: someone chose it).
    """
    path = Path(key_dir).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"job keys {path}: exists and is not a folder")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != 0o700:
            raise ConfigError(
                f"job keys {path}: folder has mode {mode:04o}, must be 0700; "
                f"run `chmod 700 {path}` or choose a new folder"
            )
        existing = [p for p in (path / PUBLIC_FILE, path / SECRET_FILE) if p.exists()]
        if existing and not force:
            raise ConfigError(
                f"job keys {path}: {existing[0].name} already exists; refusing to overwrite "
                "a job's keys (pass --force to replace them, which locks out every process "
                "still using the old ones)"
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        os.chmod(path, 0o700)  # mkdir's mode is masked by the umask
    public, secret = zmq.curve_keypair()
    for name, value in ((SECRET_FILE, secret), (PUBLIC_FILE, public)):
        target = path / name
        tmp = path / f".{name}.tmp"
        # O_EXCL on a private temp name, then rename: the secret is never readable by
        # others, not even for a moment, and a crash leaves no half-written key.
        if tmp.exists():
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, value + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    return JobKeys(public=public, secret=secret, source=str(path))


class ZapAuthenticator:
    """A ZAP handler thread that admits only the job's public key over CURVE.

    Our own ~50-line handler rather than :class:`zmq.auth.thread.ThreadAuthenticator`:
    that one runs an asyncio loop in its thread, supports address lists, PLAIN and cert
    folders we do not want, and logs every decision; here the whole policy is one
    comparison, the thread stops within one poll interval on :meth:`close`, and refusals
    are counted (:attr:`refused`) and logged at most once per second.
    """

    _POLL_MS = 100

    def __init__(self, context: zmq.Context, public_key: bytes) -> None:
        self._allowed = z85.decode(public_key)
        self._stop = threading.Event()
        self._context = context
        self.refused = 0
        self.admitted = 0
        self._last_log = 0.0
        self._sock = context.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(_ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._sock.close()
            raise ConfigError(
                f"a ZAP authenticator already runs on this zmq context ({exc}); start one "
                "per context"
            ) from None
        self._thread = threading.Thread(target=self._run, name="sparseps-zap", daemon=True)
        self._thread.start()
        _AUTHENTICATED[context] = self

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(self._POLL_MS):
                    self._answer(self._sock.recv_multipart())
        except zmq.ContextTerminated:  # pragma: no cover - close() stops us first
            pass
        finally:
            self._sock.close(linger=0)

    def _answer(self, msg: list[bytes]) -> None:
        # RFC 27 request: version, request id, domain, address, identity, mechanism, creds.
        if len(msg) < 6:
            log.error("malformed ZAP request (%d frames)", len(msg))
            version, request_id = (msg + [b"1.0", b""])[:2]
            self._sock.send_multipart([version, request_id, b"500", b"malformed", b"", b""])
            return
        version, request_id, _domain, address, _identity, mechanism = msg[:6]
        credentials = msg[6:]
        ok = mechanism == b"CURVE" and len(credentials) == 1 and credentials[0] == self._allowed
        if ok:
            self.admitted += 1
            self._sock.send_multipart([version, request_id, b"200", b"OK", b"job", b""])
            return
        self.refused += 1
        now = time.monotonic()
        if now - self._last_log > 1.0:
            self._last_log = now
            log.warning(
                "refused a %s peer from %s: not the job's key (%d refused so far)",
                mechanism.decode("ascii", "replace"), address.decode("ascii", "replace"),
                self.refused,
            )  # fmt: skip
        self._sock.send_multipart([version, request_id, b"400", b"not the job's key", b"", b""])

    def close(self) -> None:
        """Stop the handler thread (idempotent); call before terminating the context."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2.0)
        if _AUTHENTICATED.get(self._context) is self:
            del _AUTHENTICATED[self._context]

    def __enter__(self) -> ZapAuthenticator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# context -> its running authenticator; lets server_socket refuse a context without one.
_AUTHENTICATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Security:
    """Turns sockets into CURVE server or client sockets of one job."""

    def __init__(self, keys: JobKeys) -> None:
        if not isinstance(keys, JobKeys):
            raise ConfigError(f"Security: expected JobKeys, got {type(keys).__name__}")
        self.keys = keys

    @property
    def key_dir(self) -> str:
        """Where the keys came from (for error messages); empty if built in memory."""
        return self.keys.source

    def server_socket(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE server with the job secret (before bind).

        Raises:
            ConfigError: no :meth:`authenticator` runs on the socket's context (without
                one, libzmq would admit any client that knows the public key).
        """
        if sock.context not in _AUTHENTICATED:
            raise ConfigError(
                "Security.server_socket: start Security.authenticator(context) on this "
                "socket's context first"
            )
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)

    def client_socket(self, sock: zmq.Socket) -> None:
        """Make ``sock`` a CURVE client of a job server (before connect)."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)

    def authenticator(self, context: zmq.Context) -> ZapAuthenticator:
        """A started ZAP handler admitting only the job key; one per context, before bind."""
        return ZapAuthenticator(context, self.keys.public)

    def __repr__(self) -> str:
        return f"Security(key_dir={self.keys.source!r})"


def handshake_failed_events() -> int:
    """The socket-monitor event mask of failed handshakes (wrong key, wrong mechanism)."""
    return (
        zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )


def security_from_key_dir(key_dir: str | os.PathLike | None) -> Security | None:
    """A :class:`Security` for the keys in ``key_dir``; None (plain transport) if empty."""
    return Security(JobKeys.load(key_dir)) if key_dir else None


def security_from_env(environ=None) -> Security | None:
    """The transport security ``SPARSEPS_SECURE``/``SPARSEPS_KEY_DIR`` ask for, or None.

    Raises:
        ConfigError: the switch is malformed, the folder is not set, or its keys do not
            load (see :meth:`JobKeys.load`).
    """
    return security_from_key_dir(env.security_setting(environ))
