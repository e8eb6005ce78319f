"""Metrics of a store shared by all its processes: each process counts its searches and adds (latency histograms by
path and rule) and writes them to a file of its own in the store folder about once a second; `StoreMetrics` adds up
every process's file, for `tiered-recall stats` and for Prometheus (`StoreCollector`, a prometheus-client collector).

Why files and not prometheus-client's multiprocess mode: that mode is switched on for the whole Python process by an
environment variable read when prometheus_client is first imported, which would take over an application's own
metrics; a collector over our own files leaves them alone.
"""
from __future__ import annotations

import json
import os
import secrets
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..hot.proc import pid_alive

METRICS_FOLDER = "metrics"
# Histogram bucket bounds, in seconds: a hot search is tens of microseconds, a cold one milliseconds.
BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)
FLUSH_S = 1.0


class _Histogram:
    """Counts per bucket (cumulative only when exported), their sum and count."""

    __slots__ = ("counts", "total", "n")

    def __init__(self, counts: list[int] | None = None, total: float = 0.0, n: int = 0) -> None:
        self.counts = counts if counts is not None else [0] * (len(BUCKETS) + 1)
        self.total = total
        self.n = n

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(BUCKETS, seconds)] += 1  # the first bound >= seconds: Prometheus's "le"
        self.total += seconds
        self.n += 1

    def merge(self, other: "_Histogram") -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.total += other.total
        self.n += other.n

    def to_json(self) -> list:
        return [self.counts, self.total, self.n]

    @classmethod
    def from_json(cls, value: list) -> "_Histogram":
        return cls(list(value[0]), float(value[1]), int(value[2]))


class MetricsRecorder:
    """This process's counts for one store, written to <store>/metrics/<pid>-<token>.json by a daemon thread when they
    changed (at most every FLUSH_S) and at close. Observing costs a dict lookup and a few additions: nothing is
    written on the caller's path."""

    def __init__(self, store_path: Path, gauges, *, writable: bool = True) -> None:
        self.writable = writable  # a read-only store counts for its own stats() only: it writes nothing
        self.folder = Path(store_path) / METRICS_FOLDER
        # The pid says whether the writer still runs; the token keeps two stores of one process apart.
        self.file = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}.json"
        self._gauges = gauges  # () -> {name: value}: rows per tier, backlog; read when the file is written
        self._lock = threading.Lock()
        self._searches: dict[tuple[str, str], _Histogram] = {}
        self._adds = _Histogram()
        self._added_rows = 0
        self._dirty = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def observe_search(self, path: str, rule: str, seconds: float) -> None:
        """One search: the path that served it, the rule that decided it, how long it took."""
        with self._lock:
            histogram = self._searches.get((path, rule))
            if histogram is None:
                histogram = self._searches[(path, rule)] = _Histogram()
            histogram.observe(seconds)
        self._mark()

    def observe_add(self, rows: int, seconds: float) -> None:
        """One add of `rows` memories and how long it took (durable write and hot tier)."""
        with self._lock:
            self._adds.observe(seconds)
            self._added_rows += rows
        self._mark()

    def _mark(self) -> None:
        if not self.writable:
            return
        if not self._dirty.is_set():
            self._dirty.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None and not self._stopping.is_set():
                    self._thread = threading.Thread(target=self._run, name="tiered-recall-metrics", daemon=True)
                    self._thread.start()

    def snapshot(self) -> dict:
        """This process's counts and gauges as the file holds them."""
        with self._lock:
            searches = [[path, rule, h.to_json()] for (path, rule), h in self._searches.items()]
            adds, added = self._adds.to_json(), self._added_rows
        try:
            gauges = self._gauges()
        except Exception:  # a store being closed: the counts still count
            gauges = {}
        return {"pid": os.getpid(), "written_at": time.time(), "searches": searches, "adds": adds,
                "added_rows": added, "gauges": gauges}

    def write(self) -> None:
        """Writes the file now (atomically: a reader sees the old or the new one)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, self.file)

    def close(self) -> None:
        """Writes the last counts and stops the thread."""
        self._stopping.set()
        self._dirty.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.writable and (self._searches or self._adds.n):
            try:
                self.write()
            except OSError:
                pass  # a read-only folder keeps no shared metrics

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._dirty.wait()
            if self._stopping.is_set():
                return
            self._dirty.clear()
            try:
                self.write()
            except OSError:
                return  # a read-only folder keeps no shared metrics
            self._stopping.wait(FLUSH_S)


class StoreMetrics:
    """Every process's counts for one store, added up: what has happened in the store since its metrics folder was
    made, by all processes, the finished ones included."""

    def __init__(self, store_path: Path) -> None:
        self.folder = Path(store_path) / METRICS_FOLDER

    def _files(self) -> Iterator[dict]:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob("*.json")):
            try:
                yield json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # being replaced, or torn by a crash: the next read has it

    def totals(self) -> dict:
        """{"searches": {(path, rule): histogram}, "adds": histogram, "added_rows": n, "processes": n,
        "live_processes": n, "gauges": the gauges of the file written last}."""
        searches: dict[tuple[str, str], _Histogram] = {}
        adds, added, processes, live, gauges, newest = _Histogram(), 0, 0, 0, {}, -1.0
        for data in self._files():
            processes += 1
            for path, rule, value in data.get("searches", []):
                searches.setdefault((path, rule), _Histogram()).merge(_Histogram.from_json(value))
            adds.merge(_Histogram.from_json(data["adds"]))
            added += int(data.get("added_rows", 0))
            live += pid_alive(int(data.get("pid", -1)))
            if data.get("written_at", 0) > newest:  # the latest word on the store's rows, from whichever process
                newest, gauges = data["written_at"], data.get("gauges", {})
        return {"searches": searches, "adds": adds, "added_rows": added, "processes": processes,
                "live_processes": live, "gauges": gauges}

    def summary(self) -> dict:
        """The totals as plain numbers: searches by path and by rule, adds, mean latencies."""
        t = self.totals()
        by_path: dict[str, int] = {}
        by_rule: dict[str, int] = {}
        for (path, rule), h in t["searches"].items():
            by_path[path] = by_path.get(path, 0) + h.n
            by_rule[rule] = by_rule.get(rule, 0) + h.n
        n = sum(by_path.values())
        seconds = sum(h.total for h in t["searches"].values())
        return {"processes": t["processes"], "live_processes": t["live_processes"], "searches": n,
                "searches_by_path": by_path, "searches_by_rule": by_rule,
                "search_mean_us": round(seconds / n * 1e6, 1) if n else None,
                "adds": t["adds"].n, "added_rows": t["added_rows"],
                "add_mean_us": round(t["adds"].total / t["adds"].n * 1e6, 1) if t["adds"].n else None}


class StoreCollector:
    """A prometheus-client collector of a store's metrics, all processes added up (register it in a
    CollectorRegistry; `tiered-recall serve --metrics-port` does)."""

    def __init__(self, store_path: Path) -> None:
        self.metrics = StoreMetrics(store_path)

    def collect(self):
        """The metric families, read from the processes' files at each scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        t = self.metrics.totals()
        search = HistogramMetricFamily("tiered_recall_search_seconds", "Search latency by the path that served it "
                                       "(hot, hot+cold, cold) and the rule that decided it", labels=["path", "rule"])
        for (path, rule), h in sorted(t["searches"].items()):
            search.add_metric([path, rule], _cumulative(h), sum_value=h.total)
        yield search
        adds = HistogramMetricFamily("tiered_recall_add_seconds", "Latency of add calls (durable write and hot tier)")
        adds.add_metric([], _cumulative(t["adds"]), sum_value=t["adds"].total)
        yield adds
        rows = CounterMetricFamily("tiered_recall_added_rows", "Memories added")
        rows.add_metric([], t["added_rows"])
        yield rows
        processes = GaugeMetricFamily("tiered_recall_processes", "Processes using the store now")
        processes.add_metric([], t["live_processes"])
        yield processes
        for name, value in sorted(t["gauges"].items()):
            if isinstance(value, (int, float)):
                gauge = GaugeMetricFamily(f"tiered_recall_{name}", _GAUGE_HELP.get(name, name))
                gauge.add_metric([], value)
                yield gauge


