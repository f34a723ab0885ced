"""A Dispatcher that fills ``StartReplica.secrets`` just before the message is sent.

The values are read from the database and decrypted here, at send time, so
they exist in clear only in the message to the worker (``services.secrets``).
A function that names a secret nobody has set cannot start: the send raises
``NotFoundError`` naming it, and the replica ends failed with that reason.
"""

from __future__ import annotations

from control_plane.db.session import Database
from control_plane.dispatch.base import Dispatcher
from control_plane.protocol import RunCall, StartReplica, StopReplica
from control_plane.services import secrets
from control_plane.settings import Settings


def secret_box(settings: Settings) -> secrets.SecretBox:
    """The control plane's key: THAW_SECRETS_KEY, else a key file under ``home``."""
    key = settings.secrets_key or secrets.key_from_file(settings.home / "secrets.key")
    return secrets.SecretBox(key)


class SecretsDispatcher(Dispatcher):
    def __init__(self, inner: Dispatcher, db: Database, box: secrets.SecretBox) -> None:
        self.inner = inner
        self.db = db
        self.box = box

    def start_replica(self, worker_id: str, msg: StartReplica) -> None:
        with self.db.session() as session:
            names = secrets.names_for(session, msg.function, msg.version)
            values = secrets.reveal(session, self.box, names, msg.function) if names else {}
        if values:
            msg = msg.model_copy(update={"secrets": values})
        self.inner.start_replica(worker_id, msg)

    def stop_replica(self, worker_id: str, msg: StopReplica) -> None:
        self.inner.stop_replica(worker_id, msg)

    def run_call(self, worker_id: str, msg: RunCall) -> None:
        self.inner.run_call(worker_id, msg)

    def close(self) -> None:
        self.inner.close()
