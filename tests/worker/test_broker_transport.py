"""The embedded broker writes whole message files only (the worker's consumer reads them)."""

from __future__ import annotations

from pathlib import Path

from control_plane.dispatch.celery_app import make_celery
from control_plane.dispatch.fs_transport import TMP_PREFIX, Transport


def test_filesystem_broker_uses_the_atomic_transport(tmp_path: Path) -> None:
    app = make_celery("filesystem://", tmp_path, 0.01)
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
        channel = conn.default_channel
        channel._put("q1", {"body": "x" * 10_000})
        out = tmp_path / "out"
        names = [p.name for p in out.iterdir()]
        assert len(names) == 1 and names[0].endswith(".q1.msg")
        assert not any(n.startswith(TMP_PREFIX) for n in names)
        # A temporary file mid-write is not a message of any queue.
        (out / f"{TMP_PREFIX}abc").write_bytes(b"")
        assert channel._get("q1") == {"body": "x" * 10_000}
    app.close()


def test_other_brokers_keep_their_own_transport(tmp_path: Path) -> None:
    app = make_celery("redis://127.0.0.1:6379/9")
    assert app.conf.broker_transport is None
    app.close()