_GAUGE_HELP = {
    "hot_rows": "Rows the hot tier holds",
    "cold_rows": "Rows the cold tier holds",
    "log_backlog_bytes": "Bytes of write-ahead log records not yet committed to LanceDB",
    "sidecar_rewarms": "Times this process re-warmed a new sidecar (one started after the last was lost)",
}


def _cumulative(h: _Histogram) -> list[tuple[str, float]]:
    out, running = [], 0
    for bound, count in zip(BUCKETS, h.counts):
        running += count
        out.append((repr(bound), running))
    out.append(("+Inf", h.n))
    return out


def span(name: str, **attributes: Any):
    """An OpenTelemetry span when the application has configured a tracer provider, else a context manager that
    does nothing (no cost beyond this check): the store never configures tracing itself."""
    tracer = _tracer()
    if tracer is None:
        return _NO_SPAN
    return tracer.start_as_current_span(name, attributes=attributes)


# How long "no tracer provider is configured" is taken as read: asking OpenTelemetry costs a search about 2 us (it
# reads the environment each time), and a provider, once set, stays (OpenTelemetry sets the global one only once).
TRACER_RECHECK_S = 1.0
_no_tracer_until = 0.0


def tracing() -> bool:
    """Whether the application has configured an OpenTelemetry tracer provider (spans would go somewhere); one set
    after the last check is seen within TRACER_RECHECK_S."""
    global _no_tracer_until
    if _no_tracer_until and time.monotonic() < _no_tracer_until:
        return False
    if _tracer() is None:
        _no_tracer_until = time.monotonic() + TRACER_RECHECK_S
        return False
    _no_tracer_until = 0.0
    return True


class _NoSpan:
    def __enter__(self):
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


_NO_SPAN = _NoSpan()


_trace_module: Any = None  # opentelemetry.trace once found; False when it is not installed


def _tracer():
    global _trace_module
    if _trace_module is None:
        try:
            from opentelemetry import trace as _trace_module
        except ImportError:
            _trace_module = False
    if _trace_module is False:
        return None
    provider = _trace_module.get_tracer_provider()
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
        return None  # nothing configured: spans would go nowhere
    return provider.get_tracer("tiered_recall")
