"""State names for replicas and calls, and which are final. Drawn in ``db.models``."""

from __future__ import annotations

FINAL_CALL_STATES = ("succeeded", "failed", "timeout", "cancelled")
NON_FINAL_CALL_STATES = ("queued", "dispatched", "running")
IN_FLIGHT_CALL_STATES = ("dispatched", "running")

LIVE_REPLICA_STATES = ("pending", "starting", "ready")
ENDED_REPLICA_STATES = ("stopped", "failed")
