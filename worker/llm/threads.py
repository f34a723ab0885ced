"""Torch threads per batch step on a CPU: the replica's own, or every core it may use
when a step is heavy enough that the serving path would leave a core idle.

A CPU replica runs on its worker's cores less one (``worker.replicas.default_cpu_threads``):
the core left over carries the serving path, about 1 ms of CPU per generated token on
the worker agent, the server and, on one machine, the callers (``bench/README.md``,
"thaw's CPU per token by process"). Whether that core is busy depends on the model:

    a step of s seconds on the replica's n threads that makes g tokens gives the
    serving path g x ~1 ms of work in those s seconds

A 76M-parameter model spends about 6.5 ms per token on one thread at 8 and 32 streams,
so the serving core idles most of each step; a tiny test model spends a fraction of a
millisecond, so the serving path is the limit. ``StepThreadRule`` times every step of
``min_tokens`` tokens or more (fewer rows split too thinly across threads to gain, and
a step of one sequence is all fixed cost: it would make any model look heavy) and
keeps a moving mean of its time per generated token, scaled to the replica's own
threads. The mean is of time over tokens, each step's sums decayed by the next
(``_DECAY``), and it stands only once it holds ``min_tokens`` generated tokens: a step
that ends one long prompt makes one token for a whole prefill, and alone it would make
a light model look heavy. A step of that many tokens or more then runs on ``wide``
threads when the mean reaches ``wide_ms_per_token``, else on ``narrow``, as every
smaller step does. Measured on 2 vCPUs, 76M model: ``bench/README.md``, "Wide steps".

A step is timed on the generation thread's CPU clock, not the wall clock: a step that
waited for a core or for the interpreter lock (the serving path's threads, or anything
else on the machine) did no more work for its tokens, and counting the wait would
widen steps exactly when no core is spare. On ``n`` threads the generation thread does
about a ``1/n`` share of the step's work, which the scaling by threads accounts for.

``torch.set_num_threads`` sets the calling thread's OpenMP team size, so the rule is
applied on the manager's generation thread, before each step, and only when the count
changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

_DECAY = 0.8  # of the moving mean's sums at each step counted


@dataclass(frozen=True)
class StepThreads:
    narrow: int  # the replica's own threads
    wide: int  # every core the replica may use
    wide_ms_per_token: float = 3.0  # 0: never wide
    min_tokens: int = 8

    def __post_init__(self) -> None:
        if self.narrow < 1 or self.wide < self.narrow or self.wide_ms_per_token < 0:
            raise ValueError(f"step threads out of range: {self}")

    @property
    def can_widen(self) -> bool:
        return self.wide > self.narrow and self.wide_ms_per_token > 0


class StepThreadRule:
    """The threads for each step, from the steps before it (see the module docstring)."""

    def __init__(self, threads: StepThreads) -> None:
        self.threads = threads
        self.ms_per_token = 0.0  # moving mean, scaled to the narrow threads; 0: none yet
        self._ms = 0.0  # the mean's decayed sums: time on the narrow threads, and tokens
        self._tokens = 0.0
        self.steps = 0
        self.wide_steps = 0

    def choose(self, tokens: int) -> int:
        t = self.threads
        heavy = t.can_widen and self.ms_per_token >= t.wide_ms_per_token
        return t.wide if heavy and tokens >= t.min_tokens else t.narrow

    def measured(self, threads: int, seconds: float, tokens: int, generated: int) -> None:
        """One step's time on ``threads`` threads: ``tokens`` in, ``generated`` out."""
        self.steps += 1
        if threads > self.threads.narrow:
            self.wide_steps += 1
        if tokens < self.threads.min_tokens or generated < 1:
            return  # never wide; or a prefill chunk that ends no prompt (no token to charge)
        self._ms = _DECAY * self._ms + seconds * 1e3 * threads / self.threads.narrow
        self._tokens = _DECAY * self._tokens + generated
        if self._tokens >= self.threads.min_tokens:
            self.ms_per_token = self._ms / self._tokens


def install_step_threads(manager: Any, rule: StepThreadRule) -> None:
    """Wraps ``manager``'s generation step (an instance attribute: transformers'
    ``ContinuousBatchingManager._generation_step``) so ``rule`` sets each step's torch
    threads and is told the step's time."""
    step = manager._generation_step
    current = 0  # set on the first step: the generation thread's own count

    def threaded_step() -> None:
        nonlocal current
        batch = manager.batch_processor.inputs_and_outputs.requests_in_batch
        tokens = sum(r.query_length for r in batch)
        generated = sum(1 for r in batch if r.has_new_token)
        threads = rule.choose(tokens)
        if threads != current:
            torch.set_num_threads(threads)
            current = threads
        began = time.thread_time()
        step()
        rule.measured(threads, time.thread_time() - began, tokens, generated)

    manager._generation_step = threaded_step
