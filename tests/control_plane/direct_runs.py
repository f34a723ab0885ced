"""Pieces the tests of direct runs share: a dispatched call's row and its claim, and a
combiner whose first batch is held open until a burst piles up behind it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from control_plane.db.models import Call
from control_plane.protocol import RunCall
from control_plane.services import calls
from control_plane.services.combining import Combiner
from control_plane.services.context import Services
from control_plane.services.direct_calls import Claim

WAIT_S = 10.0


def dispatched_call(call_id: str, now: float) -> Call:
    """A row for a call of function ``f`` dispatched to replica ``r1`` at ``now``."""
    return Call(
        id=call_id,
        function="f",
        version=1,
        api_key_id="k",
        input_json="null",
        status="dispatched",
        replica_id="r1",
        accepted_at=now,
        timeout_s=60,
        deadline_at=now + 60,
    )


def claim_of(s: Services, call_id: str, *, stream: bool = False) -> Claim:
    """The claim of the dispatched call ``call_id``, its row detached, on a direct port."""
    with s.db.session() as session:
        row = calls.get_row(session, call_id)
        session.expunge(row)
    msg = RunCall(call_id=call_id, replica_id="r1", function="f", stream=stream, accepted_at=0.0)
    return Claim(call_id, "f", "w1", msg, s.clock() + 60, "127.0.0.1:1", "token", row)


class HeldBatches:
    """A combiner over ``run_batch`` that records each batch's size and holds the first
    batch until ``burst`` more items wait behind it (``WAIT_S`` at most)."""

    def __init__(
        self, run_batch: Callable[[Sequence[Any]], list[Any]], limit: int, burst: int
    ) -> None:
        self.run_batch = run_batch
        self.burst = burst
        self.sizes: list[int] = []
        self.combiner = Combiner(self._run, limit)

    def _run(self, items: Sequence[Any]) -> list[Any]:
        first = not self.sizes
        self.sizes.append(len(items))
        if first:
            deadline = time.monotonic() + WAIT_S
            while self.combiner.waiting < self.burst and time.monotonic() < deadline:
                time.sleep(0.01)
        return self.run_batch(items)
