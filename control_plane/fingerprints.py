"""Where a process's broker and store are, told without credentials.

A worker sends these in its ``WorkerRegister`` (protocol v1.8); the control
plane compares them with its own and refuses a worker that would consume
another broker (its replicas would stay ``pending`` forever) or read another
store (its artifacts would be "missing"). A fingerprint keeps the scheme, host,
port and virtual host or database of a broker URL and drops user and password;
a store is its bucket and prefix (with the S3 endpoint) or its absolute path.

Hosts compare loosely where one side names a loopback address: a server
configured with ``localhost`` and a worker elsewhere naming the machine's
address reach the same broker, and no side can tell otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from control_plane.settings import Settings

_DEFAULT_PORTS = {"redis": 6379, "rediss": 6380, "amqp": 5672, "amqps": 5671}
_SCHEME_ALIASES = {"pyamqp": "amqp", "librabbitmq": "amqp"}
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", ""})


@dataclass(frozen=True)
class Fingerprint:
    broker: str
    store: str


def of_settings(settings: Settings) -> Fingerprint:
    """The broker and store ``settings`` name (what a worker or server would open)."""
    store = settings.store_config()
    return Fingerprint(
        broker_fingerprint(settings.broker_url_resolved(), settings.broker_folder()),
        store_fingerprint(store.url, store.s3.endpoint_url),
    )


def broker_fingerprint(url: str, folder: Path) -> str:
    """``scheme://host:port/vhost`` of a broker URL; ``filesystem://`` gets its folder."""
    first = url.split(";", 1)[0].strip()  # kombu's failover list: the first is primary
    parts = urlsplit(first)
    scheme = _SCHEME_ALIASES.get(parts.scheme, parts.scheme)
    if scheme == "filesystem":
        return f"filesystem://{folder.resolve()}"
    host = parts.hostname or "localhost"
    port = parts.port or _DEFAULT_PORTS.get(scheme)
    where = f"{host}:{port}" if port else host
    return f"{scheme}://{where}/{_vhost(scheme, parts.path)}"


def _vhost(scheme: str, path: str) -> str:
    rest = path[1:] if path.startswith("/") else path
    if scheme.startswith("redis"):
        return rest or "0"
    return rest or "/"


def store_fingerprint(url: str, s3_endpoint_url: str | None) -> str:
    """``s3://bucket/prefix @ endpoint`` or the store directory's absolute path."""
    url = url.strip()
    if url.startswith("s3://"):
        endpoint = urlsplit(s3_endpoint_url).netloc.rpartition("@")[2] if s3_endpoint_url else ""
        return f"{url.rstrip('/')} @ {endpoint or 'AWS'}"
    if url.startswith("file://"):
        url = url[len("file://") :]
    return str(Path(url).expanduser().resolve())


def differences(server: Fingerprint, worker: Fingerprint) -> list[str]:
    """What differs, one sentence each, naming both sides and the setting to fix."""
    out = []
    if not _same_broker(server.broker, worker.broker):
        out.append(
            f"its broker is {worker.broker} but the control plane's is {server.broker} "
            "(set THAW_BROKER_URL, or THAW_HOME for the filesystem:// broker, as the server has it)"
        )
    if server.store != worker.store:
        out.append(
            f"its store is {worker.store} but the control plane's is {server.store} "
            "(set THAW_STORE and THAW_S3_ENDPOINT_URL as the server has them)"
        )
    return out


def _same_broker(a: str, b: str) -> bool:
    if a == b:
        return True
    pa, pb = urlsplit(a), urlsplit(b)
    if pa.scheme != pb.scheme or pa.scheme == "filesystem":
        return False
    loose = pa.hostname in _LOOPBACK or pb.hostname in _LOOPBACK
    same_host = loose or pa.hostname == pb.hostname
    return same_host and pa.port == pb.port and pa.path == pb.path
