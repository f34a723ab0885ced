"""The direct runner's background threads: kept for the next job, at most ``limit`` busy."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from control_plane.services.direct_runner import KeptThreads

WAIT_S = 10.0


def _run_and_wait(pool: KeptThreads, job) -> None:
    done = threading.Event()

    def wrapped() -> None:
        try:
            job()
        finally:
            done.set()

    assert pool.submit(wrapped)
    assert done.wait(WAIT_S)
    _until(lambda: pool.busy == 0)  # its thread is idle again


def _until(check) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_one_job_after_another_runs_on_the_same_kept_thread() -> None:
    pool = KeptThreads("kept-test", 4)
    seen: list[threading.Thread] = []
    for _ in range(5):
        _run_and_wait(pool, lambda: seen.append(threading.current_thread()))
    assert len(seen) == 5
    assert len({t.ident for t in seen}) == 1  # no thread started for the later jobs
    assert seen[0].name == "kept-test" and seen[0].daemon


def test_beyond_the_limit_a_job_is_refused_until_one_ends() -> None:
    pool = KeptThreads("kept-test", 2)
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocking() -> None:
        started.release()
        assert release.wait(WAIT_S)

    assert pool.submit(blocking) and pool.submit(blocking)
    assert started.acquire(timeout=WAIT_S) and started.acquire(timeout=WAIT_S)
    ran = []
    assert not pool.submit(lambda: ran.append(1))  # refused: nothing done
    release.set()
    _until(lambda: pool.busy == 0)  # both slots free once the blocking jobs return
    assert pool.submit(lambda: ran.append(1))
    _until(lambda: bool(ran))
    assert ran == [1]


def test_many_jobs_at_once_each_run_exactly_once() -> None:
    pool = KeptThreads("kept-test", 64)
    lock = threading.Lock()
    counts: dict[int, int] = {}
    all_done = threading.Semaphore(0)

    def job(i: int) -> None:
        with lock:
            counts[i] = counts.get(i, 0) + 1
        all_done.release()

    submitters = [
        threading.Thread(target=lambda i=i: pool.submit(lambda: job(i))) for i in range(48)
    ]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join(WAIT_S)
    for _ in range(48):
        assert all_done.acquire(timeout=WAIT_S)
    assert counts == {i: 1 for i in range(48)}
    threads = [t for t in threading.enumerate() if t.name == "kept-test"]
    assert len(threads) <= 48


def test_a_failing_job_is_logged_and_its_thread_serves_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = KeptThreads("kept-test", 1)

    def boom() -> None:
        raise RuntimeError("the job's own bug")

    with caplog.at_level(logging.ERROR):
        assert pool.submit(boom)
        _until(lambda: pool.busy == 0)  # the slot frees once the failure is handled
        ran = []
        assert pool.submit(lambda: ran.append(threading.current_thread().name))
        _until(lambda: bool(ran))
    assert ran == ["kept-test"]
    assert "the job's own bug" in caplog.text
    assert "kept-test" in caplog.text
