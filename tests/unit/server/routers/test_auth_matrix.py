"""Who may call what: every route x every scope, plus missing, malformed, unknown, revoked tokens.

The expected table is written out by hand; ``test_auth_matrix_covers_every_route`` compares it with
the app's own routes, so an endpoint added later cannot slip past without an entry here.

The two matrices (every route x every scope, every route x every bad credential: about a thousand
requests on both databases) share one app per database, on a database of their own (``matrix``):
an app started for each of them was a fifth of the whole suite's time. Each request seeds what it
acts on (a token to revoke, an eviction to ack), so none depends on another's.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from tests.conftest import TEST_SECRET_KEY, bearer, throwaway_postgres
from tests.factories import gpu_uuid, make_batch, make_validation, store_validation_now

from fleetwatch.config import ServerSettings
from fleetwatch.errors import AuthError
from fleetwatch.remote_write.wire import encode_write_request
from fleetwatch.server.app import create_app
from fleetwatch.server.auth import authenticate, create_token, revoke_token
from fleetwatch.server.client_certs import CERT_NAMES_KEY
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.secret_box import SecretBox
from fleetwatch.server.db.session import Database, make_engine
from fleetwatch.server.db.tables import api_tokens, evictions
from fleetwatch.server.repo.evictions import create_eviction
from fleetwatch.server.repo.maintenance import create_window
from fleetwatch.server.repo.models import store_model
from fleetwatch.server.repo.webhooks import create_webhook
from fleetwatch.server.schemas.maintenance import MaintenanceCreate
from fleetwatch.server.schemas.webhooks import WebhookCreate

SCOPES = ("agent", "read", "scheduler", "admin")
ALLOWED = {
    "ingest": {"agent", "admin"},
    "job_notices": {"agent", "read", "scheduler", "admin"},
    "read": {"read", "scheduler", "admin"},
    "admin": {"admin"},
    "schedule": {"scheduler", "admin"},
}

# (method, route path) -> (permission class, concrete request path, status when allowed)
ENDPOINTS: dict[tuple[str, str], tuple[str, str, int]] = {
    ("POST", "/v1/ingest"): ("ingest", "/v1/ingest", 200),
    ("POST", "/api/v1/write"): ("ingest", "/api/v1/write", 204),
    ("GET", "/v1/nodes"): ("read", "/v1/nodes", 200),
    ("GET", "/v1/nodes/{name}"): ("read", "/v1/nodes/node-a", 200),
    ("GET", "/v1/nodes/{name}/ports"): ("read", "/v1/nodes/node-a/ports", 200),
    ("GET", "/v1/gpus"): ("read", "/v1/gpus", 200),
    ("GET", "/v1/gpus/{uuid}"): ("read", f"/v1/gpus/{gpu_uuid('node-a', 0)}", 200),
    ("GET", "/v1/gpus/{uuid}/samples"): (
        "read",
        f"/v1/gpus/{gpu_uuid('node-a', 0)}/samples",
        200,
    ),
    ("GET", "/v1/events"): ("read", "/v1/events", 200),
    ("GET", "/metrics"): ("read", "/metrics", 200),
    ("POST", "/v1/tokens"): ("admin", "/v1/tokens", 201),
    ("GET", "/v1/tokens"): ("admin", "/v1/tokens", 200),
    ("DELETE", "/v1/tokens/{key}"): ("admin", "/v1/tokens/{victim}", 200),
    ("POST", "/v1/inventory/import"): ("admin", "/v1/inventory/import", 200),
    ("POST", "/v1/lifetimes/{serial}/events"): ("admin", "/v1/lifetimes/SN-1/events", 200),
    ("GET", "/v1/lifetimes"): ("read", "/v1/lifetimes", 200),
    ("GET", "/v1/models"): ("read", "/v1/models", 200),
    ("GET", "/v1/models/{version}"): ("read", "/v1/models/{stored_version}", 200),
    ("POST", "/v1/models/refit"): ("admin", "/v1/models/refit", 202),
    ("GET", "/v1/risk"): ("read", "/v1/risk", 200),
    ("GET", "/v1/gpus/{uuid}/risk"): ("read", f"/v1/gpus/{gpu_uuid('node-a', 0)}/risk", 200),
    # Training jobs report steps with an agent token.
    ("POST", "/v1/jobs/{job_id}/steps"): ("ingest", "/v1/jobs/job-1/steps", 200),
    ("POST", "/v1/jobs/{job_id}/start"): ("ingest", "/v1/jobs/job-1/start", 200),
    ("POST", "/v1/jobs/{job_id}/end"): ("ingest", "/v1/jobs/job-1/end", 200),
    ("POST", "/v1/jobs/{job_id}/checkpoints"): ("ingest", "/v1/jobs/job-1/checkpoints", 200),
    ("POST", "/v1/jobs/{job_id}/restarts"): ("ingest", "/v1/jobs/job-1/restarts", 200),
    ("GET", "/v1/availability"): ("read", "/v1/availability", 200),
    ("GET", "/v1/jobs"): ("read", "/v1/jobs", 200),
    # A job reads its notices with its agent token (issue 15).
    ("GET", "/v1/jobs/{job_id}/notices"): ("job_notices", "/v1/jobs/job-1/notices", 200),
    ("GET", "/v1/jobs/{job_id}"): ("read", "/v1/jobs/job-1", 200),
    ("GET", "/v1/stragglers"): ("read", "/v1/stragglers", 200),
    # node-a's GPU has no model probability and no rule verdict: past auth, the advice is a 422.
    ("GET", "/v1/advice/checkpoint"): (
        "read",
        "/v1/advice/checkpoint?job=job-1&checkpoint_cost_s=60",
        422,
    ),
    ("GET", "/v1/evictions"): ("read", "/v1/evictions", 200),
    ("GET", "/v1/evictions/{eviction_id}"): ("read", "/v1/evictions/{pending}", 200),
    ("POST", "/v1/evictions/{eviction_id}/ack"): ("schedule", "/v1/evictions/{pending}/ack", 200),
    ("POST", "/v1/evictions/{eviction_id}/complete"): (
        "schedule",
        "/v1/evictions/{acked}/complete",
        200,
    ),
    ("POST", "/v1/evictions/{eviction_id}/reject"): (
        "schedule",
        "/v1/evictions/{pending}/reject",
        200,
    ),
    ("POST", "/v1/nodes/{name}/return"): ("schedule", "/v1/nodes/node-a/return", 200),
    ("POST", "/v1/nodes/{name}/validations"): ("ingest", "/v1/nodes/node-a/validations", 201),
    ("GET", "/v1/nodes/{name}/validations"): ("read", "/v1/nodes/node-a/validations", 200),
    ("POST", "/v1/evictions/{eviction_id}/approve"): (
        "admin",
        "/v1/evictions/{paged}/approve",
        200,
    ),
    ("GET", "/v1/reports/weekly"): ("read", "/v1/reports/weekly?week=2026-W48", 200),
    ("POST", "/v1/webhooks"): ("admin", "/v1/webhooks", 201),
    ("GET", "/v1/webhooks"): ("admin", "/v1/webhooks", 200),
    ("DELETE", "/v1/webhooks/{webhook_id}"): ("admin", "/v1/webhooks/{hook}", 200),
    ("POST", "/v1/webhooks/{webhook_id}/test"): ("admin", "/v1/webhooks/{hook}/test", 202),
    ("GET", "/v1/webhooks/{webhook_id}/deliveries"): (
        "admin",
        "/v1/webhooks/{hook}/deliveries",
        200,
    ),
    ("GET", "/v1/alerts"): ("read", "/v1/alerts?state=firing", 200),
    ("POST", "/v1/maintenance"): ("schedule", "/v1/maintenance", 201),
    ("GET", "/v1/maintenance"): ("read", "/v1/maintenance", 200),
    ("GET", "/v1/maintenance/{window_id}"): ("read", "/v1/maintenance/{window}", 200),
    ("DELETE", "/v1/maintenance/{window_id}"): ("schedule", "/v1/maintenance/{window}", 200),
}

OPEN = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("GET", "/openapi.json"),
    ("GET", "/docs/oauth2-redirect"),
    # The runbook pages alerts link to (tests/unit/server/test_runbook_pages.py).
    ("GET", "/runbooks"),
    ("GET", "/runbooks/"),
}
# Open routes with a path parameter, and a path that exists for each.
OPEN_TEMPLATED = {("GET", "/runbooks/{name}"): "/runbooks/xid"}
# The docs pages' own scripts and styles (Swagger UI, ReDoc), open like the pages; each asset is
# checked in tests/unit/server/test_offline_docs.py.
OPEN_MOUNTS = {("*", "/docs-assets")}

# The fleet page and its sign-in form answer in HTML (a 401 or 403 sign-in form, not a JSON
# error) and also read the token from a cookie: tests/unit/server/test_fleet_page.py covers them
# in full; test_auth_page_routes_take_read_scopes_only runs them through every scope here.
PAGES = {
    ("GET", "/"),
    ("GET", "/nodes/{name}"),
    ("GET", "/report"),
    ("POST", "/signin"),
}


def _app_routes(client: TestClient) -> set[tuple[str, str]]:
    """(method, path) of every route, included routers flattened; a mount or websocket shows as
    ("*", path) so that it, too, needs an entry."""
    found = set()
    for route in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        assert route.path is not None, f"route without a path: {route!r}"
        for method in route.methods or {"*"}:
            if method != "HEAD":
                found.add((method, route.path))
    return found


_STEPS = {
    "steps": [
        {"rank": 0, "node": "node-a", "step": 1, "duration_ms": 10.0, "ts": "2025-01-01T00:00:00Z"}
    ]
}


def fleet(client: TestClient, tokens: dict[str, str]) -> None:
    """node-a with one GPU, so that every path parameter names something that exists."""
    response = client.post(
        "/v1/ingest", json=make_batch("node-a", gpus=1), headers=bearer(tokens["agent"])
    )
    assert response.status_code == 200, response.text
    response = client.post("/v1/jobs/job-1/steps", json=_STEPS, headers=bearer(tokens["agent"]))
    assert response.status_code == 200, response.text


CERT_NAMES_HEADER = "x-test-client-cert-names"


class ClientCertFromHeader:
    """Requests carrying ``CERT_NAMES_HEADER`` reach the app as over a mutual-TLS connection whose
    verified client certificate has those (comma-separated) names.

    A fake, because TestClient speaks no TLS: it puts into the scope what the server's HTTP
    protocol puts there after a real handshake (server/client_certs.py);
    tests/integration/test_tls_live.py checks the same with real certificates and a real server.
    Requests without the header pass untouched.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        names = dict(scope.get("headers", ())).get(CERT_NAMES_HEADER.encode())
        if scope["type"] == "http" and names is not None:
            tls = {"client_cert_name": None, CERT_NAMES_KEY: frozenset(names.decode().split(","))}
            scope = {**scope, "extensions": {**scope.get("extensions", {}), "tls": tls}}
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class Matrix:
    client: TestClient
    db: Database
    tokens: dict[str, str]


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    """One app with node-a, job-1 and a token per scope, for the two matrices on one database."""
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('auth-matrix') / 'fleetwatch.db'}"
        else:
            url = stack.enter_context(throwaway_postgres())
            migrating = Database(make_engine(ServerSettings(database_url=url)))
            upgrade(migrating.engine)
            migrating.dispose()
        settings = ServerSettings(  # type: ignore[call-arg]
            database_url=url,
            metrics_cache_ttl_s=0,
            background_jobs=False,
            secret_keys=[TEST_SECRET_KEY],
            _env_file=None,
        )
        app = create_app(settings)
        app.add_middleware(ClientCertFromHeader)
        client = stack.enter_context(TestClient(app))
        db: Database = client.app.state.db  # type: ignore[attr-defined]
        with db.write() as conn:
            tokens = {s: create_token(conn, name=f"matrix-{s}", scope=s)[0] for s in SCOPES}
        fleet(client, tokens)
        yield Matrix(client, db, tokens)


