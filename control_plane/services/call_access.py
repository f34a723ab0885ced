"""Who may see a call: the key that made it, and admin keys.

Any other key, whatever its scopes, hears what it would hear for an id that
does not exist (``no call 'ID'``, 404): a call's id tells a key that may not
see the call nothing, not even that it exists. Listing follows the same rule:
an admin key lists every call, any other key only its own.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import select
from sqlalchemy.orm import Session

from control_plane.db.models import Call, Replica, Worker
from control_plane.errors import NotFoundError
from control_plane.services import calls
from control_plane.services.calls import CallView
from control_plane.services.keys import Principal

MAX_LISTED_CALLS = 500


def owner_seen_by(who: Principal) -> str | None:
    """The key whose calls ``who`` may see; None: every key's (an admin key)."""
    return None if "admin" in who.scopes else who.key_id


def require_visible(who: Principal, call_id: str, owner_key_id: str) -> None:
    """Raise ``NotFoundError``, as for a missing call, unless ``who`` may see it."""
    if owner_seen_by(who) not in (None, owner_key_id):
        raise NotFoundError(f"no call {call_id!r}")


def visible_call(session: Session, who: Principal, call_id: str) -> CallView:
    """The call ``call_id`` if ``who`` may see it; ``NotFoundError`` otherwise."""
    row = calls.get_row(session, call_id)
    require_visible(who, call_id, row.api_key_id)
    return with_workers(session, [calls.view(row)])[0]


def list_visible(
    session: Session, who: Principal, function: str | None, limit: int
) -> list[CallView]:
    """The latest calls ``who`` may see (of ``function``, when given), newest first."""
    query = select(Call)
    if function is not None:
        query = query.where(Call.function == function)
    owner = owner_seen_by(who)
    if owner is not None:
        query = query.where(Call.api_key_id == owner)
    capped = max(1, min(limit, MAX_LISTED_CALLS))
    rows = session.scalars(query.order_by(Call.accepted_at.desc()).limit(capped)).all()
    return with_workers(session, [calls.view(r) for r in rows])


def with_workers(session: Session, views: list[CallView]) -> list[CallView]:
    """``views`` with ``worker`` set to the name of each one's replica's worker."""
    replica_ids = {v.replica_id for v in views if v.replica_id is not None}
    if not replica_ids:
        return views
    rows = session.execute(
        select(Replica.id, Worker.name, Worker.id)
        .join(Worker, Worker.id == Replica.worker_id)
        .where(Replica.id.in_(replica_ids))
    ).all()
    names = {replica_id: name or worker_id for replica_id, name, worker_id in rows}
    return [dataclasses.replace(v, worker=names.get(v.replica_id or "")) for v in views]
