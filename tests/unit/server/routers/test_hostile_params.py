"""Hostile request parameters answer a 422 naming the parameter, never a 500, on both databases.

Each case here once reached the database or the calendar arithmetic and failed there: an integer
beyond the column's range, a duration or an instant that overflows a datetime, a week at the
calendar's edge, a NUL or a lone surrogate in text PostgreSQL cannot store.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient
from tests.conftest import bearer

from fleetwatch.server.schemas.common import ErrorResponse
from fleetwatch.server.schemas.fields import storable_text

# (method, path, token scope, the parameter the 422 must name)
HOSTILE_PARAMS = [
    ("GET", "/v1/events?xid=99999999999999999999", "read", ["query", "xid"]),
    ("GET", "/v1/events?xid=2147483648", "read", ["query", "xid"]),
    ("GET", "/v1/events?since=99999999999d", "read", ["query", "since"]),
    ("GET", "/v1/events?since=9999999999999999999999999999999999w", "read", ["query", "since"]),
    ("GET", "/v1/events?since=0001-01-01T00:00:00%2B14:00", "read", ["query", "since"]),
    ("GET", "/v1/events?until=9999-12-31T23:59:59-14:00", "read", ["query", "until"]),
    ("GET", "/v1/events?since=1200-01-01T00:00:00Z", "read", ["query", "since"]),
    ("GET", "/v1/events?node=%00", "read", ["query", "node"]),
    ("GET", "/v1/events?uuid=GPU-%00", "read", ["query", "uuid"]),
    ("GET", "/v1/events?kind=x%00id", "read", ["query", "kind"]),
    ("GET", "/v1/gpus?node=%00", "read", ["query", "node"]),
    ("GET", "/v1/gpus/%00", "read", ["path", "uuid"]),
    ("GET", "/v1/gpus/%00/samples", "read", ["path", "uuid"]),
    ("GET", "/v1/gpus/GPU-1/samples?since=99999999999d", "read", ["query", "since"]),
    ("GET", "/v1/gpus/GPU-1/samples?fields=%00", "read", ["query", "fields"]),
    ("GET", "/v1/gpus/%00/risk", "read", ["path", "uuid"]),
    ("GET", "/v1/risk?node=%00", "read", ["query", "node"]),
    ("GET", "/v1/risk?horizon=99999999999999999999999d", "read", ["query", "horizon"]),
    ("GET", "/v1/nodes/%00", "read", ["path", "name"]),
    ("GET", "/v1/nodes?label=rack%3Dr%00", "read", ["query", "label", 0]),
    ("GET", "/v1/nodes?offset=99999999999999999999", "read", ["query", "offset"]),
    ("GET", "/v1/evictions?node=%00", "read", ["query", "node"]),
    ("GET", "/v1/evictions/6152578245", "read", ["path", "eviction_id"]),
    ("POST", "/v1/evictions/3160606661/complete", "scheduler", ["path", "eviction_id"]),
    ("POST", "/v1/evictions/3160606661/ack", "scheduler", ["path", "eviction_id"]),
    ("POST", "/v1/nodes/%00/return", "scheduler", ["path", "name"]),
    ("GET", "/v1/models/6152578245", "read", ["path", "version"]),
    ("GET", "/v1/jobs?limit=1", "read", None),  # a control: 200
    ("GET", "/v1/stragglers?job=%00", "read", ["query", "job"]),
    ("GET", "/v1/advice/checkpoint?checkpoint_cost_s=60&nodes=%00", "read", ["query", "nodes"]),
    ("GET", "/v1/lifetimes?serial=%00", "read", ["query", "serial"]),
    ("GET", "/v1/reports/weekly?week=0001-W01", "read", ["query", "week"]),
    ("GET", "/v1/reports/weekly?week=9999-W52", "read", ["query", "week"]),
    ("GET", "/v1/reports/weekly?week=%00", "read", ["query", "week"]),
    ("DELETE", "/v1/tokens/%00", "admin", ["path", "key"]),
    ("DELETE", "/v1/webhooks/3160606661", "admin", ["path", "webhook_id"]),
    ("POST", "/v1/webhooks/3160606661/test", "admin", ["path", "webhook_id"]),
    ("GET", "/v1/webhooks/3160606661/deliveries", "admin", ["path", "webhook_id"]),
    ("POST", "/v1/lifetimes/%00/events", "admin", ["path", "serial"]),
    ("GET", "/v1/maintenance/3160606661", "read", ["path", "window_id"]),
    ("DELETE", "/v1/maintenance/3160606661", "scheduler", ["path", "window_id"]),
    ("GET", "/v1/maintenance?node=%00", "read", ["query", "node"]),
]


def _assert_422_naming(response: httpx.Response, loc: list[str | int]) -> None:
    assert response.status_code == 422, (response.status_code, response.text)
    body = response.json()
    ErrorResponse.model_validate(body)  # the documented error body, `type` included
    assert loc in [d["loc"] for d in body["detail"]], body
    assert all(isinstance(d["type"], str) and d["type"] for d in body["detail"])


@pytest.mark.parametrize(("method", "path", "scope", "loc"), HOSTILE_PARAMS)
def test_hostile_parameter_is_a_422_naming_it(
    client: TestClient,
    tokens: dict[str, str],
    method: str,
    path: str,
    scope: str,
    loc: list[str | int] | None,
) -> None:
    body = {"kind": "failure"} if "/lifetimes/" in path else None
    response = client.request(method, path, headers=bearer(tokens[scope]), json=body)
    if loc is None:
        assert response.status_code == 200, response.text
    else:
        _assert_422_naming(response, loc)


def test_nul_and_lone_surrogate_say_why(client: TestClient, tokens: dict[str, str]) -> None:
    nul = client.get("/v1/gpus", params={"node": "a\x00b"}, headers=bearer(tokens["read"]))
    _assert_422_naming(nul, ["query", "node"])
    assert "NUL" in nul.json()["detail"][0]["msg"]
    # A JSON \udXXX escape decodes to a lone surrogate, which UTF-8 (and PostgreSQL) cannot hold.
    raw = b'{"name": "pool-\\udb97", "scope": "read"}'
    surrogate = client.post(
        "/v1/tokens",
        content=raw,
        headers={**bearer(tokens["admin"]), "Content-Type": "application/json"},
    )
    _assert_422_naming(surrogate, ["body", "name"])
    with pytest.raises(ValueError, match="surrogate"):  # the same, for text from elsewhere
        storable_text("pool-\udb97")


@pytest.mark.parametrize(
    ("method", "path", "scope", "body", "loc"),
    [
        ("POST", "/v1/tokens", "admin", {"name": "a\x00", "scope": "read"}, ["body", "name"]),
        (
            "POST",
            "/v1/webhooks",
            "admin",
            {"name": "w", "kind": "generic", "url": "http://x/\x00"},
            ["body", "url"],
        ),
        (
            "POST",
            "/v1/webhooks",
            "admin",
            {"name": "w", "kind": "generic", "url": "http://x/", "filters": {"kinds": ["\x00"]}},
            ["body", "filters", "kinds", 0],
        ),
        ("POST", "/v1/evictions/1/reject", "scheduler", {"reason": "\x00"}, ["body", "reason"]),
        ("POST", "/v1/evictions/1/approve", "admin", {"note": "\x00"}, ["body", "note"]),
        ("POST", "/v1/nodes/n1/return", "scheduler", {"note": "\x00"}, ["body", "note"]),
        (
            "POST",
            "/v1/lifetimes/SN1/events",
            "admin",
            {"kind": "failure", "cause": "D\x00BE"},
            ["body", "cause"],
        ),
        (
            "POST",
            "/v1/lifetimes/SN1/events",
            "admin",
            {"kind": "failure", "at": "0001-01-01T00:00:00+14:00"},
            ["body", "at"],
        ),
        (
            "POST",
            "/v1/lifetimes/SN1/events",
            "admin",
            {"kind": "failure", "at": "2026-01-01T00:00:00"},
            ["body", "at"],
        ),
        (
            "POST",
            "/v1/jobs/j1/steps",
            "agent",
            {
                "steps": [
                    {
                        "rank": 0,
                        "node": "n1",
                        "step": 1,
                        "duration_ms": 5.0,
                        "ts": "1900-01-01T00:00:00Z",
                    }
                ]
            },  # fmt: skip
            ["body", "steps", 0, "ts"],
        ),
    ],
)
def test_hostile_body_field_is_a_422_naming_it(
    client: TestClient,
    tokens: dict[str, str],
    method: str,
    path: str,
    scope: str,
    body: dict[str, object],
    loc: list[str | int],
) -> None:
    response = client.request(
        method,
        path,
        content=json.dumps(body).encode(),
        headers={**bearer(tokens[scope]), "Content-Type": "application/json"},
    )
    _assert_422_naming(response, loc)


def test_json_body_that_is_not_utf8_is_a_422_not_a_400(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.post(
        "/v1/tokens",
        content=b'{"name": "\xff\xfe", "scope": "read"}',
        headers={**bearer(tokens["admin"]), "Content-Type": "application/json"},
    )
    _assert_422_naming(response, ["body"])


def test_step_time_too_small_for_a_finite_ratio_is_refused(
    client: TestClient, tokens: dict[str, str]
) -> None:
    """5e-324 ms once made p99 / p50 infinite, answered as null where a number is documented."""
    step = {"rank": 0, "node": "n1", "step": 1, "duration_ms": 5e-324, "ts": "2026-01-01T00:00:00Z"}
    response = client.post(
        "/v1/jobs/j1/steps", json={"steps": [step]}, headers=bearer(tokens["agent"])
    )
    _assert_422_naming(response, ["body", "steps", 0, "duration_ms"])


def test_csv_import_with_a_nul_is_refused_naming_the_line(
    client: TestClient, tokens: dict[str, str]
) -> None:
    csv = "serial,location,inserted,removed\nSN1,c0-0c0s0n0,2024-01-01,\nS\x00N2,x,2024-01-01,\n"
    response = client.post(
        "/v1/inventory/import",
        content=csv.encode(),
        headers={**bearer(tokens["admin"]), "Content-Type": "text/csv"},
    )
    _assert_422_naming(response, ["body", "line", 3])
    assert client.get("/v1/lifetimes", headers=bearer(tokens["read"])).json()["count"] == 0


def test_report_page_refuses_a_week_at_the_calendar_edge(
    client: TestClient, tokens: dict[str, str]
) -> None:
    response = client.get("/report", params={"week": "0001-W01"}, headers=bearer(tokens["read"]))
    _assert_422_naming(response, ["query", "week"])


def test_every_text_parameter_refuses_a_nul(client: TestClient, tokens: dict[str, str]) -> None:
    """No query or path parameter of any documented operation takes a NUL to the database.

    Walks the OpenAPI rather than a list, so a parameter added later as a plain ``str`` fails here.
    """
    spec = client.get("/openapi.json").json()
    checked = []
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            params = operation.get("parameters", [])
            for target in params:
                if "string" not in json.dumps(target["schema"]):
                    continue
                url, query = path, {}
                for param in params:
                    value = "a\x00b" if param is target else _valid_value(param["schema"])
                    if param["in"] == "path":
                        url = url.replace("{" + param["name"] + "}", quote(str(value), safe=""))
                    elif param is target or param.get("required"):
                        query[param["name"]] = value
                response = client.request(
                    method, url, params=query, headers=bearer(tokens["admin"])
                )
                where = f"{method.upper()} {path} {target['name']}"
                assert response.status_code == 422, (where, response.status_code, response.text)
                locs = [d["loc"][:2] for d in response.json()["detail"]]
                assert [target["in"], target["name"]] in locs, (where, response.text)
                checked.append(where)
    assert len(checked) >= 30


def _valid_value(schema: dict[str, object]) -> object:
    """A value of this parameter schema's type (its default or first choice where there is one)."""
    options = schema.get("anyOf", [schema])
    assert isinstance(options, list)
    first = options[0]
    if "enum" in first:
        return first["enum"][0]
    return {"integer": 1, "number": 60.0, "boolean": "true"}.get(first.get("type"), "x")