def _call(
    client: TestClient, db: Database, key: tuple[str, str], headers: dict[str, str]
) -> httpx.Response:
    """One request to the endpoint ``key`` that succeeds when the caller may make it."""
    method, _ = key
    _, path, _ = ENDPOINTS[key]
    kwargs: dict[str, Any] = {"headers": headers}
    if "{victim}" in path:
        with db.write() as conn:
            _, victim = create_token(conn, name=f"victim-{secrets.token_hex(3)}", scope="read")
        path = path.format(victim=victim.token_id)
    if "{stored_version}" in path:
        with db.write() as conn:
            version = store_model(conn, None, trigger="manual", trained_at=utcnow(), error="x")
        path = path.format(stored_version=version)
    if "{hook}" in path:
        path = path.format(hook=_seed_webhook(db))
    if "{window}" in path:
        path = path.format(window=_seed_window(db))
    if any(f"{{{s}}}" in path for s in ("pending", "acked", "paged")) or key[1] == (
        "/v1/nodes/{name}/return"
    ):
        path = _seed_eviction(db, path, headers)
    if key == ("POST", "/v1/ingest"):
        kwargs["json"] = make_batch("node-a", gpus=1)
    elif key == ("POST", "/api/v1/write"):
        kwargs["content"] = encode_write_request([])  # Prometheus' remote write, empty
        kwargs["headers"] = {**headers, "Content-Type": "application/x-protobuf",
                             "Content-Encoding": "snappy"}  # fmt: skip
    elif key == ("POST", "/v1/jobs/{job_id}/steps"):
        kwargs["json"] = _STEPS
    elif key[1].startswith("/v1/jobs/{job_id}/") and key[0] == "POST":
        kwargs["json"] = _JOB_REPORTS[key[1].rsplit("/", 1)[1]]
    elif key == ("POST", "/v1/webhooks"):
        kwargs["json"] = {"name": f"hook-{secrets.token_hex(3)}", "kind": "generic",
                          "url": "http://127.0.0.1:9/hook", "secret": "s3cret"}  # fmt: skip
    elif key == ("POST", "/v1/maintenance"):
        kwargs["json"] = {"nodes": ["node-a"], "reason": "firmware update"}
    elif key == ("POST", "/v1/tokens"):
        kwargs["json"] = {"name": "made-by-test", "scope": "read"}
    elif key == ("POST", "/v1/inventory/import"):
        kwargs["content"] = b"SN,location,insert,remove,event\nSN-1,c1-1c0s0n0,2020-01-01,,\n"
        kwargs["headers"] = {**headers, "Content-Type": "text/csv"}
    elif key == ("POST", "/v1/nodes/{name}/validations"):
        kwargs["json"] = make_validation("node-a")
    elif key == ("POST", "/v1/evictions/{eviction_id}/reject"):
        kwargs["json"] = {"reason": "maintenance window"}
    elif key == ("POST", "/v1/evictions/{eviction_id}/approve"):
        kwargs["json"] = {"note": "the Xid is real on this node"}
    elif key == ("POST", "/v1/lifetimes/{serial}/events"):
        kwargs["json"] = {"kind": "failure", "installed_at": "2020-01-01T00:00:00Z"}
    return client.request(method, path, **kwargs)


