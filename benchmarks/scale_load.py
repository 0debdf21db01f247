"""The load generator of ``benchmarks/fleet_scale.py``, run in a process of its own so that its
CPU is measured apart from everything else: simulated agents pushing to real servers, and the
fatal-Xid probes.

Agents. Node ``i`` of ``N`` pushes at ``start + i * P / N + k * P`` (``P`` the push interval): the
``P / tick`` collections of all its GPUs since its last push, the newest stamped at the push time,
gzip level 6 as the agent's spool stores them, over ``connections`` keep-alive connections to
its server (``i % servers``; a push waits here for a free one, and its request time starts when
it has one). A node whose previous push is still unanswered pushes late, one push after the
other as an agent drains its spool: its pushes count as offered when they are due all the same,
which is what a backlog is. A push answered 5xx or cut is retried after 1 s with the same batch
id, as agents do (the server stores it once).

Windows. Rows of pushes scheduled in ``[start, start + duration)`` are offered; those answered
200 by ``start + duration + grace`` are stored on time (``grace`` covers requests in flight at
the end: with no backlog, stored on time equals offered). The load goes on after the window, for
the grace and until every Xid probe is settled, so that both are answered under load.

Xid probes. Every ``xid_every`` s a node not probed before sends a batch holding only an Xid 79
event, at once and on a connection of its own (agents push critical events at once), and the
time until ``GET /v1/evictions?state=pending&node=<node>&wait=...`` lists the node is recorded.

Protocol: ``python benchmarks/scale_load.py CONFIG.json``; stdout carries one JSON object a line:
``{"event": "start", "t": <monotonic start>, "wall": ...}``, every ``progress_s`` a ``progress``
line, ``window_end`` when the window closes, and ``done`` with the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
import random
import sys
import time
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from rawhttp import RawPool
from scale_fleet import Fleet, PushRenderer, format_ts

__all__ = ["LoadConfig", "percentile", "run"]


@dataclass
class LoadConfig:
    urls: list[str]
    token: str
    read_token: str
    nodes: int
    gpus_per_node: int = 8
    seed: int = 12
    tick_s: float = 10.0
    push_interval_s: float = 60.0
    variants: int = 6
    duration_s: float = 600.0
    grace_s: float = 10.0
    connections: int = 64
    client: str = "raw"
    noise_per_push: float = 0.002
    xid_every_s: float = 60.0
    xid_first_s: float = 10.0
    probe_timeout_s: float = 120.0
    progress_s: float = 30.0
    lead_s: float = 1.0  # the window starts this long after the agents are built
    # Every node pushes once before the window (its GPUs registered, as in a fleet that has run
    # for months): the window then measures the routine pushes, not 12,500 first ones.
    register_first: bool = True


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


class _Poster(Protocol):
    async def post(self, path: str, body: bytes) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


class _RawPoster:
    def __init__(self, url: str, size: int, headers: dict[str, str]) -> None:
        parsed = httpx.URL(url)
        self._pool = RawPool(parsed.host, parsed.port or 80, size, headers)

    @property
    def reopened(self) -> int:
        return self._pool.reopened

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self._pool.post(path, body)

    async def aclose(self) -> None:
        self._pool.close()


class _HttpxPoster:
    def __init__(self, url: str, size: int, headers: dict[str, str]) -> None:
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self._client = httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=httpx.Timeout(None)
        )

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        answer = await self._client.post(path, content=body)
        return answer.status_code, answer.content

    async def aclose(self) -> None:
        await self._client.aclose()


_POSTERS: dict[str, Callable[[str, int, dict[str, str]], _Poster]] = {
    "raw": _RawPoster,
    "httpx": _HttpxPoster,
}
_BROKEN = (OSError, asyncio.IncompleteReadError, ValueError, httpx.HTTPError)


@dataclass
class Tally:
    """What happened to the pushes; windows in the generator's monotonic clock."""

    start: float
    window_end: float
    grace_end: float
    acked_rows_in_window: int = 0
    on_time_rows: int = 0
    acked_rows_total: int = 0
    acked_events_total: int = 0
    noise_events_sent: int = 0
    pushes_late: int = 0  # on a connection more than 1 s after they were due
    pending: int = 0  # due and not answered yet: waiting for a connection, or in flight
    in_flight: int = 0  # sent on a connection, not answered yet
    not_sent_at_stop: int = 0
    errors: int = 0
    retries: int = 0
    error_samples: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # send -> answer, window pushes
    lags: list[float] = field(default_factory=list)  # due -> answer, window pushes
    body_bytes: int = 0
    bodies: int = 0

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 8:
            self.error_samples.append(text[:300])


