"""``fleetwatch demo``: the product running locally on its embedded default, in one command.

Starts the real server (uvicorn, SQLite file under ``var/demo``), creates tokens, writes a
simulated fleet (``fleetwatch sim``: N nodes x G GPUs with known ground truth, running faster
than real time) and starts one real ``fleetwatch agent`` process per node, each pushing its
node over HTTP with the agent token. Prints where to look and a status line every few seconds,
then runs until Ctrl-C (or ``--duration``).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx

from fleetwatch.demo_story import Story, StoryNodes

__all__ = ["DemoOptions", "run_demo"]

logger = logging.getLogger(__name__)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_port(preferred: int) -> int:
    if _port_free(preferred):
        return preferred
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _demo_tokens(database_url: str, saved: Path) -> dict[str, str]:
    """The tokens saved by an earlier run if they still work, else new ones."""
    from fleetwatch.config import load_server_settings
    from fleetwatch.errors import Unauthenticated
    from fleetwatch.server.auth import authenticate, create_token
    from fleetwatch.server.db.migrate import prepare_database
    from fleetwatch.server.db.session import Database, make_engine

    settings = load_server_settings(database_url=database_url)
    db = Database(make_engine(settings))
    scopes = ("admin", "read", "agent")
    try:
        prepare_database(db.engine, settings)
        if saved.exists():
            lines = dict(
                line.split("=", 1) for line in saved.read_text().splitlines() if "=" in line
            )
            found = {s: lines.get(f"FLEETWATCH_{s.upper()}_TOKEN", "") for s in scopes}
            try:
                with db.read() as conn:
                    for token in found.values():
                        authenticate(conn, token)
                return found
            except Unauthenticated:
                pass
        with db.write() as conn:
            made = {s: create_token(conn, name=f"demo-{s}", scope=s)[0] for s in scopes}
        saved.write_text("".join(f"FLEETWATCH_{s.upper()}_TOKEN={t}\n" for s, t in made.items()))
        return made
    finally:
        db.dispose()


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready within {timeout:.0f}s")


@dataclass(frozen=True)
class DemoOptions:
    port: int = 8400
    data_dir: Path = Path("var/demo")
    nodes: int = 16
    gpus: int = 8
    interval_s: float = 2.0
    speed: float = 14400.0
    horizon_days: float = 90.0
    seed: int = 1
    duration_s: float | None = None
    monthly_failure_prob: float = 0.05
    story: bool = True
    story_window_s: float = 180.0


# Simulated time runs thousands of times faster than real time, so the background work that
# follows it (rollups, lifetimes, refits) runs more often than a real fleet needs.
_DEMO_SERVER_ENV = {
    "FLEETWATCH_SERVER_ASSESS_INTERVAL_S": "5",
    "FLEETWATCH_SERVER_ROLLUP_INTERVAL_S": "20",
    "FLEETWATCH_SERVER_LIFECYCLE_INTERVAL_S": "20",
    "FLEETWATCH_SERVER_GPU_LEAVE_AFTER_S": "60",
    "FLEETWATCH_SERVER_REFIT_INTERVAL_S": "120",
    # The simulated fleet's own failures are evicted too, and no scheduler drains them: under
    # a budget their pending evictions would hold back the story's (the default 5 % of a small
    # fleet is one node).
    "FLEETWATCH_SERVER_DRAIN_BUDGET_PCT": "100",
}


def _history_env(options: DemoOptions) -> dict[str, str]:
    """The fleet replays ``horizon_days`` of history: the server must take readings that old
    (its default, 30 days, is for real agents, whose readings are old only after an outage),
    and keep them (raw samples are kept 14 days by default)."""
    days = options.horizon_days + 1
    return {
        "FLEETWATCH_SERVER_MAX_PAST_AGE_S": str(days * 86400),
        "FLEETWATCH_SERVER_RAW_RETENTION_DAYS": str(max(days, 14.0)),
        "FLEETWATCH_SERVER_ROLLUP_RETENTION_DAYS": str(max(days, 730.0)),
    }


def _banner(url: str, tokens: dict[str, str], database_url: str, options: DemoOptions) -> str:
    data_dir = options.data_dir
    return f"""