_JOB_REPORTS: dict[str, dict[str, Any]] = {
    "start": {"started_at": "2026-11-01T00:00:00Z", "nodes": ["node-a"]},
    "end": {"outcome": "completed", "ended_at": "2026-11-01T01:00:00Z", "nodes": ["node-a"]},
    "checkpoints": {"started_at": "2026-11-01T00:30:00Z", "duration_s": 12.5},
    "restarts": {"resumed_at": "2026-11-01T00:40:00Z", "lost_steps": 3},
}


def _seed_webhook(db: Database) -> int:
    """A generic webhook subscription to act on."""
    with db.write() as conn:
        body = WebhookCreate(name=f"seeded-{secrets.token_hex(3)}", kind="generic",
                             url="http://127.0.0.1:9/hook")  # fmt: skip
        return create_webhook(conn, body, now=utcnow(), secrets=SecretBox([])).id


def _seed_window(db: Database) -> int:
    """An open maintenance window over node-a."""
    with db.write() as conn:
        body = MaintenanceCreate(nodes=["node-a"], reason="seeded")
        return create_window(conn, body, actor="seed", now=utcnow()).id


def _seed_eviction(db: Database, path: str, headers: dict[str, str]) -> str:
    """An eviction of node-a that the endpoint can act on: pending, acked by the caller, or
    completed (for the node's return)."""
    presented = headers.get("Authorization", "").removeprefix("Bearer ")
    with db.write() as conn:
        try:
            claimer = authenticate(conn, presented).name
        except AuthError:
            claimer = "nobody"
        now = utcnow()
        state = next((s for s in ("acked", "pending", "paged") if f"{{{s}}}" in path), "completed")
        eviction_id = create_eviction(
            conn, node="node-a", state="pending", reason_kind="rule", reason="test",
            evidence={}, expected_saving_usd=None, dry_run=False, now=now,
        )  # fmt: skip
        conn.execute(
            update(evictions)
            .where(evictions.c.id == eviction_id)
            .values(state=state, claimed_by=claimer, lease_expires_at=now + timedelta(minutes=5))
        )
        if path.endswith("/return"):
            store_validation_now(conn, "node-a")  # the return gate opens for a validated node
    return path.format(pending=eviction_id, acked=eviction_id, paged=eviction_id)


