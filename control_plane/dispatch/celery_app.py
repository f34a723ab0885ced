"""The one Celery app factory both sides use (control plane sends, worker consumes).

JSON only; late acks with reject-on-lost and prefetch 1, so a call whose
worker dies is redelivered rather than lost, and a busy worker does not
hoard messages. The embedded default broker is kombu's ``filesystem://``
transport (message files under ``<home>/broker``): the same Celery code path
as Redis or RabbitMQ, with no server to run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery

FILESYSTEM_SCHEME = "filesystem://"


def filesystem_transport_options(folder: Path, poll_interval_s: float) -> dict[str, Any]:
    """Folders for kombu's filesystem transport, created here."""
    out = folder / "out"
    processed = folder / "processed"
    control = folder / "control"  # kombu's default is ./control, relative to the cwd
    for d in (out, processed, control):
        d.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(out),
        "data_folder_out": str(out),
        "processed_folder": str(processed),
        "control_folder": str(control),
        "store_processed": False,
        "polling_interval": poll_interval_s,
    }


def make_celery(
    broker_url: str, broker_folder: Path | None = None, poll_interval_s: float = 0.05
) -> Celery:
    """A Celery app for ``broker_url``; ``broker_folder`` is needed for ``filesystem://``."""
    app = Celery("thaw", broker=broker_url, set_as_current=False)
    options: dict[str, Any] = {}
    transport: str | None = None
    if broker_url.startswith(FILESYSTEM_SCHEME):
        if broker_folder is None:
            raise ValueError("the filesystem:// broker needs a folder (Settings.broker_folder())")
        options = filesystem_transport_options(broker_folder, poll_interval_s)
        transport = "control_plane.dispatch.fs_transport:Transport"  # atomic message files
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        result_backend=None,
        broker_transport_options=options,
        broker_transport=transport,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_create_missing_queues=True,
    )
    return app
