"""The replica child process: ``python -m worker.replica_child --fd N --device D``.

It starts generic (Python, torch, the device context, and the ``--preload``
modules such as transformers and peft), says ``hello`` on the inherited
socket, and waits. A pooled process is then told to ``prepare`` its weight
loader (store client, caches, staging buffers) while it waits. A
``specialize`` message turns it into one function's replica
(``worker.specialize``); after ``ready`` it serves calls, on a pool of
threads as large as the function's target concurrency, until ``shutdown``
or until the socket closes (its agent is gone), when it exits at once.
See ``worker.child_protocol``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from worker.call_cancel import CallCancelled, RunningCalls
from worker.pushed_calls import PushOut, StepFrames

T_ENTRY_S = time.time()  # as early as possible: process_start ends here
REPLICA_LOST_EXIT_CODE = 75  # EX_TEMPFAIL: the function raised sdk.ReplicaLost
# Call threads of a replica told no target concurrency (an older agent).
UNCAPPED_CALLS = 256


def _generic_start(
    device: str, spawned_at: float, preload: tuple[str, ...] = ()
) -> dict[str, float]:
    """Import torch and the ``preload`` modules, initialise the device; return the phases."""
    phases = {"process_start": max(0.0, (T_ENTRY_S - spawned_at) * 1000)}
    t0 = time.perf_counter()
    import_libraries(preload)
    phases["imports"] = (time.perf_counter() - t0) * 1000
    phases["device_init"] = init_device(device)
    return phases


def import_libraries(preload: tuple[str, ...] = ()) -> None:
    """torch, the replica's own modules, and the ``preload`` modules that are installed."""
    import importlib.util

    import torch  # noqa: F401

    import worker.specialize  # noqa: F401  (its imports are the replica's, not the user's)

    for name in preload:  # the functions' heavy libraries, where installed
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
            warm = LIBRARY_WARMUPS.get(name)
            if warm is not None:
                warm()


def _warm_transformers() -> None:
    """Build transformers' checkpoint conversion table now: its first use (PEFT
    wrapping a model, ``from_pretrained``) compiles ~900 regular expressions,
    ~170 ms of a cold start's ``user_setup`` on two CPUs. It is cached module-wide."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # another transformers version: nothing to warm
        return
    get_checkpoint_conversion_mapping("llama")


# First-use work of a preloaded library, done where it is imported (the zygote,
# or a spawned generic process) instead of in every replica's setup.
LIBRARY_WARMUPS = {"transformers": _warm_transformers}


def init_device(device: str) -> float:
    """Create the device's context now, not on the first tensor; the milliseconds it took."""
    import torch

    t0 = time.perf_counter()
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("this replica was asked for CUDA but torch sees no CUDA device")
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000


def serve_generic(sock: socket.socket, device: str, phases: dict[str, float]) -> int:
    """Say ``hello`` with the generic start's phases and serve until told to stop."""
    from worker.child_protocol import Hello, dump
    from worker.frames import FrameSocket

    conn = FrameSocket(sock)
    conn.send(dump(Hello(pid=os.getpid(), device=device, phases_ms=phases)))
    ChildServer(conn, device).serve()
    return 0