def test_auth_matrix_covers_every_route(client: TestClient) -> None:
    routes = _app_routes(client)
    expected = set(ENDPOINTS) | OPEN | set(OPEN_TEMPLATED) | OPEN_MOUNTS | PAGES
    assert routes == expected, (
        f"routes without an expected entry: {sorted(routes - expected)}; "
        f"entries without a route: {sorted(expected - routes)}"
    )


@pytest.mark.parametrize("scope", SCOPES)
def test_auth_page_routes_take_read_scopes_only(
    client: TestClient, db: Database, tokens: dict[str, str], scope: str
) -> None:
    allowed = scope in ALLOWED["read"]
    page = client.get("/", headers=bearer(tokens[scope]))
    assert page.status_code == (200 if allowed else 403), page.text
    report = client.get("/report", headers=bearer(tokens[scope]))
    assert report.status_code == (200 if allowed else 403), report.text
    node = client.get("/nodes/no-such-node", headers=bearer(tokens[scope]))
    assert node.status_code == (404 if allowed else 403), node.text  # past the sign-in or not
    signin = client.post("/signin", data={"token": tokens[scope]}, follow_redirects=False)
    assert signin.status_code == (303 if allowed else 403), signin.text
    assert ("set-cookie" in signin.headers) is allowed
    client.cookies.clear()
    for credential, headers in BAD_CREDENTIALS.items():
        refused = client.get("/", headers=headers(db))
        assert refused.status_code == 401, (credential, refused.text)


