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
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from evictions import kernel_line_trials  # noqa: E402

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
    def kind(i: int) -> str:
        return ("sxid", "aer")[i % 2]

    def record(i: int) -> str:
        return "".join(f"{line}\n" for line in _lines(kind(i), i))

    latencies: dict[str, list[float]] = {"sxid": [], "aer": []}
    for i, (seconds, found) in enumerate(kernel_line_trials(url, tmp, trials, record, 60.0)):
        latencies[kind(i)].append(seconds)
        want = "sxid_fatal" if kind(i) == "sxid" else "aer_gpu_uncorrected"
        if found is not None and not found["reason"].startswith(want):
            print(f"trial {i}: unexpected reason {found['reason']!r}")
    return latencies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="one record of each kind")
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials = 2
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        latencies = run(f"sqlite:///{tmp / 'host.db'}", tmp, args.trials)
    for kind, values in latencies.items():
        if values:
            print(f"{kind:4s} record -> pending eviction at the API ({len(values)} trials): "
                  f"{_pcts(values)}")  # fmt: skip
    both = latencies["sxid"] + latencies["aer"]
    print(f"both ({len(both)} trials): {_pcts(both)}")
    if args.smoke and float("inf") in both:
        sys.exit("smoke: a record made no pending eviction")


if __name__ == "__main__":
    main()
