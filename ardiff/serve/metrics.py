"""`GET /metrics`: the server's numbers in Prometheus' text format (prometheus-client).

    metrics = ServeMetrics(manager)        # its own registry: two servers in one process
    body, content_type = metrics.render()  # don't mix

    ardiff_serve_sessions_active              sessions active or paused (holding a slot)
    ardiff_serve_sessions_capacity            sessions the server admits at once
    ardiff_serve_sessions_{created,refused,done,failed,closed}_total   (done: every frame made)
    ardiff_serve_blocks_total                 AR blocks made for sessions
    ardiff_serve_blocks_per_second            over the last 10 s
    ardiff_serve_block_latency_seconds        histogram of one block's forward
    ardiff_serve_kv_pages_in_use / _total     the KV cache's pages (absent: a cache without)
    ardiff_serve_queue_frames                 frames waiting for clients (live sessions, and
                                              ended ones a client still streams)
    ardiff_serve_frames_dropped_total         frames dropped for slow clients
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Seconds: a tiny model's block on a CPU (ms) up to a large one's (s).
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                     10.0, 30.0)
PREFIX = "ardiff_serve"


class ServeMetrics:
    """A registry over one `SessionManager`; the histogram is fed by `manager.on_block`."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.registry = CollectorRegistry()
        self.latency = Histogram(f"{PREFIX}_block_latency_seconds",
                                 "One AR block's forward, seconds", buckets=LATENCY_BUCKETS_S,
                                 registry=self.registry)
        manager.on_block = self.latency.observe
        self.registry.register(_ManagerCollector(manager))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _ManagerCollector:
    """Reads the manager at each scrape, so the numbers are never a second copy kept in sync."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def describe(self) -> list[Metric]:
        return []  # collected live; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        m, stats = self.manager, self.manager.stats
        yield _gauge("sessions_active", "Sessions active or paused", m.live_sessions)
        yield _gauge("sessions_capacity", "Sessions admitted at once", m.capacity)
        for name, value, help_text in (
                ("sessions_created", stats.created, "Sessions admitted"),
                ("sessions_refused", stats.refused, "Sessions refused (503)"),
                ("sessions_done", stats.done, "Sessions that made every frame they asked for"),
                ("sessions_failed", stats.failed, "Sessions failed by a pipeline error"),
                ("sessions_closed", stats.closed, "Sessions closed"),
                ("blocks", stats.blocks, "AR blocks made for sessions"),
                ("frames_dropped", m.frames_dropped(), "Frames dropped for slow clients")):
            counter = CounterMetricFamily(f"{PREFIX}_{name}", help_text)
            counter.add_metric([], value)
            yield counter
        yield _gauge("blocks_per_second", "AR blocks per second over the last 10 s",
                     m.blocks_per_s())
        yield _gauge("queue_frames", "Frames waiting for clients", m.queued_frames())
        in_use, total = m.kv_pages()
        if total is not None:
            yield _gauge("kv_pages_in_use", "KV pages in use", in_use or 0)
            yield _gauge("kv_pages_total", "KV pages allocated", total)


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", help_text, value=value)
