"""Running one batch of calls through a function's ``batch`` method (in the child).

``BatchRunner.run`` is the ``worker.batcher.Batcher``'s callback: it calls
``instance.batch(inputs)`` (or ``batch(inputs, calls)`` when it takes a
second argument) once for the batch and answers every call on its own:

- a list, one value per input, in order: each call gets its value; an
  ``Exception`` instance in the list fails only that call;
- a generator of such lists: element i of each yielded list is the next
  chunk of call i (``None``: no chunk for it this step; an ``Exception``:
  call i failed, later chunks for it are dropped); a streaming caller gets
  its chunks as they come, any other caller the list of its chunks, or, when
  the generator returns a list (``return [...]``), its value from that list;
- an exception from ``batch`` itself, or a list of the wrong length, fails
  every call of the batch with that error.

Each call's timings carry ``batch_wait`` (how long it waited for its batch),
``execution`` (the batch's run) and ``first_output`` from its own arrival;
each answer carries ``batch_size`` and ``batch_index``, the tokens its function
counted on its ``CallContext`` (``usage``), and, for a batch that named an adapter,
``loaded_adapters`` (what the replica holds after it).

What a batch prints counts as one call's against ``THAW_MAX_LOG_BYTES_PER_CALL``
(``worker.log_guard``): every batch runs on the batcher's one thread, and each
starts that thread's count again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from worker import log_guard
from worker.child_protocol import CallEnd, CallError, CallMsg, Output, Result, dump
from worker.sdk import CallContext, accepts_call_context, function_usage, is_stream
from worker.specialize import format_error

Send = Callable[[dict[str, Any]], None]
Loaded = Callable[[str | None], list[str] | None]


class BatchError(Exception):
    """The function's ``batch`` broke the batch contract."""


class BatchRunner:
    def __init__(
        self,
        replica: Any,
        send: Send,
        adapter_use: Callable[[str | None], Any],
        loaded: Loaded | None = None,
    ) -> None:
        batch = replica.instance.batch  # worker.specialize checked it is there
        self._batch = batch
        self._pass_calls = accepts_call_context(batch)
        self._send = send
        self._adapter_use = adapter_use
        self._loaded = loaded

    def run(self, msgs: list[CallMsg], waits_ms: list[float]) -> None:
        """Run the batch and answer each call; never raises."""
        log_guard.start_call()  # the batches before it ran on this thread: their output is theirs
        t0 = time.perf_counter()
        n = len(msgs)
        calls = [CallContext(m.call_id, m.adapter, m.attempt, m.stream) for m in msgs]
        timings = [{"batch_wait": w} for w in waits_ms]
        hit: bool | None = None
        try:
            with self._adapter_use(msgs[0].adapter) as use:  # a batch shares its adapter
                if use is not None:
                    hit = use.hit
                    for t in timings:
                        t["adapter_load"] = use.load_ms
                outputs = self._execute(msgs, calls, t0, timings)
        except Exception as exc:
            error = format_error(exc)
            outputs = [_Failed(error)] * n
        execution_ms = (time.perf_counter() - t0) * 1000
        held = self._loaded(msgs[0].adapter) if self._loaded is not None else None
        for i, (call, out) in enumerate(zip(calls, outputs, strict=True)):
            t = timings[i]
            t["execution"] = execution_ms - t.get("adapter_load", 0.0)
            t.setdefault("first_output", t["batch_wait"] + execution_ms)
            self._answer(call, out, t, (hit, held), n, i)

    def _answer(
        self,
        call: CallContext,
        out: Any,
        t: dict[str, float],
        adapters: tuple[bool | None, list[str] | None],
        n: int,
        i: int,
    ) -> None:
        hit, held = adapters
        ended = CallEnd(
            call_id=call.call_id,
            timings_ms=t,
            adapter_hit=hit,
            loaded_adapters=held,
            batch_size=n,
            batch_index=i,
            usage=function_usage(call.usage),
        ).model_dump()
        if isinstance(out, _Failed | BaseException):
            error = out.error if isinstance(out, _Failed) else format_error(out)
            answer: CallError | Result = CallError(error=error, **ended)
        else:
            answer = Result(output=out, **ended)
        self._send(dump(answer))

    def _execute(
        self,
        msgs: list[CallMsg],
        calls: list[CallContext],
        t0: float,
        timings: list[dict[str, float]],
    ) -> list[Any]:
        inputs = [m.input for m in msgs]
        args: tuple[Any, ...] = (inputs,)
        if self._pass_calls:
            args += (calls,)
        result = self._batch(*args)
        if is_stream(result):
            return self._stream(msgs, result, t0, timings)
        outputs = list(_checked_step(result, len(msgs)))
        return [o if isinstance(o, BaseException) else _json(o) for o in outputs]

    def _stream(
        self, msgs: list[CallMsg], steps: Any, t0: float, timings: list[dict[str, float]]
    ) -> list[Any]:
        chunks: list[list[Any]] = [[] for _ in msgs]
        failed: dict[int, BaseException] = {}
        while True:
            try:
                step = next(steps)
            except StopIteration as stop:
                final = stop.value  # what the generator returned, if anything
                break
            for i, chunk in enumerate(_checked_step(step, len(msgs))):
                if isinstance(chunk, BaseException):
                    failed.setdefault(i, chunk)
                if chunk is None or i in failed:
                    continue
                self._chunk(msgs[i], _json(chunk), chunks[i], t0, timings[i])
        results = [None if m.stream else c for m, c in zip(msgs, chunks, strict=True)]
        if final is not None:  # the returned values answer the callers that did not stream
            values = _checked_step(final, len(msgs))
            results = [None if m.stream else v for m, v in zip(msgs, values, strict=True)]
            results = [v if isinstance(v, BaseException) else _json(v) for v in results]
        return [failed.get(i, r) for i, r in enumerate(results)]

    def _chunk(
        self, msg: CallMsg, chunk: Any, kept: list[Any], t0: float, timings: dict[str, float]
    ) -> None:
        timings.setdefault(
            "first_output", timings["batch_wait"] + (time.perf_counter() - t0) * 1000
        )
        if msg.stream:
            self._send(dump(Output(call_id=msg.call_id, chunk=chunk)))
        else:
            kept.append(chunk)


class _Failed:
    def __init__(self, error: str) -> None:
        self.error = error


def _checked_step(values: Any, n: int) -> list[Any]:
    if not isinstance(values, list | tuple) or len(values) != n:
        got = f"{len(values)} values" if isinstance(values, list | tuple) else type(values).__name__
        raise BatchError(
            f"batch() must return (or yield) a list with one value per input: {n} expected, "
            f"got {got}"
        )
    return list(values)


def _json(value: Any) -> Any:
    from worker.replica_child import _check_json

    _check_json(value)
    return value
