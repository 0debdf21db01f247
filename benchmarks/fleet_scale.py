#!/usr/bin/env python
"""Issue 12: does one FleetWatch hold a 100,000-GPU fleet, and what does it cost beside Prometheus?

One run, everything at once, on this machine:

1. a fresh PostgreSQL database (``fleetwatch db upgrade``, agent and read tokens from ``fleetwatch
   token create``) and the real ``fleetwatch server`` with product defaults, every background job
   on (or ``--api-processes N``: N ``--role api`` processes plus one ``--role worker``);
2. the load generator (``scale_load.py``, a process of its own): ``--nodes`` agents of
   ``--gpus-per-node`` GPUs, a tick every ``--tick`` s, a push every ``--push-interval`` s, spread
   evenly, with application-Xid noise, and a fatal Xid 79 on a fresh node every ``--xid-every`` s,
   timed until its eviction shows at ``GET /v1/evictions``;
3. Prometheus (``/usr/bin/prometheus``) scraping the same values every ``--tick`` s from
   dcgm-exporter pages (``scale_exporters.py``; ``scale_prometheus.py`` says how it is measured);
4. ``/metrics`` scraped now and then (``scale_metrics.py``): size, time, the sharded page, the
   background jobs' counters;
5. CPU of every party from /proc over the measured window, peak RSS, disk per GPU row on both
   sides; the report (``scale_report.py``) puts issue 12's targets beside the measurements.

Run: ``.venv/bin/python benchmarks/fleet_scale.py [--duration 600] [--nodes 12500] [--json-out F]``;
smoke: ``--duration 60 --nodes 500``. Progress goes to stderr every ~30 s; the report to stdout.
The exit status is 1 when the database does not hold exactly the acknowledged rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from procstats import machine, process_tree, rss_peak_bytes
from scale_exporters import disagreements
from scale_fleet import Fleet
from scale_metrics import MetricsScraper, group_commit, recommended_shards
from scale_parties import Child, Parties, PostgresCpu, Snapshot, child, log, server_group
from scale_prometheus import PrometheusSide, prometheus_figures, start_prometheus_side
from scale_report import markdown
from serverproc import (
    ServerGroup,
    ThrowawayDatabase,
    create_token,
    fleetwatch_cli,
)

HERE = Path(__file__).resolve().parent
DEFAULT_POSTGRES = "postgresql://postgres@127.0.0.1:5432/postgres"


def prometheus_binary(args: argparse.Namespace) -> str | None:
    if args.no_prometheus:
        return None
    found = args.prometheus or shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(found).exists():
        if os.environ.get("FLEETWATCH_REQUIRE_TOOLS") == "1":
            raise SystemExit(f"prometheus not found at {found} (FLEETWATCH_REQUIRE_TOOLS=1)")
        log(f"prometheus not found at {found}: running without the Prometheus side")
        return None
    return found


def load_config(
    args: argparse.Namespace, group: ServerGroup, tokens: dict[str, str]
) -> dict[str, Any]:
    return {
        "urls": group.urls,
        "token": tokens["agent"],
        "read_token": tokens["read"],
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "seed": args.seed,
        "tick_s": args.tick,
        "push_interval_s": args.push_interval,
        "duration_s": args.duration,
        "grace_s": args.grace,
        "connections": args.connections,
        "client": args.client,
        "noise_per_push": args.noise_per_push,
        "xid_every_s": args.xid_every,
        "xid_first_s": min(10.0, args.duration / 3),
        "probe_timeout_s": args.probe_timeout,
        "progress_s": args.progress,
        "register_first": not args.no_register_first,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine(), "args": vars(args).copy()}
    binary = prometheus_binary(args)
    # The premise of the comparison, checked every run: the pages say what the agents push.
    fleet = Fleet(args.nodes, args.gpus_per_node, seed=args.seed, tick_s=args.tick)
    differ = disagreements(fleet, range(min(args.nodes, args.nodes_per_target)))
    results["checks"] = {"page_vs_push_disagreements": differ[:20]}
    if differ:
        log(f"WARNING: the exporter pages and the pushes differ: {differ[:3]}")
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fw-scale-")))
        db = ThrowawayDatabase(args.database_url)
        stack.callback(db.drop)
        log(f"database {db.name}: migrating, tokens")
        fleetwatch_cli("db", "upgrade", "--database-url", db.url)
        tokens = {s: create_token(db.url, s, f"scale-{s}") for s in ("agent", "read")}
        group = stack.enter_context(
            server_group(db.url, workdir, args.api_processes, dict(args.server_setting))
        )
        log(f"server(s) up: {', '.join(s.url for s in group.servers)}")
        side = start_prometheus_side(args, binary, workdir, stack) if binary else None
        config_path = workdir / "load.json"
        config_path.write_text(json.dumps(load_config(args, group, tokens)))
        command = [sys.executable, str(HERE / "scale_load.py"), str(config_path)]
        generator = stack.enter_context(child(command, workdir / "load.log"))
        postgres = PostgresCpu(db.name, dsn=db.dsn)
        stack.callback(postgres.stop)
        parties = Parties(
            group,
            postgres,
            generator.process.pid,
            side.exporters.process.pid if side else None,
            side.prometheus if side else None,
        )
        results.update(measure(args, parties, generator, tokens["read"], side))
        results["fleetwatch"] = fleetwatch_figures(db.dsn, group, results["load"])
        # After the window's CPU and the peak RSS were read: building an api process's default
        # page (it decodes the leader's snapshot of the fleet) would count in both.
        results["window"]["group_commit"] = group_commit(
            [s.url for s in group.targets], tokens["read"]
        )
        if side is not None:
            results.update(prometheus_figures(side, binary or "", results["window"]))
        results["scale"] = {
            "nodes": args.nodes,
            "gpus_per_node": args.gpus_per_node,
            "gpus": args.nodes * args.gpus_per_node,
            "tick_s": args.tick,
            "push_interval_s": args.push_interval,
            "servers": (
                "1 x `fleetwatch server` (role all, product defaults)"
                if args.api_processes == 0
                else f"{args.api_processes} x `--role api` + 1 x `--role worker`"
            ),
        }
    return results


def measure(
    args: argparse.Namespace,
    parties: Parties,
    generator: Child,
    read_token: str,
    side: PrometheusSide | None,
) -> dict[str, Any]:
    start_event = json.loads(generator.next_line(timeout_s=1800))
    if start_event["event"] == "registered":
        log(
            f"every node pushed once before the window ({start_event['rows']:,} rows, "
            f"{start_event['errors']} failed) in {start_event['seconds']:.0f} s"
        )
        start_event = json.loads(generator.next_line(timeout_s=1800))
    start, start_wall = start_event["t"], start_event["wall"]
    end = start + args.duration
    log(f"agents built in {start_event['build_s']:.1f} s; the window starts")
    time.sleep(max(0.0, start - time.monotonic()))
    parties.postgres.begin()
    before = last = Snapshot.take(parties)
    delivered_before = side.served_rows() if side else None
    first_s = min(args.push_interval + 30, args.duration / 2)
    scraper = MetricsScraper(
        parties.group.servers[0].url,
        read_token,
        start,
        end,
        first_s,
        args.metrics_every,
        shards=recommended_shards(args.nodes * args.gpus_per_node),
    )
    scraper.start()
    while True:
        try:
            line = json.loads(generator.next_line(timeout_s=end - time.monotonic()))
        except queue.Empty:
            break
        if line["event"] == "progress":
            now = Snapshot.take(parties)
            print_progress(line, last.until(now))
            last = now
        elif line["event"] == "window_end":
            break
    time.sleep(max(0.0, end - time.monotonic()))
    after = Snapshot.take(parties)
    window = before.until(after)
    delivered_after = side.served_rows() if side else None
    if delivered_before is not None and delivered_after is not None:
        # What the exporter pages handed Prometheus: its rows even if it cannot answer later.
        window["prometheus_rows_delivered"] = delivered_after - delivered_before
    window["rss_at_end_bytes"] = {
        "server": sum(rss_peak_bytes(pid) for pid in parties.group.pids()),
        "prometheus": side.prometheus.rss_peak_bytes() if side else None,
    }
    # Prometheus' rows stop here: what it stored is what the window offered it.
    if side is not None:
        side.exporters.stop()
    log("window closed; tail: in-flight pushes, the last Xid probes")
    scraper.stop()
    scraper.join()
    result = None
    deadline = time.monotonic() + args.grace + args.probe_timeout + 2 * args.push_interval + 180
    while result is None:
        line = json.loads(generator.next_line(timeout_s=deadline - time.monotonic()))
        if line["event"] == "done":
            result = line["result"]
        elif line["event"] == "progress":
            print_progress(line, None)
    return {
        "window": {**window, "start_wall": start_wall, "end_wall": start_wall + args.duration},
        "load": result,
        "metrics": scraper.summary(),
    }


def print_progress(line: dict[str, Any], cpu: dict[str, Any] | None) -> None:
    cores = ""
    if cpu is not None:
        seconds = cpu["seconds"]
        cores = " | cores: " + " ".join(
            f"{k} {v / seconds:.2f}" for k, v in cpu["cpu_s"].items() if v
        )
        cores += f"; I/O wait {cpu['machine_iowait_pct']:.0f} %"
    log(
        f"t={line['t']:5.0f}s offered {line['offered_rows_per_s']:,} rows/s, stored "
        f"{line['acked_rows_per_s']:,} rows/s (totals {line['offered_rows']:,} / "
        f"{line['acked_rows']:,}); p50 {line['p50_ms']} ms p99 {line['p99_ms']} ms; pending "
        f"{line['pending']} ({line['in_flight']} on a connection), late pushes "
        f"{line['pushes_late']}, errors {line['errors']}; "
        f"Xid->eviction s {line['probes']}{cores}"
    )


def fleetwatch_figures(dsn: str, group: ServerGroup, load: dict[str, Any]) -> dict[str, Any]:
    rss_each = [
        sum(rss_peak_bytes(pid) for pid in process_tree(server.process.pid))
        for server in group.servers
    ]
    rss = sum(rss_each)
    probed = {p["node"] for p in load["probes"]}
    with psycopg.connect(dsn) as conn:

        def one(sql: str) -> Any:
            row = conn.execute(sql).fetchone()
            return row[0] if row else None

        def samples_size(function: str) -> int:
            # The whole partition tree (the parent, every day and the DEFAULT partition).
            tree = "pg_partition_tree('gpu_sample_blocks')"
            size = int(one(f"SELECT coalesce(sum({function}(relid)), 0) FROM {tree}"))
            return size or int(one(f"SELECT {function}('gpu_sample_blocks')"))

        # A sample is a GPU row: the blocks hold n ticks each.
        rows = int(one("SELECT coalesce(sum(n), 0) FROM gpu_sample_blocks"))
        blocks = int(one("SELECT count(*) FROM gpu_sample_blocks"))
        evictions = conn.execute("SELECT node, state, reason FROM evictions").fetchall()
        # Why nodes that got no Xid 79 were evicted: state and the reason's first word.
        others = Counter(
            f"{state}: {(reason or '').split(' ', 1)[0]}"
            for node, state, reason in evictions
            if node not in probed
        )
        figures = {
            "samples_rows": rows,
            "sample_blocks": blocks,
            "db_equals_acked": rows == load["acked_rows_total"],
            # gpu_sample_blocks is partitioned by day on PostgreSQL: its rows live in the
            # partitions.
            "samples_table_bytes": samples_size("pg_total_relation_size"),
            "samples_heap_bytes": samples_size("pg_relation_size"),
            "samples_index_bytes": samples_size("pg_indexes_size"),
            "database_bytes": int(one("SELECT pg_database_size(current_database())")),
            "events": int(one("SELECT count(*) FROM events")),
            "nodes": int(one("SELECT count(*) FROM nodes")),
            "gpus": int(one("SELECT count(*) FROM gpus")),
            "postgres_version": one("SHOW server_version"),
            "rss_peak_bytes": rss,
            "rss_peak_bytes_each": rss_each,  # in the order of server_cpu_s_each
            "evictions_of_probed_nodes": sum(1 for node, *_ in evictions if node in probed),
            "evictions_of_other_nodes": sum(others.values()),
            "evictions_of_other_nodes_by_reason": dict(others.most_common(10)),
        }
        # The leader's shared assessment (PostgreSQL): how many it published, and its size.
        shared = conn.execute(
            "SELECT seq, gpus, octet_length(body) FROM fleet_snapshots WHERE name = 'fleet'"
        ).fetchone()
        if shared is not None:
            figures["snapshot"] = {"published": shared[0], "gpus": shared[1], "bytes": shared[2]}
            log(f"shared snapshot: {shared[0]} published, {shared[1]:,} GPUs, {shared[2]:,} B")
    log(
        f"FleetWatch: {rows:,} GPU rows in {blocks:,} blocks, "
        f"{load['acked_rows_total']:,} acknowledged "
        f"({'equal' if figures['db_equals_acked'] else 'NOT EQUAL'}); "
        f"{figures['samples_table_bytes'] / rows if rows else 0:,.0f} B/row; peak RSS "
        f"{rss / 2**30:.2f} GiB; evictions of other nodes {figures['evictions_of_other_nodes']}"
    )
    return figures


# --------------------------------------------------------------------------------------------


def setting_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--duration", type=float, default=600.0, help="measured seconds (600)")
    p.add_argument("--nodes", type=int, default=12_500, help="simulated agents (12,500)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--tick", type=float, default=10.0, help="seconds between collections (10)")
    p.add_argument("--push-interval", type=float, default=60.0, help="seconds between pushes")
    p.add_argument(
        "--database-url",
        default=os.environ.get("FLEETWATCH_BENCH_POSTGRES_URL", DEFAULT_POSTGRES),
        help="PostgreSQL server on which a throwaway database is created and dropped after "
        f"[env FLEETWATCH_BENCH_POSTGRES_URL, default {DEFAULT_POSTGRES}]",
    )
    p.add_argument(
        "--api-processes",
        type=int,
        default=0,
        help="0: one `fleetwatch server` (product defaults); N: N `--role api` processes "
        "taking the load plus one `--role worker`",
    )
    p.add_argument("--connections", type=int, default=64, help="keep-alive connections in all")
    p.add_argument("--client", choices=("raw", "httpx"), default="raw", help="load generator")
    p.add_argument("--grace", type=float, default=10.0, help="seconds for in-flight pushes")
    p.add_argument("--noise-per-push", type=float, default=0.002, help="application-Xid rate")
    p.add_argument("--xid-every", type=float, default=60.0, help="seconds between Xid 79 probes")
    p.add_argument("--probe-timeout", type=float, default=300.0, help="seconds to wait for one")
    p.add_argument("--metrics-every", type=float, default=240.0, help="seconds between scrapes")
    p.add_argument("--progress", type=float, default=30.0, help="seconds between progress lines")
    p.add_argument("--nodes-per-target", type=int, default=10, help="nodes per exporter page")
    p.add_argument("--prometheus", help="the prometheus binary (default: on PATH)")
    p.add_argument("--no-prometheus", action="store_true", help="FleetWatch side only")
    p.add_argument(
        "--prometheus-nodes",
        type=int,
        help="Prometheus scrapes the pages of this many nodes only (default: all): for a machine "
        "without the memory for the whole fleet's series beside the server",
    )
    p.add_argument(
        "--no-register-first",
        action="store_true",
        help="start the window on an empty fleet (every node's first push inside it)",
    )
    p.add_argument(
        "--server-setting",
        action="append",
        default=[],
        type=setting_pair,
        metavar="NAME=VALUE",
        help="a server setting for this run, e.g. ingest_group_linger_ms=50 (repeatable; "
        "the caller's FLEETWATCH_SERVER_* variables are not passed on)",
    )
    p.add_argument("--seed", type=int, default=12)
    p.add_argument("--json-out", type=Path, help="write every figure to this JSON file")
    args = p.parse_args(argv)
    ticks = args.push_interval / args.tick
    if ticks < 1 or abs(ticks - round(ticks)) > 1e-9:
        p.error("--push-interval must be a whole multiple of --tick")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = run(args)
    print(markdown(results))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1, default=str) + "\n")
        log(f"results written to {args.json_out}")
    return 0 if results["fleetwatch"]["db_equals_acked"] else 1


if __name__ == "__main__":
    sys.exit(main())
