"""The /sys/class/infiniband reader on real captured trees, checked against independent readings:
the counter files read with plain open(), and ``ibstat`` captured on the same H100 node."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.unit.agent.sysfs_trees import h100_tree, procfs_tree

from fleetwatch.agent.parsers.infiniband_sysfs import PortReading, read_infiniband_tree

IBSTAT_H100 = "infiniband/gpud__ibstat_H100_all-active_space-indented.txt"


def _ports(root: Path) -> dict[tuple[str, int], PortReading]:
    tree = read_infiniband_tree(root)
    assert tree.problems == []
    return {(p.device, p.port): p for p in tree.ports}


def _files(directory: Path) -> dict[str, int]:
    """Every counter file of a directory, read with plain open() (``lifespan`` is a setting)."""
    if not directory.is_dir():
        return {}
    values = {}
    for name in os.listdir(directory):
        if name != "lifespan":
            with open(directory / name) as f:
                values[name] = int(f.read())
    return values


def _ibstat(path: Path) -> dict[str, dict[str, str]]:
    """CA name -> its port's State, Physical state, Rate and Link layer, as ibstat printed them."""
    cas: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("CA '"):
            current = cas.setdefault(line.split("'")[1], {})
        elif ":" in line:
            key, _, value = line.strip().partition(":")
            current[key] = value.strip()
    return cas


def _check_counters_match_files(root: Path, ports: dict[tuple[str, int], PortReading]) -> int:
    checked = 0
    for (device, port), reading in ports.items():
        base = root / device / "ports" / str(port)
        assert (reading.counters or {}) == _files(base / "counters")
        assert (reading.hw_counters or {}) == _files(base / "hw_counters")
        checked += len(reading.counters or {}) + len(reading.hw_counters or {})
    return checked


def test_the_h100_tree_reads_as_ibstat_saw_the_node(fixtures_dir: Path, tmp_path: Path) -> None:
    root = h100_tree(fixtures_dir, tmp_path)
    ports = _ports(root)
    ibstat = _ibstat(fixtures_dir / IBSTAT_H100)
    assert sorted(device for device, _ in ports) == sorted(ibstat)
    for (device, port), reading in ports.items():
        seen = ibstat[device]
        assert port == 1
        assert reading.values["state"].lower() == seen["State"].lower()
        assert reading.values["phys_state"] == seen["Physical state"]
        assert reading.values["rate_gbps"] == float(seen["Rate"])
        assert reading.values["link_layer"] == seen["Link layer"]
    bond = ports[("mlx5_bond_0", 1)].values
    assert (bond["link_layer"], bond["link_width"], bond["link_speed"]) == ("Ethernet", 2, "NDR")
    assert ports[("mlx5_0", 1)].values["state_code"] == 4
    assert ports[("mlx5_0", 1)].values["phys_state_code"] == 5


def test_the_h100_counters_are_the_files_values(fixtures_dir: Path, tmp_path: Path) -> None:
    root = h100_tree(fixtures_dir, tmp_path)
    ports = _ports(root)
    assert _check_counters_match_files(root, ports) > 9 * 40
    assert ports[("mlx5_1", 1)].counters["link_downed"] == 255  # type: ignore[index]
    assert ports[("mlx5_0", 1)].hw_counters["roce_adp_retrans"] == 3  # type: ignore[index]
    assert "lifespan" not in ports[("mlx5_0", 1)].hw_counters  # type: ignore[operator]


def test_the_h100_tree_has_no_guid_or_netdev_and_leaves_them_absent(
    fixtures_dir: Path, tmp_path: Path
) -> None:
    for reading in _ports(h100_tree(fixtures_dir, tmp_path)).values():
        assert "node_guid" not in reading.values
        assert "netdev" not in reading.values


