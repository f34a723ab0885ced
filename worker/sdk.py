"""The function SDK: what a thaw function is, and what it is given.

A function is a class named by ``entry = "module:ClassName"`` in its
``thaw.toml``. The worker imports the module from the function's code
bundle, makes one instance per replica with no arguments, and then::

    class Generate:
        def setup(self, ctx: thaw.Context) -> None:
            # Runs once per replica, before it takes calls.
            # ctx.device   "cpu" or "cuda"
            # ctx.weights  {tensor name: torch.Tensor}, already streamed by the
            #              snapshotter onto ctx.device (None-free: {} without a model)
            # ctx.config   the model's config.json as a dict ({} without one)
            # ctx.files    a directory holding the model's small non-tensor files
            #              (tokenizer.json, generation_config.json, ...)
            # ctx.adapters {adapter name: Adapter(tensors, config)} for every LoRA
            #              adapter named in the spec, tensors on ctx.device
            with ctx.empty_weights():   # parameters on meta, buffers real
                model = LlamaForCausalLM(LlamaConfig.from_dict(ctx.config))
            ctx.fill_module(model)      # the weights become the parameters
            ...

        def load_adapter(self, adapter: thaw.Adapter) -> None:
            # Optional. A call named an adapter the spec does not list
            # (NAME:TAG as pushed with `thaw models push`): the worker fetched
            # it onto ctx.device and added it to ctx.adapters under that name;
            # add it to the model (PEFT: self.model = adapter.add_to(self.model)).
            ...

        def unload_adapter(self, name: str) -> None:
            # Optional. The adapter left ctx.adapters (LRU, THAW_ADAPTER_CACHE_SIZE
            # of them are kept; listed adapters never leave); drop it from the model.
            ...

        def __call__(self, input, call=None):
            # input: the request's JSON value.
            # call (optional second parameter): CallContext with call_id,
            #   adapter (the adapter name the request asked for, or None; when
            #   set, it is in ctx.adapters and load_adapter has seen it) and
            #   stream (whether the caller reads outputs as they are produced);
            #   a function that counts tokens sets call.usage["prompt_tokens"] and
            #   call.usage["completion_tokens"] (kept in the call's record).
            # Return a JSON value, or yield JSON values (a generator): a
            # streaming caller gets each as it is produced; any other caller
            # gets the list of them as the result.
            ...

A function whose ``thaw.toml`` has a ``[batching]`` table (``max_batch_size``,
``max_wait_ms``) is batched: instead of ``__call__`` it defines::

        def batch(self, inputs, calls=None):
            # inputs: the JSON inputs of up to max_batch_size calls, oldest first,
            #   gathered for at most max_wait_ms after the first arrived (a full
            #   batch goes at once); calls (optional): their CallContexts, in order.
            # Return a list with one JSON value per input, in order; an Exception
            # instance in it fails only that call. Or yield such lists to stream:
            # element i is call i's next chunk (None: no chunk for it this step;
            # an Exception: call i failed). Callers that do not stream get the
            # list of their chunks, or their value from a list the generator
            # returns at its end (``return [final value per input]``).
            ...

  Each call still has its own record, timings (``batch_wait`` among them),
  result and stream. Calls naming different adapters never share a batch
  (the batch's adapter is loaded while it runs). One batch runs at a time
  per replica; calls arriving meanwhile form the next one. ``batch`` raising,
  or returning a list of the wrong length, fails every call of the batch.

Contract:

- ``setup`` runs exactly once, on the replica's own process, before the
  first call; an exception in it fails the replica start (the error and its
  traceback tail are reported) and no call reaches ``__call__``.
- ``__call__`` runs on at most ``target_concurrency`` threads at once (the
  replica holds back the calls beyond it); above one, guard shared mutable
  state yourself. The threads are kept from call to call: what one call sets
  per thread (a ``threading.local``, torch's grad mode) the next call on that
  thread still sees.
- An exception in ``__call__`` ends that call as failed with the message
  and the tail of the traceback; the replica stays up and takes more calls.
  A ``ReplicaLost`` (raise it when this replica can answer nothing again: its
  device context is gone, its engine cannot start) ends the call failed and
  then the replica: its process exits, the worker reports it failed, and the
  next call starts a new replica instead of failing here.
- A call that runs past its timeout is cancelled: ``worker.call_cancel.CallCancelled``
  (a ``BaseException``, so ``except Exception`` does not catch it) is raised in
  its thread at the next Python line it runs, and its ``finally`` blocks run; code
  blocked in a native call stops when that returns. A replica that stops
  answering altogether (native code holding the GIL) is killed, and then no
  ``finally`` block runs.
- The weights dict is owned by the function from ``setup`` on: the worker
  keeps no other reference, so a model may adopt the tensors
  (``module.load_state_dict(ctx.weights, assign=True)``) without a copy.
- An adapter a call names stays loaded until that call ends; ``load_adapter``
  and ``unload_adapter`` run on call threads, one at a time, while other
  calls may be running, so guard the model's active adapter with a lock.
  An adapter the store does not have fails the call, saying so.
- Return values and yielded chunks must be JSON-serializable (dict, list,
  str, int, float, bool, None); anything else fails the call.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from control_plane.protocol import MAX_INT32, MAX_TOKEN_GAPS, TokenUsage

__all__ = [
    "Adapter",
    "CallContext",
    "Context",
    "Function",
    "ReplicaLost",
    "accepts_call_context",
    "is_stream",
]


class ReplicaLost(RuntimeError):
    """This replica can answer no call again: the call that raises it fails with its
    message, then the replica process exits (``worker.replica_child``)."""


@dataclass
class Adapter:
    """One LoRA adapter: its tensors (PEFT key names) and ``adapter_config.json``."""

    name: str
    tensors: dict[str, Any]
    config: dict[str, Any]

    def add_to(self, model: Any) -> Any:
        """``model`` with this adapter loaded too, in eval mode: wrapped in a PEFT
        ``PeftModel`` on the first adapter, added to it after (``set_adapter`` picks
        the one a call runs with)."""
        from peft import LoraConfig, PeftModel, set_peft_model_state_dict

        fields = LoraConfig.__dataclass_fields__
        config = LoraConfig(**{k: v for k, v in self.config.items() if k in fields})
        if isinstance(model, PeftModel):
            model.add_adapter(self.name, config)
        else:
            model = PeftModel(model, config, adapter_name=self.name)
        set_peft_model_state_dict(model, self.tensors, adapter_name=self.name)
        return model.eval()


@dataclass
class Context:
    """What ``setup`` receives. See the module docstring for each field."""

    device: str
    weights: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    files: Path | None = None
    adapters: dict[str, Adapter] = field(default_factory=dict)
    function: str = ""
    replica_id: str = ""
    # Set by the worker: told of every module filled, to record its first forward pass.
    on_fill: Callable[[Any], None] | None = field(default=None, repr=False)

    def empty_weights(self) -> AbstractContextManager[None]:
        """A context manager to build a model skeleton for ``fill_module`` in::

            with ctx.empty_weights():
                model = BertForSequenceClassification(config)

        Parameters are made on the meta device (no memory, no initialisation);
        buffers are made by the model's constructor, real, on the CPU: the
        non-persistent ones (position ids, rotary frequencies) are in no
        checkpoint, so this is where their values come from. Process-wide
        while the block runs (``snapshotter.skeleton``).
        """
        from snapshotter.skeleton import empty_weights

        return empty_weights()

    def fill_module(self, module: Any, *, strict: bool = True) -> Any:
        """Make ``weights`` the state of ``module``, built under ``empty_weights()``
        (or ``torch.device("meta")``).

        No initialisation and no copy: parameters become the streamed tensors;
        tied weights are re-tied; buffers the checkpoint lacks move to ``device``
        (rebuilt from the model's config when they were made on meta). Returns the
        snapshotter's ``ModuleLoadResult``. A tensor still on meta afterwards
        raises ``UnfilledTensorsError`` naming it, ``strict`` or not; with
        ``strict`` any other name mismatch raises ``StateDictMismatchError``.
        The first call's forward pass through it becomes the model's
        prefetch profile (its next cold start fetches those tensors first).
        """
        import torch

        from snapshotter.module_fill import fill_module

        device = torch.device(self.device)
        result = fill_module(module, self.weights, device, strict=strict)  # type: ignore[arg-type]
        if self.on_fill is not None:
            self.on_fill(module)
        return result


@dataclass(frozen=True)
class CallContext:
    """What ``__call__`` may receive as its second argument.

    ``timings_ms``: phases the function measures itself (say ``adapter_switch``),
    reported with the call's own timings (``Server-Timing``, the call record) once
    it returns. Names are lowercase ``[a-z0-9_]``, at most ``MAX_CALL_TIMINGS``,
    none of thaw's own (``RESERVED_TIMINGS``); others are dropped.

    ``usage``: a function that counts tokens (an LLM) sets
    ``call.usage["prompt_tokens"]`` and ``call.usage["completion_tokens"]``; they
    are reported with the call's end, also when it raised, and kept in its record
    (``usage`` in ``GET /v1/calls/{id}``). Both or neither: each a non-negative int
    (``function_usage``), else neither is reported. A call that timed out or was
    cancelled ends before its function stops, so it has none.

    ``token_gaps_ms``: such a function appends the gap before each output token
    after the first (ms); they feed the inter-token latency histogram
    (``function_token_gaps``: the first ``MAX_TOKEN_GAPS`` well-formed ones).
    """

    call_id: str
    adapter: str | None = None
    attempt: int = 1
    stream: bool = False
    timings_ms: dict[str, float] = field(default_factory=dict, compare=False)
    usage: dict[str, int] = field(default_factory=dict, compare=False)
    token_gaps_ms: list[float] = field(default_factory=list, compare=False)


MAX_CALL_TIMINGS = 16
RESERVED_TIMINGS = frozenset(
    {"queue_wait", "execution", "first_output", "total", "adapter_load", "batch_wait"}
    | {"control_plane", "schedule", "pool_acquire", "process_start", "imports", "device_init"}
    | {"weights_fetch", "weights_to_device", "adapters", "user_setup"}
)
_TIMING_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")


def function_timings(reported: dict[Any, Any]) -> dict[str, float]:
    """The well-formed entries of a function's ``CallContext.timings_ms`` (others dropped)."""
    out: dict[str, float] = {}
    for name, ms in reported.items():
        if len(out) >= MAX_CALL_TIMINGS:
            break
        ok_value = isinstance(ms, int | float) and not isinstance(ms, bool) and 0 <= ms < 1e9
        named = isinstance(name, str) and _TIMING_NAME.fullmatch(name) is not None
        if named and name not in RESERVED_TIMINGS and ok_value:
            out[name] = float(ms)
    return out


USAGE_NAMES = ("prompt_tokens", "completion_tokens")
MAX_TOKEN_COUNT = MAX_INT32  # what the call record holds (``protocol.Count``)


def function_usage(reported: dict[Any, Any]) -> TokenUsage | None:
    """The tokens a function counted in ``CallContext.usage``: both of ``USAGE_NAMES``
    as ints in ``[0, MAX_TOKEN_COUNT]``, other names dropped; None when either is
    missing or malformed (half a count would read as a complete one)."""
    counts: dict[str, int] = {}
    for name in USAGE_NAMES:
        n = reported.get(name)
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_TOKEN_COUNT:
            return None
        counts[name] = n
    return TokenUsage.model_validate(counts)


def function_token_gaps(reported: Any) -> list[float] | None:
    """The first ``MAX_TOKEN_GAPS`` of a function's ``CallContext.token_gaps_ms``,
    rounded to microseconds; None when it reported none or any is not a finite
    non-negative number (a partial list would skew the histogram)."""
    if not isinstance(reported, list) or not reported:
        return None
    gaps = reported[:MAX_TOKEN_GAPS]
    for ms in gaps:
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms < 1e9:
            return None
    return [round(float(ms), 3) for ms in gaps]


@runtime_checkable
class Function(Protocol):
    """The shape the worker expects; subclassing is optional."""

    def setup(self, ctx: Context) -> None: ...

    def __call__(self, input: Any, *args: Any) -> Any: ...


def accepts_call_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn(input, call)`` is allowed, i.e. it takes a second argument."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    has_var = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    return has_var or len(positional) >= 2


def is_stream(result: Any) -> bool:
    """Whether a return value is to be streamed chunk by chunk."""
    return inspect.isgenerator(result) or (
        isinstance(result, Iterator) and not isinstance(result, str | bytes | dict | list)
    )
