"""Prompt-prefix KV reuse in the engine's cache (transformers' block sharing), made
right for adapters and for requests that end at once.

transformers keeps each full KV block of a prompt, keyed by a hash chained over the
blocks' tokens, and a later prompt that starts with the same tokens takes those blocks
instead of computing them (``PagedAttentionCache.search_prefix_match``). Two changes:

- **Keyed by adapter load, not by tokens alone.** The same tokens through another
  LoRA adapter, or through the base model, hold other keys and values. A request's id
  carries a salt for the adapter load it runs through (``salted_request_id``), and a
  chain's first block, which has no parent in transformers' hash, takes that salt as
  its parent (``install_prefix_cache``), so a prefix is shared only by requests of the
  same load of the same adapter. A base-model request has no salt and hashes as
  transformers does. The salt is in the id, not in a table, because a request's
  adapter can be dropped while the scheduler still holds it (a cancelled request's
  last step): its id still says which load made its keys and values.
- **Also the blocks of a request that ends in the step that completed them.**
  transformers hashes a step's completed blocks after the step, unless the request
  has just finished (a guard for its asynchronous mode, where the block table may be
  gone by then): a request that ends at its first token (``max_tokens`` 1, a
  classifier's or a judge's one-token answer; an end of text at once) left none of
  its prompt for the next one. The engine steps synchronously, so the blocks are
  still the request's then, and they are hashed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_SALT_MARK = "@"  # never in a uuid's hex, nor in the engine's probe id
_block_salt = threading.local()  # the salt of the request whose blocks are hashed now


def salted_request_id(salt: int | None) -> str:
    """A new request id that carries ``salt`` (None: a base-model request's, none)."""
    request_id = uuid.uuid4().hex
    return request_id if salt is None else f"{request_id}{_SALT_MARK}{salt:016x}"


def request_salt(request_id: str) -> int | None:
    """The salt ``salted_request_id`` put in ``request_id`` (None: none)."""
    _, mark, salt = request_id.rpartition(_SALT_MARK)
    if not mark:
        return None
    try:
        return int(salt, 16)
    except ValueError:
        return None


def install_prefix_cache(manager: Any, on_search: Callable[[int, int], None] | None = None) -> None:
    """The prefix cache of each batch processor ``manager`` makes (in its thread) keyed
    by each request's salt, and told of a finished request's last completed blocks
    (see the module docstring). ``on_search(prompt_tokens, matched_tokens)`` is told
    of each prompt looked up."""
    _salt_first_blocks()
    create = manager._create_batch_processor

    def created() -> Any:
        processor = create()
        cache = processor.cache
        if not getattr(cache, "_thaw_salted", False):
            search, mark = cache.search_prefix_match, cache.mark_complete_blocks

            def search_prefix_match(request_id: str, prompt_ids: list[int]) -> int:
                with _salted(request_salt(request_id)):
                    matched = int(search(request_id, prompt_ids))
                if on_search is not None:
                    on_search(len(prompt_ids), matched)
                return matched

            def mark_complete_blocks(state: Any, complete_blocks: dict[str, int]) -> None:
                with _salted(request_salt(state.request_id)):
                    if _finished_holding_blocks(cache, state, complete_blocks):
                        _mark_finished(cache, state, complete_blocks)
                    else:
                        mark(state, complete_blocks)

            cache.search_prefix_match = search_prefix_match
            cache.mark_complete_blocks = mark_complete_blocks
            cache._thaw_salted = True
        return processor

    manager._create_batch_processor = created


def _finished_holding_blocks(cache: Any, state: Any, complete_blocks: dict[str, int]) -> bool:
    """Whether ``state`` finished in this step with blocks completed by it that are
    still its own (transformers' ``mark_complete_blocks`` would skip them)."""
    from transformers.generation.continuous_batching.requests import RequestStatus

    if state.status != RequestStatus.FINISHED or not complete_blocks:
        return False
    if not cache.allow_block_sharing:
        return False
    allocators = cache.cache_allocators
    return all(state.request_id in allocators[name].block_table for name in complete_blocks)


def _mark_finished(cache: Any, state: Any, complete_blocks: dict[str, int]) -> None:
    """transformers' ``PagedAttentionCache.mark_complete_blocks`` past its guard."""
    token_ids = state.initial_tokens + state.generated_tokens
    for name, count in complete_blocks.items():
        cache.cache_allocators[name].mark_complete_blocks(state.request_id, token_ids, count)


@contextmanager
def _salted(salt: int | None) -> Iterator[None]:
    _block_salt.value = salt
    try:
        yield
    finally:
        _block_salt.value = None


def _salt_first_blocks() -> None:
    """transformers' block hash, with a chain's missing parent read as this thread's
    salt (None outside ``_salted``: the hash unchanged). Once per process."""
    from transformers.generation.continuous_batching.cache_allocators import cache_allocator

    compute = cache_allocator.compute_block_hash
    if getattr(compute, "_thaw_salted", False):
        return

    def compute_block_hash(parent_hash: int | None, tokens: list[int]) -> int:
        if parent_hash is None:
            parent_hash = getattr(_block_salt, "value", None)
        return int(compute(parent_hash, tokens))

    compute_block_hash._thaw_salted = True  # type: ignore[attr-defined]
    cache_allocator.compute_block_hash = compute_block_hash
