"""Sending work to workers: a small ``Dispatcher`` interface, one implementation per file.

Services call ``dispatcher.start_replica(worker_id, msg)`` and friends; only
``celery_dispatcher`` and ``celery_app`` import Celery.
"""

from control_plane.dispatch.base import Dispatcher

__all__ = ["Dispatcher"]
