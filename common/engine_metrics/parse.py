"""An engine's /metrics text -> a typed sample, and two samples -> the observation routing uses.

Which metric names carry which reading is a ``MetricNames`` per runtime (vLLM's here, the
others in runtime_metrics); a reading a page lacks is listed in the sample's ``missing`` and
the observation's, so a strategy never reads an absent gauge as zero load. Parsed with ``prometheus_client``'s text parser. Both KV-cache gauge names are accepted:
``vllm:kv_cache_usage_perc`` (vLLM 0.7 and later) and ``vllm:gpu_cache_usage_perc`` (earlier).
Series are summed over labels (one engine may serve several ``model_name`` labels).

Gauges (queue, running, KV usage) are read from one scrape. TTFT, tokens/s and the failure
share are rates, so they come from the delta between two scrapes of the same engine; a counter
that went down means the engine restarted, and the newer sample alone is then the delta.
Failures are finished requests whose ``finished_reason`` is ``abort`` or ``error``.

Fast path: a real vLLM page is hundreds of lines (latency histograms, process and GC metrics) and
``prometheus_client``'s parser costs 10-20 us per line (it scans labels character by character),
so ``metric_lines`` first keeps only the samples (and their ``# TYPE`` lines) of the families read
here. With a ``SeriesCache`` (the routing controller keeps one) the parser then sees each series
(name and label set) once and later scrapes only have their values read; the controller also
skips the parse when an engine's kept lines equal its previous scrape's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from common.schemas import ReplicaObservation

KV_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
FAILED_REASONS = ("abort", "error")
READINGS = ("queue", "running", "kv_cache", "ttft", "tokens", "failures")


class MetricsParseError(ValueError):
    """The page is not Prometheus text or lacks every gauge of its runtime."""


@dataclass(frozen=True)
class EngineSample:
    waiting: float
    running: float
    kv_cache_usage: float
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (upper bound, cumulative count)
    generation_tokens: float = 0.0
    finished: float = 0.0
    failed: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    missing: tuple[str, ...] = ()  # READINGS this page did not carry


@dataclass(frozen=True)
class MetricNames:
    """Where one runtime puts each reading (sample names as they appear on its page; a counter
    is matched with and without ``_total``). Empty means the runtime has no such metric."""

    runtime: str
    waiting: tuple[str, ...] = ()
    running: tuple[str, ...] = ()
    kv_usage: tuple[str, ...] = ()  # 0..1; the first one present wins
    kv_label: tuple[str, str] | None = None  # (label, value) a KV sample must carry
    ttft: str | None = None  # histogram in seconds (its _bucket/_sum/_count samples)
    tokens: tuple[str, ...] = ()  # generated-token counters
    finished: tuple[str, ...] = ()  # finished-request counters, failures among them by label
    failed_reasons: tuple[str, ...] = ()  # finished_reason values of ``finished`` that are failures
    failures: tuple[str, ...] = ()  # failed-request counters, counted as finished too

    def lacks(self) -> tuple[str, ...]:
        """Readings this runtime never reports."""
        has = {"queue": self.waiting, "running": self.running, "kv_cache": self.kv_usage, "ttft": self.ttft,
               "tokens": self.tokens, "failures": self.failures or self.failed_reasons}
        return tuple(r for r in READINGS if not has[r])

    @property
    def families(self) -> tuple[str, ...]:
        names = (*self.waiting, *self.running, *self.kv_usage, *((self.ttft,) if self.ttft else ()),
                 *self.tokens, *self.finished, *self.failures)
        return tuple(dict.fromkeys(n.removesuffix("_total") for n in names))

    @property
    def gauges(self) -> frozenset[str]:
        return frozenset((*self.waiting, *self.running, *self.kv_usage))


VLLM_NAMES = MetricNames(
    "vllm", waiting=("vllm:num_requests_waiting",), running=("vllm:num_requests_running",), kv_usage=KV_NAMES,
    ttft="vllm:time_to_first_token_seconds", tokens=("vllm:generation_tokens_total",),
    finished=("vllm:request_success_total",), failed_reasons=FAILED_REASONS,
)


@functools.cache
def _keep_prefixes(names: MetricNames) -> tuple[str, ...]:
    # A line is kept when it starts with a family name (samples with any suffix) or is one of
    # their # TYPE lines. HELP text is not read. A longer name sharing a prefix (say
    # vllm:num_requests_waiting_by_reason) is kept too and ignored by the parse.
    return names.families + tuple(f"# TYPE {f}" for f in names.families)


def metric_lines(text: str, names: MetricNames = VLLM_NAMES) -> str:
    """Only the lines of ``text`` that parse_lines reads for this runtime (the parser's input)."""
    keep = _keep_prefixes(names)
    return "\n".join(line for line in text.split("\n") if line.startswith(keep)) + "\n"


def vllm_lines(text: str) -> str:
    return metric_lines(text, VLLM_NAMES)


class SeriesCache:
    """Series text (the metric name and its label set, as on the page) -> (name, labels) as
    ``prometheus_client``'s parser read it. An engine repeats the same series every scrape (and
    engines of one model share them) with new values; with this cache the parser sees each series
    once and later lines only have their value read (``float``, as the parser does). A line
    whose series is new, or whose value part is unusual, goes to the parser. Bounded: cleared
    when it reaches ``limit`` entries."""

    def __init__(self, limit: int = 50_000):
        self.limit = limit
        self._series: dict[str, tuple[str, dict[str, str]]] = {}

    def __len__(self) -> int:
        return len(self._series)

    def samples(self, text: str) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        for line in text.split("\n"):
            if not line or line[0] == "#":
                continue
            brace = line.rfind("}")  # value and timestamp hold no "}": the last one ends the labels
            if brace >= 0:
                series, rest = line[: brace + 1], line[brace + 1:].split()
            else:
                series, *rest = line.split()
            hit = self._series.get(series)
            if hit is not None and len(rest) in (1, 2):
                try:
                    out.append((hit[0], hit[1], float(rest[0])))
                    continue
                except ValueError:
                    pass
            out.extend(self._parse_line(line, series))
        return out

    def _parse_line(self, line: str, series: str) -> list[tuple[str, dict[str, str], float]]:
        try:
            found = [(s.name, s.labels, float(s.value))
                     for family in text_string_to_metric_families(line + "\n") for s in family.samples]
        except (ValueError, TypeError) as exc:
            raise MetricsParseError(f"not Prometheus text: {exc}") from None
        if len(found) == 1:
            if len(self._series) >= self.limit:
                self._series.clear()
            self._series[series] = (found[0][0], found[0][1])
        return found


def parse_vllm_metrics(text: str, cache: SeriesCache | None = None) -> EngineSample:
    """A vLLM /metrics page -> EngineSample (MetricsParseError when it has no vLLM gauge)."""
    return parse_lines(metric_lines(text, VLLM_NAMES), VLLM_NAMES, cache)


def parse_vllm_lines(text: str, cache: SeriesCache | None = None) -> EngineSample:
    return parse_lines(text, VLLM_NAMES, cache)


def _parsed_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    try:
        return [(s.name, s.labels, float(s.value))
                for family in text_string_to_metric_families(text) for s in family.samples]
    except (ValueError, TypeError) as exc:
        raise MetricsParseError(f"not Prometheus text: {exc}") from None


def _counter(name: str, names: tuple[str, ...]) -> bool:
    return name in names or name + "_total" in names or name.removesuffix("_total") in names


def parse_lines(text: str, names: MetricNames, cache: SeriesCache | None = None) -> EngineSample:
    """Lines already reduced by ``metric_lines`` -> EngineSample, reading ``names``' metrics.
    Series are summed over labels; a reading none of whose metrics appeared is in ``missing``."""
    gauges: dict[str, float] = {}
    buckets: dict[float, float] = {}
    ttft_sum = ttft_count = gen = finished = failed = 0.0
    seen: set[str] = set()
    ttft = names.ttft
    for name, labels, value in (cache.samples(text) if cache is not None else _parsed_samples(text)):
        if math.isnan(value):
            continue
        if name in names.gauges:
            if name in names.kv_usage and names.kv_label and labels.get(names.kv_label[0]) != names.kv_label[1]:
                continue
            gauges[name] = gauges.get(name, 0.0) + value
        elif ttft and name == ttft + "_bucket":
            le = float(labels.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + value
            seen.add("ttft")
        elif ttft and name == ttft + "_sum":
            ttft_sum += value
        elif ttft and name == ttft + "_count":
            ttft_count += value
            seen.add("ttft")
        elif _counter(name, names.tokens):
            gen += value
            seen.add("tokens")
        elif _counter(name, names.finished):
            finished += value
            if labels.get("finished_reason") in names.failed_reasons:
                failed += value
            if names.failed_reasons:
                seen.add("failures")
        elif _counter(name, names.failures):
            finished += value
            failed += value
            seen.add("failures")
    if not any(g in gauges for g in (*names.waiting, *names.kv_usage)):
        wanted = ", ".join((*names.waiting, *names.kv_usage)) or "none"
        raise MetricsParseError(f"no {names.runtime} gauges ({wanted})")
    for reading, group in (("queue", names.waiting), ("running", names.running), ("kv_cache", names.kv_usage)):
        if any(g in gauges for g in group):
            seen.add(reading)
    return EngineSample(
        waiting=next((gauges[k] for k in names.waiting if k in gauges), 0.0),
        running=next((gauges[k] for k in names.running if k in gauges), 0.0),
        kv_cache_usage=next((gauges[k] for k in names.kv_usage if k in gauges), 0.0),
        ttft_sum=ttft_sum,
        ttft_count=ttft_count,
        ttft_buckets=tuple(sorted(buckets.items())),
        generation_tokens=gen,
        finished=finished,
        failed=failed,
        missing=tuple(r for r in READINGS if r not in seen),
    )


def _delta(new: float, old: float | None) -> float:
    if old is None or new < old:  # first scrape or an engine restart
        return new
    return new - old


def histogram_quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """Prometheus-style quantile from cumulative (le, count) buckets; None when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def observe(
    replica_id: str, sample: EngineSample, previous: EngineSample | None, elapsed_s: float, now: float
) -> ReplicaObservation:
    """The observation for one successful scrape, rates from the previous sample if any."""
    ttft_count = _delta(sample.ttft_count, previous.ttft_count if previous else None)
    ttft_p50 = None
    if ttft_count > 0:
        old = dict(previous.ttft_buckets) if previous and sample.ttft_count >= previous.ttft_count else {}
        delta_buckets = tuple((le, c - old.get(le, 0.0)) for le, c in sample.ttft_buckets)
        ttft_p50 = histogram_quantile(0.5, delta_buckets)
        if ttft_p50 is None:
            ttft_p50 = _delta(sample.ttft_sum, previous.ttft_sum if previous else None) / ttft_count
    tokens_per_s = None
    if previous is not None and elapsed_s > 0:
        tokens_per_s = _delta(sample.generation_tokens, previous.generation_tokens) / elapsed_s
    finished = _delta(sample.finished, previous.finished if previous else None)
    failed = _delta(sample.failed, previous.failed if previous else None)
    failure_ratio = failed / finished if finished > 0 else None
    return ReplicaObservation(
        replica_id=replica_id,
        scraped_at=now,
        ok=True,
        queue_depth=sample.waiting,
        running=sample.running,
        kv_cache_usage=sample.kv_cache_usage,
        ttft_p50_s=ttft_p50,
        tokens_per_s=tokens_per_s,
        failure_ratio=failure_ratio,
        finished_total=sample.finished,
        failed_total=sample.failed,
        ttft_sum_s=sample.ttft_sum,
        ttft_count=sample.ttft_count,
        missing=list(sample.missing),
    )


def failed_observation(replica_id: str, error: str, now: float) -> ReplicaObservation:
    """A scrape that failed: never read as idle (the strategies exclude it)."""
    return ReplicaObservation(replica_id=replica_id, scraped_at=now, ok=False, error=error[:200])
