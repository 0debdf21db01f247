"""How fast a fatal NVSwitch SXid or an uncorrected PCIe AER record becomes an eviction.

The harness of ``benchmarks/evictions.py`` (end to end): a real agent process follows a kernel
log file (fake NVML with 8 H100s, GPU 0 at 0000:18:00.0, as in ``benchmarks/agent.py``) and pushes
at once; a real server (SQLite, loopback) judges on its default timers, woken by the batch that
carries a draining host error; the trial ends when a new eviction shows at
``GET /v1/evictions?state=pending``. Trials alternate between two real records, re-stamped:

* ``sxid``: the first line of ``gpud__dmesg_Xid79-with-SXid20034-LTSSM-multi-switch.log``
  (``nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up``);
* ``aer``: the four-line Uncorrected (Fatal) record of
  ``lkml-2024-01-11_aer-corrected-nonfatalerr_fatal-tlp-malftlp.log``, its device address moved
  onto GPU 0 so that the record is on a GPU's PCIe path. A multi-line record is complete only
  when the reader sees that no line follows, so this one includes an extra agent poll.

After each trial the scheduler acks, completes and returns the node (cooldown 0).

    .venv/bin/python benchmarks/host_error_evictions.py [--trials 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from agent import run_agent  # noqa: E402
from tests.integration.live import create_token, live_server  # noqa: E402

from fleetwatch.config import ServerSettings  # noqa: E402
from fleetwatch.server.db.migrate import upgrade  # noqa: E402
from fleetwatch.server.db.session import make_engine  # noqa: E402

SXID = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
AER_GPU = "0000:18:00.0"  # GPU 0 of tests/fixtures/nvml/h100_8x.json
AER = (
    "pcieport 0000:b7:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, "
    "(Receiver ID)",
    "pcieport 0000:b7:02.0:   device [8086:0db0] error status/mask=00041000/00180020",
    "pcieport 0000:b7:02.0:    [12] TLP                    (First)",
    "pcieport 0000:b7:02.0:    [18] MalfTLP       ",
)


def _lines(kind: str, trial: int) -> list[str]:
    stamp = f"[{3000 + trial:6d}.{trial:06d}]"
    if kind == "sxid":
        return [f"{stamp} {SXID}"]
    return [f"{stamp} {line.replace('0000:b7:02.0', AER_GPU)}" for line in AER]


def _pcts(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return (
        f"min {ordered[0] * 1000:.0f} ms, p50 {statistics.median(ordered) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
    )


def run(url: str, tmp: Path, trials: int) -> dict[str, list[float]]:
    upgrade(make_engine(ServerSettings(database_url=url)))
    agent_token = create_token(url, "agent", "bench-agent-host")
    sched_token = create_token(url, "scheduler", "bench-sched-host")
    for name in ("ASSESS_INTERVAL_S", "PLANNER_INTERVAL_S"):  # default timers: the batch wakes
        os.environ.pop(f"FLEETWATCH_SERVER_{name}", None)
    for name, value in {"EVICTION_COOLDOWN_S": "0", "REFIT_INTERVAL_S": "0"}.items():
        os.environ[f"FLEETWATCH_SERVER_{name}"] = value
    latencies: dict[str, list[float]] = {"sxid": [], "aer": []}
    with live_server(url, tmp) as server, server.client(sched_token) as sched:
        agent = run_agent(server.url, agent_token, 10.0, tmp / "agent", 50.0)
        log = tmp / "agent" / "kern.log"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the agent's first batch names its GPUs
                if sched.get("/v1/nodes").json()["count"]:
                    break
                time.sleep(0.2)
            seen: set[int] = set()
            for i in range(trials):
                kind = ("sxid", "aer")[i % 2]
                with log.open("a") as f:
                    f.write("".join(f"{line}\n" for line in _lines(kind, i)))
                written = time.perf_counter()
                found = None
                while time.perf_counter() - written < 60 and found is None:
                    data = sched.get("/v1/evictions", params={"state": "pending"}).json()["data"]
                    found = next((e for e in data if e["id"] not in seen), None)
                    if found is None:
                        time.sleep(0.01)
                if found is None:
                    latencies[kind].append(float("inf"))
                    continue
                latencies[kind].append(time.perf_counter() - written)
                seen.add(found["id"])
                want = "sxid_fatal" if kind == "sxid" else "aer_gpu_uncorrected"
                if not found["reason"].startswith(want):
                    print(f"trial {i}: unexpected reason {found['reason']!r}")
                for step in ("ack", "complete"):
                    sched.post(f"/v1/evictions/{found['id']}/{step}").raise_for_status()
                sched.post("/v1/nodes/bench-node/return", json={"note": "reset"}).raise_for_status()
                time.sleep(0.2)
        finally:
            agent.terminate()
            agent.wait(timeout=20)
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        latencies = run(f"sqlite:///{tmp / 'host.db'}", tmp, args.trials)
    for kind, values in latencies.items():
        if values:
            print(f"{kind:4s} record -> pending eviction at the API ({len(values)} trials): "
                  f"{_pcts(values)}")  # fmt: skip
    both = latencies["sxid"] + latencies["aer"]
    print(f"both ({len(both)} trials): {_pcts(both)}")


if __name__ == "__main__":
    main()
