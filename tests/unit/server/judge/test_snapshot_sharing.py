"""One judgement of the fleet for every process: a process that does not lead adopts the leader's
stored snapshot instead of judging the fleet itself, keeps its own newer urgent judgements, and
judges for itself when the stored one is stale or unreadable. Real PostgreSQL only: SQLite has one
process, and nothing is shared there."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import text, update
from tests.conftest import _truncate
from tests.factories import make_batch
from tests.unit.server.conftest import Push
from tests.unit.server.judge.test_snapshot_codec import _assessor, _view
from tests.unit.server.routers.test_risk_api import _xid_batch

from fleetwatch.config import ServerSettings
from fleetwatch.server.background import BackgroundJobs
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import fleet_snapshots
from fleetwatch.server.judge.assessor import Assessor
from fleetwatch.server.judge.snapshot_sharing import SnapshotSharing
from fleetwatch.server.runtime.metric_families import ServerMetrics

pytestmark = pytest.mark.postgres


@pytest.fixture
def database_url(migrated_postgres_url: str) -> str:
    """PostgreSQL alone (the conftest's runs SQLite too)."""
    _truncate(migrated_postgres_url)
    return migrated_postgres_url


def _sharing(db: Database, assessor: Assessor) -> tuple[SnapshotSharing, Counter]:
    counted = Counter("snapshots", "test", ["outcome"], registry=CollectorRegistry())
    return SnapshotSharing(db, assessor, stale_after_s=300.0, counted=counted), counted


def _count(counted: Counter, outcome: str) -> float:
    return counted.labels(outcome=outcome)._value.get()


def _no_judging(assessor: Assessor) -> None:
    def judged(*args: object, **kwargs: object) -> None:
        raise AssertionError("a follower with a fresh snapshot of the leader's judged itself")

    assessor.judge.judge = judged  # type: ignore[method-assign]
    assessor.judge.judge_nodes = judged  # type: ignore[method-assign]


def test_a_follower_adopts_each_new_snapshot_of_the_leaders_and_judges_nothing(
    db: Database, settings: ServerSettings, push: Push
) -> None:
    for node in ("node-a", "node-b"):
        assert push(make_batch(node, gpus=2, ticks=2)).status_code == 200
    leader, follower = _assessor(db, settings), _assessor(db, settings)
    publisher, _ = _sharing(db, leader)
    sharing, counted = _sharing(db, follower)
    _no_judging(follower)
    assert sharing.follow() is False, "nothing stored yet: judge yourself"

    first = leader.run_once()
    assert publisher.publish(first) == 1
    assert sharing.follow() is True
    adopted = follower.current()  # no pass of its own: _no_judging would raise
    assert _view(adopted) == _view(first) and adopted.whole_at == first.at
    assert sharing.follow() is True and follower.latest is adopted, "same seq: nothing re-read"
    assert _count(counted, "adopted") == 1

    assert push(_xid_batch("node-b", 79)).status_code == 200
    second = leader.run_once()
    assert publisher.publish(second) == 2
    assert sharing.follow() is True and sharing.adopted_seq == 2
    assert follower.latest is not None and _view(follower.latest) == _view(second)
    assert "xid79_off_bus" in {v.rule for g in follower.latest.gpus for v in g.verdicts}
    assert _count(counted, "adopted") == 2


def test_a_follower_judges_itself_when_the_stored_snapshot_is_stale_or_unreadable(
    db: Database, settings: ServerSettings, push: Push
) -> None:
    assert push(make_batch("node-a", gpus=2, ticks=2)).status_code == 200
    leader = _assessor(db, settings)
    publisher, _ = _sharing(db, leader)
    sharing, counted = _sharing(db, _assessor(db, settings))
    publisher.publish(leader.run_once())

    def stored(**values: object) -> None:
        with db.write() as conn:
            conn.execute(update(fleet_snapshots).values(**values))

    stored(published_at=datetime.now(UTC) - timedelta(hours=1))
    assert sharing.follow() is False, "published an hour ago: no leader to follow"
    stored(published_at=datetime.now(UTC))
    stored(format=99, seq=fleet_snapshots.c.seq + 1)
    assert sharing.follow() is False and sharing.follow() is False
    assert _count(counted, "refused") == 1, "refused once per stored snapshot"
    stored(format=1, body=b"not zlib", seq=fleet_snapshots.c.seq + 1)
    assert sharing.follow() is False
    assert _count(counted, "refused") == 2 and _count(counted, "adopted") == 0
    publisher.publish(leader.run_once())
    assert sharing.follow() is True, "a readable one again"


def test_adoption_keeps_the_followers_newer_urgent_judgement(
    db: Database, settings: ServerSettings, push: Push
) -> None:
    """The follower's urgent lane judged node-x after the leader's pass began: that judgement
    stands over the leader's older one, every other node is the leader's; the leader's next
    pass, newer still, replaces it."""
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=2)).status_code == 200
    leader, follower = _assessor(db, settings), _assessor(db, settings)
    publisher, _ = _sharing(db, leader)
    sharing, _ = _sharing(db, follower)
    now = datetime.now(UTC)
    publisher.publish(leader.run_once(now=now))
    assert sharing.follow()
    older = leader.run_once(now=now + timedelta(seconds=1))  # before the Xid arrives
    assert push(_xid_batch("node-x", 79)).status_code == 200
    urgent_at = now + timedelta(seconds=2)
    follower.run_nodes({"node-x"}, now=urgent_at)
    publisher.publish(older)
    assert sharing.follow()
    latest = follower.latest
    assert latest is not None and latest.whole_at == older.at
    assert latest.judged_at("node-x") == urgent_at and latest.judged_at("node-y") == older.at
    assert "xid79_off_bus" in {
        v.rule for g in latest.gpus if g.node == "node-x" for v in g.verdicts
    }
    assert [g.node for g in latest.gpus] == ["node-x"] * 2 + ["node-y"] * 2

    newest = leader.run_once(now=now + timedelta(seconds=3))
    publisher.publish(newest)
    assert sharing.follow()
    assert follower.latest is not None and follower.latest.judged_at("node-x") == newest.at
    assert _view(follower.latest) == _view(newest)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_follower_adopts_at_once_only_while_read_and_its_next_reader_catches_up(
    db: Database, settings: ServerSettings, push: Push
) -> None:
    """Nobody read the follower's snapshot: its poll reads the stored head only, and its next
    reader adopts the newest one first. Read within read_for_s: each poll adopts at once."""
    assert push(make_batch("node-a", gpus=2, ticks=2)).status_code == 200
    leader, follower = _assessor(db, settings), _assessor(db, settings)
    publisher, _ = _sharing(db, leader)
    clock = _Clock()
    counted = Counter("snapshots", "test", ["outcome"], registry=CollectorRegistry())
    sharing = SnapshotSharing(
        db, follower, stale_after_s=300.0, counted=counted, read_for_s=600.0, clock=clock
    )
    follower.catch_up = sharing.catch_up
    _no_judging(follower)
    assert sharing.poll() is False and sharing.stored_seq is None, "nothing stored: judge"

    first = leader.run_once()
    publisher.publish(first)
    assert sharing.poll() is True and sharing.stored_seq == 1
    assert follower.latest is None and _count(counted, "adopted") == 0, "not read: not decoded"
    served = follower.newest()
    assert served is not None and _view(served) == _view(first) and sharing.adopted_seq == 1

    assert push(_xid_batch("node-a", 79)).status_code == 200
    second = leader.run_once()
    publisher.publish(second)
    assert sharing.poll() is True and sharing.adopted_seq == 2, "read just now: adopted at once"
    assert follower.latest is not None and _view(follower.latest) == _view(second)

    clock.now += 601.0  # nobody read it for longer than read_for_s
    publisher.publish(leader.run_once())
    assert sharing.poll() is True and sharing.stored_seq == 3 and sharing.adopted_seq == 2
    assert follower.current().whole_at > second.whole_at and sharing.adopted_seq == 3
    assert _count(counted, "adopted") == 3


