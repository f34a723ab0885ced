"""Bad input and security (issue 7, items 16-20): hostile artifacts, caps, rate limits,
secrets, and a broker that accepts JSON only.

Each test sends the hostile input through the real path (a store, the loader, the
push, the HTTP API, a Celery worker) and checks both the refusal and its message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from typer.testing import CliRunner

from cli.main import app as cli_app
from control_plane.db import migrate
from control_plane.db.session import Database
from control_plane.dispatch.celery_app import make_celery
from control_plane.errors import NotFoundError
from control_plane.protocol import (
    TASK_START_REPLICA,
    TASK_STOP_REPLICA,
    CallEvent,
    StartReplica,
    StopReplica,
    worker_queue,
)
from control_plane.services.secrets import SecretBox, SecretsKeyError, reveal, set_secret
from snapshotter.errors import BadArtifactError
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores.local import LocalStore
from tests.control_plane import conftest as cp_fixtures
from tests.control_plane.conftest import ControlPlane
from tests.faults.security_artifacts import (
    BOMB_RAW_BYTES,
    compressible_model,
    framed_bomb,
    many_entries_header,
    safetensors_with_header,
    zstd_chunk,
)
from tests.faults.security_http import database_holds, invoke, key, recorded_calls, starts
from tests.faults.security_replicas import LocalCodeRuntime, SmallBodyRecorder, run, start
from tests.worker.recorder import Recorder
from worker.call_guard import CallLimits, guard
from worker.consumer import BrokerConfig, Consumer, Handlers
from worker.replicas import ReplicaManager

# The control-plane suite's fixtures (a served app with fake workers), used here too.
cp_factory = cp_fixtures.cp_factory
cp_store = cp_fixtures.cp_store

REPO_ROOT = Path(__file__).resolve().parents[2]
CHUNK_SIZE_BYTES = 64 << 10
CHILD = [sys.executable, "-m", "tests.faults.security_bomb_child"]

# --- 16: decompression bombs are refused without allocating them ---------------


@pytest.mark.parametrize("kind", ["thc-header", "zstd-claims", "zstd-expands"])
def test_zstd_bomb_in_store_is_refused_without_allocating_it(tmp_path: Path, kind: str) -> None:
    registry = Registry(LocalStore(tmp_path / "store"))
    model = compressible_model(tmp_path / "zeros")
    digest = push_directory(model, "zeros:v1", registry, chunk_size_bytes=CHUNK_SIZE_BYTES).digest
    victim = zstd_chunk(registry, digest)
    registry.put_chunk(victim.digest, framed_bomb(kind, victim.size))

    child = subprocess.run(
        [*CHILD, str(tmp_path / "store"), str(tmp_path / "cache"), "zeros:v1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["type"] == "ChunkTooLargeError", report
    assert "zeros:v1" in report["message"] and victim.digest in report["message"]
    assert str(victim.size) in report["message"]
    assert "push the artifact again" in report["message"]
    # The bomb would be 256 MiB (thaw's own header claims 1 TiB); the load's whole
    # peak stays far under that, in RSS and in Python allocations.
    grown_bytes = (report["rss_after_kib"] - report["rss_before_kib"]) << 10
    assert grown_bytes < BOMB_RAW_BYTES // 4, report
    assert report["traced_peak_bytes"] < 16 << 20, report
    assert victim.digest not in {p.name for p in (tmp_path / "cache").rglob("*")}


# --- 17: pickles refused at push; hostile safetensors headers refused ------------


def _push_cli(tmp_path: Path, directory: Path, ref: str) -> tuple[int, str]:
    env = {"THAW_HOME": str(tmp_path / "home"), "THAW_STORE": str(tmp_path / "store")}
    result = CliRunner().invoke(cli_app, ["models", "push", str(directory), ref], env=env)
    return result.exit_code, result.output


def _stored_chunks(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "store").rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "sub/opt.pkl", "last.ckpt"])
def test_push_refuses_pickle_checkpoint_naming_it(
    tmp_path: Path, llama_dir: Path, name: str
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for f in llama_dir.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    pickle_path = model / name
    pickle_path.parent.mkdir(exist_ok=True)
    # A real torch pickle whose unpickling would run code: never opened by push.
    pickle_path.write_bytes(b"\x80\x04cos\nsystem\n(S'touch " + bytes(tmp_path) + b"/pwned'\ntR.")

    code, output = _push_cli(tmp_path, model, "pickled:v1")
    assert code != 0
    flat = " ".join(output.split())
    assert name in flat and "pickle" in flat and "safetensors" in flat
    assert "Convert them to safetensors" in flat
    assert not (tmp_path / "pwned").exists()
    assert _stored_chunks(tmp_path) == []


def test_safetensors_header_with_too_many_entries_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "wide"
    model.mkdir()
    count = 100_001
    safetensors_with_header(model / "model.safetensors", many_entries_header(count), count)
    with pytest.raises(BadArtifactError, match="more than 100000 entries; refused"):
        push_directory(model, "wide:v1", Registry(LocalStore(tmp_path / "store")))
    assert _stored_chunks(tmp_path) == []


@pytest.mark.parametrize(
    ("header", "data_bytes", "message"),
    [
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            },
            24,
            "overlaps the tensor before it",
        ),
        (
            {"huge": {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4 << 40]}},
            16,
            "past the end of the data",
        ),
        (
            {"lie": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 16]}},
            16,
            "span 16",
        ),
    ],
    ids=["overlap", "past-end", "shape-lies"],
)
def test_safetensors_header_with_bad_offsets_is_refused_before_reading_data(
    tmp_path: Path, header: dict[str, object], data_bytes: int, message: str
) -> None:
    model = tmp_path / "bad"
    model.mkdir()
    safetensors_with_header(model / "model.safetensors", header, data_bytes)
    code, output = _push_cli(tmp_path, model, "bad:v1")
    assert code != 0
    assert message in " ".join(output.split()), output
    assert "model.safetensors" in output
    assert _stored_chunks(tmp_path) == []


# --- Celery accepts JSON only ------------------------------------------------------


class _TouchOnUnpickle:
    """Unpickling this runs ``Path(path).touch()``: what a hostile pickle could do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (Path.touch, (self.path,))


