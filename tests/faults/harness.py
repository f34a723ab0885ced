"""The chaos harness: a prober sending calls while a fault is done, and the ledger.

The ledger is the suite's one guarantee, checked after every fault: every
call the API accepted (it answered a call id) ends in exactly one final
state, ran at most ``retries + 1`` times, and none is left queued,
dispatched or running. It reads the calls from the database the control
plane writes, so a call the database holds but no client heard of counts too.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from control_plane.services.states import FINAL_CALL_STATES
from tests.e2e.stack import Stack


@dataclass
class Prober:
    """Sends one asynchronous call every ``every_s`` until stopped, noting each answer.

    ``accepted`` are call ids the API handed out; ``refused`` maps status code
    (or the transport error's class name) to how many; a 503 must carry
    ``Retry-After``, which ``missing_retry_after`` counts when it does not.
    """

    stack: Stack
    function: str
    every_s: float = 0.2
    sync: bool = False  # wait for each call (warm calls then take the fast path)
    body: dict[str, Any] = field(default_factory=lambda: {"input": {"probe": True}})
    accepted: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    missing_retry_after: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)

    def _run(self) -> None:
        with self.stack.client(timeout_s=10) as c:
            while not self._stop.is_set():
                self.send_one(c)
                self._stop.wait(self.every_s)

    def send_one(self, c: httpx.Client) -> None:
        url = f"/v1/functions/{self.function}/invoke"
        headers = {} if self.sync else {"Prefer": "respond-async"}
        try:
            r = c.post(url, json=self.body, headers=headers)
        except httpx.HTTPError as exc:
            self.refused[type(exc).__name__] += 1
            return
        call_id = r.headers.get("X-Thaw-Call-Id")
        if call_id and (self.sync or r.status_code == 202):  # a sync call may end failed
            self.accepted.append(call_id)
            return
        self.refused[str(r.status_code)] += 1
        if r.status_code == 503 and "Retry-After" not in r.headers:
            self.missing_retry_after += 1


@dataclass(frozen=True)
class CallRecord:
    id: str
    function: str
    status: str
    attempt: int
    retries: int
    error: str | None


def db_rows(stack: Stack, sql: str, **params: Any) -> list[Any]:
    """The rows ``sql`` selects from the control plane's database."""
    engine = create_engine(stack.backend.database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql), params).all())
    finally:
        engine.dispose()


def db_value(stack: Stack, sql: str, **params: Any) -> Any:
    """The single value ``sql`` selects (exactly one row)."""
    [row] = db_rows(stack, sql, **params)
    return row[0]


def db_calls(stack: Stack) -> dict[str, CallRecord]:
    """Every call the control plane recorded, read from its database."""
    rows = db_rows(stack, "SELECT id, function, status, attempt, retries, error FROM calls")
    return {r[0]: CallRecord(*r) for r in rows}


def settle(stack: Stack, timeout_s: float = 90.0) -> dict[str, CallRecord]:
    """Wait until no recorded call is still queued, dispatched or running."""
    deadline = time.monotonic() + timeout_s
    while True:
        calls = db_calls(stack)
        open_calls = [c for c in calls.values() if c.status not in FINAL_CALL_STATES]
        if not open_calls:
            return calls
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{len(open_calls)} calls stuck after {timeout_s:g} s, e.g. {open_calls[:3]}\n"
                f"{stack.logs()}"
            )
        time.sleep(0.2)


def check_ledger(
    stack: Stack,
    accepted: list[str],
    *,
    runs_dir: Path | None = None,
    counted: list[str] | None = None,
    settle_s: float = 90.0,
) -> dict[str, CallRecord]:
    """Assert the guarantees over every call; returns the settled calls by id.

    With ``runs_dir`` (the functions' ``RUNS_DIR``), executions are counted
    from the files the function itself wrote, one line per run.
    """
    calls = settle(stack, settle_s)
    missing = [cid for cid in accepted if cid not in calls]
    assert not missing, f"accepted calls the database lost: {missing[:5]}"
    assert len(set(accepted)) == len(accepted), "one call id was handed out twice"
    counted_ids = set(accepted if counted is None else counted)
    for c in calls.values():
        assert 1 <= c.attempt <= c.retries + 1, f"{c} ran more attempts than retries + 1"
        if runs_dir is not None and c.id in counted_ids:
            runs = _runs(runs_dir, c.id)
            assert runs <= c.retries + 1, f"{c} executed {runs} times"
            if c.status == "succeeded":
                assert runs >= 1, f"{c} succeeded without running"
    return calls


def _runs(runs_dir: Path, call_id: str) -> int:
    path = runs_dir / call_id
    return len(path.read_text().splitlines()) if path.exists() else 0


def statuses(calls: dict[str, CallRecord], ids: list[str] | None = None) -> Counter[str]:
    chosen = calls.values() if ids is None else [calls[i] for i in ids]
    return Counter(c.status for c in chosen)