@pytest.mark.parametrize(
    ("method", "path"), sorted(OPEN | {(m, p) for (m, _), p in OPEN_TEMPLATED.items()})
)
def test_auth_open_routes_need_no_token(client: TestClient, method: str, path: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("key", "scope"), list(itertools.product(sorted(ENDPOINTS), SCOPES)), ids=lambda v: str(v)
)
def test_auth_matrix_scope_decides(matrix: Matrix, key: tuple[str, str], scope: str) -> None:
    permission, _, ok_status = ENDPOINTS[key]
    response = _call(matrix.client, matrix.db, key, bearer(matrix.tokens[scope]))
    if scope in ALLOWED[permission]:
        assert response.status_code == ok_status, response.text
        return
    assert response.status_code == 403, response.text
    message = response.json()["error"]
    assert repr(scope) in message
    for needed in sorted(ALLOWED[permission]):
        assert needed in message, f"403 for {key} does not name scope {needed!r}: {message}"


def _revoked_admin(db: Database) -> str:
    with db.write() as conn:
        token, info = create_token(conn, name="soon-revoked", scope="admin")
        revoke_token(conn, info.token_id)
    return token


BAD_CREDENTIALS: dict[str, Callable[[Database], dict[str, str]]] = {
    "none": lambda db: {},
    "malformed": lambda db: {"Authorization": "Bearer not-a-fleetwatch-token"},
    "not_bearer": lambda db: {"Authorization": "Basic dXNlcjpwYXNz"},
    "unknown": lambda db: bearer(f"fwt_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"),
    "revoked": lambda db: bearer(_revoked_admin(db)),
}