def test_worker_consumer_refuses_a_pickle_serialized_message(tmp_path: Path) -> None:
    seen: list[str] = []
    done = threading.Event()

    def stop_replica(msg: StopReplica) -> None:
        seen.append(msg.replica_id)
        done.set()

    ignore = lambda _: None  # noqa: E731
    handlers = Handlers(start_replica=ignore, stop_replica=stop_replica, run_call=ignore)
    broker = BrokerConfig("filesystem://", tmp_path / "broker", 0.01)
    consumer = Consumer(broker, "w-json-only", handlers, concurrency=2)
    consumer.start()
    sender = make_celery("filesystem://", tmp_path / "broker", 0.01)
    queue = worker_queue("w-json-only")
    try:
        hostile = _TouchOnUnpickle(tmp_path / "pwned")
        sender.send_task(TASK_STOP_REPLICA, args=[hostile], queue=queue, serializer="pickle")
        fine = StopReplica(replica_id="r-json").model_dump(mode="json")
        sender.send_task(TASK_STOP_REPLICA, args=[fine], queue=queue)
        assert done.wait(30), "the JSON message after the pickle was never handled"
    finally:
        consumer.stop()
        sender.close()
    assert seen == ["r-json"]
    assert not (tmp_path / "pwned").exists()


# --- 19: rate limits answer 429 before anything is scheduled -----------------------


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """The rate limiter keeps no state in the database: SQLite is enough here."""
    return f"sqlite:///{tmp_path / 'thaw.db'}"