class LoadGenerator:
    def __init__(self, config: LoadConfig, emit: Any) -> None:
        self.config = config
        self.emit = emit
        self.fleet = Fleet(
            config.nodes,
            config.gpus_per_node,
            seed=config.seed,
            tick_s=config.tick_s,
            variants=config.variants,
        )
        self.ticks_per_push = round(config.push_interval_s / config.tick_s)
        self.rows_per_push = self.ticks_per_push * config.gpus_per_node
        self.rng = random.Random(config.seed + 1)
        self.stop = asyncio.Event()
        self.probes: list[dict[str, Any]] = []
        self.renderers: list[PushRenderer] = []
        headers = {
            "Authorization": f"Bearer {config.token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
        }
        per_server = max(1, config.connections // len(config.urls))
        poster = _POSTERS[config.client]
        self.posters: list[_Poster] = [poster(u, per_server, headers) for u in config.urls]
        # Pushes wait here for a connection, so that a request's time is the server's alone.
        self.slots = [asyncio.Semaphore(per_server) for _ in config.urls]
        # Critical events do not queue behind routine pushes: their own connections.
        self.probe_posters: list[_Poster] = [_RawPoster(u, 4, headers) for u in config.urls]
        self.reader = httpx.AsyncClient(
            base_url=config.urls[0],
            headers={"Authorization": f"Bearer {config.read_token}"},
            timeout=httpx.Timeout(90.0),
        )

    def _wall(self, mono: float) -> float:
        return self.wall0 + (mono - self.mono0)

    async def run(self) -> dict[str, Any]:
        c = self.config
        built = time.monotonic()
        self.renderers = [PushRenderer(self.fleet, i, c.push_interval_s) for i in range(c.nodes)]
        build_s = time.monotonic() - built
        self.registered = await self._register() if c.register_first else {}
        self.mono0, self.wall0 = time.monotonic(), time.time()
        start = self.mono0 + c.lead_s
        self.tally = t = Tally(start, start + c.duration_s, start + c.duration_s + c.grace_s)
        self.emit({"event": "start", "t": start, "wall": self._wall(start), "build_s": build_s})
        nodes = [asyncio.create_task(self._node(i)) for i in range(c.nodes)]
        probes = asyncio.create_task(self._probes())
        progress = asyncio.create_task(self._progress())
        await asyncio.sleep(max(0.0, t.window_end - time.monotonic()))
        self.emit({"event": "window_end", **self._summary()})
        await asyncio.sleep(max(0.0, t.grace_end - time.monotonic()))
        await probes
        self.stop.set()
        # Pushes in flight finish (the database must hold exactly what was acknowledged), but
        # not forever: a server far behind is given two push intervals.
        _, pending = await asyncio.wait(nodes, timeout=2 * c.push_interval_s + 30)
        abandoned = len(pending)
        for task in pending:
            task.cancel()
        progress.cancel()
        for poster in (*self.posters, *self.probe_posters):
            await poster.aclose()
        await self.reader.aclose()
        return {**self._summary(), "pushes_abandoned_in_flight": abandoned, "build_s": build_s}

    async def _register(self) -> dict[str, Any]:
        """One push of one tick per node, a push interval before the window, every node at once
        through the same connections; refused or failed pushes are counted, not retried."""
        c = self.config
        began, wall = time.monotonic(), time.time()
        ts = format_ts(wall - c.push_interval_s)
        outcome = {"rows": 0, "errors": 0}

        async def one(i: int) -> None:
            server = i % len(self.posters)
            body = gzip.compress(self.renderers[i].render(_batch_id(self.rng), [(0, ts)], []), 6)
            async with self.slots[server]:
                try:
                    status, _ = await self.posters[server].post("/v1/ingest", body)
                except _BROKEN:
                    status = 0
            if status == 200:
                outcome["rows"] += c.gpus_per_node
            else:
                outcome["errors"] += 1

        await asyncio.gather(*(one(i) for i in range(c.nodes)))
        self.emit({"event": "registered", "seconds": time.monotonic() - began, **outcome})
        return {**outcome, "seconds": round(time.monotonic() - began, 1)}

    async def _sleep_until(self, due: float) -> bool:
        """Sleep until ``due``; False when the run stops first."""
        delay = due - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)
        return not self.stop.is_set()

    async def _node(self, i: int) -> None:
        c, t = self.config, self.tally
        renderer = self.renderers[i]
        server = i % len(self.posters)
        phase = i * c.push_interval_s / c.nodes
        tpp = self.ticks_per_push
        k = 0
        while await self._sleep_until(t.start + phase + k * c.push_interval_s):
            due = t.start + phase + k * c.push_interval_s
            newest = self._wall(due)
            ticks = [
                (k * tpp + j, format_ts(newest - (tpp - 1 - j) * c.tick_s)) for j in range(tpp)
            ]
            events = []
            if self.rng.random() < c.noise_per_push:
                events.append(renderer.noise_event(self.rng, ticks[-1][1]))
                t.noise_events_sent += 1
            body = gzip.compress(renderer.render(_batch_id(self.rng), ticks, events), 6)
            t.body_bytes += len(body)
            t.bodies += 1
            in_window = due < t.window_end
            t.pending += 1
            try:
                await self._push(server, body, due, self.rows_per_push, len(events), in_window)
            finally:
                t.pending -= 1
            k += 1

    async def _push(
        self, server: int, body: bytes, due: float, rows: int, events: int, in_window: bool
    ) -> None:
        t = self.tally
        first = True
        while True:
            async with self.slots[server]:
                if self.stop.is_set():
                    t.not_sent_at_stop += 1  # the run is over: the backlog stays unsent
                    return
                sent = time.monotonic()
                if first and sent - due > 1.0:
                    t.pushes_late += 1
                first = False
                t.in_flight += 1
                try:
                    status, payload = await self.posters[server].post("/v1/ingest", body)
                except _BROKEN as exc:
                    status, payload = 0, f"{type(exc).__name__}: {exc}".encode()
                finally:
                    t.in_flight -= 1
            answered = time.monotonic()
            if status == 200:
                self._acked(payload, due, sent, answered, rows, events, in_window)
                return
            t.error(f"{status}: {payload[:200]!r}")
            if 400 <= status < 500 and status not in (408, 429):
                return  # refused: a bug in this generator, counted; retrying would not help
            if self.stop.is_set():
                return
            t.retries += 1
            await asyncio.sleep(1.0)

    def _acked(
        self,
        payload: bytes,
        due: float,
        sent: float,
        answered: float,
        rows: int,
        events: int,
        in_window: bool,
    ) -> None:
        t = self.tally
        answer = json.loads(payload)
        if not answer.get("duplicate") and answer["accepted"]["samples"] != rows:
            t.error(f"accepted {answer['accepted']} for {rows} rows")
        t.acked_rows_total += rows
        t.acked_events_total += events
        if t.start <= answered <= t.window_end:
            t.acked_rows_in_window += rows
        if in_window:
            t.latencies.append(answered - sent)
            t.lags.append(answered - due)
            if answered <= t.grace_end:
                t.on_time_rows += rows

    def offered_pushes(self, until: float) -> int:
        """Pushes due before ``until`` (and in the window), whether or not they could be sent:
        a node still waiting for its previous answer owes them all the same."""
        c, t = self.config, self.tally
        horizon = min(until, t.window_end) - t.start
        if horizon <= 0:
            return 0
        phases = (i * c.push_interval_s / c.nodes for i in range(c.nodes))
        return sum(max(0, math.ceil((horizon - phase) / c.push_interval_s)) for phase in phases)

    async def _probes(self) -> None:
        c, t = self.config, self.tally
        order = list(range(c.nodes))
        self.rng.shuffle(order)
        running = []
        k = 0
        while k < len(order):
            due = t.start + c.xid_first_s + k * c.xid_every_s
            if due >= t.window_end:
                break
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            running.append(asyncio.create_task(self._probe(order[k])))
            k += 1
        await asyncio.gather(*running)

    async def _probe(self, i: int) -> None:
        c, t = self.config, self.tally
        renderer = self.renderers[i]
        probe: dict[str, Any] = {"node": renderer.name, "evicted_after_s": None}
        self.probes.append(probe)
        event = renderer.fatal_xid(self.rng, format_ts(time.time()))
        body = gzip.compress(renderer.render(_batch_id(self.rng), [], [event]), 6)
        sent = time.monotonic()
        probe["sent_at_s"] = round(sent - t.start, 3)
        poster = self.probe_posters[i % len(self.probe_posters)]
        try:
            status, payload = await poster.post("/v1/ingest", body)
        except _BROKEN as exc:
            status, payload = 0, str(exc).encode()
        probe["ingest_s"] = round(time.monotonic() - sent, 4)
        if status != 200:
            probe["error"] = f"ingest answered {status}: {payload[:200]!r}"
            return
        t.acked_events_total += 1
        deadline = sent + c.probe_timeout_s
        params = {"state": "pending", "node": renderer.name}
        while (left := deadline - time.monotonic()) > 0:
            try:
                answer = await self.reader.get(
                    "/v1/evictions", params={**params, "wait": f"{min(30.0, left):.1f}"}
                )
            except httpx.HTTPError as exc:
                probe["error"] = f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(1.0)
                continue
            if answer.status_code == 200 and answer.json()["count"]:
                probe["evicted_after_s"] = round(time.monotonic() - sent, 4)
                return
        # Not pending in time: say what became of it (none, or e.g. paged over the budget).
        with contextlib.suppress(httpx.HTTPError):
            answer = await self.reader.get("/v1/evictions", params={"node": renderer.name})
            probe["states"] = [e["state"] for e in answer.json().get("data", [])]

    async def _progress(self) -> None:
        c, t = self.config, self.tally
        await asyncio.sleep(max(0.0, t.start - time.monotonic()))
        last = (t.start, 0, 0, 0)
        while True:
            await asyncio.sleep(c.progress_s)
            now = time.monotonic()
            offered = self.offered_pushes(now) * self.rows_per_push
            recent = t.latencies[last[3] :]
            self.emit(
                {
                    "event": "progress",
                    "t": round(now - t.start, 1),
                    "offered_rows": offered,
                    "acked_rows": t.acked_rows_total,
                    "offered_rows_per_s": round((offered - last[1]) / (now - last[0])),
                    "acked_rows_per_s": round((t.acked_rows_total - last[2]) / (now - last[0])),
                    "p50_ms": _ms(percentile(recent, 50)),
                    "p99_ms": _ms(percentile(recent, 99)),
                    "in_flight": t.in_flight,
                    "pending": t.pending,
                    "pushes_late": t.pushes_late,
                    "errors": t.errors,
                    "probes": [p.get("evicted_after_s") for p in self.probes],
                }
            )
            last = (now, offered, t.acked_rows_total, len(t.latencies))

    def _summary(self) -> dict[str, Any]:
        t, c = self.tally, self.config
        return {
            "duration_s": c.duration_s,
            "rows_per_push": self.rows_per_push,
            "offered_rows": self.offered_pushes(t.window_end) * self.rows_per_push,
            "offered_pushes": self.offered_pushes(t.window_end),
            "acked_rows_in_window": t.acked_rows_in_window,
            "on_time_rows": t.on_time_rows,
            # The registration pushes' rows are in the database too.
            "acked_rows_total": t.acked_rows_total + self.registered.get("rows", 0),
            "registered": self.registered,
            "acked_events_total": t.acked_events_total,
            "noise_events_sent": t.noise_events_sent,
            "pushes_late": t.pushes_late,
            "pushes_not_sent_at_stop": t.not_sent_at_stop,
            "in_flight": t.in_flight,
            "errors": t.errors,
            "retries": t.retries,
            "error_samples": t.error_samples,
            "latency_p50_ms": _ms(percentile(t.latencies, 50)),
            "latency_p99_ms": _ms(percentile(t.latencies, 99)),
            "lag_p50_ms": _ms(percentile(t.lags, 50)),
            "lag_p99_ms": _ms(percentile(t.lags, 99)),
            "mean_body_bytes": round(t.body_bytes / t.bodies) if t.bodies else None,
            # Requests sent again because the server had just closed a kept-alive connection.
            "resent_on_closed_connection": sum(
                getattr(p, "reopened", 0) for p in (*self.posters, *self.probe_posters)
            ),
            "probes": list(self.probes),
        }


def _batch_id(rng: random.Random) -> str:
    return str(uuidlib.UUID(int=rng.getrandbits(128), version=4))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


def run(config: LoadConfig, emit: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        return await LoadGenerator(config, emit).run()

    return asyncio.run(go())


def main() -> None:
    config = LoadConfig(**json.loads(open(sys.argv[1]).read()))

    def emit(line: dict[str, Any]) -> None:
        print(json.dumps(line), flush=True)

    result = run(config, emit)
    emit({"event": "done", "result": result})


if __name__ == "__main__":
    main()
