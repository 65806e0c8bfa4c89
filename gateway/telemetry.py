"""Optional OTLP/HTTP spans: one per gateway call, when FABRIC_OTEL_ENDPOINT is set.

Attributes are the endpoint, HTTP status and token count -- never the prompt or the key.
Spans are exported from the SDK's batch processor thread, so an unreachable collector only
costs a logged export error and never fails or slows a request.
"""

from __future__ import annotations

import time


class Tracer:
    def __init__(self, otel_endpoint: str | None, service_name: str = "fabric-gateway"):
        self._provider = None
        self._tracer = None
        if not otel_endpoint:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # Our own provider, not the global one, so several apps in one process never collide.
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        exporter = OTLPSpanExporter(endpoint=otel_endpoint.rstrip("/") + "/v1/traces", timeout=5)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        self._tracer = self._provider.get_tracer("fabric.gateway")

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(self, *, endpoint: str, status: int, tokens: int, seconds: float) -> None:
        if self._tracer is None:
            return
        end = time.time_ns()
        span = self._tracer.start_span("gateway.call", start_time=end - int(seconds * 1e9), attributes={
            "fabric.endpoint": endpoint, "http.response.status_code": status, "fabric.tokens": tokens,
        })
        span.end(end_time=end)

    def force_flush(self) -> None:
        if self._provider is not None:
            self._provider.force_flush(5000)

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()
