"""Prometheus remote write into a real `fleetwatch server`, from real Prometheus processes.

Debian's Prometheus 2.42 scrapes three captured dcgm-exporter pages (shared/fixtures/dcgm_exporter:
datadog's, three hosts' T4 and A10G series; NVIDIA's A100 page with a MIG instance; a 1.x page
with neither Hostname nor UUID labels, only ``uuid``, whose node is named by its address) every
second and remote-writes them to ``POST /api/v1/write`` with an agent token, as an operator's
``remote_write`` block with ``authorization: {credentials: ...}`` does. Checked: the pages' GPUs
are listed with the values FleetWatch's own dcgm-exporter parser reads from the same text; a
GPU's last Xid turning 79 on the page is one Xid event and, through the urgent lane alone (the
whole-fleet passes are an hour apart), an eviction of its node; a server that is stopped and
started again while Prometheus keeps scraping stores every scrape Prometheus holds exactly once;
an HA pair (two Prometheus servers, one ``cluster``, ``__replica__`` A and B) is stored from one
replica at a time, once, and from the other after the stored one falls silent.

One server and one Prometheus serve the first three tests; the HA pair has a server of its own,
as it writes the same GPUs with other scrape times.
"""

from __future__ import annotations

import shutil
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from fleetwatch.agent.parsers import GpuReading
from fleetwatch.agent.parsers.dcgm_exporter import parse_dcgm_exporter
from fleetwatch.config import ServerSettings
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.repo.sample_reader import to_us
from fleetwatch.telemetry import MigIdentity
from tests.conftest import require_tool
from tests.faults.waiting import wait_for
from tests.integration.live import LiveServer, create_token, free_port, live_server
from tests.integration.prometheus_remote import (
    DCGM_PAGES,
    Exporter,
    Prometheus,
    exporter,
    prometheus,
    remote_write_config,
    with_last_xid,
)
from tests.stored_samples import stored_samples

pytestmark = pytest.mark.slow

DATADOG_PAGE = "datadog__dcgm_tests_fixtures_metrics.txt"
A100_PAGE = "nvidia-docs_A100_MIG_ub20-a100-k8s.prom"
LEGACY_PAGE = "legacy-1.x_prometheus-dcgm_README_sample.prom"  # 1.x names, no Hostname label
# Where each page is served: the 1.x page's node is named by its instance, the port dropped.
ADDRESSES = {DATADOG_PAGE: "127.0.0.1", A100_PAGE: "127.0.0.1", LEGACY_PAGE: "127.0.0.2"}
# The pages' GPUs with a reading, and the node each belongs to (its Hostname label, else its
# instance's address).
NODES = {
    "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e": "424773df46e0",
    "GPU-9ef1b6d0-3643-5dd7-b823-c0ec20dcf2d5": "551bdf382151",
    "GPU-34319582-d595-d1c7-d1d2-179bcfa61660": "ub20-a100-k8s",
    "GPU-8f640a3c-7e9a-608d-02a3-f4372d72b323": "127.0.0.2",
}
T4 = "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e"  # the datadog page's GPU with a last-Xid series
# A GPU whose only series no reading is made from (DCGM_FI_PROF_DRAM_ACTIVE): it may be listed.
WITHOUT_READING = "GPU-abc"
WAIT = 90.0  # seconds: generous, as CI shares two cores; every wait ends as soon as it holds

SERVER_ENV = {
    "FLEETWATCH_SERVER_REMOTE_WRITE_SETTLE_S": "1",
    "FLEETWATCH_SERVER_REMOTE_WRITE_SCRAPE_INTERVAL_S": "1",
    # The whole-fleet passes an hour apart: an eviction within the test came by the urgent lane.
    "FLEETWATCH_SERVER_ASSESS_INTERVAL_S": "3600",
    "FLEETWATCH_SERVER_PLANNER_INTERVAL_S": "3600",
    "FLEETWATCH_SERVER_REFIT_INTERVAL_S": "0",
}


