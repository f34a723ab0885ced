"""One continuous-batching engine per replica: transformers' own manager
(``model.init_continuous_batching``, a paged KV cache), used as it is meant to be.

::

    call thread        generate(prompt) ─ add_request ─▶ manager (its generation thread
                                                          runs one batch step at a time;
                                                          a new request joins the running
                                                          batch at the next step)
    router thread      manager.get_result() ─ by request id ─▶ that call's queue
    call thread        ◀─ TokenStep per new token ─ its queue

    or pushed (``push``): the router hands each request's TokenStep to its sink, in the
    router thread, and after each batch of outputs (a step's) calls the step listeners,
    so no thread is woken per token (``worker.llm.function.LLMFunction.push_call``)
    a call that stops  cancel_request; the manager sends no final output for a
    early              cancelled request, so the engine ends that stream itself

On a GPU each step's forward, logits processing and sampling replay a CUDA graph
captured for the step's padded shape (transformers' ``use_cuda_graph``), the first time
a shape comes: queries padded to a multiple of ``GRAPH_Q_TOKENS``, the keys and values
read to a multiple of ``GRAPH_KV_TOKENS`` (or of 1/``GRAPH_KV_SHAPES`` of the cache, if
that is more), so a bounded set of graphs serves every batch. A small model's eager step
is Python launching kernels one by one (about 14 ms a step for a 76M model on an H200,
the GPU mostly idle); replayed, the step is the GPU's own time (4 ms at 8 streams).
transformers' own intervals pad the keys to 16,384 tokens and the queries to 64, which
with a masked attention (sdpa) cost more than the graphs save. Preparing the next step
while one runs (``use_async_batching``) made more tokens a second but a burst's first
tokens later (TTFT p50 at 32 streams 20 -> 71..133 ms): it stays off. A request to the
running manager probes the model at start (one that cannot batch at all is refused
there, not at its first call) and the graphs with it; a model whose forward cannot be captured (a
host sync, ``.item()``) runs eagerly, with a warning, and ``cuda_graphs`` off
(``EngineSizes``) runs every model so. After the probe, a shape's first step runs
eagerly and its graph is captured when it comes again (``CaptureGate``; torch's CUDA
graph trees also run a function eagerly once before recording it): requests that reach
the engine one by one make mixes of prefill and decode that may never come again, and
capturing one stalls the whole batch for two forwards. Figures: bench/README.md,
"Seventh run" and "Eighth run".

Off CUDA graphs a step makes an attention mask of its own size (``worker.llm.attention``):
with ``sdpa`` transformers keeps a dense mask as wide as the whole cache (1 GiB for a
small model's 256 MB cache), fills it when the batch starts and refills part of it every
step.

Sizes are explicit (``EngineSizes``): the KV cache gets ``kv_cache_bytes``, never
"most of free memory" (transformers' default without ``num_blocks`` is about 60 %
of the machine's RAM), and a batch holds at most ``max_num_seqs`` sequences and
``max_batch_tokens`` tokens.

Sampling is per request, in one batch: the manager is built with sampling on and
every warper present (temperature, top-k, top-p) in their per-request form, and
each request sets its own values. Greedy is top-k 1: the one token left is drawn
with certainty, so greedy output equals ``model.generate`` without sampling. A request
with a ``seed`` draws its tokens from its own stream (``seeded.SeededDraw``, last of
the warpers), so it is reproducible whatever shares the batch; the others draw from
the manager's one global RNG. Penalties (repetition, frequency, presence) and ``min_p``
are per request too (``penalties``): a greedy request with a repetition penalty
equals ``model.generate``'s greedy with it. A request may ask for the log
probability of each token it makes and of the most likely alternatives (``logprobs``):
they come with its tokens, taken from the raw logits of its rows only.
"""

from __future__ import annotations

import logging
import math
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from worker.llm.adapters import AdapterRouting
from worker.llm.logprobs import MAX_TOP_LOGPROBS, StepLogprobs, TokenLogprob
from worker.llm.prefix import install_prefix_cache, request_salt, salted_request_id
from worker.llm.threads import StepThreadRule, StepThreads, install_step_threads
from worker.sdk import ReplicaLost

FinishReason = Literal["stop", "length"]
SEED_LIMIT = 2**63  # exclusive: OpenAI's seed is a signed 64-bit integer
# Tokens one request's logit bias may name: each step builds its index from them.
MAX_LOGIT_BIAS = 1024
_ROUTER_POLL_S = 0.05
_WAKE_S = 0.1
# A temperature above 0 but below this is taken as this (as vLLM does): the manager
# keeps temperatures in float32, where 1e-300 is 0 and 1e-40 overflows the scores,
# and one request's nan or inf probabilities stop the batch's generation loop.
MIN_TEMPERATURE = 0.01
GRAPH_Q_TOKENS = 16  # a graphed step's query tokens are padded to a multiple of this
GRAPH_KV_TOKENS = 256  # the keys and values it reads, likewise, at least
GRAPH_KV_SHAPES = 32  # at most this many key lengths for the whole cache
GRAPH_CAPTURE_AT = 2  # a step shape's graph is captured when it comes this many times
_RESTART_STOP_S = 10.0  # for a stopped loop's thread to end before a new one starts
_RESTART_POLL_S = 0.01
_IDLE_POLL_S = 0.002
_PROBE_S = 120.0  # the start's probe request: the first captures take a few seconds

