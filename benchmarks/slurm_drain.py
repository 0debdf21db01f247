"""A fatal Xid on a GPU node until Slurm shows the node drained, with every part real.

A real ``slurmctld`` (the Debian packages, munge via ``scripts/ensure-slurm.sh``, a temporary
``slurm.conf`` with one node ``bench-node`` at 127.0.0.1, as
``tests/integration/test_slurm_sync.py`` does for gpu[01-04]), a real ``fleetwatch server`` on
SQLite with its default assessment and planner timers (the Xid's batch wakes them;
``FLEETWATCH_SERVER_EVICTION_COOLDOWN_S=0`` so the node can be drained again each trial), a real
agent process following a kernel-log file (fake NVML with 8 GPUs, ``benchmarks/agent.py``'s
runner, node name ``bench-node``) and ``fleetwatch slurm-sync`` running as a loop with its
default interval (5 s) and a scheduler token.

Each trial waits a random fraction of the sync interval (so the Xid lands at a random phase of
the adapter's loop, as a real one does), appends an ``NVRM: Xid ... 79`` line to the agent's
kern.log and polls ``scontrol --oneliner show node bench-node`` every 50 ms until its State has
DRAIN; the same loop polls ``GET /v1/evictions?node=bench-node`` for the split Xid -> eviction
at the API and eviction -> drained. Then a passing validation pushed as ``fleetwatch validate``
on the node pushes it (agent token; a node drained for a hardware reason returns only after
one), ``POST /v1/nodes/bench-node/return`` (scheduler token) and a wait until slurm-sync has
resumed the node in Slurm before the next trial.

    .venv/bin/python benchmarks/slurm_drain.py [--trials 50] [--budget 600] [--smoke]

``--smoke``: two trials (the second one drains a node that returned), for the test suite.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent import run_agent  # noqa: E402
from tests.factories import make_validation  # noqa: E402
from tests.integration.live import FLEETWATCH, create_token, live_server  # noqa: E402
from tests.integration.slurm import SlurmctldFailed, running_slurmctld  # noqa: E402

from fleetwatch.adapters.settings import AdapterSettings  # noqa: E402
from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import make_engine  # noqa: E402

NODE = "bench-node"
POLL_S = 0.05


@contextmanager
def slurmctld(root: Path) -> Iterator[Path]:
    """A running slurmctld that knows ``bench-node``; yields its slurm.conf."""
    missing = [tool for tool in ("slurmctld", "scontrol", "munge") if not shutil.which(tool)]
    ensure = subprocess.run(
        [str(REPO / "scripts/ensure-slurm.sh")], capture_output=True, text=True, timeout=300
    )
    if ensure.returncode != 0:
        sys.exit(f"scripts/ensure-slurm.sh failed (missing: {missing}): {ensure.stderr.strip()}")
    try:
        with running_slurmctld(root, cluster="fwbench", node_groups=(NODE,),
                               partition=NODE) as conf:  # fmt: skip
            yield conf
    except SlurmctldFailed as exc:
        sys.exit(str(exc))


def slurm_state() -> str:
    line = subprocess.run(
        ["scontrol", "--oneliner", "show", "node", NODE],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    return line.split(" State=", 1)[1].split()[0]


def drained() -> bool:
    return "DRAIN" in slurm_state().split("+")


def _wait(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_S)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _line(name: str, values: list[float]) -> str:
    return (
        f"{name:34s} p50 {statistics.median(values):6.2f} s  p99 {_pct(values, 0.99):6.2f} s  "
        f"max {max(values):6.2f} s  min {min(values):6.2f} s"
    )


def run(tmp: Path, trials: int, budget_s: float, seed: int) -> int:
    """Runs the trials and prints their figures; how many finished."""
    interval = AdapterSettings.model_fields["interval_s"].default
    url = f"sqlite:///{tmp / 'fleetwatch.db'}"
    upgrade(make_engine(ServerSettings(database_url=url)))
    agent_token = create_token(url, "agent", "bench-agent")
    sched_token = create_token(url, "scheduler", "bench-slurm-sync")
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S"):  # default timers
        os.environ.pop(f"FLEETWATCH_SERVER_{name}", None)
    for name, value in {"EVICTION_COOLDOWN_S": "0", "REFIT_INTERVAL_S": "0"}.items():
        os.environ[f"FLEETWATCH_SERVER_{name}"] = value
    rng = random.Random(seed)
    total: list[float] = []
    to_api: list[float] = []
    to_drain: list[float] = []
    to_resume: list[float] = []
    with slurmctld(tmp / "slurm") as conf, live_server(url, tmp) as server:
        os.environ["SLURM_CONF"] = str(conf)
        agent = run_agent(server.url, agent_token, 10.0, tmp / "agent", 50.0)
        sync_log = tmp / "slurm-sync.log"
        with sync_log.open("wb") as sink:
            sync = subprocess.Popen(  # no --interval: the default
                [*FLEETWATCH, "slurm-sync", "--server", server.url],
                env={**os.environ, "FLEETWATCH_SCHEDULER_TOKEN": sched_token},
                stdout=sink, stderr=subprocess.STDOUT,
            )  # fmt: skip
        kern_log = tmp / "agent" / "kern.log"
        started = time.monotonic()
        try:
            with server.client(sched_token) as api, server.client(agent_token) as node:
                _wait(lambda: api.get("/v1/nodes").json()["count"], 60, "the agent's first batch")
                assert not drained(), slurm_state()
                seen: set[int] = set()
                for i in range(trials):
                    if time.monotonic() - started > budget_s:
                        print(f"time budget spent after {i} trials", file=sys.stderr)
                        break
                    time.sleep(rng.uniform(0, interval))  # a random phase of the sync loop
                    with kern_log.open("a") as f:
                        f.write(
                            f"[{3000 + i}.000000] NVRM: Xid (PCI:0000:18:00): 79, pid={70_000 + i}"
                            ", name=bench, GPU has fallen off the bus.\n"
                        )
                    written = time.perf_counter()
                    at_api = eviction_id = None
                    while True:
                        now = time.perf_counter()
                        if now - written > 60:
                            raise RuntimeError(f"trial {i}: not drained after 60 s")
                        if at_api is None:
                            data = api.get(
                                "/v1/evictions", params={"node": NODE, "limit": 5}
                            ).json()["data"]
                            new = [e for e in data if e["id"] not in seen]
                            if new:
                                at_api, eviction_id = now, new[0]["id"]
                        if drained():
                            break
                        time.sleep(POLL_S)
                    done = time.perf_counter()
                    if at_api is None:  # drained between two API polls
                        at_api = done
                        data = api.get("/v1/evictions", params={"node": NODE, "limit": 5}).json()
                        eviction_id = next(e["id"] for e in data["data"] if e["id"] not in seen)
                    assert eviction_id is not None
                    seen.add(eviction_id)
                    total.append(done - written)
                    to_api.append(at_api - written)
                    to_drain.append(done - at_api)
                    print(f"trial {i + 1:2d}: drained in {done - written:5.2f} s "
                          f"(eviction {eviction_id} at the API after "
                          f"{(at_api - written) * 1000:.0f} ms)", file=sys.stderr)  # fmt: skip
                    # slurm-sync completes the eviction in the pass that drained the node.
                    state_url = f"/v1/evictions/{eviction_id}"
                    _wait(
                        lambda url=state_url: api.get(url).json()["state"] == "completed",
                        30, "the eviction to be completed",
                    )  # fmt: skip
                    node.post(
                        f"/v1/nodes/{NODE}/validations", json=make_validation(NODE, gpus=8)
                    ).raise_for_status()
                    api.post(
                        f"/v1/nodes/{NODE}/return", json={"note": "bench: GPU reseated"}
                    ).raise_for_status()
                    returned = time.perf_counter()
                    _wait(lambda: not drained(), 60, "slurm-sync to resume the node")
                    to_resume.append(time.perf_counter() - returned)
        finally:
            for process in (sync, agent):
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    if not total:
        sys.exit("no trial finished")
    print(f"\n{len(total)} trials, slurm-sync interval {interval:g} s (its default; it long-polls "
          "new pending and returned evictions between passes), "
          f"scontrol polled every {POLL_S * 1000:.0f} ms")  # fmt: skip
    print(_line("Xid line -> Slurm State has DRAIN", total))
    print(_line("  Xid line -> eviction at the API", to_api))
    print(_line("  eviction at API -> DRAIN", to_drain))
    print(_line("return -> Slurm resumed", to_resume))
    return len(total)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument(
        "--budget", type=float, default=600, help="stop starting trials after this many seconds"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="two trials, for the test suite")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials = 2
    with tempfile.TemporaryDirectory() as tmp_dir:
        finished = run(Path(tmp_dir), args.trials, args.budget, args.seed)
    if args.smoke and finished < args.trials:
        sys.exit(f"smoke: {finished} of {args.trials} trials finished")


if __name__ == "__main__":
    main()
