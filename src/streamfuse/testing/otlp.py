"""Real OTLP receivers on loopback, for tests and benchmarks: `OtlpReceiver` decodes what an
OTLP/HTTP exporter POSTs to /v1/traces, /v1/metrics and /v1/logs (protobuf, gzip or not) with
the `opentelemetry-proto` classes, `OtlpGrpcReceiver` serves the OTLP gRPC services; both keep
what arrived in memory. `format_trace` prints one trace as a tree.

    with OtlpReceiver() as receiver:          # listens on 127.0.0.1:<free port>
        ...export to receiver.endpoint...
        receiver.wait_for(lambda r: r.spans())
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

#: URL path -> (list attribute, request class, response class) of each OTLP signal.
_SIGNALS: dict[str, tuple[str, Any, Any]] = {
    "/v1/traces": ("traces", ExportTraceServiceRequest, ExportTraceServiceResponse),
    "/v1/metrics": ("metrics", ExportMetricsServiceRequest, ExportMetricsServiceResponse),
    "/v1/logs": ("logs", ExportLogsServiceRequest, ExportLogsServiceResponse),
}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    return getattr(v, kind) if kind else None


def _attributes(kvs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _link(link: Any) -> tuple[str, str, dict[str, Any]]:
    return link.trace_id.hex(), link.span_id.hex(), _attributes(link.attributes)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    #: (trace_id, span_id, attributes) of each linked span.
    links: list[tuple[str, str, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error
    resource: dict[str, Any]

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


@dataclass(frozen=True)
class ReceivedLog:
    trace_id: str  # "" when the record was logged outside a span
    span_id: str
    severity: str
    body: Any
    attributes: dict[str, Any]
    resource: dict[str, Any]


class _Received:
    """What the receivers keep: the decoded export requests, by signal. A receiver is a
    context manager (`start` on entry, `close` on exit); `endpoint` is what to give an OTLP
    exporter (signals under /v1/... over HTTP; the http scheme means no TLS over gRPC)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        self.requests = 0
        self.received_bytes = 0
        self._lock = threading.Lock()

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _add(self, signal: str, request: Any, size: int) -> None:
        with self._lock:
            getattr(self, signal).append(request)
            self.requests += 1
            self.received_bytes += size

    # -- what arrived -------------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[Any], Any], timeout_s: float = 10.0) -> bool:
        """Poll until `predicate(self)` is true (True) or `timeout_s` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.05)
        return bool(predicate(self))

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            requests = list(self.traces)
        out = []
        for request in requests:
            for rs in request.resource_spans:
                resource = _attributes(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(
                            ReceivedSpan(
                                trace_id=s.trace_id.hex(),
                                span_id=s.span_id.hex(),
                                parent_span_id=s.parent_span_id.hex(),
                                name=s.name,
                                start_ns=s.start_time_unix_nano,
                                end_ns=s.end_time_unix_nano,
                                attributes=_attributes(s.attributes),
                                links=[_link(ln) for ln in s.links],
                                status_code=int(s.status.code),
                                resource=resource,
                            )
                        )
        return out

    def metric_names(self) -> set[str]:
        with self._lock:
            requests = list(self.metrics)
        return {
            m.name
            for request in requests
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        }

    def log_records(self) -> list[ReceivedLog]:
        with self._lock:
            requests = list(self.logs)
        out = []
        for request in requests:
            for rl in request.resource_logs:
                resource = _attributes(rl.resource.attributes)
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        out.append(
                            ReceivedLog(
                                trace_id=r.trace_id.hex() if any(r.trace_id) else "",
                                span_id=r.span_id.hex() if any(r.span_id) else "",
                                severity=r.severity_text,
                                body=_value(r.body),
                                attributes=_attributes(r.attributes),
                                resource=resource,
                            )
                        )
        return out


class OtlpReceiver(_Received):
    """OTLP/HTTP (protobuf) on `host`, a free port unless `port` is given, until `close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                status, reply = receiver._accept(self.path, body)
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def _accept(self, path: str, body: bytes) -> tuple[int, bytes]:
        if path not in _SIGNALS:
            return 404, b""
        signal, request_cls, response_cls = _SIGNALS[path]
        request = request_cls()
        try:
            request.ParseFromString(body)
        except Exception:
            return 400, b""
        self._add(signal, request, len(body))
        return 200, response_cls().SerializeToString()


class OtlpGrpcReceiver(_Received):
    """OTLP/gRPC (insecure) on `host`, a free port unless `port` is given, until `close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self._server: Any = None

    def start(self) -> OtlpGrpcReceiver:
        from concurrent.futures import ThreadPoolExecutor

        import grpc
        from opentelemetry.proto.collector.logs.v1 import logs_service_pb2_grpc
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        receiver = self

        def servicer(base: type, signal: str, response_cls: Any) -> Any:
            def export(_self: Any, request: Any, context: Any) -> Any:
                receiver._add(signal, request, request.ByteSize())
                return response_cls()

            return type(f"{signal}Servicer", (base,), {"Export": export})()

        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(
            servicer(
                trace_service_pb2_grpc.TraceServiceServicer, "traces", ExportTraceServiceResponse
            ),
            server,
        )
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            servicer(
                metrics_service_pb2_grpc.MetricsServiceServicer,
                "metrics",
                ExportMetricsServiceResponse,
            ),
            server,
        )
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(
            servicer(logs_service_pb2_grpc.LogsServiceServicer, "logs", ExportLogsServiceResponse),
            server,
        )
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.stop(grace=1).wait()
            self._server = None


