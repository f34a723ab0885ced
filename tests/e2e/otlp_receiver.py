"""A real OTLP/HTTP trace receiver for tests: decodes ``ExportTraceServiceRequest``
protobufs posted to ``/v1/traces`` and keeps the spans."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # hex
    span_id: str
    parent_span_id: str  # "" for a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: bool


def _value(v: Any) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest.FromString(body)
    out = []
    for rs in request.resource_spans:
        resource = {a.key: _value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        error=s.status.code == s.status.STATUS_CODE_ERROR,
                    )
                )
    return out


class OtlpReceiver:
    """``with OtlpReceiver() as r:`` listens on a free local port; ``r.endpoint``."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver.lock:
                    receiver.spans.extend(spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