def test_refused_calls_never_cold_start_a_scaled_to_zero_function(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    cp = cp_factory()
    worker = cp.worker()
    cp.deploy("echo")
    cp.deploy("other")
    slow_key = key(cp, scopes=["invoke"], rate_per_s=0.001, rate_burst=1)
    assert invoke(cp, "other", slow_key).status_code == 200  # its one token, spent

    refused: dict[int, list[str | None]] = {
        401: [None, "thaw_nope", "thaw_000000000000_wrongsecret"],
        403: [cp.key("deploy"), cp.key("invoke", function="other")],
        429: [slow_key],
    }
    for status, tokens in refused.items():
        for token in tokens:
            for _ in range(5):
                r = invoke(cp, "echo", token)
                assert r.status_code == status, r.text
                assert r.json()["detail"]
    unknown = invoke(cp, "echo", "thaw_000000000000_wrongsecret")
    assert unknown.headers["WWW-Authenticate"] == "Bearer"
    assert "check THAW_API_KEY" in unknown.json()["detail"]
    r = invoke(cp, "echo", slow_key)
    assert r.headers["Retry-After"].isdigit() and int(r.headers["Retry-After"]) >= 1
    assert "API key" in r.json()["detail"] and "retry after" in r.json()["detail"]
    time.sleep(10 * cp.settings.reconcile_interval_s)  # reconcile rounds pass: still nothing
    assert starts(worker, "echo") == 0
    assert recorded_calls(cp, "echo") == 0  # nothing was even accepted

    assert invoke(cp, "echo", cp.admin_token).status_code == 200
    assert starts(worker, "echo") == 1  # the check above could see a start


def test_function_rate_limit_from_spec_answers_429_with_retry_after(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    cp = cp_factory()
    worker = cp.worker()
    cp.deploy("limited", limits={"calls_per_s": 0.01, "burst": 2})
    token = cp.key("invoke")
    assert [invoke(cp, "limited", token).status_code for _ in range(2)] == [200, 200]
    refused = [invoke(cp, "limited", token) for _ in range(10)]
    assert {r.status_code for r in refused} == {429}
    assert all(50 <= int(r.headers["Retry-After"]) <= 100 for r in refused)
    assert (
        "function 'limited' is over its rate limit of 0.01 calls/s" in refused[0].json()["detail"]
    )
    assert starts(worker, "limited") == 1
    assert recorded_calls(cp, "limited") == 2


# --- 18 and 20: results capped, secrets injected at run time and redacted ----------

SECRET = "hf_s3cr3tV4LUE-do-not-leak"
LIMITS = CallLimits(max_result_bytes=1000, max_stream_chunk_bytes=500, max_error_bytes=400)


@pytest.fixture
def replicas() -> Iterator[tuple[ReplicaManager, Recorder]]:
    recorder = Recorder()
    runtime = LocalCodeRuntime()
    manager = ReplicaManager(runtime, recorder.client(), None, call_limits=LIMITS)
    yield manager, recorder
    manager.close()
    manager.stop_all()
    runtime.close()


def test_secret_reaches_the_replica_env_and_is_redacted_from_call_records(
    replicas: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = replicas
    start(manager, "secretive:Leaky", {"HF_TOKEN": SECRET})
    [*_, done] = run(manager, recorder, "c-ok", {})
    assert done["kind"] == "succeeded"
    # The replica read the value from its environment; the record holds only its name.
    assert done["output"] == {
        "token": "[redacted:HF_TOKEN]",
        "nested": ["Bearer [redacted:HF_TOKEN]"],
        "[redacted:HF_TOKEN]": "as a key",
    }
    [*_, failed] = run(manager, recorder, "c-raise", {"mode": "raise"})
    assert failed["kind"] == "failed"
    assert "upstream refused token [redacted:HF_TOKEN]" in failed["error"]
    assert SECRET not in json.dumps(recorder.posts)  # nothing the worker posted holds it


def test_secret_is_not_in_the_start_message_repr() -> None:
    msg = StartReplica(
        replica_id="r",
        function="f",
        version=1,
        bundle_digest="b",
        entry="m:C",
        secrets={"HF_TOKEN": SECRET},
    )
    assert SECRET not in repr(msg) and SECRET not in str(msg)


def test_result_over_the_cap_fails_the_call_with_a_clear_reason(
    replicas: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = replicas
    start(manager, "secretive:Leaky", {"HF_TOKEN": SECRET})
    [*_, small] = run(manager, recorder, "c-small", {"mode": "big", "size": 900})
    assert small["kind"] == "succeeded" and small["output"] == "x" * 900
    [*_, big] = run(manager, recorder, "c-big", {"mode": "big", "size": 5000})
    assert big["kind"] == "failed" and big["output"] is None
    assert "result is 5002 bytes as JSON, over the worker's cap of 1000 bytes" in big["error"]
    assert "THAW_MAX_RESULT_BYTES" in big["error"] and "by reference" in big["error"]


def test_streamed_output_over_the_cap_ends_the_call_failed(
    replicas: tuple[ReplicaManager, Recorder],
) -> None:
    manager, recorder = replicas
    start(manager, "secretive:Chunky", {})
    events = run(manager, recorder, "c-stream", {"sizes": [100, 600, 100]}, stream=True)
    assert [e["kind"] for e in events] == ["started", "output", "failed"]
    assert "streamed output is 602 bytes" in events[-1]["error"]
    assert "THAW_MAX_STREAM_CHUNK_BYTES" in events[-1]["error"]


def test_long_error_message_is_cut_with_a_marker() -> None:
    event = CallEvent(kind="failed", error="e" * 5000)
    cut = guard(event, LIMITS, {})
    assert cut.error is not None and cut.error.startswith("e" * 400)
    assert cut.error.endswith("[truncated by thaw: 4600 more bytes]")


def test_secrets_are_sealed_at_rest_never_returned_and_sent_only_to_start_a_replica(
    cp_factory: Callable[..., ControlPlane], tmp_path: Path
) -> None:
    cp = cp_factory()
    worker = cp.worker()
    env = {"THAW_SERVER_URL": cp.base_url, "THAW_API_KEY": cp.admin_token, "COLUMNS": "200"}
    runner = CliRunner()
    result = runner.invoke(cli_app, ["secrets", "set", "HF_TOKEN", SECRET], env=env)
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli_app, ["secrets", "ls"], env=env)
    assert "HF_TOKEN" in listed.output and SECRET not in listed.output
    with cp.client() as c:
        assert SECRET not in c.get("/v1/secrets").text
        bad = c.put("/v1/secrets/hf-token", json={"value": "x"})
        assert bad.status_code == 400 and "HF_TOKEN" in bad.json()["detail"]

    with cp.client() as c:
        r = c.post("/v1/functions", json=cp.spec("needy", secrets=["HF_TOKEN", "NOT_SET"]))
    assert r.status_code == 400
    assert "NOT_SET that are not set; set them with `thaw secrets set NOT_SET" in r.json()["detail"]
    cp.deploy("echo", secrets=["HF_TOKEN"])
    assert invoke(cp, "echo", cp.admin_token).status_code == 200
    [start] = [p for t, p in worker.received if t == TASK_START_REPLICA]
    assert start["secrets"] == {"HF_TOKEN": SECRET}
    assert all(SECRET not in json.dumps(p) for t, p in worker.received if t != TASK_START_REPLICA)
    assert database_holds(cp, SECRET) == []  # sealed: not in clear in any table
    assert database_holds(cp, '"HF_TOKEN"') != []  # the spec holds the name (the scan works)

    result = runner.invoke(cli_app, ["secrets", "rm", "HF_TOKEN"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli_app, ["secrets", "rm", "HF_TOKEN"], env=env)
    assert result.exit_code != 0 and "thaw secrets ls" in " ".join(result.output.split())


def test_secrets_of_a_function_are_revealed_only_when_all_are_set(tmp_path: Path) -> None:
    box = SecretBox(Fernet.generate_key())
    db = Database(f"sqlite:///{tmp_path / 'thaw.db'}")
    migrate.upgrade(f"sqlite:///{tmp_path / 'thaw.db'}")
    try:
        with db.session() as s:
            set_secret(s, box, "A_TOKEN", "aaa", now=1.0)
        with db.session() as s, pytest.raises(NotFoundError, match=r"B_TOKEN .*thaw secrets set"):
            reveal(s, box, ["A_TOKEN", "B_TOKEN"], "fn")
        with db.session() as s:
            assert reveal(s, box, ["A_TOKEN"], "fn") == {"A_TOKEN": "aaa"}
        with db.session() as s, pytest.raises(SecretsKeyError, match="THAW_SECRETS_KEY"):
            reveal(s, SecretBox(Fernet.generate_key()), ["A_TOKEN"], "fn")
    finally:
        db.dispose()


def test_request_body_over_the_cap_is_413_naming_the_setting(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    cp = cp_factory(max_body_bytes=4096)
    cp.deploy("echo")
    with cp.client() as c:
        r = c.post("/v1/functions/echo/invoke", json={"input": "z" * 5000})
    assert r.status_code == 413
    assert "exceeds 4096 bytes (THAW_MAX_BODY_BYTES)" in r.json()["detail"]
    assert "by reference" in r.json()["detail"]
    assert recorded_calls(cp, "echo") == 0


def test_replica_output_is_redacted_and_capped_per_call(tmp_path: Path) -> None:
    log_path = tmp_path / "replica.log"
    recorder = Recorder()
    with log_path.open("wb") as log:
        runtime = LocalCodeRuntime(log=log)
        limits = CallLimits(max_log_bytes_per_call=4000)
        manager = ReplicaManager(runtime, recorder.client(), None, call_limits=limits)
        try:
            start(manager, "secretive:Chatty", {"HF_TOKEN": SECRET})
            [*_, short] = run(manager, recorder, "c-short", {"lines": 3, "tag": "short"})
            [*_, chatty] = run(manager, recorder, "c-chatty", {"lines": 200, "tag": "chatty"})
            [*_, after] = run(manager, recorder, "c-after", {"lines": 3, "tag": "after"})
        finally:
            manager.close()
            manager.stop_all()
            runtime.close()
    assert [short["kind"], chatty["kind"], after["kind"]] == ["succeeded"] * 3
    text = log_path.read_text()
    assert SECRET not in text
    assert "token: [redacted:HF_TOKEN]" in text
    assert "split [redacted:HF_TOKEN] end" in text  # split across two writes
    assert "to stderr [redacted:HF_TOKEN]" in text
    assert "short line 0002" in text and "after line 0002" in text  # each call has its own cap
    assert "chatty line 0010" in text and "chatty line 0199" not in text
    assert text.count("THAW_MAX_LOG_BYTES_PER_CALL") == 1


def test_keys_are_stored_hashed_and_rate_limits_set_from_the_cli(
    cp_factory: Callable[..., ControlPlane],
) -> None:
    cp = cp_factory()
    env = {"THAW_SERVER_URL": cp.base_url, "THAW_API_KEY": cp.admin_token, "COLUMNS": "200"}
    args = ["keys", "create", "--scope", "invoke", "--rate", "2.5", "--burst", "4"]
    result = CliRunner().invoke(cli_app, args, env=env)
    assert result.exit_code == 0, result.output
    token = result.output.split()[-1]
    listed = CliRunner().invoke(cli_app, ["keys", "ls"], env=env).output
    assert "2.5/s burst 4" in listed
    secret_part = token.split("_", 2)[2]  # thaw_<id>_<secret>; the secret may hold "_"
    assert database_holds(cp, secret_part) == [] and database_holds(cp, cp.admin_token) == []
    args = ["keys", "create", "--scope", "invoke", "--burst", "4"]
    refused = CliRunner().invoke(cli_app, args, env=env)
    assert refused.exit_code != 0 and "pass --rate" in refused.output


def test_result_the_control_plane_refuses_as_too_large_ends_the_call_failed() -> None:
    recorder = SmallBodyRecorder(max_body_bytes=3000)
    runtime = LocalCodeRuntime()
    manager = ReplicaManager(runtime, recorder.client(), None)  # default caps: 4 MiB
    try:
        start(manager, "secretive:Leaky", {"HF_TOKEN": SECRET})
        events = run(manager, recorder, "c-huge", {"mode": "big", "size": 5000})
    finally:
        manager.close()
        manager.stop_all()
        runtime.close()
    assert [e["kind"] for e in events] == ["started", "failed"]
    assert "THAW_MAX_BODY_BYTES" in events[-1]["error"]
    assert "THAW_MAX_RESULT_BYTES" in events[-1]["error"]