@pytest.mark.parametrize("key", sorted(ENDPOINTS), ids=str)
@pytest.mark.parametrize("credential", sorted(BAD_CREDENTIALS))
def test_auth_matrix_refuses_bad_credentials_with_401(
    matrix: Matrix, key: tuple[str, str], credential: str
) -> None:
    response = _call(matrix.client, matrix.db, key, BAD_CREDENTIALS[credential](matrix.db))
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.json()["error"]


def test_auth_tampered_secret_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    genuine = tokens["admin"]
    tampered = genuine[:-1] + ("A" if genuine[-1] != "A" else "B")
    response = client.get("/v1/nodes", headers=bearer(tampered))
    assert response.status_code == 401
    assert client.get("/v1/nodes", headers=bearer(genuine)).status_code == 200


def test_auth_revoked_token_reports_revoked(client: TestClient, db: Database) -> None:
    response = client.get("/v1/nodes", headers=bearer(_revoked_admin(db)))
    assert response.status_code == 401
    assert "revoked" in response.json()["error"]


def test_auth_insecure_no_auth_lets_requests_through(
    make_client: Callable[..., TestClient],
) -> None:
    open_client = make_client(insecure_no_auth=True)
    ingest = open_client.post("/v1/ingest", json=make_batch("node-a", gpus=1))
    assert ingest.status_code == 200, ingest.text
    assert open_client.get("/v1/nodes").json()["count"] == 1
    assert open_client.get("/metrics").status_code == 200
    created = open_client.post("/v1/tokens", json={"name": "x", "scope": "read"})
    assert created.status_code == 201, created.text


def test_auth_insecure_no_auth_is_off_by_default(client: TestClient) -> None:
    assert client.get("/v1/nodes").status_code == 401


def test_auth_metrics_token_can_be_switched_off(
    make_client: Callable[..., TestClient],
) -> None:
    scrape = make_client(metrics_require_token=False)
    assert scrape.get("/metrics").status_code == 200
    assert scrape.get("/v1/nodes").status_code == 401


# -- tokens: stored hashed, shown once, revocable --------------------------------------------


