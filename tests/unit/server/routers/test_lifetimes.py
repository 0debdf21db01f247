"""GPU lifetimes over HTTP, on SQLite and PostgreSQL: import, re-import, operator endings, list."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from tests.conftest import bearer
from tests.factories import make_batch

from fleetwatch.inventory import read_lifetimes
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import gpu_lifetimes, gpus
from fleetwatch.server.repo.lifetimes import import_lifetimes, list_lifetimes

CSV = """SN,location,insert,remove,duration,out,event
S1,c11-2c1s4n1,2017-04-09 21:36:19,2019-08-01 20:07:33,1,FALSE,
S2,c9-3c1s2n1,2014-01-21 10:28:50,2016-07-19 20:15:20,1,TRUE,DBE
S2,c9-3c1s2n1,2016-08-01 00:00:00,,,,
S3,c6-2c1s2n0,2014-01-21 10:28:50,2016-02-21 04:54:23,1,TRUE,
S4,c8-6c1s0n1,,2016-04-26 18:35:50,,,DBE
"""


def _import(client: TestClient, token: str, body: str = CSV, **params: Any) -> httpx.Response:
    return client.post(
        "/v1/inventory/import",
        content=body.encode(),
        params=params,
        headers={"Content-Type": "text/csv", **bearer(token)},
    )


def _count(db: Database) -> int:
    with db.read() as conn:
        return conn.execute(select(func.count()).select_from(gpu_lifetimes)).scalar_one()


def test_lifetimes_import_stores_valid_rows_and_reports_the_rest(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    response = _import(client, tokens["admin"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["rows"] == 5 and body["accepted"] == 4 and body["inserted"] == 4
    assert body["rejected"] == 1 and body["already_stored"] == 0
    assert body["first_rejected"][0]["line"] == 6
    assert _count(db) == 4

    listed = client.get("/v1/lifetimes", params={"serial": "S2"}, headers=bearer(tokens["read"]))
    assert listed.status_code == 200, listed.text
    data = listed.json()["data"]
    assert [d["end_kind"] for d in data] == ["failure", None]
    assert data[0]["cause"] == "DBE" and data[0]["source"] == "import"
    assert data[0]["installed_at"].startswith("2014-01-21T10:28:50")
    assert data[0]["evidence"]["location_parts"] == {
        "col": 9,
        "row": 3,
        "cage": 1,
        "slot": 2,
        "node": 1,
    }
    failures = client.get(
        "/v1/lifetimes", params={"end_kind": "retirement"}, headers=bearer(tokens["read"])
    ).json()
    assert [d["serial"] for d in failures["data"]] == ["S3"]


def test_lifetimes_reimport_is_idempotent(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    assert _import(client, tokens["admin"]).json()["inserted"] == 4
    again = _import(client, tokens["admin"])
    assert again.status_code == 200, again.text
    assert again.json()["inserted"] == 0 and again.json()["already_stored"] == 4
    assert _count(db) == 4


def test_lifetimes_repo_dedupes_across_chunks_and_within_a_file(db: Database) -> None:
    rows = CSV.splitlines(keepends=True)
    doubled = rows + rows[1:]  # every row twice in one file
    with db.write() as conn:
        counts = import_lifetimes(conn, read_lifetimes(doubled), chunk_rows=2)
    assert (counts.inserted, counts.already_stored) == (4, 4)
    with db.write() as conn:
        counts = import_lifetimes(conn, read_lifetimes(rows), chunk_rows=1)
        assert len(list_lifetimes(conn, serial="S2")) == 2
    assert (counts.inserted, counts.already_stored) == (0, 4)


def test_lifetimes_strict_import_stores_nothing_on_a_refused_row(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    response = _import(client, tokens["admin"], strict="true")
    assert response.status_code == 422, response.text
    assert "line 6" in response.json()["error"]
    assert response.json()["detail"][0]["loc"] == ["body", "line", 6]
    assert _count(db) == 0


@pytest.mark.parametrize(
    ("body", "params", "status", "needle"),
    [
        ("serial,when\n1,2\n", {}, 422, "'SN' (serial)"),
        (CSV, {"location_pattern": "c(?P<x"}, 422, "not a regular expression"),
        (CSV, {"map": "colour=SN"}, 422, "colour"),
        ("", {}, 422, "empty"),
    ],
)
def test_lifetimes_import_refuses_bad_input_whole(
    client: TestClient,
    db: Database,
    tokens: dict[str, str],
    body: str,
    params: dict[str, str],
    status: int,
    needle: str,
) -> None:
    response = _import(client, tokens["admin"], body, **params)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]
    assert _count(db) == 0


def test_lifetimes_import_needs_csv_content_type(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.post("/v1/inventory/import", json={"a": 1}, headers=bearer(tokens["admin"]))
    assert response.status_code == 415, response.text
    assert "text/csv" in response.json()["error"]


def test_lifetimes_import_maps_other_column_names(
    client: TestClient, tokens: dict[str, str]
) -> None:
    body = "serial,slot,since,until,why\nX1,r1,2020-01-01T00:00:00Z,2021-01-01T00:00:00Z,Xid 79\n"
    response = _import(
        client,
        tokens["admin"],
        body,
        map=["serial=serial", "location=slot", "inserted=since", "removed=until", "event=why"],
        location_pattern=r"r(?P<rack>\d+)",
    )
    assert response.status_code == 200, response.text
    assert response.json()["inserted"] == 1
    got = client.get("/v1/lifetimes", params={"serial": "X1"}, headers=bearer(tokens["read"]))
    (only,) = got.json()["data"]
    assert only["cause"] == "Xid 79" and only["evidence"] == {"location_parts": {"rack": 1}}


def _record(client: TestClient, token: str, serial: str, **body: Any) -> httpx.Response:
    return client.post(f"/v1/lifetimes/{serial}/events", json=body, headers=bearer(token))


def test_lifetimes_operator_closes_the_open_stint(
    client: TestClient, tokens: dict[str, str]
) -> None:
    _import(client, tokens["admin"])
    response = _record(
        client, tokens["admin"], "S2", kind="repair", cause="reseated", at="2018-01-01T00:00:00Z"
    )
    assert response.status_code == 200, response.text
    closed = response.json()
    assert closed["installed_at"].startswith("2016-08-01")
    assert closed["removed_at"].startswith("2018-01-01")
    assert (closed["end_kind"], closed["cause"], closed["source"]) == (
        "repair",
        "reseated",
        "import",
    )
    assert closed["evidence"]["recorded_by"] == "test-admin"
    # Nothing open is left and no GPU carries the serial: 404.
    again = _record(client, tokens["admin"], "S2", kind="failure", at="2019-01-01T00:00:00Z")
    assert again.status_code == 404, again.text
    assert "S2" in again.json()["error"]


def test_lifetimes_operator_writes_a_stint_when_none_is_open(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    response = _record(
        client,
        tokens["admin"],
        "NEW1",
        kind="retirement",
        at="2024-02-01T00:00:00Z",
        installed_at="2022-01-01T00:00:00+01:00",
    )
    assert response.status_code == 200, response.text
    made = response.json()
    assert made["source"] == "operator" and made["end_kind"] == "retirement"
    assert made["installed_at"].startswith("2021-12-31T23:00:00")


def test_lifetimes_operator_uses_a_known_gpu_with_that_serial(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    pushed = client.post(
        "/v1/ingest", json=make_batch("node-a", gpus=1), headers=bearer(tokens["agent"])
    )
    assert pushed.status_code == 200, pushed.text
    with db.write() as conn:
        uuid = conn.execute(select(gpus.c.uuid)).scalar_one()
        conn.execute(gpus.update().values(serial="GPU-SERIAL-1"))
    response = _record(client, tokens["admin"], "GPU-SERIAL-1", kind="failure", cause="Xid 79")
    assert response.status_code == 200, response.text
    made = response.json()
    assert made["gpu_uuid"] == uuid and made["node_id"] is not None
    assert made["source"] == "operator" and made["cause"] == "Xid 79"


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"kind": "exploded"}, "kind"),
        ({"kind": "failure", "at": "2024-01-01T00:00:00"}, "UTC offset"),
        (
            {"kind": "failure", "at": "2020-01-01T00:00:00Z", "installed_at": "2021-01-01T00:00Z"},
            "after the event",
        ),
    ],
)
def test_lifetimes_operator_refuses_bad_bodies(
    client: TestClient, tokens: dict[str, str], body: dict[str, str], needle: str
) -> None:
    response = _record(client, tokens["admin"], "S9", **body)
    assert response.status_code == 422, response.text
    assert needle in response.json()["error"]
