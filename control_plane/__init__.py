"""thaw's control plane: the HTTP API, the decisions, and the books.

Where things live::

    protocol.py        the boundary with worker agents (Celery tasks + HTTP), v1
    spec.py            FunctionSpec and the thaw.toml / thaw.yaml format
    settings.py        every setting (THAW_*), read once per process
    api/               create_app(settings) -> FastAPI; one router per resource;
                       errors.py maps every error to a status, in one place
    services/          decisions and use cases, no FastAPI: keys, functions,
                       catalog (models), calls, workers, replicas; the pure
                       scheduler.place (soonest estimated start: bytes per
                       tier over measured bandwidth, plus load) /
                       autoscaler.decide / router.route; activator
                       (holding a caller until its deadline); reconciler
                       (applies the decisions); coldstart (the schedule and
                       first_output phases, phase/timing histograms);
                       inventory (a worker's tier holdings and bandwidths)
    db/                SQLAlchemy models, sessions (SQLite WAL + busy timeout),
                       migrate (Alembic in migrations/, URL from Settings)
    dispatch/          Dispatcher interface; Celery app factory (filesystem://
                       by default, Redis or RabbitMQ by THAW_BROKER_URL)
    loop.py            the background thread running reconciler.tick

HTTP surface (all but ``/healthz`` need ``Authorization: Bearer thaw_…``)::

    POST   /v1/keys | GET /v1/keys | DELETE /v1/keys/{id}           admin
    GET    /v1/models | GET/DELETE /v1/models/{name}:{tag}           deploy
    POST   /v1/functions (FunctionSpec) | GET /v1/functions[/{name}]  deploy
    DELETE /v1/functions/{name} | POST /v1/functions/{name}/rollback deploy
    POST   /v1/functions?canary_pct=10 (a canary beside the active)  deploy
    GET    /v1/functions/{name}/canary | POST …/canary/promote|abort  deploy
    POST   /v1/functions/{name}/invoke {"input", "adapter"?}          invoke
           Prefer: respond-async → 202 + Location; Accept: text/event-stream
           → SSE (output*, then done | error); Idempotency-Key; X-Thaw-Deadline-Ms;
           X-Thaw-Session (back to the session's replica while it has room);
           "adapter": a listed name or any NAME:TAG adapter in the store (else 400)
           200 succeeded, 500 failed, 504 deadline (phases so far), 409 cancelled
           headers: X-Thaw-Call-Id, X-Thaw-Cold, Server-Timing (phases, timings)
    POST   /v1/functions/{name}/warm {"replicas": N}? | PATCH …/scaling deploy
    GET    /v1/functions/{name}/stats (p50/90/95/99 cold+warm, phases) deploy
    GET    /v1/functions/{name}/stats/llm (TTFT, TPOT cold+warm, tokens/s) deploy
    GET    /v1/calls/{id} | DELETE /v1/calls/{id} (cancel)           invoke
    POST   /v1/workers/register | /v1/workers/{id}/heartbeat          worker
    POST   /v1/replicas/{id}/events | /v1/calls/{id}/events           worker
    GET    /metrics (Prometheus)                                      admin
    GET    /openapi.json (FastAPI's open /docs is off)                any key
    400 bad spec/missing model or adapter (named) · 401 no/bad key · 403 scope
    or function limit · 404 unknown · 409 in use/final · 413 body > max_body_bytes
    · 422 malformed body (field named) · 503 no worker can take a replica

Decisions made here (and why):

* Code reaches the control plane by reference: ``thaw deploy DIR`` pushes DIR
  to the store as a bundle artifact and sends its digest in the spec, so
  code is chunked, deduplicated and cached by the same snapshotter as
  weights, and the API never handles archives.
* A deploy is checked before it goes live: model and adapters must resolve
  with the right kind, and the bundle's entry must import in an isolated
  subprocess (``services.bundles``). A failure leaves the serving version
  untouched. The worker validates again for real when it starts a replica;
  a replica that fails to start fails the calls waiting on it with its error.
* Calls wait in the database (status queued) until a ready replica can take
  them; every transition is a guarded UPDATE, so a call ends exactly once.
* Waiters are woken in-process and also re-read the database every
  ``result_poll_interval_s``, so several control-plane processes can serve
  one database; reconcile passes take turns through a row lock.
"""