# Routes with a path parameter that never answer 404, and why.
_NEVER_404 = {
    # A job the server has not heard of yet has no notices (an empty list): its ranks may ask
    # before the job's first report arrives.
    ("get", "/v1/jobs/{job_id}/notices"),
}


def test_openapi_documents_the_error_body_for_every_error_status(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    detail = spec["components"]["schemas"]["ErrorDetail"]
    assert {"loc", "msg", "type"} <= set(detail["properties"])
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            responses = operation["responses"]
            assert {"401", "403", "422", "503"} <= set(responses), (method, path)
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorResponse"}, (
                        method,
                        path,
                        status,
                    )
            if (method, path) in _NEVER_404:
                assert "404" not in responses, (method, path)
            elif "{" in path and method != "post" or path.endswith(("/ack", "/complete")):
                assert "404" in responses, (method, path)


@pytest.mark.parametrize("where", ["query", "form", "header"])
def test_token_with_a_nul_is_refused_as_malformed(client: TestClient, where: str) -> None:
    """The page's ?token=, its sign-in form and the bearer header all reach the token lookup."""
    token = "fwt_0123456789ab_\x00secret"
    if where == "query":
        response = client.get("/", params={"token": token}, follow_redirects=False)
    elif where == "form":
        response = client.post("/signin", data={"token": token}, follow_redirects=False)
    else:
        response = client.get("/v1/nodes", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401, response.text