def test_the_procfs_tree_reads_three_kinds_of_adapter(fixtures_dir: Path, tmp_path: Path) -> None:
    root = procfs_tree(fixtures_dir, tmp_path)
    ports = _ports(root)
    assert sorted(ports) == [("hfi1_0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    assert _check_counters_match_files(root, ports) > 4 * 15
    hfi1, mlx4_2, mlx5 = ports[("hfi1_0", 1)], ports[("mlx4_0", 2)], ports[("mlx5_0", 1)]
    assert hfi1.values["rate_gbps"] == 100.0 and hfi1.values["link_speed"] == "EDR"
    assert hfi1.hw_counters is None  # no hw_counters directory: absent, not empty or zero
    # Its link_layer file ends in an extra blank line.
    assert mlx4_2.values["link_layer"] == "InfiniBand"
    assert mlx4_2.counters["port_xmit_wait"] == 3846  # type: ignore[index]
    # The node GUID file has no final newline; the GUID is the adapter's, on each of its ports.
    assert mlx5.values["node_guid"] == "0a7f:bc12:45ef:d23b"
    assert (mlx5.values["rate_gbps"], mlx5.values["link_width"]) == (25.0, 1)
    # This capture's phys_state reads "4: ACTIVE": kept as read, not corrected.
    assert (mlx5.values["phys_state_code"], mlx5.values["phys_state"]) == (4, "ACTIVE")
    assert mlx5.hw_counters is not None
    assert mlx5.hw_counters["local_ack_timeout_err"] == 131
    assert mlx5.hw_counters["roce_adp_retrans"] == 99


def _port(root: Path, device: str = "mlx5_0", port: int = 1) -> Path:
    path = root / device / "ports" / str(port)
    (path / "counters").mkdir(parents=True)
    (path / "state").write_text("4: ACTIVE\n")
    (path / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (path / "counters" / "symbol_error").write_text("7\n")
    (path / "counters" / "link_downed").write_text("1\n")
    return path


@pytest.mark.parametrize(
    ("name", "text", "field", "said"),
    [
        ("rate", "fast\n", "rate_gbps", "expected a rate"),
        ("state", "ACTIVE\n", "state", "expected a port state"),
        ("phys_state", "5 LinkUp\n", "phys_state", "expected a port state"),
        ("link_layer", "<infiniband>\n", "link_layer", "expected a link layer"),
        ("counters/symbol_error", "N/A\n", "symbol_error", "expected a decimal counter"),
        ("counters/symbol_error", "9223372036854775808\n", "symbol_error", "beyond 64-bit"),
        ("counters/symbol_error", "\xb5s\n", "symbol_error", "not ASCII"),
    ],
)
def test_a_file_that_does_not_parse_is_named_and_left_out(
    tmp_path: Path, name: str, text: str, field: str, said: str
) -> None:
    port = _port(tmp_path)
    (port / name).write_bytes(text.encode("latin-1"))
    tree = read_infiniband_tree(tmp_path)
    (problem,) = tree.problems
    assert str(port / name) in str(problem) and said in str(problem)
    (reading,) = tree.ports
    assert field not in reading.values and field not in (reading.counters or {})
    # The rest of the port is still read.
    assert reading.values["state" if name != "state" else "rate_gbps"] is not None
    assert (reading.counters or {}).get("link_downed") == 1


def test_an_unreadable_file_stays_absent_never_zero(tmp_path: Path) -> None:
    port = _port(tmp_path)
    # sysfs answers EINVAL for a counter the firmware lacks; a directory fails read() alike.
    (port / "counters" / "symbol_error").unlink()
    (port / "counters" / "symbol_error").mkdir()
    (port / "rate").unlink()
    tree = read_infiniband_tree(tmp_path)
    assert tree.problems == []
    (reading,) = tree.ports
    assert reading.counters == {"link_downed": 1}
    assert "rate_gbps" not in reading.values and "phys_state" not in reading.values


def test_a_node_without_infiniband_has_no_ports(tmp_path: Path) -> None:
    tree = read_infiniband_tree(tmp_path / "absent")
    assert (tree.ports, tree.problems) == ([], [])


def test_the_netdev_of_a_port_is_found(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0")
    (tmp_path / "mlx5_0" / "device" / "net" / "ibp12s0").mkdir(parents=True)
    _port(tmp_path, "mlx4_0", 1)
    _port(tmp_path, "mlx4_0", 2)
    for name, dev_port in (("ib0", "0"), ("ib1", "1")):
        net = tmp_path / "mlx4_0" / "device" / "net" / name
        net.mkdir(parents=True)
        (net / "dev_port").write_text(f"{dev_port}\n")
    netdevs = {
        (p.device, p.port): p.values.get("netdev") for p in read_infiniband_tree(tmp_path).ports
    }
    assert netdevs == {("mlx4_0", 1): "ib0", ("mlx4_0", 2): "ib1", ("mlx5_0", 1): "ibp12s0"}
