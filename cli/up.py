"""``thaw up``: the whole platform on this machine, in one command.

In order: migrate the database (SQLite under THAW_HOME by default); make an
admin key and a worker key (kept in ``<home>/admin.key`` and
``<home>/worker/api.key``, mode 600, reused while valid); build the example
model and its two LoRA adapters locally (``examples/build_model.py``, once)
and push them to the store; start the control plane and one worker as child
processes (logs in ``<home>/logs``); deploy ``examples/textgen``; print the
admin key and ready-to-paste curl lines.

A worker that dies (killed, crashed) is started again after a pause that
doubles from 1 s up to 30 s while it keeps dying, and said on the console;
it registers under the same id, and the control plane re-runs what its
replicas held. Ctrl-C (or SIGTERM) drains the worker first: it takes no new
calls, lets running ones finish for up to ``THAW_DRAIN_GRACE_S``, then stops
its replicas; calls that never started stay queued for the next start. Then
the control plane stops. A child that does not exit within its grace period
is killed.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Annotated, Any

import httpx
import typer

from cli.control import err, fail, out
from control_plane.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = REPO_ROOT / "examples"
EXAMPLE_FUNCTION = "textgen"
EXAMPLE_ARTIFACTS = {
    "model": "textgen-llama:v1",
    "pirate": "textgen-pirate:v1",
    "poet": "textgen-poet:v1",
}
# An LLM function on the example's model, beside it: no code, the OpenAI routes.
LLM_FUNCTION = "chat"
LLM_DEPLOY = [
    "--llm",
    EXAMPLE_ARTIFACTS["model"],
    LLM_FUNCTION,
    "--adapter",
    f"pirate={EXAMPLE_ARTIFACTS['pirate']}",
    "--kv-cache-mb",
    "16",
]
STOP_GRACE_S = 15.0
UP_HEARTBEAT_INTERVAL_S = 1.0
START_TIMEOUT_S = 180.0
RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 30.0
# A child that ran this long before it died starts its backoff again from the first delay.
RESTART_RESET_AFTER_S = 60.0


def up(
    port: Annotated[int, typer.Option(help="control plane port")] = 8000,
    host: Annotated[str, typer.Option(help="control plane bind address")] = "127.0.0.1",
) -> None:
    """Start thaw on this machine (control plane + one worker) with the example deployed."""
    url = f"http://{host}:{port}"
    settings = Settings(server_host=host, server_port=port, server_url=url)
    home = settings.home.resolve()
    if not (EXAMPLES / EXAMPLE_FUNCTION / "thaw.toml").is_file():
        raise fail(f"{EXAMPLES} is missing: run `thaw up` from a checkout of the thaw repository")
    admin_key, worker_key = prepare(settings, home)
    env = {
        "THAW_HOME": str(home),
        "THAW_SERVER_URL": url,
        "THAW_SERVER_HOST": host,
        "THAW_SERVER_PORT": str(port),
    }
    if "heartbeat_interval_s" not in settings.model_fields_set:
        # One machine: a lost worker or a stopped replica is noticed within seconds.
        env["THAW_HEARTBEAT_INTERVAL_S"] = str(UP_HEARTBEAT_INTERVAL_S)
    stop = threading.Event()
    with Children(home / "logs") as children, signals_set(stop):
        children.start("server", ["server", "--host", host, "--port", str(port)], env)
        wait_until(lambda: healthy(url), "the control plane", children, stop)
        children.start(
            "worker",
            ["worker"],
            {**env, "THAW_API_KEY": worker_key},
            restart=True,
            stop_grace_s=settings.drain_grace_s + STOP_GRACE_S,
            stopping=f"draining the worker: running calls may finish for up to "
            f"{settings.drain_grace_s:g} s (THAW_DRAIN_GRACE_S)…",
        )
        devices = wait_until(lambda: worker_devices(url, admin_key), "the worker", children, stop)
        deploy_example(env, admin_key)
        banner(url, admin_key, devices, home)
        children.wait(stop)
    out.print("thaw stopped.")


# --- preparation -------------------------------------------------------------
def prepare(settings: Settings, home: Path) -> tuple[str, str]:
    """Migrate, make keys, build and push the example model. Returns (admin, worker) keys."""
    from control_plane.db import migrate
    from control_plane.db.reach import DatabaseUnreachableError

    db_url = settings.database_url_resolved()
    try:
        migrate.upgrade(db_url)
    except DatabaseUnreachableError as exc:
        raise fail(str(exc)) from None
    out.print(f"database ready ({_redacted(db_url)})", soft_wrap=True)
    admin_key = ensure_key(db_url, settings.admin_key_file or home / "admin.key", "admin")
    worker_key = ensure_key(db_url, home / "worker" / "api.key", "worker")
    built = build_example(home / "example")
    push_example(settings, built)
    return admin_key, worker_key


def ensure_key(db_url: str, path: Path, scope: str) -> str:
    """The key kept at ``path`` if the database still accepts it, else a new one written there."""
    from control_plane.db.session import Database
    from control_plane.errors import UnauthorizedError
    from control_plane.services import keys

    db = Database(db_url)
    try:
        with db.session() as s:
            if path.is_file():
                token = path.read_text().strip()
                try:
                    keys.authenticate(s, token)
                    return token
                except UnauthorizedError:
                    pass  # revoked, or another database: make a new one
            token, _ = keys.create_key(s, time.time(), [scope], name=f"thaw up {scope}")
    finally:
        db.dispose()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


def build_example(out_dir: Path) -> dict[str, Path]:
    """The example model and adapters, built once (``examples/build_model.py``)."""
    dirs = {"model": out_dir / "model", **{n: out_dir / "adapters" / n for n in ("pirate", "poet")}}
    marker = out_dir / ".built-v2"  # v2: the tokenizer has a chat template
    if not marker.is_file():
        out.print("building the example model and adapters (tiny Llama, local tokenizer)…")
        cmd = [sys.executable, str(EXAMPLES / "build_model.py"), str(out_dir)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise fail(f"examples/build_model.py failed:\n{done.stderr[-3000:]}")
        marker.write_text("ok\n")
    return dirs


def push_example(settings: Settings, dirs: dict[str, Path]) -> None:
    from snapshotter.push import push_directory
    from snapshotter.registry import Registry
    from snapshotter.stores import open_store

    registry = Registry(open_store(settings.store_config()))
    for name, ref in EXAMPLE_ARTIFACTS.items():
        result = push_directory(dirs[name], ref, registry)
        out.print(
            f"pushed {ref} ({result.raw_size_bytes / 1e6:.1f} MB) to {registry.store.url}",
            soft_wrap=True,
        )


def deploy_example(env: dict[str, str], admin_key: str) -> None:
    """The example function, and the LLM function on its model."""
    for args in ([str(EXAMPLES / EXAMPLE_FUNCTION)], LLM_DEPLOY):
        cmd = [sys.executable, "-m", "cli.main", "deploy", *args]
        done = subprocess.run(
            cmd,
            env={**os.environ, **env, "THAW_API_KEY": admin_key},
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise fail(f"deploying the example failed:\n{(done.stderr or done.stdout)[-3000:]}")
        out.print(done.stdout.strip(), soft_wrap=True)


# --- children ----------------------------------------------------------------
def restart_delay_s(previous_s: float | None, ran_s: float) -> float:
    """The pause before starting a dead child again: doubled each time it dies soon
    after a start, from the first delay again once it had run a while."""
    if previous_s is None or ran_s >= RESTART_RESET_AFTER_S:
        return RESTART_FIRST_DELAY_S
    return min(previous_s * 2, RESTART_MAX_DELAY_S)


@dataclass
class Child:
    """One child process, and how it is started again and stopped."""

    name: str
    args: list[str]
    env: dict[str, str]
    restart: bool  # started again when it dies; else its death stops ``thaw up``
    stop_grace_s: float  # from SIGTERM to SIGKILL
    stopping: str  # said when it is asked to stop
    proc: subprocess.Popen[bytes]
    log: IO[bytes]
    started_at: float
    delay_s: float | None = None  # the last pause before a restart
    restart_at: float | None = None  # when it is due to start again (it died)


class Children:
    """Child processes of ``thaw``, each in its own session, logging to a file.

    Stopped in reverse start order (the worker drains and stops its replicas
    before the control plane goes away): SIGTERM, then SIGKILL after the
    child's grace.
    """

    def __init__(self, log_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.log_dir = log_dir
        self.clock = clock
        self.children: list[Child] = []

    def __enter__(self) -> Children:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        *,
        restart: bool = False,
        stop_grace_s: float = STOP_GRACE_S,
        stopping: str = "",
    ) -> None:
        proc, log = self._spawn(name, args, env)
        self.children.append(
            Child(
                name,
                args,
                env,
                restart,
                stop_grace_s,
                stopping or f"stopping {name}…",
                proc,
                log,
                self.clock(),
            )
        )

    def _spawn(
        self, name: str, args: list[str], env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        log_name = self.log_dir / f"{name}.log"
        log = open(log_name, "ab")  # noqa: SIM115 (closed in stop_all)
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *args],
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches thaw up only; it stops them in order
        )
        out.print(f"started {name} (pid {proc.pid}, log {log_name})", soft_wrap=True)
        return proc, log

    def wait(self, stop: threading.Event) -> None:
        """Until ``stop`` is set; a child that dies is started again (or, one that is
        not restarted, raises with its log's tail)."""
        while not stop.wait(0.5):
            self.check()

    def check(self) -> None:
        for child in self.children:
            if child.proc.poll() is None:
                continue
            if not child.restart:
                raise fail(
                    f"the {child.name} exited unexpectedly; its log ends with:\n"
                    f"{self.tail(child.name)}"
                )
            self._restart_when_due(child)

    def _restart_when_due(self, child: Child) -> None:
        now = self.clock()
        if child.restart_at is None:
            child.delay_s = restart_delay_s(child.delay_s, now - child.started_at)
            child.restart_at = now + child.delay_s
            err.print(
                f"the {child.name} exited with code {child.proc.returncode}; starting it "
                f"again in {child.delay_s:g} s (its log: {self.log_dir / child.name}.log)",
                soft_wrap=True,
            )
            return
        if now < child.restart_at:
            return
        child.log.close()
        child.proc, child.log = self._spawn(child.name, child.args, child.env)
        child.started_at, child.restart_at = self.clock(), None

    def tail(self, name: str, lines: int = 30) -> str:
        text = (self.log_dir / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop_all(self) -> None:
        for child in reversed(self.children):
            proc = child.proc
            if proc.poll() is None:
                out.print(child.stopping)
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=child.stop_grace_s)
                except subprocess.TimeoutExpired:
                    err.print(f"{child.name} did not stop in {child.stop_grace_s:g} s; killing it")
                    proc.kill()
                    proc.wait()
            child.log.close()
        self.children.clear()


class signals_set:
    """SIGINT, SIGTERM and SIGHUP set ``stop`` instead of raising, while inside."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, lambda *_: self.stop.set())

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def wait_until(
    probe: Callable[[], Any], what: str, children: Children, stop: threading.Event
) -> Any:
    """Poll ``probe`` until it returns a truthy value; fail if a child dies or on timeout."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if stop.is_set():
            raise typer.Exit(130)
        children.check()
        value = probe()
        if value:
            return value
        stop.wait(0.2)
    raise fail(f"{what} did not come up in {START_TIMEOUT_S:g} s; see the logs")


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def worker_devices(url: str, admin_key: str) -> list[dict[str, Any]] | None:
    """The devices of the first live worker, once one has registered."""
    try:
        r = httpx.get(f"{url}/v1/workers", headers=_auth(admin_key), timeout=5)
    except httpx.HTTPError:
        return None
    live = [w for w in r.json() if not w.get("lost")] if r.status_code == 200 else []
    if not live:
        return None
    return list(live[0]["devices"]) or [{"kind": "cpu"}]


# --- output ------------------------------------------------------------------
def banner(url: str, admin_key: str, devices: list[dict[str, Any]], home: Path) -> None:
    gpus = [d for d in devices if d.get("kind") == "cuda"]
    where = (
        f"{len(gpus)} GPU(s): {', '.join(d.get('name', 'cuda') for d in gpus)}"
        if gpus
        else "no GPU found: functions run on the CPU"
    )
    invoke = f"{url}/v1/functions/{EXAMPLE_FUNCTION}/invoke"
    body = '{"input": {"prompt": "The quick brown fox", "max_tokens": 24}}'
    adapter_body = '{"input": {"prompt": "Hello", "max_tokens": 24}, "adapter": "pirate"}'
    auth = f"-H {shlex.quote('Authorization: Bearer ' + admin_key)}"
    json_h = "-H 'Content-Type: application/json'"
    out.print(f"\n[bold green]thaw is up[/bold green] at {url} with one worker.", soft_wrap=True)
    out.print(f"devices: {where}.", soft_wrap=True)
    out.print(f"state and logs: {home}\n", soft_wrap=True)
    out.print("[bold]admin key[/bold] (also in admin.key there):")
    out.print(admin_key, soft_wrap=True)
    out.print(f"\nexport THAW_SERVER_URL={url} THAW_API_KEY={admin_key}\n", soft_wrap=True)
    out.print("[bold]invoke (sync):[/bold]")
    out.print(f"curl -s {invoke} {auth} {json_h} -d '{body}'", soft_wrap=True)
    out.print("[bold]invoke (streaming tokens, server-sent events):[/bold]")
    out.print(
        f"curl -sN {invoke} {auth} {json_h} -H 'Accept: text/event-stream' -d '{body}'",
        soft_wrap=True,
    )
    out.print("[bold]with a LoRA adapter:[/bold]")
    out.print(f"curl -s {invoke} {auth} {json_h} -d '{adapter_body}'", soft_wrap=True)
    llm_banner(url, admin_key)
    out.print(f"\nweb console: {url}/   —   Ctrl-C stops everything.", soft_wrap=True)


def llm_banner(url: str, admin_key: str) -> None:
    """How to call the LLM function: curl, and the openai SDK unchanged."""
    auth = f"-H {shlex.quote('Authorization: Bearer ' + admin_key)}"
    messages = '[{"role": "user", "content": "Hello"}]'
    chat = f'{{"model": "{LLM_FUNCTION}", "messages": {messages}, "max_tokens": 24}}'
    out.print(f"\n[bold]LLM function {LLM_FUNCTION!r} (OpenAI API at {url}/openai/v1):[/bold]")
    out.print(
        f"curl -s {url}/openai/v1/chat/completions {auth} "
        f"-H 'Content-Type: application/json' -d '{chat}'",
        soft_wrap=True,
    )
    out.print("[bold]with the openai SDK (pip install openai):[/bold]")
    snippet = "\n".join(
        [
            "python3 - <<'EOF'",
            "from openai import OpenAI",
            f'client = OpenAI(base_url="{url}/openai/v1", api_key="{admin_key}")',
            f'r = client.chat.completions.create(model="{LLM_FUNCTION}", '
            f"messages={messages}, max_tokens=24)",
            "print(r.choices[0].message.content)",
            "EOF",
        ]
    )
    out.print(snippet, soft_wrap=True, markup=False, highlight=False)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _redacted(db_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(db_url).render_as_string(hide_password=True)