class ChildServer:
    """Serves one replica's calls over the agent's socket."""

    def __init__(self, conn: Any, device: str = "cpu") -> None:
        from worker.frames import FrameSocket

        self.conn: FrameSocket = conn if isinstance(conn, FrameSocket) else FrameSocket(conn)
        self.replica: Any = None
        self.device = device
        self.loader: Any = None  # a WeightLoader built by ``prepare``
        self.batcher: Any = None  # a worker.batcher.Batcher when the function is batched
        # The threads calls run on, as many as the function's target concurrency: calls
        # beyond it wait here for one, so ``__call__`` never runs on more threads than
        # the SDK promises (sdk.py). Made at specialize and kept between calls: a new
        # thread per call was about a sixth of the replica's CPU for a no-op call.
        self.calls: ThreadPoolExecutor | None = None
        self.running = RunningCalls()  # whose function runs on which thread: cancels
        # A function that pushes its streamed chunks step by step: their frames
        self.step_frames: StepFrames | None = None

    def serve(self) -> None:
        from worker.child_protocol import (
            TO_CHILD,
            CallMsg,
            CancelCall,
            Ping,
            Pong,
            Prepare,
            Shutdown,
            Specialize,
            dump,
        )
        from worker.frames import PeerClosedError

        while True:
            try:
                msg = TO_CHILD.validate_python(self.conn.recv())
            except PeerClosedError:
                return  # the agent is gone: so are we
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, Ping):  # answered here, whatever the call threads do
                self.conn.send(dump(Pong(seq=msg.seq)))
            elif isinstance(msg, CancelCall):
                self.running.cancel(msg.call_id)  # a batched call ends with its batch
            elif isinstance(msg, Prepare):
                self._prepare(msg)
            elif isinstance(msg, Specialize):
                self._specialize(msg)
            elif isinstance(msg, CallMsg) and self.batcher is not None:
                self.batcher.submit(msg)
            elif isinstance(msg, CallMsg) and self.calls is not None:
                self.calls.submit(self._run_call, msg)  # the wait is not the call's execution
            elif isinstance(msg, CallMsg):
                self._run_call(msg)  # not specialized: answered at once with an error

    def _prepare(self, msg: Any) -> None:
        """Build the weight loader and its staging buffers before any spec arrives."""
        from worker.artifacts import WeightLoader, open_registry
        from worker.child_protocol import Prepared, SetupFailed, dump
        from worker.preimport import import_ahead
        from worker.specialize import format_error

        t0 = time.perf_counter()
        try:
            loader = WeightLoader(open_registry(msg.store), msg.store)
            loader.prewarm(self.device, msg.host_bytes)
        except Exception as exc:
            self.conn.send(dump(SetupFailed(error=format_error(exc))))
            return
        self.loader = loader
        phases = {"loader_prepare": (time.perf_counter() - t0) * 1000}
        t0 = time.perf_counter()
        import_ahead(msg.imports)
        phases["import_ahead"] = (time.perf_counter() - t0) * 1000
        self.conn.send(dump(Prepared(phases_ms=phases)))

    def _specialize(self, msg: Any) -> None:
        from worker.child_protocol import Ready, SetupFailed, dump
        from worker.engine_report import reporter_for
        from worker.specialize import SpecializeError, specialize

        if self.replica is not None:
            self.conn.send(dump(SetupFailed(error="this process is already specialized")))
            return
        try:
            self.replica = specialize(msg.spec, self.loader)
            self.step_frames = self._step_frames(self.replica)
            if msg.spec.max_batch_size is not None:
                self.batcher = self._batcher(msg.spec.max_batch_size, msg.spec.max_wait_ms)
            else:
                self.calls = ThreadPoolExecutor(
                    msg.spec.max_concurrent_calls or UNCAPPED_CALLS, thread_name_prefix="thaw-call"
                )
        except SpecializeError as exc:
            self.conn.send(dump(SetupFailed(error=str(exc), phases_ms=exc.phases_ms)))
            return
        finally:
            if self.loader is not None:  # what the start's loads did not use
                self.loader.give_back_host_memory()
        ready = Ready(
            phases_ms=self.replica.phases_ms, loads=self.replica.loads, imports=self.replica.imports
        )
        self.conn.send(dump(ready))
        # an LLM replica's engine load; an engine that cannot run again ends the replica
        reporter_for(self.replica.instance, self.conn.send, on_lost=_exit_lost)

    def _step_frames(self, replica: Any) -> StepFrames | None:
        """A function that pushes its streamed chunks step by step (an LLM function:
        ``worker.pushed_calls``) gets the frames its steps are sent in; None otherwise."""
        instance = replica.instance
        if not (replica.pass_call_context and hasattr(instance, "push_call")):
            return None
        frames = StepFrames(self.conn.send_frame)
        instance.add_step_listener(frames.flush)
        return frames

    def _batcher(self, max_batch_size: int, max_wait_ms: float) -> Any:
        """Calls of a batched function go through ``batch()``, gathered by a Batcher."""
        from worker.batch_calls import BatchRunner
        from worker.batcher import Batcher

        runner = BatchRunner(self.replica, self.conn.send, self._adapter, self._loaded_adapters)
        return Batcher(runner.run, max_batch_size, max_wait_ms / 1000, key=lambda m: m.adapter)

    def _run_call(self, msg: Any) -> None:
        from worker import log_guard
        from worker.child_protocol import CallError, Result, dump
        from worker.sdk import CallContext, ReplicaLost, function_token_gaps, function_usage
        from worker.specialize import format_error

        log_guard.start_call()  # its thread ran other calls before: their output is theirs
        t0 = time.perf_counter()
        call = CallContext(msg.call_id, msg.adapter, msg.attempt, msg.stream)
        timings: dict[str, float] = {}
        hit: bool | None = None
        try:
            if self.replica is None:
                raise RuntimeError("call received before the replica was specialized")
            with self._adapter(msg.adapter) as use:
                if use is not None:
                    hit = use.hit
                    timings["adapter_load"] = use.load_ms
                result = self._execute_cancellable(msg, call, t0, timings)
            timings["execution"] = (time.perf_counter() - t0) * 1000 - timings.get(
                "adapter_load", 0.0
            )
            timings.setdefault("first_output", (time.perf_counter() - t0) * 1000)
            out = Result(
                call_id=msg.call_id,
                output=result,
                timings_ms=timings,
                adapter_hit=hit,
                usage=function_usage(call.usage),
                token_gaps_ms=function_token_gaps(call.token_gaps_ms),
            )
            out.loaded_adapters = self._loaded_adapters(msg.adapter)
            self.conn.send(dump(out))
            if self.replica.profile is not None:
                self.replica.profile.save_once()  # after the answer: off the caller's clock
        except (Exception, CallCancelled) as exc:
            timings["execution"] = (time.perf_counter() - t0) * 1000
            cancelled = isinstance(exc, CallCancelled)
            self.running.leave(msg.call_id)  # again: it may have arrived inside leave()
            error = "cancelled: its deadline passed" if cancelled else format_error(exc)
            err = CallError(
                call_id=msg.call_id,
                error=error,
                timings_ms=timings,
                adapter_hit=hit,
                cancelled=cancelled,
                usage=function_usage(call.usage),  # the tokens it used before it ended
                token_gaps_ms=function_token_gaps(call.token_gaps_ms),
            )
            err.loaded_adapters = self._loaded_adapters(msg.adapter)
            self.conn.send(dump(err))
            if isinstance(exc, ReplicaLost):
                _exit_lost(exc)

    def _loaded_adapters(self, named: str | None) -> list[str] | None:
        """Every adapter held now, after a call that named one (the only kind that
        loads or evicts); None otherwise, or when there is no adapter cache."""
        replica = self.replica
        if named is None or replica is None or replica.adapters is None:
            return None
        return list(replica.adapters.loaded())

    def _adapter(self, name: str | None) -> Any:
        """Hold the call's adapter loaded (``AdapterUse``), or None: no adapter or no cache."""
        if name is None or self.replica.adapters is None:
            return contextlib.nullcontext(None)
        return self.replica.adapters.use(name)

    def _execute_cancellable(
        self, msg: Any, call: Any, t0: float, timings: dict[str, float]
    ) -> Any:
        """``_execute`` while a cancel of the call may raise ``CallCancelled`` in it
        (``worker.call_cancel``); raises it at once when the call was cancelled first."""
        if not self.running.enter(msg.call_id):
            raise CallCancelled
        try:
            return self._execute(msg, call, t0, timings)
        finally:
            self.running.leave(msg.call_id)

    def _execute(self, msg: Any, call: Any, t0: float, timings: dict[str, float]) -> Any:
        """Run the function (``call``: its ``CallContext``); stream or collect what it
        yields. The result is JSON."""
        from worker.sdk import function_timings

        args: tuple[Any, ...] = (msg.input,)
        if self.replica.pass_call_context:
            args += (call,)
        try:
            if msg.stream and self.step_frames is not None:
                out = PushOut(self.step_frames, partial(_output_frame, msg.call_id), t0, timings)
                self.replica.instance.push_call(msg.input, call, out)
                return None
            return self._collect(self.replica.instance(*args), msg, t0, timings)
        finally:  # the function's own phases, also when it failed
            for name, ms in function_timings(call.timings_ms).items():
                timings.setdefault(name, ms)

    def _collect(self, result: Any, msg: Any, t0: float, timings: dict[str, float]) -> Any:
        from worker.sdk import is_stream

        if is_stream(result):
            chunks = []
            for chunk in result:
                if msg.stream:
                    frame = _output_frame(msg.call_id, chunk)
                    timings.setdefault("first_output", (time.perf_counter() - t0) * 1000)
                    self.conn.send_frame(frame)
                else:
                    _check_json(chunk)
                    timings.setdefault("first_output", (time.perf_counter() - t0) * 1000)
                    chunks.append(chunk)
            result = None if msg.stream else chunks
        _check_json(result)
        return result