log = logging.getLogger(__name__)


class EngineError(RuntimeError):
    """The engine could not take or finish a request (the message says why)."""


class EngineDeadError(EngineError, ReplicaLost):
    """The generation loop stopped on a failed step and could not start again: no call
    can be answered here (the replica exits after this call, ``sdk.ReplicaLost``)."""


@dataclass(frozen=True)
class EngineSizes:
    max_num_seqs: int = 8  # sequences in one batch: a replica's target concurrency
    max_batch_tokens: int = 512  # tokens one step processes (prefill chunks included)
    kv_cache_bytes: int = 64 << 20
    page_size_tokens: int = 64
    # Reuse the KV blocks of a prompt prefix already computed (transformers' block
    # sharing), keyed by the tokens and the request's adapter load
    # (``worker.llm.prefix``).
    share_prefixes: bool = True
    # On a CUDA device, steps replay CUDA graphs (see the module docstring); off, or on
    # any other device, each step runs eagerly.
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_batch_tokens < 1 or self.page_size_tokens < 4:
            raise ValueError(f"engine sizes out of range: {self}")


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token holds across every layer."""
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    return 2 * layers * heads * head_dim * torch.finfo(dtype).bits // 8


def kv_blocks(config: Any, dtype: torch.dtype, sizes: EngineSizes) -> int:
    """Blocks of ``page_size_tokens`` tokens (every layer's keys and values) that fit
    in ``kv_cache_bytes``; at least one."""
    per_block = kv_bytes_per_token(config, dtype) * sizes.page_size_tokens
    return max(1, sizes.kv_cache_bytes // per_block)


def sequence_tokens(manager: Any) -> int | None:
    """The most tokens one sequence may hold in the started ``manager``'s KV cache (its
    prompt and each token fed back: all but the last made), or None where no layer
    bounds it (sliding windows only). A sequence past it can never be scheduled, and
    transformers then fails the whole batch and stops its loop."""
    from transformers.generation.continuous_batching.cache_allocators.full_attention import (
        FullAttentionCacheAllocator,
    )
    from transformers.generation.continuous_batching.cache_allocators.sliding_attention import (
        SlidingAttentionCacheAllocator,
    )

    allocators = manager.batch_processor.cache.cache_allocators.values()
    bounds = [
        a.num_blocks * a.tokens_per_page
        for a in allocators
        if isinstance(a, FullAttentionCacheAllocator)
        and not isinstance(a, SlidingAttentionCacheAllocator)
    ]
    return min(bounds) if bounds else None


def install_unblock_when_idle(manager: Any) -> None:
    """After transformers' scheduler offloads a request to make room, it takes no
    waiting request (``block_new_requests``) until an active one finishes. When the
    active ones are cancelled instead (their callers left), none ever finishes: the
    engine then waits forever with requests waiting, the offloaded one among them, and
    every later call waits behind them. Here a step with nothing active unblocks it.
    Wraps the scheduler of each batch processor ``manager`` makes, in its thread."""
    create = manager._create_batch_processor

    def created() -> Any:
        processor = create()
        scheduler = processor.scheduler
        if not getattr(scheduler, "_thaw_unblocks", False):
            schedule = scheduler.schedule_batch

            def schedule_batch(*args: Any, **kwargs: Any) -> Any:
                if scheduler.block_new_requests and not scheduler.active_requests:
                    scheduler.block_new_requests = False
                return schedule(*args, **kwargs)

            scheduler.schedule_batch = schedule_batch
            scheduler._thaw_unblocks = True
        return processor

    manager._create_batch_processor = created


def install_step_guard(
    manager: Any,
    lock: Any,
    before_step: Callable[[Sequence[Any]], None] | None,
    after_step: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """Run each step's forward of ``manager`` (the model runner's ``compute_batch`` of
    each batch processor it makes, in its thread) holding ``lock``, so a change to the
    model's layers (``Engine.model_change``) never lands inside one; first, with the
    lock held, ``before_step`` is given the step's requests in the order their tokens
    are packed (each has ``state.request_id`` and ``query_length``); last, once the
    step's tokens are sampled, ``after_step`` is given them (one per request with a new
    token, in that order: the runner's output ids)."""
    create = manager._create_batch_processor

    def created() -> Any:
        processor = create()
        runner = processor.model_runner
        if getattr(runner, "_thaw_guarded", False):  # a processor made again, reset
            return processor
        io = runner.inputs_and_outputs
        compute = runner.compute_batch

        def guarded(model: Any, batch_data: Any) -> None:
            with lock:
                if before_step is not None:
                    before_step(io.requests_in_batch)
                compute(model, batch_data)
                if after_step is not None:
                    after_step(io.output_ids[0])

        runner.compute_batch = guarded
        runner._thaw_guarded = True
        return processor

    manager._create_batch_processor = created