def test_an_unread_follower_keeps_its_urgent_judgement_for_the_snapshot_it_adopts_later(
    db: Database, settings: ServerSettings, push: Push
) -> None:
    """Nobody reads the follower: its urgent pass judges node-x alone and decodes nothing; the
    first reader adopts the leader's snapshot with that newer judgement in it (the GPUs taking
    the snapshot's covariates), and a later leader's snapshot newer still replaces it."""
    for node in ("node-x", "node-y"):
        assert push(make_batch(node, gpus=2, ticks=2)).status_code == 200
    leader, follower = _assessor(db, settings), _assessor(db, settings)
    publisher, _ = _sharing(db, leader)
    clock = _Clock()
    counted = Counter("snapshots", "test", ["outcome"], registry=CollectorRegistry())
    sharing = SnapshotSharing(db, follower, stale_after_s=300.0, counted=counted, clock=clock)
    follower.catch_up, follower.adopter = sharing.catch_up, sharing.follow
    follower.defers = lambda: not sharing.being_read()
    now = datetime.now(UTC)
    older = leader.run_once(now=now)
    publisher.publish(older)
    assert sharing.poll() is True
    assert push(_xid_batch("node-x", 79)).status_code == 200
    urgent_at = now + timedelta(seconds=2)
    assert follower.run_nodes({"node-x"}, now=urgent_at) is None
    assert follower.latest is None and _count(counted, "adopted") == 0, "nothing decoded"

    served = follower.current()  # the first reader
    assert _count(counted, "adopted") == 1 and served.whole_at == older.at
    assert served.judged_at("node-x") == urgent_at and served.judged_at("node-y") == older.at
    x_gpus = [g for g in served.gpus if g.node == "node-x"]
    assert "xid79_off_bus" in {v.rule for g in x_gpus for v in g.verdicts}
    leaders = {g.uuid: g.features for g in older.gpus}
    assert [g.features for g in x_gpus] == [leaders[g.uuid] for g in x_gpus]

    newest = leader.run_once(now=now + timedelta(seconds=3))
    publisher.publish(newest)
    assert sharing.poll() is True  # read just now: adopted at once
    assert follower.latest is not None and _view(follower.latest) == _view(newest)


