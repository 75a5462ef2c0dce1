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

The front of `--workers N` (FrontCollector) merges every worker's with a `worker` label and
adds its own per worker: _workers, _worker_up, _worker_restarts_total, _sessions_lost_total,
_sessions_routed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

import httpx
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:  # pragma: no cover - typing only: one server never imports the pool
    from ardiff.serve.workers import WorkerPool, WorkerSlot

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


# -- the front of --workers N ---------------------------------------------------------
async def metrics_of(client: httpx.AsyncClient, slot: WorkerSlot) -> tuple[int, str] | None:
    try:
        response = await client.get(f"{slot.url}/metrics", timeout=5.0)
    except httpx.HTTPError:
        return None
    return (slot.index, response.text) if response.status_code == 200 else None


class FrontCollector:
    """Every worker's metrics with a `worker` label, and the front's own per worker."""

    def __init__(self, pool: WorkerPool, texts: dict[int, str]) -> None:
        self.pool, self.texts = pool, texts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for index, text in sorted(self.texts.items()):
            for family in text_string_to_metric_families(text):
                into = merged.setdefault(family.name, Metric(family.name, family.documentation,
                                                             family.type, family.unit))
                into.samples += [sample._replace(labels={**sample.labels, "worker": str(index)})
                                 for sample in family.samples]
        up = GaugeMetricFamily(f"{PREFIX}_worker_up", "1: the worker serves; 0: it starts, "
                               "restarts or stopped", labels=["worker"])
        restarts = CounterMetricFamily(f"{PREFIX}_worker_restarts", "Times the worker was "
                                       "started again after it died", labels=["worker"])
        lost = CounterMetricFamily(f"{PREFIX}_sessions_lost", "Sessions failed because their "
                                   "worker died", labels=["worker"])
        routed = GaugeMetricFamily(f"{PREFIX}_sessions_routed", "Sessions the front routes to "
                                   "the worker", labels=["worker"])
        counts = self.pool.routed()
        for slot in self.pool.slots:
            label = [str(slot.index)]
            up.add_metric(label, 1.0 if slot.state == "ready" else 0.0)
            restarts.add_metric(label, slot.restarts)
            lost.add_metric(label, slot.lost)
            routed.add_metric(label, counts[slot.index])
        workers = GaugeMetricFamily(f"{PREFIX}_workers", "Worker processes", value=self.pool.size)
        return [*merged.values(), workers, up, restarts, lost, routed]
