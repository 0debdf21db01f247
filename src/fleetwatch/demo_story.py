"""The demo's scripted story (issue 14): what operators are held to, played on the live fleet.

While the simulated fleet runs, one thread plays an operator, a training job and a scheduler
against the real server, through the API only, and prints each step as a ``[story]`` line:

1. a maintenance window on one node, whose agent is stopped during it and restarted after
   (the node reads ``maintenance``, never ``unreachable``; no eviction): the states seen and
   the node's evictions are printed;
2. a training job on two nodes, and a fatal Xid 79 (GPU fallen off the bus) on one of them,
   pushed with the agent token as that node's agent would; the job ends ``failed`` and is
   attributed to hardware;
3. the node's eviction: acked and completed (the demo plays the scheduler), a return refused
   (409) without a validation and again after an imperfect repair (rows pending remap), then a
   passing validation and the return accepted. The validations are documents pushed with the
   agent token in the format ``fleetwatch validate`` pushes: the demo's nodes are simulated,
   so there is no NVML for ``fleetwatch validate`` to read;
4. ``GET /v1/availability`` since the demo started, before and after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

__all__ = ["Story", "StoryNodes", "format_availability"]

JOB_ID = "demo-train-1"
_VALIDATION_CHECKS = (
    "nvml.remapped_rows",
    "nvml.ecc_volatile",
    "nvml.pcie_link",
    "nvml.clocks_idle",
)


@dataclass(frozen=True)
class StoryNodes:
    maintained: str  # gets the maintenance window
    others: tuple[str, ...]  # the job runs on two of them; one gets the fatal Xid


def format_availability(body: dict[str, Any]) -> str:
    """One line of the figures that move: planned and unplanned downtime, availability, jobs."""
    fleet, jobs = body["fleet"], body["jobs"]

    def num(value: Any, spec: str) -> str:
        return "null" if value is None else format(value, spec)

    return (
        f"planned_down_h {num(fleet['planned_down_h'], '.3f')}"
        f" | unplanned_down_h {num(fleet['unplanned_down_h'], '.3f')}"
        f" | infrastructure {num(fleet['infrastructure_availability'], '.4f')}"
        f" | workload {num(fleet['workload_availability'], '.4f')}"
        f" | failures {fleet['failures']}"
        f" | jobs completed {jobs.get('completed')} failed {jobs.get('failed')}"
        f" success_rate {num(jobs.get('success_rate'), '.2f')}"
        f" interrupted_by_hardware {jobs.get('interrupted_by_hardware')}"
    )


def _validation(node: str, gpus: int, failing: str | None) -> dict[str, Any]:
    """A validation in the format ``fleetwatch validate`` pushes; ``failing`` fails on GPU 0."""
    now = datetime.now(UTC)
    return {
        "node": node,
        "started_at": (now - timedelta(seconds=30)).isoformat(),
        "finished_at": now.isoformat(),
        "checks": [
            {
                "name": name,
                "status": "fail" if name == failing and index == 0 else "pass",
                "gpu_index": index,
                "evidence": {"demo": "simulated node: pushed by the demo story"},
            }
            for index in range(gpus)
            for name in _VALIDATION_CHECKS
        ],
        "tools": {"fleetwatch": "demo story"},
        "duration_s": 30.0,
    }


class Story:
    """Runs the story once in its own thread; ``say`` prints a line."""

    def __init__(
        self,
        url: str,
        tokens: dict[str, str],
        nodes: StoryNodes,
        *,
        gpus: int,
        window_s: float,
        started_at: datetime,
        stop_agent: Callable[[str], None],
        start_agent: Callable[[str], None],
        say: Callable[[str], None],
    ) -> None:
        self._url = url
        self._tokens = tokens
        self._nodes = nodes
        self._gpus = gpus
        self._window_s = window_s
        self._since = started_at
        self._stop_agent = stop_agent
        self._start_agent = start_agent
        self._say = say
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-story", daemon=True)
        self.finished = threading.Event()
        self.failing, self.partner = nodes.others[:2]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    # -- plumbing --

    def _client(self, scope: str) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self._tokens[scope]}"}
        return httpx.Client(base_url=self._url, headers=headers, timeout=30)

    def _wait(self, what: str, check: Callable[[], Any], timeout: float = 300) -> Any:
        """Polls ``check`` until it returns something truthy; raises when the demo stops."""
        deadline = datetime.now(UTC) + timedelta(seconds=timeout)
        while not self._stop.is_set():
            try:
                found = check()
            except (httpx.HTTPError, KeyError, ValueError):
                found = None
            if found:
                return found
            if datetime.now(UTC) > deadline:
                raise TimeoutError(f"gave up waiting for {what}")
            self._stop.wait(1.0)
        raise InterruptedError

    def _availability(self, read: httpx.Client) -> str:
        response = read.get("/v1/availability", params={"since": self._since.isoformat()})
        response.raise_for_status()
        return format_availability(response.json())

    def _run(self) -> None:
        try:
            self._play()
            self.finished.set()
        except InterruptedError:
            pass
        except Exception as exc:  # the story is a demo: say what broke, keep the fleet running
            self._say(f"stopped: {type(exc).__name__}: {exc}")

    # -- the story --

    def _play(self) -> None:
        n = self._nodes
        with self._client("read") as read, self._client("admin") as admin:
            with self._client("agent") as agent:
                self._wait(
                    "the story's nodes",
                    lambda: (
                        {n.maintained, *n.others[:2]}
                        <= {node["name"] for node in read.get("/v1/nodes").json()["data"]}
                    ),
                )
                self._say(
                    f"availability since the demo started (before): {self._availability(read)}"
                )
                self._maintenance(read, admin)
                self._pick_job_nodes(read)
                self._failure(read, agent)
                self._return(read, admin, agent)
                self._say(
                    f"availability since the demo started (after):  {self._availability(read)}"
                )
                self._say(f"done; see {self._url}/v1/availability and {self._url}/v1/maintenance")

    def _maintenance(self, read: httpx.Client, admin: httpx.Client) -> None:
        node = self._nodes.maintained
        ends_at = datetime.now(UTC) + timedelta(seconds=self._window_s)
        opened = admin.post(
            "/v1/maintenance",
            json={"nodes": [node], "ends_at": ends_at.isoformat(), "reason": "demo: PSU swap"},
        )
        opened.raise_for_status()
        window = opened.json()["id"]
        self._say(
            f"1. maintenance window {window} on {node} for {self._window_s:g} s; its agent is"
            f" stopped. Look: {self._url}/v1/maintenance, the fleet page, /v1/nodes"
        )
        self._stop_agent(node)

        def state() -> str:
            nodes = read.get("/v1/nodes").json()["data"]
            return str(next(x["state"] for x in nodes if x["name"] == node))

        self._wait("the maintenance state", lambda: state() == "maintenance")
        self._say(f"   {node} reads 'maintenance' in /v1/nodes and on the fleet page")
        seen = {"maintenance"}
        while datetime.now(UTC) < ends_at:
            if self._stop.wait(1.0):
                raise InterruptedError
            try:
                if datetime.now(UTC) < ends_at:
                    seen.add(state())
            except (httpx.HTTPError, KeyError, ValueError, StopIteration):
                pass
        self._start_agent(node)
        self._wait("the node back up", lambda: state() == "up", timeout=120)
        evicted = read.get("/v1/evictions", params={"node": node}).json()["data"]
        kinds = ", ".join(sorted({e["reason_kind"] for e in evicted})) or "none"
        self._say(
            f"   window over, agent restarted: {node} is up again; states while its agent was"
            f" stopped: {', '.join(sorted(seen))}; its evictions (any time): {kinds}"
        )

    def _pick_job_nodes(self, read: httpx.Client) -> None:
        """Two nodes that the simulated fleet's own failures have not evicted (an open
        eviction would take the story's place)."""
        params: dict[str, Any] = {"state": ["pending", "acked", "completed"], "limit": 100_000}
        taken = {e["node"] for e in read.get("/v1/evictions", params=params).json()["data"]}
        free = [node for node in self._nodes.others if node not in taken]
        self.failing, self.partner = (free if len(free) >= 2 else list(self._nodes.others))[:2]

    def _failure(self, read: httpx.Client, agent: httpx.Client) -> None:
        n = self
        now = datetime.now(UTC)
        agent.post(
            f"/v1/jobs/{JOB_ID}/start",
            json={
                "started_at": now.isoformat(),
                "nodes": [n.failing, n.partner],
                "ranks": 2 * self._gpus,
            },
        ).raise_for_status()
        self._say(f"2. training job {JOB_ID} started on {n.failing} and {n.partner}")
        gpus = read.get("/v1/gpus", params={"node": n.failing}).json()
        gpu = sorted(gpus, key=lambda g: g["index"])[min(3, len(gpus) - 1)]
        xid_at = datetime.now(UTC)
        agent.post(
            "/v1/ingest",
            json={
                "batch_id": f"demo-story-xid-{xid_at.timestamp():.0f}",
                "node": {"name": n.failing},
                "events": [
                    {
                        "kind": "xid",
                        "ts": xid_at.isoformat(),
                        "xid": 79,
                        "uuid": gpu["uuid"],
                        "message": f"NVRM: Xid (PCI:{gpu.get('pci_bus_id')}): 79, "
                        "GPU has fallen off the bus.",
                    }
                ],
            },
        ).raise_for_status()
        self._say(
            f"   fatal Xid 79 on {n.failing} GPU {gpu['index']} ({gpu['uuid']}); the job crashes"
        )
        agent.post(
            f"/v1/jobs/{JOB_ID}/end",
            json={
                "outcome": "failed",
                "ended_at": datetime.now(UTC).isoformat(),
                "reason": "NCCL error: a rank lost its GPU",
            },
        ).raise_for_status()
        job = self._wait(
            "the job's hardware attribution",
            lambda: (
                (body := read.get(f"/v1/jobs/{JOB_ID}").json()).get("hardware_failure") and body
            ),
        )
        self._say(
            f"   job {JOB_ID} {job['outcome']}, attributed to hardware: {job['hardware_failure']}."
            f" Look: {self._url}/v1/jobs/{JOB_ID}"
        )

    def _return(self, read: httpx.Client, admin: httpx.Client, agent: httpx.Client) -> None:
        node = self.failing

        def open_eviction() -> dict[str, Any] | None:
            params = {"node": node, "state": ["pending", "acked", "completed"]}
            found = read.get("/v1/evictions", params=params).json()["data"]
            return found[0] if found else None

        eviction = self._wait(f"the eviction of {node}", open_eviction)
        self._say(
            f"3. {node} evicted (#{eviction['id']}, {eviction['reason_kind']}: "
            f"{eviction['reason']}); the demo plays the scheduler"
        )
        if eviction["state"] == "pending":
            admin.post(
                f"/v1/evictions/{eviction['id']}/ack", json={"lease_s": 300}
            ).raise_for_status()
            eviction["state"] = "acked"
        if eviction["state"] == "acked":
            admin.post(f"/v1/evictions/{eviction['id']}/complete").raise_for_status()
        self._say(f"   acked and completed (drained); the repair takes {self._window_s:g} s")
        if self._stop.wait(self._window_s):
            raise InterruptedError
        refused = admin.post(f"/v1/nodes/{node}/return", json={"note": "GPU reseated"})
        error = refused.json().get("error")
        self._say(f"   return without a validation -> {refused.status_code}: {error}")
        pushed = agent.post(
            f"/v1/nodes/{node}/validations",
            json=_validation(node, self._gpus, "nvml.remapped_rows"),
        )
        pushed.raise_for_status()
        passed = pushed.json()["passed"]
        self._say(f"   validation pushed (imperfect repair: rows pending remap) -> passed {passed}")
        refused = admin.post(f"/v1/nodes/{node}/return", json={"note": "GPU reseated"})
        self._say(f"   return -> {refused.status_code}: {refused.json().get('error')}")
        pushed = agent.post(
            f"/v1/nodes/{node}/validations", json=_validation(node, self._gpus, None)
        )
        pushed.raise_for_status()
        self._say(f"   GPU replaced, validation pushed again -> passed {pushed.json()['passed']}")
        back = admin.post(f"/v1/nodes/{node}/return", json={"note": "GPU 3 replaced"})
        body = back.json()
        self._say(
            f"   return -> {back.status_code}: eviction #{body.get('id')} {body.get('state')}"
        )
        back.raise_for_status()