def _jobs(db: Database, settings: ServerSettings) -> BackgroundJobs:
    return BackgroundJobs(
        db,
        settings,
        metrics=ServerMetrics(CollectorRegistry()),
        secrets=SecretBox([]),
        heard_since=datetime.now(UTC) - timedelta(hours=1),
    )


def test_the_leaders_assessment_job_publishes_and_a_standbys_adopts(
    db: Database,
    settings: ServerSettings,
    push: Push,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert push(make_batch("node-a", gpus=2, ticks=2)).status_code == 200
    leader, standby = _jobs(db, settings), _jobs(db, settings)
    monkeypatch.setattr(leader, "elector", type("Leading", (), {"is_leader": True})())
    passes: list[str] = []
    monkeypatch.setattr(standby.assessor, "run_once", lambda now=None: passes.append("own"))
    leader._assess_then_act()
    with db.read() as conn:
        seq = conn.execute(text("SELECT seq FROM fleet_snapshots")).scalar_one()
    standby._assess_then_act()
    assert passes == [] and standby.sharing is not None and standby.sharing.stored_seq == seq
    assert standby.assessor.latest is None, "nothing read it yet: not decoded"
    served = standby.assessor.current()  # the first reader adopts (run_once would record "own")
    assert passes == [] and standby.sharing.adopted_seq == seq
    assert leader.assessor.latest is not None
    assert _view(served) == _view(leader.assessor.latest)
    # Sharing off: every process judges the fleet itself, as before.
    alone = _jobs(db, settings.model_copy(update={"snapshot_poll_s": 0.0}))
    monkeypatch.setattr(alone.assessor, "run_once", lambda now=None: passes.append("own"))
    alone._assess_then_act()
    assert alone.sharing is None and passes == ["own"]
