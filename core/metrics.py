"""What Kaiwa counts for its operators, as Prometheus metrics: one owner for every name.

Each metric is defined here once, on prometheus-client's default registry, and moved by the
one module that knows the event (a turn's end in `core.turns.endings`, a tool's result in
`core.agent.loop`, a slot in `core.agent.slots`, the database in `core.store.dbthread` and
`core.store.outage`, a firing
in `core.features.schedule.firing`, a question in `core.features.approvals.questions`, a run in
`core.features.subagents.work`, a lease in `core.cluster.leases`, a platform's refusal in
`channels.rendering`). Moving one is a lock and an addition, so it costs a turn nothing
measurable; nothing is exported unless `[metrics]` serves them (`bot.health`).

Label values are bounded: platforms, outcomes, model names and tool names come from the code
and the configuration, never from people, so no place id, person id or text becomes a label. A
tool name the model invented is counted as `unknown`.
"""

from prometheus_client import Counter, Gauge, Histogram

SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""From a fast first word to a long agent run."""

TURNS = Counter("kaiwa_turns", "Turns ended, by platform and outcome.", ["platform", "outcome"])
FIRST_POST_SECONDS = Histogram(
    "kaiwa_turn_first_post_seconds",
    "From a turn's start until its reply first shows on the platform (its first words, or what "
    "it is doing).",
    ["platform"],
    buckets=SECONDS_BUCKETS,
)
TURN_SECONDS = Histogram(
    "kaiwa_turn_seconds",
    "From a turn's start until its reply's end.",
    ["platform"],
    buckets=SECONDS_BUCKETS,
)
QUEUED_MESSAGES = Gauge(
    "kaiwa_queued_messages", "Messages waiting behind their conversation's running turn."
)
MODEL_REQUESTS_IN_FLIGHT = Gauge(
    "kaiwa_model_requests_in_flight", "Model requests holding one of Ollama's slots."
)
MODEL_REQUESTS_WAITING = Gauge(
    "kaiwa_model_requests_waiting", "Model requests waiting for a slot ([ollama] max_concurrent)."
)
MODEL_TOKENS = Counter(
    "kaiwa_model_tokens", "Tokens the model read (in) and wrote (out).", ["model", "direction"]
)
TOOL_CALLS = Counter("kaiwa_tool_calls", "Tool calls, by tool and outcome.", ["tool", "outcome"])
SCHEDULED_FIRINGS = Counter(
    "kaiwa_scheduled_firings", "Scheduled task runs ended, by outcome.", ["outcome"]
)
STORE_OUTAGES = Counter("kaiwa_store_outages", "Times the database became unreachable.")
STORE_OUTAGE_SECONDS = Counter(
    "kaiwa_store_outage_seconds", "Seconds the database was unreachable, summed over outages."
)
REFUSED_WRITES = Counter(
    "kaiwa_store_refused_writes",
    "Writes the database refused, by cause (disk_full, read_only, quota).",
    ["cause"],
)
REFUSING_WRITES = Gauge(
    "kaiwa_store_refusing_writes", "1 while the database refuses writes, by cause.", ["cause"]
)
STORE_RETRIES = Counter(
    "kaiwa_store_retries",
    "Times a batch of database calls was tried again after its connection was lost.",
)
APPROVALS_ASKED = Counter("kaiwa_approvals_asked", "Questions asked of a person (approvals).")
APPROVALS_ANSWERED = Counter(
    "kaiwa_approvals_answered",
    "Questions settled, by decision (allowed, allowed_here, edited, denied, timed_out, "
    "cancelled, expired).",
    ["decision"],
)
SUBAGENTS_RUNNING = Gauge("kaiwa_subagents_running", "Sub-agent runs working now.")
SUBAGENT_RUNS = Counter(
    "kaiwa_subagent_runs", "Sub-agent runs ended, by outcome (done, stopped, failed).", ["outcome"]
)
PLATFORM_API_ERRORS = Counter(
    "kaiwa_platform_api_errors",
    "Platform API calls refused or failed (rate limits apart), by platform.",
    ["platform"],
)
PLATFORM_RATE_LIMITS = Counter(
    "kaiwa_platform_rate_limits", "Platform API calls answered with a rate limit.", ["platform"]
)
CLUSTER_WORKERS = Gauge(
    "kaiwa_cluster_workers_alive", "Workers of this cluster connected, as this worker last saw."
)
CLUSTER_LEASES = Gauge("kaiwa_cluster_leases_held", "Leases this worker holds (channels, places).")