def test_auth_tokens_are_stored_hashed(
    client: TestClient, db: Database, tokens: dict[str, str]
) -> None:
    response = client.post(
        "/v1/tokens", json={"name": "pool-a", "scope": "agent"}, headers=bearer(tokens["admin"])
    )
    assert response.status_code == 201, response.text
    token = response.json()["token"]
    with db.read() as conn:
        rows = [dict(row._mapping) for row in conn.execute(select(api_tokens))]
    dumped = repr(rows)
    for clear in [token, *tokens.values()]:
        assert clear not in dumped
        assert clear.split("_", 2)[2] not in dumped  # the secret part alone
    mine = [row for row in rows if row["name"] == "pool-a"]
    assert len(mine) == 1
    assert mine[0]["secret_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert mine[0]["scope"] == "agent"


def test_auth_token_secret_is_shown_once(client: TestClient, tokens: dict[str, str]) -> None:
    admin = bearer(tokens["admin"])
    created = client.post("/v1/tokens", json={"name": "pool-b", "scope": "read"}, headers=admin)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["token"].startswith(f"fwt_{body['token_id']}_")
    assert body["name"] == "pool-b" and body["scope"] == "read" and body["revoked_at"] is None

    listed = client.get("/v1/tokens", headers=admin)
    assert listed.status_code == 200
    assert body["token"] not in listed.text
    assert all("token" not in entry for entry in listed.json())
    names = {entry["name"]: entry for entry in listed.json()}
    assert names["pool-b"]["token_id"] == body["token_id"]
    # The new token works, with its scope.
    assert client.get("/v1/nodes", headers=bearer(body["token"])).status_code == 200
    assert client.get("/v1/tokens", headers=bearer(body["token"])).status_code == 403


@pytest.mark.parametrize(
    "body", [{"name": "x", "scope": "root"}, {"name": "", "scope": "read"}, {"scope": "read"}]
)
def test_auth_token_create_rejects_bad_input(
    client: TestClient, tokens: dict[str, str], body: dict[str, str]
) -> None:
    response = client.post("/v1/tokens", json=body, headers=bearer(tokens["admin"]))
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][0] == "body"


def test_auth_revoke_by_name(client: TestClient, tokens: dict[str, str]) -> None:
    admin = bearer(tokens["admin"])
    made = client.post("/v1/tokens", json={"name": "pool-c", "scope": "read"}, headers=admin).json()
    assert client.get("/v1/nodes", headers=bearer(made["token"])).status_code == 200

    revoked = client.delete("/v1/tokens/pool-c", headers=admin)
    assert revoked.status_code == 200, revoked.text
    assert revoked.json()["token_id"] == made["token_id"]
    assert revoked.json()["revoked_at"] is not None

    assert client.get("/v1/nodes", headers=bearer(made["token"])).status_code == 401
    active = client.get("/v1/tokens", headers=admin).json()
    assert "pool-c" not in {t["name"] for t in active}
    everything = client.get("/v1/tokens", params={"include_revoked": "true"}, headers=admin).json()
    assert {t["name"]: t["revoked_at"] is not None for t in everything}["pool-c"] is True
    # Revoked tokens are not found again.
    assert client.delete("/v1/tokens/pool-c", headers=admin).status_code == 404


def test_auth_revoke_ambiguous_name_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    admin = bearer(tokens["admin"])
    made = [
        client.post("/v1/tokens", json={"name": "dup", "scope": "read"}, headers=admin).json()
        for _ in range(2)
    ]
    response = client.delete("/v1/tokens/dup", headers=admin)
    assert response.status_code == 422, response.text
    for token in made:
        assert token["token_id"] in response.json()["error"]
        assert client.get("/v1/nodes", headers=bearer(token["token"])).status_code == 200
    # By id it is unambiguous.
    assert client.delete(f"/v1/tokens/{made[0]['token_id']}", headers=admin).status_code == 200
    assert client.get("/v1/nodes", headers=bearer(made[0]["token"])).status_code == 401
    assert client.get("/v1/nodes", headers=bearer(made[1]["token"])).status_code == 200


def test_auth_revoke_unknown_token_is_404(client: TestClient, tokens: dict[str, str]) -> None:
    response = client.delete("/v1/tokens/nobody", headers=bearer(tokens["admin"]))
    assert response.status_code == 404
    assert "nobody" in response.json()["error"]


# -- a node speaks only for itself (issue 37) ------------------------------------------------
# The routes where a caller speaks for a node: each request _call makes names node-a. Job
# checkpoints and restarts name no node, and reading a job's notices speaks for none.
SPEAKS_FOR = {
    ("POST", "/v1/ingest"),
    ("POST", "/v1/nodes/{name}/validations"),
    ("POST", "/v1/jobs/{job_id}/steps"),
    ("POST", "/v1/jobs/{job_id}/start"),
    ("POST", "/v1/jobs/{job_id}/end"),
}
AGENT_ROUTES = sorted(key for key, entry in ENDPOINTS.items() if "agent" in ALLOWED[entry[0]])