@dataclass
class Site:
    """A `fleetwatch server` on an SQLite file, that a test may stop and start again on the
    same port and database."""

    database_url: str
    work_dir: Path
    port: int = field(default_factory=free_port)
    tokens: dict[str, str] = field(default_factory=dict)
    _running: ExitStack | None = None
    _server: LiveServer | None = None

    @property
    def write_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v1/write"

    @property
    def server(self) -> LiveServer:
        assert self._server is not None, "the server is stopped"
        return self._server

    def start(self) -> None:
        self._running = ExitStack()
        self._server = self._running.enter_context(
            live_server(self.database_url, self.work_dir, port=self.port)
        )

    def stop(self) -> None:
        """SIGTERM, as systemd or Kubernetes stops it."""
        if self._running is not None:
            self._running.close()
        self._running = self._server = None

    def get(self, path: str, **params: Any) -> Any:
        with self.server.client(self.tokens["read"]) as client:
            answer = client.get(path, params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def remote_write_counts(self) -> list[str]:
        """The server's remote-write counters, to say why a wait failed."""
        with self.server.client(self.tokens["read"]) as client:
            text = client.get("/metrics").text
        return [line for line in text.splitlines() if line.startswith("fleetwatch_remote_write_")]

    def stored_times(self, uuid: str) -> list[int]:
        """Milliseconds since the epoch of every stored sample of GPU ``uuid``, repeats kept."""
        db = Database(make_engine(ServerSettings(database_url=self.database_url)))
        try:
            with db.read() as conn:
                rows = stored_samples(conn)
        finally:
            db.dispose()
        return sorted(to_us(_ts(r["ts"])) // 1000 for r in rows if r["gpu_uuid"] == uuid)


def _ts(value: datetime | str) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


@pytest.fixture(scope="module")
def server_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name, value in SERVER_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def pages(shared_dir: Path) -> dict[str, str]:
    return {name: (DCGM_PAGES / name).read_text() for name in ADDRESSES}


@pytest.fixture(scope="module")
def exporters(pages: dict[str, str]) -> Iterator[dict[str, Exporter]]:
    with ExitStack() as stack:
        yield {
            name: stack.enter_context(exporter(pages[name], address))
            for name, address in ADDRESSES.items()
        }


def _site(work_dir: Path, template: Path) -> Site:
    work_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, work_dir / "fleetwatch.db")
    url = f"sqlite:///{work_dir / 'fleetwatch.db'}"
    tokens = {scope: create_token(url, scope) for scope in ("agent", "read")}
    return Site(url, work_dir, tokens=tokens)


@dataclass
class Single:
    site: Site
    prom: Prometheus
    exporters: dict[str, Exporter]


@pytest.fixture(scope="module")
def single(
    server_env: None,
    exporters: dict[str, Exporter],
    migrated_sqlite_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Single]:
    """One server, and one Prometheus scraping both pages and writing to it."""
    binary = require_tool("prometheus")
    work_dir = tmp_path_factory.mktemp("remote-write")
    site = _site(work_dir / "fleetwatch", migrated_sqlite_file)
    targets = [e.target for e in exporters.values()]
    config = remote_write_config(targets, site.write_url, site.tokens["agent"])
    # Prometheus first: its first scrape comes 5 s after it starts (its scrape manager applies
    # targets every 5 s), about the time the server takes to start; until then nothing is sent.
    with ExitStack() as stack:
        stack.callback(site.stop)  # after Prometheus: it would flush to a server no longer there
        prom = stack.enter_context(prometheus(binary, config, work_dir / "prometheus"))
        site.start()
        yield Single(site, prom, exporters)


def _listed(site: Site) -> dict[str, dict[str, Any]]:
    return {gpu["uuid"]: gpu for gpu in site.get("/v1/gpus") if gpu["latest"] is not None}


def _listed_all(site: Site) -> dict[str, dict[str, Any]] | None:
    """The listed GPUs once every GPU of the pages is among them with a sample."""
    listed = _listed(site)
    return listed if set(NODES) <= set(listed) else None


def _mig(declared: dict[str, Any] | None) -> MigIdentity | None:
    return None if declared is None else MigIdentity.model_validate(declared)


def _readings(pages: dict[str, str]) -> dict[str, GpuReading]:
    return {
        r.identity["uuid"]: r
        for page in pages.values()
        for r in parse_dcgm_exporter(page)
        if r.values
    }


def test_remote_write_lists_the_pages_gpus_with_the_values_on_the_page(
    single: Single, pages: dict[str, str]
) -> None:
    expected = _readings(pages)
    assert set(expected) == set(NODES)  # what the captured pages hold, read by the agent's parser
    try:
        listed = wait_for(
            "every GPU of the pages listed with a sample",
            lambda: _listed_all(single.site),
            WAIT,
        )
    except AssertionError as exc:
        counts = "\n".join(single.site.remote_write_counts())
        raise AssertionError(f"{exc}; listed: {sorted(_listed(single.site))}\n{counts}") from exc
    assert set(listed) - set(NODES) <= {WITHOUT_READING}, listed.keys()
    for uuid, reading in expected.items():
        gpu = listed[uuid]
        assert gpu["node"] == NODES[uuid], gpu
        for key in ("index", "name", "serial", "driver_version", "vbios_version", "pci_bus_id"):
            assert gpu[key] == reading.identity.get(key), (key, gpu)
        assert gpu["latest"]["values"] == pytest.approx(reading.values), (uuid, gpu["latest"])
        assert _mig(gpu["mig"]) == _mig(reading.identity.get("mig")), gpu
    # No node from the datadog page's unlabelled series (their instance names 127.0.0.1), nor
    # one for a GPU without a reading.
    nodes = {node["name"] for node in single.site.get("/v1/nodes")["data"]}
    assert nodes - {"ip-11111"} == set(NODES.values()), nodes


def _has_stored(site: Site, uuid: str, ms: int) -> bool:
    return any(t >= ms for t in site.stored_times(uuid))


def test_a_last_xid_of_79_on_the_page_is_one_event_and_evicts_the_node(
    single: Single, pages: dict[str, str]
) -> None:
    site, prom, datadog = single.site, single.prom, single.exporters[DATADOG_PAGE]
    # The server has stored a scrape with the Xid at 0 (no Xid since DCGM started): the change
    # to 79 is one it sees.
    zero = wait_for(
        "a scrape of the T4's Xid at 0", lambda: prom.values("DCGM_FI_DEV_XID_ERRORS", T4), WAIT
    )
    wait_for("that scrape stored", lambda: _has_stored(site, T4, zero[-1][0]), WAIT)
    datadog.page = with_last_xid(pages[DATADOG_PAGE], T4, 79)
    try:
        evictions = wait_for(
            "an eviction of the T4's node",
            lambda: [e for e in site.get("/v1/evictions")["data"] if e["node"] == NODES[T4]],
            WAIT,
        )
        first_79 = next(
            ts for ts, value in prom.values("DCGM_FI_DEV_XID_ERRORS", T4) if value == "79"
        )
        # Two more scrapes with the code still 79 stored: a sticky code is no new Xid.
        wait_for("later scrapes stored", lambda: _has_stored(site, T4, first_79 + 2000), WAIT)
    finally:
        datadog.page = pages[DATADOG_PAGE]
    events = site.get("/v1/events", kind="xid", node=NODES[T4])["data"]
    assert [(e["gpu_uuid"], e["xid"]) for e in events] == [(T4, 79)], events
    assert to_us(_ts(events[0]["ts"])) // 1000 == first_79, (events[0], first_79)
    [eviction] = evictions
    assert eviction["reason_kind"] == "rule", eviction
    detail = site.get(f"/v1/evictions/{eviction['id']}")
    assert [g["uuid"] for g in detail["evidence"]["gpus"]] == [T4], detail


def _prom_times(prom: Prometheus, uuid: str, since: int, until: int) -> set[int]:
    return {t for t in prom.sample_times(uuid) if since <= t <= until}


def test_scrapes_made_while_the_server_was_down_are_stored_once_after_it_returns(
    single: Single,
) -> None:
    site, prom = single.site, single.prom
    wait_for("a stored sample of every GPU", lambda: all(site.stored_times(u) for u in NODES), WAIT)
    stopped_at = max(max(prom.sample_times(u)) for u in NODES)
    site.stop()  # with whatever it had received and not yet stored
    wait_for(
        "three scrapes while the server is down",
        lambda: min(max(prom.sample_times(u)) for u in NODES) >= stopped_at + 3000,
        WAIT,
    )
    down_until = max(max(prom.sample_times(u)) for u in NODES)
    site.start()
    wait_for(
        "two scrapes after the server returned",
        lambda: min(max(prom.sample_times(u)) for u in NODES) >= down_until + 2000,
        WAIT,
    )
    # The window: from ten scrapes before the stop (some still settling when it stopped) to
    # the last scrape Prometheus held just now; its last settle window is waited for below.
    since, until = stopped_at - 10_000, max(max(prom.sample_times(u)) for u in NODES)
    held = {u: _prom_times(prom, u, since, until) for u in NODES}
    assert all(len(times) >= 12 for times in held.values()), held

    def stored_in_window(uuid: str) -> list[int]:
        return [t for t in site.stored_times(uuid) if since <= t <= until]

    wait_for(
        "every scrape Prometheus holds stored",
        lambda: all(held[u] <= set(stored_in_window(u)) for u in NODES),
        WAIT,
    )
    for uuid in NODES:
        stored = stored_in_window(uuid)
        assert set(stored) == held[uuid], (uuid, sorted(set(stored) ^ held[uuid]))
        repeated = [t for t, n in Counter(site.stored_times(uuid)).items() if n > 1]
        assert repeated == [], (uuid, repeated)


@pytest.fixture
def ha_site(
    server_env: None,
    migrated_sqlite_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Site]:
    """A server of its own, not started yet (the pair starts first, see ``single``), failing
    over after 2 s of silence."""
    monkeypatch.setenv("FLEETWATCH_SERVER_REMOTE_WRITE_HA_FAILOVER_S", "2")
    site = _site(tmp_path / "fleetwatch", migrated_sqlite_file)
    try:
        yield site
    finally:
        site.stop()


def _pair(binary: str, targets: list[str], site: Site, work_dir: Path) -> Iterator[Any]:
    for name in ("A", "B"):
        labels = {"cluster": "it-pair", "__replica__": name}
        config = remote_write_config(
            targets, site.write_url, site.tokens["agent"], external_labels=labels
        )
        yield name, prometheus(binary, config, work_dir / f"prometheus-{name}")


def test_an_ha_pair_is_stored_once_from_one_replica_at_a_time(
    ha_site: Site, exporters: dict[str, Exporter], tmp_path: Path
) -> None:
    binary = require_tool("prometheus")
    site = ha_site
    targets = [e.target for e in exporters.values()]
    with ExitStack() as stack:
        replicas = {
            name: stack.enter_context(started)
            for name, started in _pair(binary, targets, site, tmp_path)
        }
        site.start()
        wait_for("three samples of the T4 stored", lambda: len(site.stored_times(T4)) >= 3, WAIT)
        times = {name: prom.sample_times(T4) for name, prom in replicas.items()}
        if times["A"] & times["B"]:
            pytest.skip("the replicas' scrape offsets coincide: their samples look alike")
        stored = set(site.stored_times(T4))
        elected = next((n for n, t in times.items() if stored <= t), None)
        assert elected is not None, (sorted(stored), {n: sorted(t) for n, t in times.items()})
        other = replicas["B" if elected == "A" else "A"]
        # The stored replica falls silent (frozen, so that its samples can be read afterwards):
        # after the failover delay the other one is stored.
        paused_at = max(times[elected])
        replicas[elected].process.send_signal(signal.SIGSTOP)
        try:
            wait_for(
                "a scrape of the other replica stored after the stored one fell silent",
                lambda: any(t > paused_at for t in site.stored_times(T4)),
                WAIT,
            )
        finally:
            replicas[elected].process.send_signal(signal.SIGCONT)
        # Back, it sends what it scraped before and since: the other replica stays stored.
        resumed_at = max(other.sample_times(T4))
        wait_for(
            "two more scrapes stored",
            lambda: max(site.stored_times(T4)) >= resumed_at + 2000,
            WAIT,
        )
        made = {u: (replicas[elected].sample_times(u), other.sample_times(u)) for u in NODES}
    for uuid, (first, second) in made.items():
        stored_times = site.stored_times(uuid)
        repeated = [t for t, n in Counter(stored_times).items() if n > 1]
        assert repeated == [], (uuid, repeated)
        strays = [t for t in stored_times if t not in first | second]
        assert strays == [], (uuid, strays)  # each stored time is one of a replica's scrapes
        if first & second:
            continue  # this target's scrapes coincide in both: no telling whose was stored
        from_first = [t for t in stored_times if t in first]
        from_second = [t for t in stored_times if t in second]
        assert from_first and from_second, (uuid, stored_times)
        # One replica at a time: none of the second's scrapes stored before the switch, none
        # of the first's after it.
        assert max(from_first) < min(from_second), (uuid, from_first, from_second)
