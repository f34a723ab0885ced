"""The threads the invoke routes' blocking steps run on.

A synchronous call waits on one of them for its end (a warm one runs on its own);
the OpenAI routes accept their calls on them. A pool of their own costs a third of
anyio's per hop (no cancel scope, no limiter), on every request's way to its call.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.datastructures import State

from control_plane.api.routes.invoke import SYNC_THREADS

T = TypeVar("T")


def invoke_threads() -> ThreadPoolExecutor:
    """The app's pool (``app.state.invoke_threads``)."""
    return ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="thaw-invoke")


async def on_invoke_threads(state: State, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, blocking, on the app's invoke threads."""
    threads: ThreadPoolExecutor = state.invoke_threads
    return await asyncio.get_running_loop().run_in_executor(threads, functools.partial(fn, *args))
