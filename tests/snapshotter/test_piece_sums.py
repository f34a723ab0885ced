"""Per-piece sums that a GPU takes of copied bytes: the same on every device, and
changed by any damage a check is for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from snapshotter.piece_sums import _C, piece_sums

_M = 1 << 64


def _reference(data: bytes) -> list[int]:
    """(s1, s2) by the definition, in Python integers."""
    n = len(data) // 8
    values = [int(v) for v in np.frombuffer(data[: 8 * n], dtype="<i8")] + list(data[8 * n :])
    k = _C % _M
    s1 = sum(values) % _M
    s2 = sum(v * ((2 * j + 1) * k % _M) for j, v in enumerate(values)) % _M
    return [x - _M if x >= 1 << 63 else x for x in (s1, s2)]


def _random(n: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=generator)


def test_the_sums_follow_their_definition_with_a_tail_and_in_any_pieces() -> None:
    buf = _random(300_005)
    pieces = [(0, 131_072), (131_072, 262_144), (262_144, 300_005)]
    got = piece_sums(buf, pieces).tolist()
    assert got == [_reference(buf[b:e].numpy().tobytes()) for b, e in pieces]
    assert piece_sums(buf, []).shape == (0, 2)


@pytest.mark.parametrize("where", [0, 7, 8, 65_539, 131_071, 300_004])
def test_a_flipped_bit_changes_both_sums(where: int) -> None:
    buf = _random(300_005, seed=1)
    pieces = [(0, 131_072), (131_072, 300_005)]
    before = piece_sums(buf, pieces)
    buf[where] ^= 0x10
    after = piece_sums(buf, pieces)
    changed = (before != after).all(dim=1).tolist()
    assert changed == [where < 131_072, where >= 131_072]


def test_swapped_words_change_the_weighted_sum() -> None:
    buf = _random(4096, seed=2)
    before = piece_sums(buf, [(0, 4096)])
    words = buf.view(torch.int64).clone()
    words[[3, 9]] = words[[9, 3]]
    after = piece_sums(words.view(torch.uint8), [(0, 4096)])
    assert after[0, 0] == before[0, 0] and after[0, 1] != before[0, 1]


def test_a_piece_must_begin_on_a_word() -> None:
    with pytest.raises(ValueError, match="multiple of 8"):
        piece_sums(_random(64), [(4, 64)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_sums_on_cuda_are_the_sums_on_the_cpu() -> None:
    buf = _random((3 << 20) + 5, seed=3)
    pieces = [(0, 1 << 20), (1 << 20, 2 << 20), (2 << 20, (3 << 20) + 5)]
    assert torch.equal(piece_sums(buf.cuda(), pieces).cpu(), piece_sums(buf, pieces))
