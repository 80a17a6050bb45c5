#!/usr/bin/env python3
"""Writes the Grafana dashboards of charts/trellis/dashboards/ (job overview, parameter servers,
operator). Edit the panels here and rerun; the JSON files are what the chart ships and what
tests/integration/metrics/prometheus_e2e_test.py evaluates against a real Prometheus.

usage: scripts/gen-dashboards.py [OUT_DIR]
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
R = "$__rate_interval"


def sel(extra=""):
    base = 'job=~"$job",rank=~"$rank"'
    return "{" + base + ("," + extra if extra else "") + "}"


def quantiles(metric, selector, by="", qs=(0.5, 0.9, 0.99)):
    group = "le" + (", " + by if by else "")
    legend_by = "".join(" {{%s}}" % b.strip() for b in by.split(",") if b.strip())
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{selector}[{R}])))",
             f"p{int(q * 100)}{legend_by}") for q in qs]


def panel(title, targets, unit="short", w=12, h=8, kind="timeseries", desc=""):
    return {"title": title, "type": kind, "datasource": DS, "description": desc,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"expr": e, "legendFormat": l, "refId": chr(ord("A") + i), "datasource": DS}
                        for i, (e, l) in enumerate(targets)],
            "_w": w, "_h": h}


def variables(rank_metric):
    def query(name, q):
        return {"name": name, "label": name, "type": "query", "datasource": DS,
                "query": {"query": q, "refId": name}, "definition": q, "refresh": 2,
                "includeAll": True, "multi": True, "allValue": ".*", "sort": 3,
                "current": {"text": "All", "value": "$__all"}}
    out = [{"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0}]
    if rank_metric:
        out.append(query("job", f"label_values({rank_metric}, job)"))
        out.append(query("rank", f'label_values({rank_metric}{{job=~"$job"}}, rank)'))
    return out


def dashboard(uid, title, desc, panels, rank_metric):
    x = y = row_h = 0
    laid = []
    for i, p in enumerate(panels):
        w, h = p.pop("_w"), p.pop("_h")
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i + 1
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x += w
        row_h = max(row_h, h)
        laid.append(p)
    return {"uid": uid, "title": title, "description": desc, "tags": ["trellis"], "editable": True,
            "schemaVersion": 38, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "templating": {"list": variables(rank_metric)}, "annotations": {"list": []}, "panels": laid}


def job_overview():
    s = sel()
    return dashboard("trellis-job", "Trellis job overview",
                     "One training job: progress, data path, health. Variables: job and worker rank.", [
        panel("Training progress", [
            ('max(trellis_job_step{job=~"$job"})', "step (lowest worker)"),
            ('max(trellis_job_total_steps{job=~"$job"})', "total steps (0: not known)")], "short",
              desc="From the workers' ReportProgress (docs/user-guide.md#progress), aggregated by the scheduler."),
        panel("Samples per second and ETA", [
            ('sum(trellis_job_samples_per_second{job=~"$job"})', "samples/s"),
            ('max(trellis_job_eta_seconds{job=~"$job"})', "ETA seconds (-1: not known)")], "short"),
        panel("Straggler", [
            ('max(trellis_job_straggler_rank{job=~"$job"})', "straggler rank (-1: none)"),
            ('max(trellis_job_slowest_rank{job=~"$job"})', "slowest rank now"),
            ('max(trellis_job_step_skew_ratio{job=~"$job"})', "slowest / median compute time")], "short", w=24,
              desc="A worker above spec.monitoring.straggler.factor x the others' median compute time per step for "
                   "windowSeconds is the straggler (status condition Straggler, alert TrellisStraggler)."),
        panel("Steps per second", [(f"sum by (rank) (rate(trellis_worker_steps_total{s}[{R}]))", "worker {{rank}}")],
              "ops", desc="A step starts with the first push numbered n of any key."),
        panel("Step time", quantiles("trellis_worker_step_duration_seconds", s), "s"),
        panel("Push bandwidth", [(f"sum by (rank) (rate(trellis_worker_pushed_bytes_total{s}[{R}]))", "worker {{rank}}")],
              "Bps"),
        panel("Pull bandwidth", [(f"sum by (rank) (rate(trellis_worker_pulled_bytes_total{s}[{R}]))", "worker {{rank}}")],
              "Bps"),
        panel("PushPull latency", quantiles("trellis_worker_operation_duration_seconds", sel('op="pushpull"')), "s",
              desc="One PushPull of one key, all its slices, from the call to the answer."),
        panel("Operation latency p99 by op", quantiles("trellis_worker_operation_duration_seconds", s, "op", (0.99,)), "s"),
        panel("Queue depth and slices in flight", [
            (f"sum by (rank) (trellis_worker_queue_depth{s})", "queued, worker {{rank}}"),
            (f"sum by (rank) (trellis_worker_inflight_slices{s})", "in flight, worker {{rank}}")], "short",
              desc="Slices waiting above the water mark, and those on the wire."),
        panel("Queue depth by priority band", [
            (f"sum by (band) (trellis_worker_queue_depth_by_band_slices{s})", "band {{band}}")], "short",
              desc="Slices waiting by priority band (with -layer priorities: band 0 = layer 0 and broadcasts). "
                   "A growing low band under a flat 0 band is P3 working: the first layers overtake the tail."),
        panel("Slice wait and round trip (p99)", [
            (f"histogram_quantile(0.99, sum by (le) (rate(trellis_worker_slice_wait_seconds_bucket{s}[{R}])))",
             "queued -> sent"),
            (f"histogram_quantile(0.99, sum by (le) (rate(trellis_worker_slice_round_trip_seconds_bucket{s}[{R}])))",
             "sent -> answered")], "s"),
        panel("Failed operations per second", [
            (f"sum by (op) (rate(trellis_worker_operation_errors_total{s}[{R}]))", "{{op}}")], "ops"),
        panel("Barrier wait", quantiles("trellis_worker_barrier_wait_seconds", s, qs=(0.5, 0.99)), "s"),
        panel("Nodes registered and dead", [
            ('sum by (node_role) (trellis_scheduler_nodes{job=~"$job"})', "{{node_role}}s registered"),
            ('sum by (node_role) (trellis_scheduler_dead_nodes{job=~"$job"})', "{{node_role}}s dead")], "short"),
        panel("Restarts (last hour)", [
            ('sum by (node_role) (increase(trellis_scheduler_restarts_total{job=~"$job"}[1h]))', "{{node_role}}s")],
              "short", desc="Restarts the agents reported to the scheduler."),
        panel("Programs up", [('sum by (role) (trellis_agent_program_up{job=~"$job"})', "{{role}}s")], "short"),
        panel("Checkpoints", [
            ('sum(increase(trellis_worker_checkpoint_saves_total{job=~"$job"}[1h]))', "saved (last hour)"),
            ('sum(increase(trellis_worker_checkpoint_rejected_files_total{job=~"$job"}[1h]))',
             "files rejected on restore (last hour)")], "short",
              desc="Rank 0's model checkpoints (docs/checkpoints.md); a rejected file was corrupt, truncated or "
                   "of another version and the previous good one was used."),
        panel("Checkpoint save time and size", [
            ('histogram_quantile(0.99, sum by (le) (rate(trellis_worker_checkpoint_save_seconds_bucket{job=~"$job"}[1h])))',
             "save p99 (s)"),
            ('max(trellis_worker_checkpoint_size_bytes{job=~"$job"})', "newest file (bytes)")], "short"),
        panel("Newest checkpoint: age and step", [
            ('(time() - max(trellis_job_checkpoint_timestamp_seconds{job=~"$job"} > 0)) or '
             '(max(trellis_job_checkpoint_timestamp_seconds{job=~"$job"}) - 1)', "age (s; -1: none yet)"),
            ('max(trellis_job_checkpoint_step{job=~"$job"})', "step")], "short", w=24,
              desc="How old the job's newest checkpoint is (what a preemption would lose at most without an "
                   "exit checkpoint) and its step, as rank 0 reported it to the scheduler (docs/checkpoints.md)."),
        panel("Scrape targets up", [('sum by (role) (up{job=~"$job"})', "{{role}}")], "short", w=24, h=6),
    ], "trellis_worker_steps_total")


def parameter_servers():
    s = sel()
    return dashboard("trellis-pserver", "Trellis parameter servers",
                     "The parameter servers of one job. Variables: job and server rank.", [
        panel("Requests per second", [
            (f"sum by (rank, op) (rate(trellis_pserver_requests_total{s}[{R}]))", "server {{rank}} {{op}}")], "reqps"),
        panel("Bandwidth", [
            (f"sum by (rank) (rate(trellis_pserver_received_bytes_total{s}[{R}]))", "in, server {{rank}}"),
            (f"sum by (rank) (rate(trellis_pserver_sent_bytes_total{s}[{R}]))", "out, server {{rank}}")], "Bps"),
        panel("Aggregation time (one pushed slice)", quantiles("trellis_pserver_aggregation_duration_seconds", s), "s"),
        panel("Update time (one slice's step)", quantiles("trellis_pserver_update_duration_seconds", s), "s"),
        panel("Slice steps per second", [
            (f"sum by (rank) (rate(trellis_pserver_slice_steps_total{s}[{R}]))", "server {{rank}}")], "ops"),
        panel("Waiting pulls", [(f"sum by (rank) (trellis_pserver_waiting_pulls{s})", "server {{rank}}")], "short"),
        panel("Slices held", [(f"sum by (rank) (trellis_pserver_slices{s})", "server {{rank}}")], "short"),
        panel("Bytes held", [(f"sum by (rank) (trellis_pserver_slice_bytes{s})", "server {{rank}}")], "bytes"),
        panel("Request errors per second", [
            (f"sum by (rank) (rate(trellis_pserver_request_errors_total{s}[{R}]))", "server {{rank}}")], "ops", w=24),
    ], "trellis_pserver_requests_total")


def operator():
    return dashboard("trellis-operator", "Trellis operator", "The TrainingJob controller.", [
        panel("TrainingJobs by phase", [("sum by (phase) (trellis_operator_jobs)", "{{phase}}")], "short"),
        panel("Reconciles per second", [(f"sum(rate(trellis_operator_reconciles_total[{R}]))", "reconciles")], "ops"),
        panel("Reconcile latency", quantiles("trellis_operator_reconcile_duration_seconds", "", qs=(0.5, 0.99)), "s"),
        panel("API errors and watch restarts per second", [
            (f"sum(rate(trellis_operator_api_errors_total[{R}]))", "API errors"),
            (f"sum(rate(trellis_operator_watch_restarts_total[{R}]))", "watch restarts")], "ops"),
    ], None)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "charts", "trellis",
                                                             "dashboards")
    for name, d in [("trellis-job.json", job_overview()), ("trellis-pserver.json", parameter_servers()),
                    ("trellis-operator.json", operator())]:
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(d, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