def can_graph(model: Any) -> bool:
    """Whether ``model``'s steps may replay CUDA graphs: it is on a CUDA device."""
    return bool(model.device.type == "cuda")


def reset_after_failed_capture(device: Any) -> None:
    """Make ``device``'s random generator usable again after a CUDA graph capture
    failed part way. torch ends a capture's generator state only when the capture
    succeeds, so after a failed one every random draw outside a capture raises
    "Offset increment outside graph capture encountered unexpectedly"; a fresh state
    at the same seed takes its place. Nothing to do off CUDA."""
    if device.type != "cuda":
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    fresh = torch.Generator(device=f"cuda:{index}")
    fresh.manual_seed(generator.initial_seed())
    generator.graphsafe_set_state(fresh.graphsafe_get_state())


class CaptureGate:
    """Which step shapes get a CUDA graph: one whose step comes for the ``capture_at``-th
    time. Before that its steps run eagerly. Counts what it let through and held back."""

    def __init__(self, capture_at: int = GRAPH_CAPTURE_AT) -> None:
        if capture_at < 1:
            raise ValueError(f"capture_at must be at least 1, got {capture_at}")
        self.capture_at = capture_at
        self._seen: dict[tuple[int, ...], int] = {}
        self.captures = 0  # shapes let through to be captured
        self.eager_steps = 0  # steps held back: run eagerly

    def capture(self, key: tuple[int, ...]) -> bool:
        """Whether the step of shape ``key``, which has no graph yet, captures one now."""
        seen = self._seen.get(key, 0) + 1
        self._seen[key] = seen
        if seen >= self.capture_at:
            self.captures += 1
            return True
        self.eager_steps += 1
        return False


