"""State names for replicas and calls, and which are final. Drawn in ``db.models``."""

from __future__ import annotations

# ``expired``: the deadline passed while the call was still queued (it never started);
# ``timeout``: it passed after the call was dispatched or while it ran.
FINAL_CALL_STATES = ("succeeded", "failed", "timeout", "cancelled", "expired")
DEADLINE_CALL_STATES = ("timeout", "expired")
NON_FINAL_CALL_STATES = ("queued", "dispatched", "running")
IN_FLIGHT_CALL_STATES = ("dispatched", "running")

LIVE_REPLICA_STATES = ("pending", "starting", "ready")
ENDED_REPLICA_STATES = ("stopped", "failed")
