"""Function secrets: set by name, stored encrypted, handed to replicas only at start.

A secret (``thaw secrets set HF_TOKEN hf_...``) is stored in the ``secrets``
table encrypted with Fernet (AES-128-CBC + HMAC-SHA256) under the control
plane's key (``THAW_SECRETS_KEY``; embedded default: a key file made on first
use under ``home``, mode 0600). The API lists names and times, never values.

A function's spec names the secrets it needs (``secrets = ["HF_TOKEN"]``).
Their values are decrypted only when a ``StartReplica`` is sent
(``control_plane.dispatch.secrets``), travel in its typed ``secrets`` field,
and become environment variables of the replica process. They are never in a
bundle, an image, a spec or a call record; the worker redacts them from call
outputs and errors (``worker.call_guard``).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken
from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Function, FunctionVersion, Secret
from control_plane.errors import BadRequestError, NotFoundError
from control_plane.spec import FunctionSpec

NAME_PATTERN = r"^[A-Z_][A-Z0-9_]{0,127}$"
MAX_VALUE_BYTES = 64 << 10
_NAME = re.compile(NAME_PATTERN)


class SecretsKeyError(ValueError):
    """The configured key cannot be used, or cannot decrypt what is stored."""


@dataclass(frozen=True)
class SecretInfo:
    name: str
    created_at: float
    updated_at: float


class SecretBox:
    """Encrypts and decrypts secret values with one Fernet key."""

    def __init__(self, key: str | bytes) -> None:
        try:
            self._fernet = Fernet(key)
        except (ValueError, TypeError):
            raise SecretsKeyError(
                "THAW_SECRETS_KEY is not a Fernet key (32 url-safe base64 bytes); make one "
                'with `python -c "from cryptography.fernet import Fernet; '
                'print(Fernet.generate_key().decode())"`'
            ) from None

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(value.encode()).decode()

    def open(self, name: str, sealed: str) -> str:
        try:
            return self._fernet.decrypt(sealed.encode()).decode()
        except InvalidToken:
            raise SecretsKeyError(
                f"secret {name} cannot be decrypted with this THAW_SECRETS_KEY; run every "
                "control plane with the key it was set with, or set the secret again"
            ) from None


def key_from_file(path: Path) -> bytes:
    """The key in ``path``, made (mode 0600) when the file does not exist yet.

    A new key is written to a file of this process's and linked into place, so
    processes starting together never read a key half written: one link wins
    and every process uses its key.
    """
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Fernet.generate_key()
    mine = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(mine, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    try:
        os.link(mine, path)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_bytes().strip()
    finally:
        os.unlink(mine)
    return key


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise BadRequestError(
            f"secret name {name!r} is not valid; use an environment variable name: "
            "capital letters, digits and _, not starting with a digit (e.g. HF_TOKEN)"
        )
    return name


def set_secret(session: Session, box: SecretBox, name: str, value: str, now: float) -> SecretInfo:
    """Create or replace secret ``name``; replicas started from now on get the new value."""
    check_name(name)
    if not value or len(value.encode()) > MAX_VALUE_BYTES:
        raise BadRequestError(
            f"secret {name} must be 1 to {MAX_VALUE_BYTES} bytes; put larger material "
            "in the store and give the function a token to fetch it"
        )
    row = session.get(Secret, name)
    if row is None:
        row = Secret(name=name, created_at=now)
        session.add(row)
    row.sealed_value = box.seal(value)
    row.updated_at = now
    session.flush()
    return _info(row)


def list_secrets(session: Session) -> list[SecretInfo]:
    return [_info(r) for r in session.scalars(select(Secret).order_by(Secret.name))]


def delete_secret(session: Session, name: str) -> None:
    row = session.get(Secret, name)
    if row is None:
        raise NotFoundError(f"no secret {name!r}; list them with `thaw secrets ls`")
    session.delete(row)


def require_set(session: Session, names: Iterable[str], function: str) -> None:
    """Refuse (400) a deploy of ``function`` naming a secret that is not set."""
    wanted = sorted(set(names))
    if not wanted:
        return
    found = set(session.scalars(select(Secret.name).where(Secret.name.in_(wanted))))
    missing = [n for n in wanted if n not in found]
    if missing:
        raise BadRequestError(
            f"function {function} lists secret(s) {', '.join(missing)} that are not set; "
            f"set them with `thaw secrets set {missing[0]} VALUE`, then deploy again"
        )


def reveal(session: Session, box: SecretBox, names: Iterable[str], function: str) -> dict[str, str]:
    """The values of ``names`` for a replica of ``function``. Raises ``NotFoundError``
    naming every missing secret."""
    wanted = sorted(set(names))
    rows = {r.name: r for r in session.scalars(select(Secret).where(Secret.name.in_(wanted)))}
    missing = [n for n in wanted if n not in rows]
    if missing:
        raise NotFoundError(
            f"function {function} needs secret(s) {', '.join(missing)} that are not set; "
            f"set them with `thaw secrets set NAME VALUE`"
        )
    return {n: box.open(n, rows[n].sealed_value) for n in wanted}


def names_for(session: Session, function: str, version: int) -> list[str]:
    """The secret names version ``version`` of ``function`` asks for (none if it is gone)."""
    spec_json = session.scalars(
        select(FunctionVersion.spec_json)
        .join(Function, Function.id == FunctionVersion.function_id)
        .where(Function.name == function, FunctionVersion.version == version)
    ).first()
    return FunctionSpec.model_validate_json(spec_json).secrets if spec_json else []


def _info(row: Secret) -> SecretInfo:
    return SecretInfo(row.name, row.created_at, row.updated_at)