def _exit_lost(exc: BaseException) -> None:
    """The function said this replica can answer nothing again (``sdk.ReplicaLost``),
    after its call's error went out: exit, so the worker reports the replica failed
    and a new one takes the next call instead of this one failing it."""
    print(f"replica lost, exiting: {exc}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(REPLICA_LOST_EXIT_CODE)


def _output_frame(call_id: str, chunk: Any) -> bytes:
    """A streamed chunk's ``Output`` frame, encoded once, which checks it is JSON too.
    A chunk with NaN or an infinity takes pydantic's JSON mode, which makes them null."""
    from worker.frames import encode_frame

    try:
        return encode_frame({"type": "output", "call_id": call_id, "chunk": chunk}, allow_nan=False)
    except (TypeError, ValueError):
        from worker.child_protocol import Output, dump

        _check_json(chunk)  # the function's error, if it is not JSON at all
        return encode_frame(dump(Output(call_id=call_id, chunk=chunk)))


def _check_json(value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"the function produced a {type(value).__name__}, which is not JSON ({exc}); "
            "return or yield dict, list, str, int, float, bool or None"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="worker.replica_child")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket fd")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--spawned-at", type=float, default=T_ENTRY_S)
    parser.add_argument("--preload", default="", help="modules to import, comma-separated")
    args = parser.parse_args(argv)
    from control_plane import gil, heap

    gil.tune()
    sock = socket.socket(fileno=args.fd)
    preload = tuple(m for m in args.preload.split(",") if m)
    try:
        phases = _generic_start(args.device, args.spawned_at, preload)
    except Exception as exc:  # e.g. CUDA asked for on a machine without it
        report_start_failure(sock, exc)
        return 1
    heap.freeze()
    return serve_generic(sock, args.device, phases)


def report_start_failure(sock: socket.socket, exc: Exception) -> None:
    """Tell the agent why the generic start failed, instead of a bare exit."""
    from worker.child_protocol import SetupFailed, dump
    from worker.frames import FrameSocket
    from worker.specialize import format_error

    FrameSocket(sock).send(dump(SetupFailed(error=format_error(exc))))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: call threads may still be running user code,
    # and the agent already considers this replica gone.
    os._exit(code)
