#!/usr/bin/env python3
"""Writes grafana/dashboards/hackserve.json: one row per stage of a request's path, in that
order — router (what the client sees) -> prefill -> KV transfer -> decode -> vault. Every
query names a metric registered in src/node/metrics.cpp (tests/deploy/deploy_config_test.py
checks that); `job` is the Prometheus job of monitoring/prometheus.yml."""
import json
import os


def quantiles(metric, job, title, unit="s"):
    targets = [{"expr": f'histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{job="{job}"}}[1m])))',
                "legendFormat": f"p{int(q * 100)}", "refId": chr(65 + i)} for i, q in enumerate((0.5, 0.9, 0.99))]
    return {"title": title, "unit": unit, "targets": targets}


def series(title, unit, *exprs):
    return {"title": title, "unit": unit,
            "targets": [{"expr": e, "legendFormat": legend, "refId": chr(65 + i)} for i, (e, legend) in enumerate(exprs)]}


ROWS = [
    ("Router — what clients see", [
        quantiles("hack:time_to_first_token_seconds", "router", "TTFT"),
        quantiles("hack:inter_token_latency_seconds", "router", "ITL"),
        quantiles("hack:e2e_request_latency_seconds", "router", "E2E latency"),
        series("Requests", "reqps",
               ('sum(rate(hack:request_success_total{job="router"}[1m]))', "finished/s"),
               ('sum by (type) (rate(hack:request_errors_total{job="router"}[1m]))', "errors/s {{type}}")),
        series("Queue", "short",
               ('hack:num_requests_waiting{job="router"}', "waiting"),
               ('hack:num_requests_running{job="router"}', "running")),
        quantiles("hack:request_queue_time_seconds", "router", "Router queue time"),
    ]),
    ("Prefill", [
        quantiles("hack:request_queue_time_seconds", "prefill", "Prefill queue time"),
        series("Prompt tokens", "short", ('rate(hack:prompt_tokens_total{job="prefill"}[1m])', "tokens/s")),
        series("Prefix cache (blocks/s)", "short",
               ('sum by (tier) (rate(hack:prefix_cache_hits_total{job="prefill"}[1m]))', "hits {{tier}}"),
               ('rate(hack:prefix_cache_misses_total{job="prefill"}[1m])', "misses")),
    ]),
    ("KV transfer prefill -> decode", [
        series("KV bytes sent / received", "Bps",
               ('rate(hack:kv_bytes_transferred_total{job="prefill"}[1m])', "prefill sent"),
               ('rate(hack:kv_bytes_transferred_total{job="decode"}[1m])', "decode received")),
        series("KV bytes per node (router's view)", "Bps",
               ('sum by (node) (rate(hack:kv_bytes_transferred_total{job="router"}[1m]))', "{{node}}")),
    ]),
    ("Decode", [
        quantiles("hack:inter_token_latency_seconds", "decode", "Decode ITL"),
        series("Generated tokens", "short", ('rate(hack:generation_tokens_total{job="decode"}[1m])', "tokens/s")),
        series("KV cache usage", "percentunit", ('hack:kv_cache_usage_ratio{job="decode"}', "{{node}}")),
        series("Running", "short", ('hack:num_requests_running{job="decode"}', "running"),
               ('hack:num_requests_waiting{job="decode"}', "waiting")),
    ]),
    ("Vault", [
        series("Vault hit rate", "percentunit",
               ('sum(rate(hack:vault_hits_total{job="vault"}[5m])) / clamp_min(sum(rate(hack:vault_hits_total{job="vault"}[5m])) + sum(rate(hack:vault_misses_total{job="vault"}[5m])), 1e-9)', "hits / lookups")),
        series("Vault contents", "bytes", ('hack:vault_bytes{job="vault"}', "bytes"),
               ('hack:vault_blocks{job="vault"}', "blocks")),
        series("Vault traffic", "Bps", ('rate(hack:vault_bytes_stored_total{job="vault"}[1m])', "stored"),
               ('rate(hack:vault_bytes_served_total{job="vault"}[1m])', "served"),
               ('rate(hack:vault_evictions_total{job="vault"}[1m])', "evictions (blocks/s)")),
        quantiles("hack:vault_restore_seconds", "prefill", "Vault restore (prefill side)"),
    ]),
]


def dashboard():
    panels, y, pid = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        pid, y = pid + 1, y + 1
        width = 24 // min(len(row), 4)
        for i, p in enumerate(row):
            panels.append({"type": "timeseries", "title": p["title"], "id": pid,
                           "datasource": {"type": "prometheus", "uid": "hack-prometheus"},
                           "fieldConfig": {"defaults": {"unit": p["unit"]}, "overrides": []},
                           "targets": p["targets"],
                           "gridPos": {"h": 8, "w": width, "x": (i % 4) * width, "y": y + (i // 4) * 8}})
            pid += 1
        y += 8 * ((len(row) + 3) // 4)
    return {"uid": "hackserve", "title": "hackserve — request path", "schemaVersion": 39, "version": 1,
            "refresh": "10s", "time": {"from": "now-30m", "to": "now"}, "tags": ["hackserve"], "panels": panels}


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grafana", "dashboards", "hackserve.json")
    with open(out, "w") as f:
        json.dump(dashboard(), f, indent=1)
        f.write("\n")
    print(out)