def test_auth_speaking_routes_are_agent_routes() -> None:
    assert SPEAKS_FOR <= set(AGENT_ROUTES)


def _bound_agent(db: Database, pattern: str) -> str:
    with db.write() as conn:
        token, info = create_token(
            conn, name=f"bound-{secrets.token_hex(3)}", scope="agent", node_pattern=pattern
        )
    assert info.node_pattern == pattern
    return token


@pytest.mark.parametrize("key", AGENT_ROUTES, ids=str)
@pytest.mark.parametrize("pattern", ["node-a", "node-*", "gpu-*", "Node-A"])
def test_auth_matrix_node_bound_agent_token_speaks_for_its_nodes_only(
    matrix: Matrix, key: tuple[str, str], pattern: str
) -> None:
    """A bound agent token (`fleetwatch token create --scope agent --node PATTERN`) may do what
    any agent token may, except speak for a node its pattern does not match (case counts)."""
    _, _, ok_status = ENDPOINTS[key]
    response = _call(matrix.client, matrix.db, key, bearer(_bound_agent(matrix.db, pattern)))
    if key not in SPEAKS_FOR or pattern in ("node-a", "node-*"):
        assert response.status_code == ok_status, response.text
        return
    assert response.status_code == 403, response.text
    message = response.json()["error"]
    assert "'node-a'" in message and repr(pattern) in message, message


def test_auth_node_pattern_is_for_agent_tokens_only(
    client: TestClient, tokens: dict[str, str]
) -> None:
    admin = bearer(tokens["admin"])
    body = {"name": "bound-reader", "scope": "read", "node_pattern": "gpu-*"}
    refused = client.post("/v1/tokens", json=body, headers=admin)
    assert refused.status_code == 422, refused.text
    assert "only agent tokens" in refused.json()["error"]
    made = client.post(
        "/v1/tokens", json={**body, "scope": "agent", "name": "rack-1"}, headers=admin
    )
    assert made.status_code == 201, made.text
    assert made.json()["node_pattern"] == "gpu-*"
    listed = {t["name"]: t["node_pattern"] for t in client.get("/v1/tokens", headers=admin).json()}
    assert listed["rack-1"] == "gpu-*" and listed["test-agent"] is None


@pytest.mark.parametrize("key", AGENT_ROUTES, ids=str)
@pytest.mark.parametrize("scope", ["agent", "admin"])
# Tuples, not sets: a set's order (and so its test id) differs between pytest-xdist workers.
@pytest.mark.parametrize(
    "names", [("node-a",), ("gpu-7.example", "NODE-A"), ("node-b",)], ids="+".join
)
def test_auth_matrix_client_certificate_names_the_node_it_speaks_for(
    matrix: Matrix, key: tuple[str, str], scope: str, names: tuple[str, ...]
) -> None:
    """Under mutual TLS a request speaks only for a node its certificate names (CN or DNS SAN,
    without case), whatever the token's scope; the token is still checked."""
    _, _, ok_status = ENDPOINTS[key]
    lowered = frozenset(name.lower() for name in names)
    cert = {CERT_NAMES_HEADER: ",".join(sorted(lowered))}
    response = _call(matrix.client, matrix.db, key, {**bearer(matrix.tokens[scope]), **cert})
    unauthenticated = _call(matrix.client, matrix.db, key, cert)
    assert unauthenticated.status_code == 401, unauthenticated.text
    if key not in SPEAKS_FOR or "node-a" in lowered:
        assert response.status_code == ok_status, response.text
        return
    assert response.status_code == 403, response.text
    message = response.json()["error"]
    assert "'node-a'" in message and "node-b" in message, message
