"""The router's Prometheus metrics (its own registry, served at `/metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "adapterplane_router_requests", "Inference requests by outcome: ok, refused "
            "(answered 4xx by the router or an agent), failed (5xx or no agent), "
            "interrupted (a stream broken after its first byte).",
            ["outcome"], registry=self.registry)
        self.attempts = Counter(
            "adapterplane_router_attempts", "Requests sent to agents, by result: ok, "
            "connect (no connection or dropped before an answer), status_5xx, status_429.",
            ["result"], registry=self.registry)
        self.cold_routes = Counter(
            "adapterplane_router_cold_routes", "Requests sent to an agent that did not "
            "hold the adapter (by consistent hashing).", registry=self.registry)
        self.overhead = Histogram(
            "adapterplane_router_admission_seconds", "Router time before a request is sent "
            "to an agent (parse, authorize, resolve, route).", registry=self.registry,
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05))
        self.table_age = Gauge(
            "adapterplane_router_table_age_seconds", "Seconds since the routing state was "
            "last refreshed from the control plane.", registry=self.registry)
        self.agents = Gauge(
            "adapterplane_router_agents", "Agents in the routing table by state: routable, "
            "draining, stale (heartbeat older than the lease).", ["state"],
            registry=self.registry)
        self.outcome = {o: self.requests.labels(o)
                        for o in ("ok", "refused", "failed", "interrupted")}
        """Bound series of `requests` (a label lookup per request costs more than the count)."""
        self.attempt = {r: self.attempts.labels(r)
                        for r in ("ok", "connect", "status_5xx", "status_429")}
