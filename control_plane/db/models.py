"""The control plane's tables (SQLAlchemy 2.0, declarative, typed).

Times are unix seconds as floats: the services take an injected clock, and a
float compares the same way on SQLite and PostgreSQL. Small structured
values (phases, device lists, specs) are JSON text columns; nothing queries
inside them.

Replica states: pending → starting → ready → draining → stopped, or failed.
Call states: queued → dispatched → running → one final state of
succeeded | failed | timeout | cancelled (see ``services.calls``).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    secret_sha256: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(200), doc="comma-separated")
    function: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Invokes with this key: a token bucket (services.ratelimit); None: no limit.
    rate_per_s: Mapped[float | None] = mapped_column(Float, nullable=True, default=None)
    rate_burst: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)


class Secret(Base):
    """A function secret, Fernet-encrypted (services.secrets); never returned by the API."""

    __tablename__ = "secrets"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    sealed_value: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class Function(Base):
    __tablename__ = "functions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    active_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    # The autoscaler's recent recommendations per serving version ({version:
    # [[since, replicas], ...]}), so every control-plane process stabilizes over
    # the same window (services.scale_history).
    scale_history_json: Mapped[str] = mapped_column(Text, default="{}")


class FunctionVersion(Base):
    __tablename__ = "function_versions"
    __table_args__ = (UniqueConstraint("function_id", "version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    function_id: Mapped[int] = mapped_column(ForeignKey("functions.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    spec_json: Mapped[str] = mapped_column(Text)
    model_digest: Mapped[str | None] = mapped_column(String(100), nullable=True)
    adapters_json: Mapped[str] = mapped_column(Text, default="[]")
    created_at: Mapped[float] = mapped_column(Float)
    # The entry class defines load_adapter (the deploy check saw it); None: deployed
    # before thaw recorded it.
    loads_adapters: Mapped[bool | None] = mapped_column(Boolean, nullable=True, default=None)


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    queue: Mapped[str] = mapped_column(String(200))
    devices_json: Mapped[str] = mapped_column(Text, default="[]")
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    free_memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    pool_size: Mapped[int] = mapped_column(Integer, default=0)
    cached_manifests_json: Mapped[str] = mapped_column(Text, default="[]")
    cache_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # Tier holdings, measured bandwidths, pool idle/busy (protocol.WorkerHeartbeat).
    inventory_json: Mapped[str] = mapped_column(Text, default="{}")
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    lost: Mapped[bool] = mapped_column(Boolean, default=False)
    # The direct call port and its token (worker.dataplane); None: queue only. The
    # token is the worker's own per-run secret, kept in clear because the control
    # plane must present it, like a broker password.
    data_addr: Mapped[str | None] = mapped_column(String(300), nullable=True, default=None)
    data_token: Mapped[str | None] = mapped_column(String(200), nullable=True, default=None)
    registered_at: Mapped[float] = mapped_column(Float)
    last_heartbeat_at: Mapped[float] = mapped_column(Float)


class Replica(Base):
    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    function: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(64), index=True)
    device: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), index=True)
    phases_json: Mapped[str] = mapped_column(Text, default="{}")
    adapters_json: Mapped[str] = mapped_column(Text, default="[]")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    # The schedule phase is dispatched_at - requested_at (the oldest waiting
    # call's acceptance, or the decision to start); kept apart from phases_json
    # so the send never races the worker's events on that column.
    requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ready_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stopped_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class Call(Base):
    __tablename__ = "calls"
    __table_args__ = (
        UniqueConstraint("function", "api_key_id", "idempotency_key"),
        # Every call lookup on a hot path narrows by both columns, so the work stays
        # proportional to the calls in flight, not to every call ever made.
        Index("ix_calls_replica_status", "replica_id", "status"),
        Index("ix_calls_function_status", "function", "status"),
        Index("ix_calls_function_accepted", "function", "accepted_at"),
        Index("ix_calls_function_finished", "function", "finished_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    function: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    api_key_id: Mapped[str] = mapped_column(String(32))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    input_json: Mapped[str] = mapped_column(Text)
    adapter: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # X-Thaw-Session: the router sends a session's calls to the replica of its last one.
    session_id: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    output_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # A failed call: "function" (its code raised) or "replica" (its replica died or
    # stopped answering); only the latter counts against a worker (worker_health).
    fault: Mapped[str | None] = mapped_column(String(16), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    timeout_s: Mapped[float] = mapped_column(Float)
    replica_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    cold: Mapped[bool] = mapped_column(Boolean, default=False)
    phases_json: Mapped[str] = mapped_column(Text, default="{}")
    timings_json: Mapped[str] = mapped_column(Text, default="{}")
    # An LLM call's tokens as its replica counted them (``protocol.TokenUsage``);
    # NULL for a call that counted none.
    usage_json: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_pending: Mapped[bool] = mapped_column(Boolean, default=False)
    accepted_at: Mapped[float] = mapped_column(Float)
    deadline_at: Mapped[float] = mapped_column(Float)
    dispatched_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    first_output_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class CallOutput(Base):
    """One streamed chunk of a call, in order (``seq``), for SSE readers anywhere."""

    __tablename__ = "call_outputs"
    __table_args__ = (UniqueConstraint("call_id", "attempt", "seq"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    call_id: Mapped[str] = mapped_column(ForeignKey("calls.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    output_json: Mapped[str] = mapped_column(Text)


class Lock(Base):
    """Named rows that passes lock by updating them (``services.reconciler``).

    An UPDATE takes a row lock on PostgreSQL and the write lock on SQLite, so
    the same statement makes passes of several processes take turns on both.
    """

    __tablename__ = "locks"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)


class Canary(Base):
    """A function's canary: ``version`` takes ``weight_pct`` % of new calls while the
    active version keeps the rest (``services.canary``). At most one per function."""

    __tablename__ = "canaries"

    function_id: Mapped[int] = mapped_column(
        ForeignKey("functions.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer)
    weight_pct: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
