"""Control-plane fixtures: a served app on SQLite and on PostgreSQL, a store with
a real tiny model, adapters and code bundles, and fake workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from control_plane.api.app import create_app
from control_plane.dispatch.memory import InMemoryDispatcher
from control_plane.settings import Settings
from snapshotter.manifest import ArtifactKind
from snapshotter.push import push_directory
from snapshotter.registry import Registry
from snapshotter.stores import LocalStore
from tests.control_plane.databases import fresh_pg_database, pg_available
from tests.control_plane.fake_worker import FakeWorker
from tests.control_plane.server import serve

GOOD_CODE = """
class Echo:
    def setup(self, ctx):
        self.ready = True

    def load_adapter(self, adapter):
        pass

    def __call__(self, input, ctx=None):
        return input
"""
# No load_adapter: an ad-hoc adapter is refused.
PLAIN_CODE = "class Echo:\n    def __call__(self, input):\n        return input\n"
BAD_CODE = "import thaw_module_that_does_not_exist\n\nclass Echo:\n    pass\n"
NO_CALL_CODE = "class Echo:\n    def setup(self, ctx):\n        pass\n"


@dataclass(frozen=True)
class StoreFixture:
    root: Path
    model_ref: str
    adapter_refs: list[str]
    good_bundle: str
    bad_bundle: str
    no_call_bundle: str
    plain_bundle: str  # __call__ only: no load_adapter


def _bundle(root: Path, registry: Registry, name: str, code: str) -> str:
    d = root / name
    d.mkdir(parents=True)
    (d / "app.py").write_text(code)
    (d / "thaw.toml").write_text('name = "x"\nentry = "app:Echo"\n')
    return push_directory(d, f"bundles/{name}:v1", registry, kind=ArtifactKind.BUNDLE).digest


@pytest.fixture(scope="session")
def cp_store(
    tmp_path_factory: pytest.TempPathFactory, llama_dir: Path, adapter_dirs: list[Path]
) -> StoreFixture:
    root = tmp_path_factory.mktemp("cp-store")
    registry = Registry(LocalStore(root / "store"))
    push_directory(llama_dir, "llama-tiny:v1", registry)
    adapters = []
    for i, d in enumerate(adapter_dirs):
        push_directory(d, f"llama-lora{i}:v1", registry)
        adapters.append(f"llama-lora{i}:v1")
    return StoreFixture(
        root=root / "store",
        model_ref="llama-tiny:v1",
        adapter_refs=adapters,
        good_bundle=_bundle(root / "code", registry, "good", GOOD_CODE),
        bad_bundle=_bundle(root / "code", registry, "bad", BAD_CODE),
        no_call_bundle=_bundle(root / "code", registry, "nocall", NO_CALL_CODE),
        plain_bundle=_bundle(root / "code", registry, "plain", PLAIN_CODE),
    )


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'thaw.db'}"
        return
    if not pg_available():
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is not reachable")
    with fresh_pg_database() as url:
        yield url


@dataclass
class ControlPlane:
    base_url: str
    admin_token: str
    dispatcher: InMemoryDispatcher
    settings: Settings
    store: StoreFixture
    workers: list[FakeWorker] = field(default_factory=list)
    app: Any = None  # the served app, for a test that reaches its services

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token or self.admin_token}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30)

    def key(self, *scopes: str, function: str | None = None) -> str:
        with self.client() as c:
            r = c.post("/v1/keys", json={"scopes": list(scopes), "function": function})
            r.raise_for_status()
            return str(r.json()["token"])

    def worker(self, **kw: Any) -> FakeWorker:
        w = FakeWorker(self.base_url, self.key("worker"), self.dispatcher, **kw).start()
        self.workers.append(w)
        return w

    def spec(self, name: str = "echo", **kw: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "name": name,
            "bundle": self.store.good_bundle,
            "entry": "app:Echo",
            "model": self.store.model_ref,
            "device": "cpu",
            "timeout_s": 10,
            "scaling": {"min_replicas": 0, "max_replicas": 2, "idle_timeout_s": 60},
        }
        base.update(kw)
        return base

    def deploy(self, name: str = "echo", **kw: Any) -> dict[str, Any]:
        with self.client() as c:
            r = c.post("/v1/functions", json=self.spec(name, **kw))
            assert r.status_code == 201, r.text
            return dict(r.json())


def make_settings(tmp_path: Path, db_url: str, store: Path, **kw: Any) -> Settings:
    base: dict[str, Any] = dict(
        home=tmp_path / "home",
        database_url=db_url,
        store=str(store),
        reconcile_interval_s=0.05,
        result_poll_interval_s=0.05,
        heartbeat_interval_s=0.2,
        # Lost after 2 s of silence: the fake worker's heartbeat thread shares a GIL
        # with two served apps and the test's clients, and may stall past 0.6 s.
        worker_lost_after_heartbeats=10,
        deploy_validate_timeout_s=60,
    )
    base.update(kw)
    return Settings(**base)


@pytest.fixture
def cp_factory(
    tmp_path: Path, db_url: str, cp_store: StoreFixture
) -> Iterator[Callable[..., ControlPlane]]:
    """Start a served control plane with settings overrides; everything stops at teardown."""
    stack: list[Any] = []

    def start(dispatcher: InMemoryDispatcher | None = None, **overrides: Any) -> ControlPlane:
        settings = make_settings(tmp_path, db_url, cp_store.root, **overrides)
        dispatcher = dispatcher or InMemoryDispatcher()
        app = create_app(settings, dispatcher=dispatcher)
        ctx = serve(app)
        base_url = ctx.__enter__()
        stack.append(ctx)
        # A second app on the same database finds the key already made: reuse the first's.
        token = app.state.bootstrap_admin_key or next(
            c.admin_token for c in stack if isinstance(c, ControlPlane)
        )
        cp = ControlPlane(base_url, token, dispatcher, settings, cp_store, app=app)
        stack.append(cp)
        return cp

    yield start
    for item in reversed(stack):
        if isinstance(item, ControlPlane):
            for w in item.workers:
                w.stop()
        else:
            item.__exit__(None, None, None)


@pytest.fixture
def cp(cp_factory: Callable[..., ControlPlane]) -> ControlPlane:
    return cp_factory()
