"""Issue #25, server-side visibility, on one embedded stack with real workers: a
function whose setup keeps failing is shown failing (API and ``thaw functions``)
until a version starts; a worker on another broker or store, or with a live
worker's name, is refused at registration saying why; two workers on one host
get distinct default names; a call record names its worker and replica."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import E2EStore
from tests.e2e.stack import Proc, wait_for
from tests.faults.conftest import FaultStack, chaos_spec, fault_stack, invoke

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, chaos_store: E2EStore) -> Iterator[FaultStack]:
    tmp = tmp_path_factory.mktemp("visibility")
    with fault_stack("embedded", tmp, chaos_store, workers=1) as s:
        yield s


def _health(stack: FaultStack, name: str) -> dict[str, Any]:
    with stack.client() as c:
        health: dict[str, Any] = c.get(f"/v1/functions/{name}").json()["health"]
    return health


def _thaw(stack: FaultStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**stack.env(THAW_API_KEY=stack.admin_key), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _health_cell(table: str, name: str) -> str:
    """The last column (health) of ``name``'s row in ``thaw functions ls``."""
    [row] = [line for line in table.splitlines() if f" {name} " in line]
    return row.strip("│ ").split("│")[-1].strip()


def _spawn_worker(stack: FaultStack, label: str, **env: str) -> Proc:
    """A ``thaw worker`` with its own directory and ``env`` on top of the stack's; no
    THAW_WORKER_NAME unless ``env`` gives one (the default name is under test)."""
    full = stack.env(
        THAW_API_KEY=stack.worker_key, THAW_WORKER_DIR=str(stack.root / "workers" / label)
    )
    full.pop("THAW_WORKER_NAME", None)
    full.update(env)
    return stack._spawn(label, ["worker", "--log-level", "WARNING"], full)


def _refusal(proc: Proc) -> str:
    """The last line a refused worker printed, once it has exited (code 2)."""
    assert proc.popen.wait(timeout=90) == 2, proc.log_path.read_text()
    proc.log.close()
    return proc.log_path.read_text().strip().splitlines()[-1]


def test_setup_that_keeps_failing_is_shown_failing_until_a_version_starts(
    stack: FaultStack, chaos_store: E2EStore
) -> None:
    name = "setup-keeps-failing"
    stack.deploy(chaos_spec(chaos_store, name, env={"SETUP_FAIL": "no weights"}))
    assert _health(stack, name) == {
        "state": "ok",
        "last_error": None,
        "last_error_at": None,
        "last_error_replica_id": None,
    }
    r = invoke(stack, name, {"input": {}})
    assert r.status_code == 500, r.text
    health = _health(stack, name)
    assert health["state"] == "failing", health
    assert "setup failed: no weights" in health["last_error"]
    assert health["last_error_at"] is not None and health["last_error_replica_id"]
    with stack.client() as c:
        listed = {f["name"]: f["health"] for f in c.get("/v1/functions").json()}
    assert listed[name] == health
    ls = _thaw(stack, "functions", "ls")
    assert ls.returncode == 0, ls.stderr
    assert _health_cell(ls.stdout, name) == "failing"
    show = _thaw(stack, "functions", "show", name)
    assert show.returncode == 0, show.stderr
    assert "setup failed: no weights" in show.stderr and "failing" in show.stderr

    stack.deploy(chaos_spec(chaos_store, name))  # the fix: a version whose setup works
    r = invoke(stack, name, {"input": {}})
    assert r.status_code == 200, r.text
    assert _health(stack, name)["state"] == "ok"
    assert _health_cell(_thaw(stack, "functions", "ls").stdout, name) == "ok"


def test_worker_on_another_broker_and_store_is_refused_naming_both(stack: FaultStack) -> None:
    other = stack.root / "elsewhere"
    proc = _spawn_worker(
        stack, "stray", THAW_HOME=str(other / "home"), THAW_STORE=str(other / "store")
    )
    line = _refusal(proc)
    server_home = stack.root / "home"
    assert f"its broker is filesystem://{(other / 'home' / 'broker').resolve()}" in line
    assert f"the control plane's is filesystem://{(server_home / 'broker').resolve()}" in line
    assert f"its store is {(other / 'store').resolve()}" in line
    assert f"the control plane's is {stack.store.resolve()}" in line
    assert "stray" not in {w["name"] for w in stack.workers()}


def test_workers_on_one_host_get_distinct_names_and_calls_name_them(
    stack: FaultStack, chaos_store: E2EStore
) -> None:
    before = {w["id"] for w in stack.workers() if not w["lost"]}
    for label in ("anon-a", "anon-b"):
        _spawn_worker(stack, label)

    def new_workers() -> list[dict[str, Any]]:
        fresh = [w for w in stack.workers() if not w["lost"] and w["id"] not in before]
        return fresh if len(fresh) == 2 else []

    fresh = wait_for(new_workers, "two unnamed workers to register")
    names = {w["name"] for w in fresh}
    assert len(names) == 2, names
    host = socket.gethostname()
    assert all(n.startswith(f"{host}-") for n in names), names

    # A name a live worker has is refused, saying so.
    taken = next(iter(names))
    line = _refusal(_spawn_worker(stack, "copycat", THAW_WORKER_NAME=taken))
    assert f"worker name {taken!r} is taken by live worker" in line

    stack.deploy(chaos_spec(chaos_store, "named"))
    r = invoke(stack, "named", {"input": {}})
    assert r.status_code == 200, r.text
    call = stack.call(r.json()["call_id"])
    live = {w["name"] for w in stack.workers() if not w["lost"]}
    assert call["worker"] in live, (call, live)
    assert call["replica_id"], call
    with stack.client() as c:
        [listed] = [x for x in c.get("/v1/calls?function=named").json()]
    assert (listed["worker"], listed["replica_id"]) == (call["worker"], call["replica_id"])