FleetWatch demo: {options.nodes} simulated nodes x {options.gpus} GPUs, each a real agent process,
pushing to the real server on the embedded SQLite database. Simulated time runs {options.speed:g}x
(from {options.horizon_days:g} days ago, catching up with now), so GPUs age, show precursors and
fail while you watch; the ground truth is in {data_dir / "sim" / "ground_truth.json"}.

  Fleet page    {url}/?token={tokens["read"]}
  API docs      {url}/docs
  Nodes         {url}/v1/nodes
  Risk          {url}/v1/risk?horizon=7d   (GPUs ranked: rule verdicts first, then the model)
  Models        {url}/v1/models            (refitted every 2 minutes as GPUs fail)
  Ports         {url}/v1/nodes/<node>/ports  (8 InfiniBand or RoCE links a node; flaps and
                degradations are in the ground truth's link_faults)
  Metrics       {url}/metrics        (Prometheus; needs a read token)
  Database      {database_url}
  Logs          {data_dir / "server.log"}, {data_dir / "agents"}/<node>/agent.log

Tokens (also in {data_dir / "tokens.env"}):
  admin   {tokens["admin"]}
  read    {tokens["read"]}
  agent   {tokens["agent"]}

Try:
  curl -s -H "Authorization: Bearer {tokens["read"]}" {url}/v1/nodes
  curl -s -H "Authorization: Bearer {tokens["read"]}" "{url}/v1/events?kind=xid"
  curl -s -H "Authorization: Bearer {tokens["read"]}" "{url}/v1/risk?horizon=7d&limit=5"
  curl -s -H "Authorization: Bearer {tokens["read"]}" {url}/v1/nodes/sim-node-000/ports
  curl -s -H "Authorization: Bearer {tokens["read"]}" {url}/metrics | grep temperature

Ctrl-C stops it; the data stays in {data_dir}/ for the next run.
"""


def _write_fleet(options: DemoOptions) -> Path:
    from fleetwatch.sim.fleet import SimFleet
    from fleetwatch.sim.spec import FleetSpec

    out = options.data_dir / "sim"
    out.mkdir(parents=True, exist_ok=True)
    spec = FleetSpec.live(
        seed=options.seed,
        real_start=datetime.now(UTC),
        speed=options.speed,
        horizon_days=options.horizon_days,
        nodes=options.nodes,
        gpus_per_node=options.gpus,
        # Five times the reference failure rate, so that a 90-day demo fleet has enough
        # failures (about 25 of 128 GPUs) for the risk model to fit while you watch.
        failures={"monthly_failure_prob": options.monthly_failure_prob},
    )
    spec.save(out / "fleet.json")
    SimFleet(spec).write_ground_truth(out / "ground_truth.json")
    return out / "fleet.json"


def _start_agent(
    options: DemoOptions, url: str, token: str, spec_path: Path, node: str
) -> subprocess.Popen[bytes]:
    home = options.data_dir / "agents" / node
    home.mkdir(parents=True, exist_ok=True)
    with (home / "agent.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetwatch",
                "agent",
                "--server-url",
                url,
                "--token",
                token,
                "--node-name",
                node,
                "--interval",
                str(options.interval_s),
                # Simulated time runs fast: each collection is pushed as it is made.
                "--push-interval",
                "0",
                "--collectors",
                "sim",
                "--sim-spec",
                str(spec_path),
                "--spool-dir",
                str(home / "spool"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _start_agents(
    options: DemoOptions, url: str, token: str, spec_path: Path
) -> dict[str, subprocess.Popen[bytes]]:
    from fleetwatch.sim.spec import FleetSpec

    spec = FleetSpec.load(spec_path)
    nodes = [spec.node_name(i) for i in range(spec.nodes)]
    return {node: _start_agent(options, url, token, spec_path, node) for node in nodes}


def _story(
    options: DemoOptions,
    url: str,
    tokens: dict[str, str],
    spec_path: Path,
    agents: dict[str, subprocess.Popen[bytes]],
) -> Story | None:
    """The scripted story: a maintenance window on the last node, the job on two of the others
    from the second on."""
    names = list(agents)
    if len(names) < 3:
        sys.stdout.write("(the story needs at least 3 nodes: not played)\n")
        return None

    def say(line: str) -> None:
        sys.stdout.write(f"[story] {line}\n")
        sys.stdout.flush()

    def stop_agent(node: str) -> None:
        agents[node].terminate()
        agents[node].wait(timeout=15)

    def start_agent(node: str) -> None:
        agents[node] = _start_agent(options, url, tokens["agent"], spec_path, node)

    return Story(
        url,
        tokens,
        StoryNodes(maintained=names[-1], others=tuple(names[1:-1])),
        gpus=options.gpus,
        window_s=options.story_window_s,
        started_at=datetime.now(UTC),
        stop_agent=stop_agent,
        start_agent=start_agent,
        say=say,
    )


def _status(client: httpx.Client) -> str:
    try:
        nodes = client.get("/v1/nodes").json()["data"]
        gpus = client.get("/v1/gpus").json()
        xids = client.get("/v1/events", params={"kind": "xid", "limit": 100_000}).json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        return f"(status unavailable: {exc})"
    try:
        risk = client.get("/v1/risk", params={"horizon": "7d", "limit": 1000}).json()
        failed = client.get("/v1/lifetimes", params={"end_kind": "failure"}).json()["count"]
    except (httpx.HTTPError, KeyError, ValueError):
        risk, failed = {}, "?"
    ruled = sum(1 for g in risk.get("gpus", []) if g["basis"] == "rule")
    model = risk.get("model_version") or "none yet"
    states = Counter(n["state"] for n in nodes)
    newest = max((g["latest"]["ts"] for g in gpus if g.get("latest")), default="-")
    codes = Counter(e["xid"] for e in xids)
    top = ", ".join(f"{code}x{n}" for code, n in codes.most_common(6)) or "none"
    return (
        f"sim time {newest[:16]} | nodes up {states['up']}, unreachable {states['unreachable']}"
        f" | GPUs {len(gpus)} | Xid events {len(xids)} ({top})"
        f" | out by rule {ruled} | failures recorded {failed} | model {model}"
    )


def run_demo(options: DemoOptions) -> None:
    data_dir = options.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    database_url = f"sqlite:///{(data_dir / 'fleetwatch.db').resolve()}"
    tokens = _demo_tokens(database_url, data_dir / "tokens.env")
    spec_path = _write_fleet(options)
    port = _pick_port(options.port)
    url = f"http://127.0.0.1:{port}"
    with (data_dir / "server.log").open("ab") as sink:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "fleetwatch",
                "server",
                "--port",
                str(port),
                "--database-url",
                database_url,
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **_DEMO_SERVER_ENV, **_history_env(options)},
        )
    agents: dict[str, subprocess.Popen[bytes]] = {}
    story: Story | None = None
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        _wait_ready(url, server)
        agents = _start_agents(options, url, tokens["agent"], spec_path)
        sys.stdout.write(_banner(url, tokens, database_url, options))
        sys.stdout.flush()
        if options.story:
            story = _story(options, url, tokens, spec_path, agents)
            if story is not None:
                story.start()
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {tokens['read']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=10) as client:
            while not stop and (
                options.duration_s is None or time.monotonic() - started < options.duration_s
            ):
                time.sleep(min(5.0, options.interval_s * 2))
                sys.stdout.write(_status(client) + "\n")
                sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    finally:
        if story is not None:
            story.stop()
        for process in [*agents.values(), server]:
            process.terminate()
        for process in [*agents.values(), server]:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