def install_capture_gate(manager: Any, gate: CaptureGate) -> bool:
    """Puts ``gate`` before the graph captures of ``manager``'s model runner (an instance
    attribute over transformers' ``ModelRunner.compute_batch``): a step whose shape has
    no graph and that the gate holds back runs with the runner's graphs off, eagerly on
    the same padded inputs (transformers' capture runs that same eager forward first).
    The batch processor must exist (``manager.warmup()`` makes it). A runner that
    prepares steps ahead keeps its graphs per input pair, and is left as it is: False."""
    runner = manager.batch_processor.model_runner
    io = runner.inputs_and_outputs
    if not (hasattr(io, "_get_graph_key") and hasattr(io, "graphs")):
        return False
    compute = runner.compute_batch

    def gated(model: Any, batch_data: Any) -> None:
        key = io._get_graph_key()
        if io.graphs.get_graph(key) is not None or gate.capture(key):
            compute(model, batch_data)
            return
        graphs = runner.use_cuda_graph_varlen, runner.use_cuda_graph_decode
        runner.use_cuda_graph_varlen = runner.use_cuda_graph_decode = False
        try:
            compute(model, batch_data)
        finally:
            runner.use_cuda_graph_varlen, runner.use_cuda_graph_decode = graphs

    runner.compute_batch = gated
    return True


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: every token of the vocabulary
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None  # the same seed, prompt and values give the same tokens
    ignore_eos: bool = False  # run to max_new_tokens past the model's end of text (load tests)
    # worker.llm.penalties: 1.0 and 0.0 are off
    repetition_penalty: float = 1.0  # > 0; on the prompt's and the output's tokens
    frequency_penalty: float = 0.0  # in [-2, 2], times each output token's count
    presence_penalty: float = 0.0  # in [-2, 2], once for each token in the output
    min_p: float = 0.0  # in [0, 1]
    # ((token id, bias in [-100, 100]), ...), added to those tokens' logits first
    logit_bias: tuple[tuple[int, float], ...] = ()
    # worker.llm.logprobs: None, off; n, each token's log probability and the n most
    # likely tokens' at its position (0 to MAX_TOP_LOGPROBS)
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a number >= 0, not {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], not {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: off), not {self.top_k!r}")
        if self.seed is not None and not (_is_int(self.seed) and 0 <= self.seed < SEED_LIMIT):
            raise ValueError(f"seed must be an integer in [0, 2**63), not {self.seed!r}")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError(
                f"repetition_penalty must be a number > 0 (1: off), not {self.repetition_penalty!r}"
            )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and -2 <= value <= 2):
                raise ValueError(f"{name} must be a number in [-2, 2] (0: off), not {value!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0: off), not {self.min_p!r}")
        self._check_logit_bias()
        if self.logprobs is not None and not (
            _is_int(self.logprobs) and 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(
                f"logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS} (the most likely "
                f"tokens to return at each position), not {self.logprobs!r}"
            )

    def _check_logit_bias(self) -> None:
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(
                f"logit_bias names {len(self.logit_bias)} tokens; at most {MAX_LOGIT_BIAS}"
            )
        tokens = [token for token, _ in self.logit_bias]
        if len(set(tokens)) != len(tokens):
            raise ValueError("logit_bias names a token twice")
        for token, bias in self.logit_bias:
            if not _is_int(token) or token < 0:
                raise ValueError(f"logit_bias names {token!r}: a token id is an integer >= 0")
            if not (isinstance(bias, int | float) and math.isfinite(bias) and abs(bias) <= 100):
                raise ValueError(
                    f"logit_bias of token {token} is {bias!r}: a bias is from -100 to 100"
                )

    def processor_kwargs(self, vocab_size: int) -> dict[str, Any]:
        """What ``add_request`` passes the logits processors; a penalty or ``min_p``
        that is off is left out (a step with none set skips its processor)."""
        warpers: dict[str, Any]
        if self.temperature == 0:
            warpers = {"top_k": 1, "temperature": 1.0, "top_p": 1.0}
        else:
            warpers = {
                "top_k": min(self.top_k, vocab_size) or vocab_size,
                "temperature": max(float(self.temperature), MIN_TEMPERATURE),
                "top_p": self.top_p,
            }
        if self.seed is not None:
            warpers["seed"] = self.seed
        for name, off in _OFF.items():
            if getattr(self, name) != off:
                warpers[name] = float(getattr(self, name))
        if self.logit_bias:
            warpers["logit_bias"] = tuple((t, float(b)) for t, b in self.logit_bias)
        if self.logprobs is not None:
            warpers["logprobs"] = self.logprobs
        return warpers


_OFF = {"repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "min_p": 0.0}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def bias_error(sampling: Sampling, vocab_size: int) -> str | None:
    """Why ``sampling``'s logit bias cannot join a batch of a model with ``vocab_size``
    tokens (None: it can): an id outside the logits fails the step, as a prompt's would."""
    outside = [t for t, _ in sampling.logit_bias if t >= vocab_size]
    if outside:
        return (
            f"logit_bias names token id {outside[0]}, outside this model's vocabulary "
            f"(ids 0 to {vocab_size - 1})"
        )
    return None


def prompt_error(prompt_ids: list[int], vocab_size: int) -> str | None:
    """Why ``prompt_ids`` cannot join a batch (None: they can). A token id outside the
    embeddings fails the step that holds it, and with it the generation loop and every
    request in the batch (on a GPU, a device-side assert ends the process's context)."""
    if not prompt_ids:
        return "the prompt has no tokens"
    low, high = min(prompt_ids), max(prompt_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        return f"token id {bad} is outside this model's vocabulary (ids 0 to {vocab_size - 1})"
    return None


@dataclass(frozen=True)
class TokenStep:
    """New tokens of one request, as the replica made them."""

    token_ids: list[int]
    at_s: float  # time.perf_counter() when the engine handed them over
    finish_reason: FinishReason | None = None  # set on the last step
    # time.perf_counter() when the engine took the request into its batch (None: not
    # reported); before it, the request waited for a batch slot or KV blocks
    started_s: float | None = None
    # one per token, for a request that asked for them (Sampling.logprobs)
    logprobs: tuple[TokenLogprob, ...] = ()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def then(self, later: TokenStep) -> TokenStep:
        """This step and ``later`` as one, handed over when ``later`` was."""
        started = self.started_s if self.started_s is not None else later.started_s
        return TokenStep(
            self.token_ids + later.token_ids,
            later.at_s,
            later.finish_reason,
            started,
            self.logprobs + later.logprobs,
        )


def _with_waiting(step: TokenStep, steps: queue.Queue[Any]) -> tuple[TokenStep, Any]:
    """``step`` joined with the steps already waiting behind it, and the error that
    followed them if one did (None otherwise). A reader that fell behind the batch (a
    busy interpreter, a slow consumer) takes what it missed in one step, so each
    token is not one more event through the replica, the worker and the server."""
    while not step.finished:
        try:
            later = steps.get_nowait()
        except queue.Empty:
            break
        if isinstance(later, BaseException):
            return step, later
        step = step.then(later)
    return step, None


# What a pushed request's sink is given: its next step, or the error that ended it.
Sink = Callable[["TokenStep | EngineError"], None]


@dataclass
class _Stream:
    queue: queue.Queue[Any]
    sampling: Sampling
    stop_ids: frozenset[int]
    seen: int = 0  # generated tokens already handed over
    sink: Sink | None = None  # pushed: steps go here, in the router thread
    # the logprobs of tokens made but not yet handed over, in order (the generation
    # thread adds them after each step, before its outputs reach the router)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def put(self, item: TokenStep | EngineError) -> None:
        if self.sink is not None:
            self.sink(item)
        else:
            self.queue.put(item)


class Engine:
    """Continuous batching over ``model`` (a transformers causal LM on its device).

    ``generate`` may be called from many threads at once: each call is one request
    of the running batch. ``close`` stops the manager; open streams then fail."""

    def __init__(
        self,
        model: Any,
        sizes: EngineSizes,
        eos_token_ids: list[int],
        threads: StepThreads | None = None,
        capture_at: int = GRAPH_CAPTURE_AT,
        step_masks: bool = True,
        step_masks_in_graphs: bool = False,
        adapter_routing: AdapterRouting | None = None,
    ) -> None:
        """``threads``, on a CPU: each step's torch threads (``worker.llm.threads``);
        None leaves the process's own. ``capture_at``, with CUDA graphs: the time a step
        shape comes that captures its graph (1: the first, as transformers does).
        ``step_masks``: an eager step makes a mask of its own size (``worker.llm.attention``);
        False keeps transformers' dense mask as wide as the cache. ``step_masks_in_graphs``:
        graphed steps too (a trial: not yet measured on a GPU). ``adapter_routing``: each
        request runs through the adapter it names, several in one step
        (``worker.llm.adapters``; the model's LoRA layers routed by it); None: the model
        as it is, for every request (the adapter a request names, which ``add_adapter``
        made known, then keys its prefix blocks only: its caller made it the model's)."""
        from transformers import GenerationConfig
        from transformers.generation import ContinuousBatchingConfig

        from worker.llm.attention import use_step_masks
        from worker.llm.logprobs import install_logprobs
        from worker.llm.penalties import install_penalties
        from worker.llm.seeded import install_seeded_draw

        self.sizes = sizes
        self.vocab_size = int(model.config.vocab_size)
        self.eos_token_ids = list(eos_token_ids)
        self.num_blocks = kv_blocks(model.config, model.dtype, sizes)
        # Sampling on, every warper at a value that makes transformers build it, in
        # its per-request form; each request then sets its own values.
        generation = GenerationConfig(
            do_sample=True,
            temperature=0.5,
            top_k=2,
            top_p=0.5,
            eos_token_id=self.eos_token_ids or None,
            max_new_tokens=16,
        )

        def manager(graphs: bool) -> Any:
            graphed: dict[str, Any] = {"use_cuda_graph": graphs, "use_async_batching": False}
            if graphs:
                cache_tokens = self.num_blocks * sizes.page_size_tokens
                graphed["q_padding_interval_size"] = GRAPH_Q_TOKENS
                graphed["kv_padding_interval_size"] = max(
                    GRAPH_KV_TOKENS, cache_tokens // GRAPH_KV_SHAPES
                )
            batching = ContinuousBatchingConfig(
                num_blocks=self.num_blocks,
                max_batch_tokens=sizes.max_batch_tokens,
                page_size=sizes.page_size_tokens,
                max_requests_per_batch=sizes.max_num_seqs,
                per_request_processors=True,
                allow_block_sharing=sizes.share_prefixes,
                **graphed,
            )
            # Read when the batch starts: a graph keeps the shapes it was captured with.
            self.step_masks = use_step_masks(
                model, step_masks and (not graphs or step_masks_in_graphs)
            )
            made = model.init_continuous_batching(
                generation_config=generation, continuous_batching_config=batching
            )
            install_penalties(made, self.vocab_size, model.device)
            kept = install_logprobs(made, self.vocab_size, model.device)  # first: raw logits
            install_seeded_draw(made)  # last, after MinP
            install_unblock_when_idle(made)
            route = None if adapter_routing is None else self._route_step

            def after_step(sampled: torch.Tensor) -> None:
                self._keep_logprobs(kept, sampled)

            install_step_guard(made, self._step_lock, route, after_step)
            if sizes.share_prefixes:
                install_prefix_cache(made, self._prefix_searched)
            if self.step_threads is not None:
                install_step_threads(made, self.step_threads)
            if graphs:
                made.warmup()  # the largest graph first, so the graphs' memory pool holds
            made.start()
            return made

        self.step_threads: StepThreadRule | None = None
        if threads is not None and threads.can_widen and model.device.type == "cpu":
            self.step_threads = StepThreadRule(threads)
        self._model = model
        self.adapter_routing = adapter_routing
        self._make_manager = manager
        self._capture_at = capture_at
        self.cuda_graphs = sizes.cuda_graphs and can_graph(model)
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}  # the probe's steps read these: made first
        self._step_lock = threading.Lock()  # held by each step's forward
        self._salts: dict[str, int] = {}  # each adapter known, its load's salt
        self.prefix_queried_tokens = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hit_tokens = 0  # of them, found there: not computed again
        self._adapter_of_salt: dict[int, str] = {}
        self._begin()
        self.sequence_tokens = sequence_tokens(self._manager)
        self._closed = threading.Event()
        self._step_listeners: list[Callable[[], None]] = []
        self.peak_active = 0  # most requests seen in one running batch
        self.aborted = 0  # requests cancelled before they finished (their callers left)
        self.restarts = 0  # generation loops started again after a step failed
        self.dead: str | None = None  # why the loop could not start again: calls refused
        self._restart_lock = threading.Lock()  # held while the router starts a new loop
        self._router = threading.Thread(target=self._route, name="llm-router", daemon=True)
        self._router.start()

    def _begin(self) -> None:
        """Start a manager and probe it: on CUDA graphs first, then eagerly if the graphs
        failed. Raises ``EngineError`` when no call could be answered."""
        model = self._model
        self._manager = self._make_manager(self.cuda_graphs)
        failed = self._probe()
        if self.cuda_graphs and failed is not None:
            log.warning("this model's steps cannot run as CUDA graphs, so run eagerly: %s", failed)
            self._manager.stop(block=True, timeout=30)
            reset_after_failed_capture(model.device)
            self.cuda_graphs = False
            self._manager = self._make_manager(False)
            failed = self._probe()
        if failed is not None:  # eagerly too: no call could be answered
            self._manager.stop(block=True, timeout=30)
            raise EngineError(
                f"{type(model).__name__} ({model.config.model_type!r}) cannot run on "
                f"transformers' continuous batching: {failed}"
            )
        self.capture_gate: CaptureGate | None = None
        if self.cuda_graphs:  # after the probe, which captures its shapes at once
            gate = CaptureGate(self._capture_at)
            if install_capture_gate(self._manager, gate):
                self.capture_gate = gate

    def _probe(self) -> str | None:
        """One greedy request of two tokens, through the started manager before the
        router runs: None when it ran, else why not. A forward that cannot be captured,
        or an architecture whose layers do not take the paged cache (GPT-NeoX, OPT in
        transformers 5), fails here, not in a caller's request."""
        request_id = "thaw-probe-" + uuid.uuid4().hex
        sampling = Sampling(max_new_tokens=2)
        self._manager.add_request(
            list(range(min(8, self.vocab_size))),
            request_id=request_id,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=-1,
            **sampling.processor_kwargs(self.vocab_size),
        )
        deadline = time.monotonic() + _PROBE_S
        while time.monotonic() < deadline:
            output = self._manager.get_result(request_id=request_id, timeout=_WAKE_S)
            if output is not None and output.is_finished():
                return None if output.error is None else str(output.error)
            if output is None and not self._manager.is_running():
                fatal = self._manager.background_thread_status.fatal_error
                return f"the generation loop stopped: {fatal}"
        return f"no answer in {_PROBE_S:.0f} s"

    # --- requests --------------------------------------------------------------
    def generate(
        self, prompt_ids: list[int], sampling: Sampling, adapter: str | None = None
    ) -> Generator[TokenStep, None, None]:
        """The request's tokens as they are made, in steps; the last step has its
        finish reason. Closing the iterator early cancels the request and frees its
        sequence and KV blocks. ``adapter``: the LoRA adapter it runs through, with
        ``adapter_routing`` (None: the base model; one ``add_adapter`` made known).
        Raises ``EngineError``."""
        request_id = self.new_request_id(adapter)
        stream = self._start(prompt_ids, sampling, request_id, None, adapter)
        finished = False
        try:
            held: Any = None  # what the last drain took past its step: an error
            while not finished:
                if held is not None:
                    step, held = held, None
                else:
                    try:  # woken now and then: a cancel raised in this thread lands here
                        step = stream.queue.get(timeout=_WAKE_S)
                    except queue.Empty:
                        continue
                if isinstance(step, BaseException):
                    raise EngineError(str(step))
                step, held = _with_waiting(step, stream.queue)
                finished = step.finished
                yield step
        finally:
            with self._lock:
                self._streams.pop(request_id, None)
            if not finished:
                self._manager.cancel_request(request_id)
                self.aborted += 1  # its sequence and KV blocks are freed now

    def push(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        sink: Sink,
        request_id: str,
        adapter: str | None = None,
    ) -> None:
        """Start request ``request_id``, whose steps the router hands to ``sink`` (in its
        thread; the last step has its finish reason, or the sink gets an
        ``EngineError``); ``cancel(request_id)`` ends it early. The sink must be quick:
        every stream waits for it. ``adapter`` as for ``generate``; a request through
        one has an id ``new_request_id(adapter)`` made."""
        self._start(prompt_ids, sampling, request_id, sink, adapter)

    def _start(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        request_id: str,
        sink: Sink | None,
        adapter: str | None,
    ) -> _Stream:
        """Register the request's stream and add it to the manager; raises
        ``EngineError`` (nothing left registered) when it cannot be added."""
        if request_salt(request_id) != self._salt(adapter):
            raise EngineError(
                f"request {request_id!r} was not made for adapter {adapter!r}: "
                "take its id from new_request_id"
            )
        refused = prompt_error(prompt_ids, self.vocab_size) or bias_error(sampling, self.vocab_size)
        needed = len(prompt_ids) + sampling.max_new_tokens - 1
        if refused is None and self.sequence_tokens is not None and needed > self.sequence_tokens:
            refused = (
                f"the prompt ({len(prompt_ids)} tokens) and max_new_tokens "
                f"({sampling.max_new_tokens}) need {needed} tokens of KV cache; one sequence "
                f"may hold {self.sequence_tokens}"
            )
        if refused is not None:
            raise EngineError(refused)
        eos_ids = () if sampling.ignore_eos else self.eos_token_ids
        stop_ids = frozenset(eos_ids) | frozenset(sampling.stop_token_ids)
        manager = self._manager
        stream = self._add(prompt_ids, sampling, request_id, stop_ids, sink, adapter)
        if stream is None and manager.background_thread_status.fatal_error is not None:
            # The loop stopped on a failed step just now: the router is starting a new
            # one, and this request was not in the failed batch.
            self._await_restart(manager)
            stream = self._add(prompt_ids, sampling, request_id, stop_ids, sink, adapter)
        if stream is None:
            raise EngineError("the engine is not taking requests (stopping)")
        return stream

    def _add(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        request_id: str,
        stop_ids: frozenset[int],
        sink: Sink | None,
        adapter: str | None,
    ) -> _Stream | None:
        """Register a new stream for the request and add it to the manager; None
        (nothing left registered) when the manager takes no requests. Waits while the
        router starts a new loop: the probe's reads by request id would put this
        request's outputs back in the queue out of order, and the restart ends every
        stream open before."""
        stream = _Stream(queue.Queue(), sampling, stop_ids, sink=sink)
        with self._restart_lock:
            with self._lock:
                if self._closed.is_set():
                    raise EngineError("the engine is stopped")
                if self.dead is not None:
                    raise EngineDeadError(
                        f"the engine could not start again after a step failed: {self.dead}"
                    )
                self._streams[request_id] = stream
            added = None
            try:
                added = self._manager.add_request(
                    list(prompt_ids),
                    request_id=request_id,
                    max_new_tokens=sampling.max_new_tokens,
                    streaming=True,
                    eos_token_id=sorted(stop_ids) or -1,
                    **sampling.processor_kwargs(self.vocab_size),
                )
            finally:
                if added is None:
                    with self._lock:
                        self._streams.pop(request_id, None)
        return None if added is None else stream

    def _await_restart(self, manager: Any) -> None:
        """Until the router has replaced ``manager`` (or given up, or the engine closed)."""
        deadline = time.monotonic() + _RESTART_STOP_S + _PROBE_S
        while self._manager is manager and self.dead is None and not self._closed.is_set():
            if time.monotonic() > deadline:
                return
            time.sleep(_RESTART_POLL_S)

    # --- adapters --------------------------------------------------------------
    def add_adapter(self, name: str) -> None:
        """Make adapter ``name`` known (its layers are in the model, or the caller makes
        it the model's before its requests run), with a salt of its own for this load:
        prefix blocks made through an earlier load of the same name, which may have held
        other weights, are never matched again."""
        with self._lock:
            if name in self._salts:
                raise ValueError(f"adapter {name!r} is known to this engine already")
            salt = secrets.randbits(64)
            self._salts[name] = salt
            self._adapter_of_salt[salt] = name

    def remove_adapter(self, name: str) -> None:
        """Forget adapter ``name`` (its requests have ended; a cancelled one may still
        take a last step, through the base model's layers, its output dropped)."""
        with self._lock:
            salt = self._salts.pop(name, None)
            if salt is not None:
                self._adapter_of_salt.pop(salt, None)

    def new_request_id(self, adapter: str | None = None) -> str:
        """An id for a request through ``adapter`` (None: the base model), carrying the
        salt its prefix blocks are keyed by. Raises ``EngineError`` for an adapter
        ``add_adapter`` did not make known."""
        return salted_request_id(self._salt(adapter))

    def _salt(self, adapter: str | None) -> int | None:
        if adapter is None:
            return None
        salt = self._salts.get(adapter)
        if salt is None:
            raise EngineError(f"adapter {adapter!r} is not loaded in this engine")
        return salt

    def wait_idle(self, timeout_s: float = _RESTART_STOP_S) -> bool:
        """Until the manager holds no request (a cancelled one leaves at its next step);
        False if it still held one after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.active_requests():
            if time.monotonic() > deadline:
                return False
            time.sleep(_IDLE_POLL_S)
        return True

    @contextmanager
    def model_change(self) -> Iterator[None]:
        """While held, no step's forward runs (one running ends first): the model's
        layers may change, an adapter loaded into it or dropped."""
        with self._step_lock:
            yield

    def _keep_logprobs(self, kept: StepLogprobs, sampled: torch.Tensor) -> None:
        """After a step, in the generation thread: the logprobs of its tokens, to the
        streams of the requests that asked (a request gone since: dropped)."""
        made = kept.collect(sampled)
        if not made:
            return
        with self._lock:
            for request_id, logprob in made:
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.logprobs.append(logprob)

    def _prefix_searched(self, prompt_tokens: int, matched: int) -> None:
        self.prefix_queried_tokens += prompt_tokens  # the generation thread only
        self.prefix_hit_tokens += matched

    def _route_step(self, requests: Sequence[Any]) -> None:
        """Before a step's forward, in the generation thread: whose adapter each of its
        tokens goes through, from each request's id (an adapter removed since: the base
        model's layers)."""
        assert self.adapter_routing is not None
        of_salt = self._adapter_of_salt
        if not of_salt:  # no adapter loaded: every token is the base model's
            self.adapter_routing.set_step(())
            return
        routes = []
        for request in requests:
            salt = request_salt(request.state.request_id)
            routes.append((None if salt is None else of_salt.get(salt), request.query_length))
        self.adapter_routing.set_step(routes)

    def cancel(self, request_id: str) -> None:
        """End a pushed request: its sink gets nothing more (but the step the router
        may be handing over as this is called), and unless it had finished its sequence
        and KV blocks are freed."""
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            self._manager.cancel_request(request_id)
            self.aborted += 1

    def add_step_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` in the router thread after each batch of outputs it handed
        over (those of one step, or of the steps it fell behind by)."""
        self._step_listeners.append(listener)

    def active_requests(self) -> int:
        """Requests the manager holds now, running or waiting for room."""
        running, waiting, _ = self.load()
        return running + waiting

    def load(self) -> tuple[int, int, float]:
        """Requests in the running batch, requests waiting for room in it, and the
        share of KV blocks live requests hold (blocks kept only for prefix reuse, which
        any request may take, count as free, as in vLLM's ``kv_cache_usage_perc``)."""
        processor = self._manager.batch_processor
        if processor is None:
            return 0, 0, 0.0
        scheduler = processor.scheduler
        running, waiting = len(scheduler.active_requests), len(scheduler.waiting_requests)
        held = total = 0
        for allocator in processor.cache.cache_allocators.values():
            held += len({block for table in allocator.block_table.values() for block in table})
            total += allocator.num_blocks
        return running, waiting, min(1.0, held / total) if total else 0.0

    # --- the router --------------------------------------------------------------
    def _route(self) -> None:
        while not self._closed.is_set():
            output = self._manager.get_result(timeout=_ROUTER_POLL_S)
            if output is None:
                if not self._manager.is_running():
                    self._after_loop_stopped()
                continue
            while output is not None:  # the rest of the step's outputs, if they are there
                self._deliver(output)
                output = self._manager.get_result(timeout=0)
            self._after_step()

    def _deliver(self, output: Any) -> None:
        with self._lock:
            stream = self._streams.get(output.request_id)
            if stream is not None and stream.sink is not None and output.is_finished():
                self._streams.pop(output.request_id)  # pushed: nothing is left to hand over
        if stream is None:
            return  # cancelled: its caller left
        processor = self._manager.batch_processor
        if processor is not None:
            self.peak_active = max(self.peak_active, len(processor.scheduler.active_requests))
        if output.error is not None:
            with self._lock:
                self._streams.pop(output.request_id, None)
            stream.put(EngineError(f"generation failed: {output.error}"))
            return
        tokens = list(output.generated_tokens)
        new, stream.seen = tokens[stream.seen :], len(tokens)
        reason: FinishReason | None = None
        if output.is_finished():
            hit_stop = bool(tokens) and tokens[-1] in stream.stop_ids
            reason = "stop" if hit_stop else "length"
        logprobs: tuple[TokenLogprob, ...] = ()
        if stream.sampling.logprobs is not None and new:
            with self._lock:
                logprobs = tuple(stream.logprobs[: len(new)])
                del stream.logprobs[: len(new)]
        if new or reason is not None:
            began = float(output.lifespan[0])
            started = began if began > 0 else None
            stream.put(TokenStep(new, time.perf_counter(), reason, started, logprobs))

    def _after_loop_stopped(self) -> None:
        """The manager's loop is not running (its outputs all handed over). Stopped by
        ``close``: wait for the router's end. Stopped by a failed step: transformers
        failed every request it held, so end any stream still open and start the loop
        again, so one failed step costs the calls in it, not every later call. If it
        cannot start again, ``dead`` says why and new requests are refused."""
        fatal = self._manager.background_thread_status.fatal_error
        if fatal is None or self._closed.is_set() or self.dead is not None:
            time.sleep(_ROUTER_POLL_S)  # get_result returns at once now
            return
        log.error("a step failed and stopped the generation loop, starting it again: %s", fatal)
        with self._restart_lock:  # new requests wait (``_add``)
            with self._lock:
                open_streams = list(self._streams.values())
                self._streams.clear()
            self._manager.stop(block=True, timeout=_RESTART_STOP_S)
            try:
                self._begin()
                self.restarts += 1
            except Exception as exc:
                self.dead = f"{type(exc).__name__}: {exc}"
                log.error(
                    "the generation loop could not start again; refusing calls: %s", self.dead
                )
        # Ended outside the lock: a pushed stream's sink may start another request.
        for stream in open_streams:
            stream.put(EngineError(f"generation failed: {fatal}"))
        self._after_step()

    # --- shutdown ------------------------------------------------------------------
    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the manager; every open stream ends with ``EngineError``, the last
        thing it is handed (the router stops first)."""
        with self._lock:
            self._closed.set()
        if self._router is not threading.current_thread():
            self._router.join(timeout=timeout_s)  # it stops at its next poll
        with self._lock:
            open_streams = list(self._streams.values())
            self._streams.clear()
        for stream in open_streams:
            stream.put(EngineError("the engine stopped"))
        self._after_step()  # the router is gone: the pushed streams' ends go out here
        self._manager.stop(block=True, timeout=timeout_s)

    def _after_step(self) -> None:
        for listener in self._step_listeners:
            try:
                listener()
            except Exception:  # a listener's failure must not stop every stream
                log.exception("an engine step listener failed")
