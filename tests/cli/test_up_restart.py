"""``thaw up``'s pause before starting a dead worker again (pure)."""

from __future__ import annotations

from cli.up import (
    RESTART_FIRST_DELAY_S,
    RESTART_MAX_DELAY_S,
    RESTART_RESET_AFTER_S,
    restart_delay_s,
)


def test_the_pause_doubles_while_it_keeps_dying_up_to_the_cap() -> None:
    delays = []
    delay = None
    for _ in range(8):
        delay = restart_delay_s(delay, ran_s=0.5)
        delays.append(delay)
    assert delays[0] == RESTART_FIRST_DELAY_S
    assert delays[1] == 2 * RESTART_FIRST_DELAY_S
    assert delays[-1] == RESTART_MAX_DELAY_S


def test_a_child_that_ran_a_while_starts_from_the_first_pause_again() -> None:
    assert restart_delay_s(RESTART_MAX_DELAY_S, RESTART_RESET_AFTER_S) == RESTART_FIRST_DELAY_S
