"""`kaiwa status`'s live figures, read from a scrape as Prometheus writes it: every family the
summary names, summed over labels, times told as the bucket they fall under. (The figures of a
running process are checked end to end in tests/bot/test_cli.py.)"""

from bot.figures import read, summary

SCRAPE = """\
kaiwa_turns_total{platform="telegram",outcome="done"} 7
kaiwa_turns_total{platform="slack",outcome="done"} 2
kaiwa_turns_total{platform="slack",outcome="failed"} 1
kaiwa_turn_first_post_seconds_bucket{platform="telegram",le="0.25"} 4
kaiwa_turn_first_post_seconds_bucket{platform="telegram",le="0.5"} 8
kaiwa_turn_first_post_seconds_bucket{platform="telegram",le="1.0"} 9
kaiwa_turn_first_post_seconds_bucket{platform="telegram",le="+Inf"} 10
kaiwa_turn_first_post_seconds_count{platform="telegram"} 10
kaiwa_queued_messages 3
kaiwa_model_requests_in_flight 2
kaiwa_model_requests_waiting 1
kaiwa_model_tokens_total{model="qwen3:4b",direction="in"} 12345
kaiwa_model_tokens_total{model="qwen3:4b",direction="out"} 678
kaiwa_model_tokens_total{model="llama3.2",direction="in"} 5
kaiwa_tool_calls_total{tool="fetch_url",outcome="ok"} 4
kaiwa_tool_calls_total{tool="fetch_url",outcome="error"} 1
kaiwa_approvals_asked_total 2
kaiwa_approvals_answered_total{decision="allowed"} 1
kaiwa_subagents_running 1
kaiwa_scheduled_firings_total{outcome="done"} 3
kaiwa_store_outages_total 1
kaiwa_store_outage_seconds_total 4.25
kaiwa_store_retries_total 6
kaiwa_store_refused_writes_total{cause="disk_full"} 5
kaiwa_store_refused_writes_total{cause="read_only"} 0
kaiwa_store_refusing_writes{cause="disk_full"} 1
kaiwa_store_refusing_writes{cause="read_only"} 0
kaiwa_platform_api_errors_total{platform="slack"} 1
kaiwa_platform_rate_limits_total{platform="discord"} 2
kaiwa_cluster_workers_alive 3
kaiwa_cluster_leases_held 2
"""


def test_the_summary_reads_each_family_summed_over_its_labels() -> None:
    assert summary(read(SCRAPE)) == [
        "turns: 10 (9 done, 1 failed)",
        "first shown text: half within 0.5 s, 9 in 10 within 1 s (10 replies)",
        "queued messages: 3; model requests: 2 in flight, 1 waiting for a slot",
        "tokens: 12,350 in, 678 out",
        "tool calls: 5 (1 error, 4 ok)",
        "approvals: 2 asked; answered: 1 (1 allowed)",
        "sub-agents: 1 running; ended: none",
        "scheduled firings: 3 (3 done)",
        "database: 1 outage (4.2 s in all), 6 retries; refused writes: 5 (5 disk_full)",
        "the database refuses writes now: the server's disk is full",
        "discord: 0 API errors, 2 rate limits",
        "slack: 1 API error, 0 rate limits",
        "cluster: 3 workers alive; this one holds 2 leases",
    ]


def test_a_fresh_worker_says_none_rather_than_zeroes() -> None:
    fresh = "kaiwa_queued_messages 0\nkaiwa_cluster_workers_alive 0\n"
    lines = summary(read(fresh))
    assert lines[0] == "turns: none"
    assert not any(line.startswith(("first shown", "cluster:")) for line in lines)
