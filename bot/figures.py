"""`kaiwa status`'s live figures: what a running worker's /metrics says, in a few lines a person
reads.

The figures live in the running process, so `status` asks it over HTTP at `[metrics]`'s address
rather than keeping a second account of its own: the lines here and a Prometheus dashboard can
never disagree. They count from that process's start. A cluster's other workers serve their own
figures at their own addresses; `status` asks the one its config names.

Times come from histograms, so they are told as the bucket bounds they fall under ("half within
0.5 s"), not as made-up precision.
"""

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from bot.config import MetricsConfig
from core.store.outage import PLAINLY
from core.text import plural

ASK_SECONDS = 2.0
ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
"""A server bound to every address is asked on this machine's own."""


@dataclass
class Scrape:
    """The samples of one scrape: name → {labels → value}, labels as sorted (name, value)."""

    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = field(
        default_factory=lambda: defaultdict(dict)
    )

    def total(self, name: str, **labels: str) -> float:
        """The sum over every sample of `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for key, v in self.samples.get(name, {}).items() if wanted <= set(key))

    def by(self, name: str, label: str) -> dict[str, float]:
        """`name`'s samples summed by the value of `label`."""
        summed: dict[str, float] = defaultdict(float)
        for key, value in self.samples.get(name, {}).items():
            summed[dict(key).get(label, "")] += value
        return dict(summed)


def read(text: str) -> Scrape:
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.samples[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return scrape


async def live_figures(settings: MetricsConfig) -> list[str]:
    """The lines `kaiwa status` prints about the running worker at `settings`' address."""
    if not settings.enabled:
        return [
            "live figures: off; set [metrics].enabled = true to see them here and in Prometheus"
        ]
    import aiohttp  # only to ask a worker that serves its figures (`bot.health`)

    host = ANY_ADDRESS.get(settings.host, settings.host)
    url = f"http://{host}:{settings.port}/metrics"
    try:
        timeout = aiohttp.ClientTimeout(total=ASK_SECONDS)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as answer:
            answer.raise_for_status()
            text = await answer.text()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        why = str(exc) or type(exc).__name__
        return [f"live figures: no Kaiwa answered at {url} ({why}); is it running?"]
    return [f"live figures (from {url}, since that process started):", *summary(read(text))]


def summary(scrape: Scrape) -> list[str]:
    lines = ["turns: " + _counted(scrape.by("kaiwa_turns_total", "outcome")), *_waits(scrape)]
    in_flight = scrape.total("kaiwa_model_requests_in_flight")
    waiting = scrape.total("kaiwa_model_requests_waiting")
    lines.append(
        f"queued messages: {scrape.total('kaiwa_queued_messages'):g}; model requests: "
        f"{in_flight:g} in flight, {waiting:g} waiting for a slot"
    )
    tokens = scrape.by("kaiwa_model_tokens_total", "direction")
    lines.append(f"tokens: {tokens.get('in', 0):,.0f} in, {tokens.get('out', 0):,.0f} out")
    lines.append("tool calls: " + _counted(scrape.by("kaiwa_tool_calls_total", "outcome")))
    answered = scrape.by("kaiwa_approvals_answered_total", "decision")
    asked = scrape.total("kaiwa_approvals_asked_total")
    lines.append(f"approvals: {asked:g} asked; answered: {_counted(answered)}")
    running = scrape.total("kaiwa_subagents_running")
    ended = scrape.by("kaiwa_subagent_runs_total", "outcome")
    lines.append(f"sub-agents: {running:g} running; ended: {_counted(ended)}")
    fired = scrape.by("kaiwa_scheduled_firings_total", "outcome")
    lines.append("scheduled firings: " + _counted(fired))
    lines.extend(_store(scrape))
    lines.extend(_platforms(scrape))
    if scrape.total("kaiwa_cluster_workers_alive"):  # a worker of a cluster: it counts itself
        workers = scrape.total("kaiwa_cluster_workers_alive")
        leases = scrape.total("kaiwa_cluster_leases_held")
        lines.append(f"cluster: {workers:g} workers alive; this one holds {leases:g} leases")
    return lines


def _waits(scrape: Scrape) -> list[str]:
    waits = [
        ("first shown text", "kaiwa_turn_first_post_seconds"),
        ("whole reply", "kaiwa_turn_seconds"),
    ]
    lines = []
    for what, name in waits:
        buckets = _buckets(scrape.samples.get(f"{name}_bucket", {}))
        count = buckets[-1][1] if buckets else 0
        if count:
            half, most = _within(buckets, 0.5), _within(buckets, 0.9)
            replies = f"{count:g} {plural(int(count), 'reply', 'replies')}"
            lines.append(f"{what}: half within {half}, 9 in 10 within {most} ({replies})")
    return lines


def _buckets(samples: Mapping[tuple[tuple[str, str], ...], float]) -> list[tuple[float, float]]:
    """(upper bound, replies at most that long), summed over platforms, shortest first."""
    summed: dict[float, float] = defaultdict(float)
    for key, value in samples.items():
        summed[float(dict(key)["le"])] += value
    return sorted(summed.items())


def _within(buckets: list[tuple[float, float]], share: float) -> str:
    wanted = share * buckets[-1][1]
    bound = next(le for le, count in buckets if count >= wanted)
    return "more than the longest bucket" if math.isinf(bound) else f"{bound:g} s"


def _store(scrape: Scrape) -> list[str]:
    outages = scrape.total("kaiwa_store_outages_total")
    seconds = scrape.total("kaiwa_store_outage_seconds_total")
    retries = scrape.total("kaiwa_store_retries_total")
    line = (
        f"database: {outages:g} {plural(int(outages), 'outage')} ({seconds:.1f} s in all), "
        f"{retries:g} {plural(int(retries), 'retry', 'retries')}"
    )
    refused = scrape.by("kaiwa_store_refused_writes_total", "cause")
    if any(refused.values()):
        line += f"; refused writes: {_counted(refused)}"
    refusing = scrape.by("kaiwa_store_refusing_writes", "cause")
    plainly = {cause.value: why for cause, why in PLAINLY.items()}
    now = [plainly.get(cause, cause) for cause, on in sorted(refusing.items()) if on]
    return [line, *(f"the database refuses writes now: {why}" for why in now)]


def _platforms(scrape: Scrape) -> Iterable[str]:
    errors = scrape.by("kaiwa_platform_api_errors_total", "platform")
    limits = scrape.by("kaiwa_platform_rate_limits_total", "platform")
    for platform in sorted(errors.keys() | limits.keys()):
        failed, limited = int(errors.get(platform, 0)), int(limits.get(platform, 0))
        yield (
            f"{platform}: {failed} API {plural(failed, 'error')}, "
            f"{limited} rate {plural(limited, 'limit')}"
        )


def _counted(counts: Mapping[str, float]) -> str:
    """ "12 (10 done, 2 failed)", or "none"."""
    shown = {key: value for key, value in counts.items() if value}
    if not shown:
        return "none"
    parts = ", ".join(f"{value:g} {key}" for key, value in sorted(shown.items()))
    return f"{sum(shown.values()):g} ({parts})"
