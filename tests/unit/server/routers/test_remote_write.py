"""``POST /api/v1/write`` through the app (SQLite and PostgreSQL): Prometheus remote write of the
real captured dcgm-exporter pages and node_exporter's InfiniBand/EDAC series, split as
Prometheus splits a scrape, resent as it resends, from an HA pair; the sealer is run by hand
with an injected clock (background jobs are off in these tests)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from tests.conftest import bearer
from tests.stored_samples import stored_samples

from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter
from fleetwatch.config import ServerSettings
from fleetwatch.remote_write.exposition import scrape_series
from fleetwatch.remote_write.wire import Series, encode_write_request
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import events, gpus, node_ports, nodes
from fleetwatch.server.upkeep.remote_write_seal import RemoteWriteSealer

DCGM_PAGES = Path(__file__).resolve().parents[4] / "../shared/fixtures/dcgm_exporter/metrics"
DATADOG = "datadog__dcgm_tests_fixtures_metrics.txt"  # two GPUs, Hostname labels
MIG = "nvidia-docs_A100_MIG_ub20-a100-k8s.prom"
NODE_EXPORTER = Path(__file__).resolve().parents[3] / "fixtures/node_exporter"
HEADERS = {
    "Content-Type": "application/x-protobuf",
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


def _page(name: str) -> str:
    path = DCGM_PAGES / name
    if not path.is_file():
        pytest.skip(f"shared fixture {path} not found")
    return path.read_text()


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _write(client: TestClient, token: str, series: list[Series], **headers: str) -> Any:
    return client.post(
        "/api/v1/write",
        content=encode_write_request(series),
        headers=HEADERS | bearer(token) | headers,
    )


def _seal(db: Database, settings: ServerSettings, after: datetime) -> int:
    """Run the sealer as if ``after`` were long enough after every piece to have settled."""
    clock = iter([after - timedelta(hours=1), after])
    sealer = RemoteWriteSealer(db, settings, clock=lambda: next(clock))
    return sealer.run_once()


def _later(now: datetime) -> datetime:
    return now + timedelta(seconds=120)


def test_a_scrape_split_across_requests_and_resent_is_stored_once_with_the_pages_values(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    page = _page(DATADOG)
    now = datetime.now(UTC).replace(microsecond=0)
    series = scrape_series(page, _ms(now), {"job": "dcgm", "instance": "10.0.0.7:9400"})
    half = len(series) // 2
    for part in (series[:half], series[half:], series[:half], series):  # split, then resent
        assert _write(client, tokens["agent"], part).status_code == 204
    sealed = _seal(db, settings, _later(now))  # fields, as staged
    with db.read() as conn:
        samples = stored_samples(conn)
        stored_gpus = {row.uuid: row for row in conn.execute(select(gpus))}
        node_names = set(conn.execute(select(nodes.c.name)).scalars())
    # The page's third GPU (GPU-abc) has only series FleetWatch does not read: no sample.
    expected = {r.identity["uuid"]: r for r in parse_dcgm_exporter(page) if r.values}
    assert len(samples) == len(expected) == 2  # one sample per GPU, however often sent
    assert sealed == sum(len(r.values) for r in expected.values())
    for sample in samples:
        reading = expected[sample["gpu_uuid"]]
        assert sample["ts"] == now
        got = {k: sample[k] for k in reading.values}
        assert got == pytest.approx(reading.values)
        # Data is never made up: a field the page lacks is absent, not 0.
        assert all(sample[k] is None for k in ("fan_speed_pct", "gpu_temp_c") if k not in got)
        assert stored_gpus[sample["gpu_uuid"]].name == reading.identity.get("name")
    # The page names its node by dcgm-exporter's Hostname label, which wins over instance.
    hostnames = {
        line.split('Hostname="')[1].split('"')[0]
        for line in page.splitlines()
        if 'Hostname="' in line and any(uuid in line for uuid in expected)
    }
    assert node_names == hostnames
    assert _seal(db, settings, _later(_later(now))) == 0  # nothing left pending


def test_the_last_xid_code_becomes_one_event_per_new_xid_and_a_fatal_one_is_urgent(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    page = _page(DATADOG)
    xid_line = next(line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_XID_ERRORS"))
    uuid = xid_line.split('UUID="')[1].split('"')[0]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=5)
    codes = [0, 0, 79, 79, 0, 79, 13]  # baseline, same, new, same, reset, again, another
    for i, code in enumerate(codes):
        text = page.replace(xid_line, xid_line.rsplit(" ", 1)[0] + f" {code}")
        series = scrape_series(text, _ms(start + timedelta(seconds=15 * i)))
        assert _write(client, tokens["agent"], series).status_code == 204
    # Resending the whole history changes nothing.
    for i, code in enumerate(codes[:4]):
        text = page.replace(xid_line, xid_line.rsplit(" ", 1)[0] + f" {code}")
        series = scrape_series(text, _ms(start + timedelta(seconds=15 * i)))
        assert _write(client, tokens["agent"], series).status_code == 204
    with db.read() as conn:
        stored = conn.execute(
            select(events.c.gpu_uuid, events.c.xid, events.c.ts)
            .where(events.c.kind == "xid")
            .order_by(events.c.ts)
        ).all()
    assert [(row.gpu_uuid, row.xid) for row in stored] == [(uuid, 79), (uuid, 79), (uuid, 13)]
    assert [row.ts for row in stored] == [start + timedelta(seconds=15 * i) for i in (2, 5, 6)]
    urgent = client.app.state.urgent  # type: ignore[attr-defined]
    node = xid_line.split('Hostname="')[1].split('"')[0]
    assert urgent.take() == {node}  # the Xid 79 handed its node to the urgent lane


def test_an_ha_pair_stores_one_replica_until_it_falls_silent(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    page = _page(DATADOG)
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)

    def replica(name: str, offset_s: float) -> list[Series]:
        labels = {"cluster": "eu-1", "__replica__": name}
        return scrape_series(page, _ms(now + timedelta(seconds=offset_s)), labels)

    assert _write(client, tokens["agent"], replica("a", 0)).status_code == 204
    assert _write(client, tokens["agent"], replica("b", 0.4)).status_code == 204  # dropped
    assert _write(client, tokens["agent"], replica("a", 15)).status_code == 204
    _seal(db, settings, _later(now))
    with db.read() as conn:
        stamps = sorted({s["ts"] for s in stored_samples(conn)})
    assert stamps == [now, now + timedelta(seconds=15)]  # replica a's scrapes only
    metrics = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert 'fleetwatch_remote_write_samples_total{outcome="replica_dropped"}' in metrics


def test_the_other_replica_is_stored_once_the_first_is_silent_past_the_failover(
    db: Database, settings: ServerSettings
) -> None:
    from fleetwatch.server.ingest.remote_write_readings import limits_for, read_request
    from fleetwatch.server.ingest.remote_write_store import store_request

    page = _page(DATADOG)
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)

    def push(name: str, at: datetime) -> int:
        series = scrape_series(page, _ms(at), {"cluster": "eu-1", "__replica__": name})
        readings = read_request(series, limits_for(settings, at))
        return store_request(db, readings, settings, at).samples["replica_dropped"]

    assert push("a", t0) == 0
    assert push("b", t0 + timedelta(seconds=settings.remote_write_ha_failover_s - 1)) > 0
    assert push("b", t0 + timedelta(seconds=settings.remote_write_ha_failover_s + 1)) == 0
    assert push("a", t0 + timedelta(seconds=settings.remote_write_ha_failover_s + 2)) > 0


def test_a_mig_gpu_gives_one_whole_gpu_sample_as_the_agent_reads_it(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    page = _page(MIG)
    now = datetime.now(UTC).replace(microsecond=0)
    assert _write(client, tokens["agent"], scrape_series(page, _ms(now))).status_code == 204
    _seal(db, settings, _later(now))
    (expected,) = parse_dcgm_exporter(page)
    with db.read() as conn:
        (sample,) = stored_samples(conn)
        latest = conn.execute(select(gpus.c.latest)).scalar_one()
    assert {k: sample[k] for k in expected.values} == pytest.approx(expected.values)
    assert latest["mig"] == expected.identity["mig"]


def test_node_exporter_ports_and_edac_counts_become_port_readings_and_edac_events(
    client: TestClient, db: Database, settings: ServerSettings, tokens: dict[str, str]
) -> None:
    text = (NODE_EXPORTER / "e2e-output_infiniband_edac.prom").read_text()
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=30)
    target = {"instance": "gpu-node-9:9100", "job": "node"}
    first = scrape_series(text, _ms(now), target)
    assert _write(client, tokens["agent"], first).status_code == 204
    raised = text.replace(
        'node_edac_uncorrectable_errors_total{controller="0"} 5',
        'node_edac_uncorrectable_errors_total{controller="0"} 7',
    )
    assert raised != text
    later = scrape_series(raised, _ms(now + timedelta(seconds=15)), target)
    assert _write(client, tokens["agent"], later).status_code == 204
    _seal(db, settings, _later(now))
    with db.read() as conn:
        ports = conn.execute(select(node_ports.c.device, node_ports.c.port)).all()
        edac = conn.execute(select(events.c.details).where(events.c.kind == "edac")).scalars().all()
        node = conn.execute(select(nodes.c.name)).scalar_one()
    assert node == "gpu-node-9"  # instance, its port dropped
    assert ("mlx4_0", 1) in {(row.device, row.port) for row in ports}
    assert [(d["severity"], d["count"], d["memory_controller"]) for d in edac] == [
        ("uncorrected", 2, 0)
    ]


def test_unused_series_are_counted_not_refused(client: TestClient, tokens: dict[str, str]) -> None:
    now = _ms(datetime.now(UTC))
    series = [Series({"__name__": "up", "job": "x", "instance": "h:1"}, [(now, 1.0)])]
    assert _write(client, tokens["agent"], series).status_code == 204
    metrics = client.get("/metrics", headers=bearer(tokens["read"])).text
    assert 'fleetwatch_remote_write_series_total{outcome="unused"} 1.0' in metrics


@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b"not snappy at all", {}, 400, "snappy"),
        (b"\x05\x10garbage", {}, 400, ""),
        (None, {"Content-Encoding": "gzip"}, 415, "snappy"),
        (None, {"Content-Type": "application/json"}, 415, "x-protobuf"),
        (
            None,
            {"Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request"},
            415,
            "1.0",
        ),
    ],
)
def test_a_request_no_retry_can_fix_is_a_4xx_naming_the_problem(
    client: TestClient,
    tokens: dict[str, str],
    body: bytes | None,
    headers: dict[str, str],
    status: int,
    says: str,
) -> None:
    content = body if body is not None else encode_write_request([])
    response = client.post(
        "/api/v1/write", content=content, headers=HEADERS | bearer(tokens["agent"]) | headers
    )
    assert response.status_code == status
    assert says in response.json()["error"]


def test_only_an_ingest_token_for_the_series_nodes_may_write(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    series = scrape_series(_page(DATADOG), _ms(datetime.now(UTC)))
    anonymous = client.post("/api/v1/write", content=encode_write_request(series), headers=HEADERS)
    assert anonymous.status_code == 401
    assert _write(client, tokens["read"], series).status_code == 403
    with db.write() as conn:
        bound, _ = create_token(conn, name="bound", scope="agent", node_pattern="other-*")
    response = _write(client, bound, series)
    assert response.status_code == 403
    with db.read() as conn:
        assert conn.execute(select(gpus.c.uuid)).first() is None  # nothing of it staged