def format_trace(spans: list[ReceivedSpan], trace_id: str) -> str:
    """The spans of one trace as an indented tree: offset from the root's start, duration,
    name and the attributes worth reading (links listed under the span that has them)."""
    mine = [s for s in spans if s.trace_id == trace_id]
    by_id = {s.span_id: s for s in mine}
    names_of = {s.span_id: s.name for s in spans}
    children: dict[str, list[ReceivedSpan]] = {}
    roots = []
    for s in sorted(mine, key=lambda s: (s.start_ns, s.end_ns)):
        if s.parent_span_id and s.parent_span_id in by_id:
            children.setdefault(s.parent_span_id, []).append(s)
        else:
            roots.append(s)
    t0 = min((s.start_ns for s in mine), default=0)
    lines: list[str] = []

    def detail(s: ReceivedSpan) -> str:
        a = s.attributes
        bits = []
        if "streamfuse.frame.type" in a and not s.name.startswith("event"):
            bits.append(f"{a['streamfuse.frame.type']} t={a.get('streamfuse.t_media', 0):.2f}s")
        if "streamfuse.queue_wait_s" in a:
            bits.append(f"queued {1000 * a['streamfuse.queue_wait_s']:.1f} ms")
        if "streamfuse.busy_s" in a:
            bits.append(f"busy {1000 * a['streamfuse.busy_s']:.1f} ms")
        if "streamfuse.event.latency_s" in a:
            bits.append(f"latency {1000 * a['streamfuse.event.latency_s']:.1f} ms")
        if s.status_code == 2:
            bits.append("ERROR")
        return ", ".join(bits)

    def walk(s: ReceivedSpan, depth: int) -> None:
        offset = (s.start_ns - t0) / 1e6
        lines.append(
            f"{'  ' * depth}{s.name:<{max(1, 28 - 2 * depth)}} +{offset:8.1f} ms "
            f"{s.duration_ms:8.1f} ms  {detail(s)}".rstrip()
        )
        for _, span_id, _attrs in s.links:
            lines.append(f"{'  ' * (depth + 2)}-> link: {names_of.get(span_id, span_id)}")
        for c in children.get(s.span_id, []):
            walk(c, depth + 1)

    for r in roots:
        walk(r, 0)
    return "\n".join(lines)


__all__ = ["OtlpGrpcReceiver", "OtlpReceiver", "ReceivedLog", "ReceivedSpan", "format_trace"]
