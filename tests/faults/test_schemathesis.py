"""Schemathesis over the live OpenAPI, as every kind of caller: no 5xx, every answer as documented.

A real ``fleetwatch server`` process on PostgreSQL and on SQLite; ``st run`` (schemathesis' CLI,
as a subprocess) reads ``/openapi.json`` from it and sends generated requests once without a token
and once with a token of each scope (on SQLite, with the admin token only: refusals do not depend
on the database). The admin token may do everything, so its run is the full
one: the schema's examples, the coverage phase (boundary and negative values of every parameter
and body field), then random cases. The other callers' runs are random cases only (about 200 a
caller, every operation called, with bodies that parse and bodies that do not), enough to show
that each refusal (401, 403, or a 422 for a body that does not parse, which is read before the
token) is documented. They leave out the examples phase: it cost each run about 3 s of ``st``'s
CPU for 5 cases, which the admin run sends anyway.

Checks: ``not_a_server_error`` (no 5xx), ``response_schema_conformance`` (each body matches the
schema documented for its status) and ``status_code_conformance`` (each status is documented).
Generation is deterministic and the number of examples per operation fixed, so every run sends
the same cases.

Excluded, each with its reason:

- ``DELETE /v1/tokens/{key}`` for the admin run: schemathesis feeds values it read from earlier
  responses (``GET /v1/tokens`` lists token ids) into later parameters, so it would revoke the
  very tokens the run uses and leave the rest of the run answering 401. Its hostile keys are
  covered by ``tests/unit/server/routers/test_hostile_params.py``; revocation by
  ``tests/unit/server/routers/test_auth_matrix.py``. After the runs every token must still work,
  so no revocation can silently narrow a run.
- ``POST /api/v1/write`` for every caller: its body is a snappy-compressed protobuf, which
  schemathesis cannot generate (its run errors on the media type). Its refusals are covered by
  ``tests/unit/server/routers/test_remote_write.py`` and its hostile bodies (random, truncated and
  bit-flipped ones: never a 5xx, never anything stored) by ``test_remote_write_fuzz.py`` beside it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from fleetwatch.config import ServerSettings
from fleetwatch.server.auth import create_token
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine
from tests.conftest import _truncate
from tests.integration.live import live_server

pytestmark = pytest.mark.slow

SCOPES = ("agent", "read", "scheduler", "admin")
# Per operation and phase for the admin runs, half that for the others: the file takes about 70 s
# on 2 loaded cores. For a longer run by hand: FLEETWATCH_SCHEMATHESIS_EXAMPLES=100.
MAX_EXAMPLES = int(os.environ.get("FLEETWATCH_SCHEMATHESIS_EXAMPLES", "8"))
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance"
RUN_TIMEOUT_S = 240  # one `st run`; generous for 2 loaded cores, never reached when healthy
ST = Path(sys.executable).with_name("st")


@dataclass
class Findings:
    cases: int = 0
    server_errors: int = 0
    failures: Counter[str] = field(default_factory=Counter)  # "operation: problem" -> cases
    examples: dict[str, str] = field(default_factory=dict)  # the first case of each

    def add(self, failure: str, example: str) -> None:
        self.failures[failure] += 1
        self.examples.setdefault(failure, example)

    def lines(self) -> list[str]:
        return [
            f"{count:4d} x {failure}; first: {self.examples[failure]}"
            for failure, count in sorted(self.failures.items())
        ]


def _st_run(
    url: str, token: str | None, report: Path, work: Path, phases: str, examples: int,
    *exclude: str,
) -> None:  # fmt: skip
    if not ST.exists():
        pytest.fail(f"schemathesis' st not found at {ST}: install the dev extra (.[dev])")
    auth = ["-H", f"Authorization: Bearer {token}"] if token else []
    excluded = [arg for path in exclude for arg in ("--exclude-path", path)]
    command = [
        str(ST), "run", f"{url}/openapi.json", *auth, *excluded,
        "--checks", CHECKS,
        "--max-examples", str(examples),
        "--generation-deterministic",
        "--phases", phases,
        "--continue-on-failure",  # every case of every operation, not up to its first failure
        "--workers", "1",
        "--request-timeout", "30",
        "--no-color",
        "--report", "ndjson", "--report-ndjson-path", str(report),
    ]  # fmt: skip
    # Exit status 1 means "failures found"; the report says which, so it is read, not the status.
    result = subprocess.run(
        command, cwd=work, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if not report.exists() or result.returncode not in (0, 1):
        raise AssertionError(
            f"st run failed ({result.returncode}):\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )


def _read_report(report: Path, caller: str, into: Findings) -> None:
    """Counts the cases and the 5xx answers; keeps one line per distinct failure."""
    for line in report.read_text().splitlines():
        event = json.loads(line)
        scenario = event.get("ScenarioFinished")
        if scenario is None:
            continue
        recorder = scenario["recorder"]
        into.cases += len(recorder.get("cases", {}))
        for interaction in recorder.get("interactions", {}).values():
            status = (interaction.get("response") or {}).get("status_code", 0)
            into.server_errors += status >= 500
        if scenario["status"] == "error":
            into.add(f"{recorder['label']}: run error", caller)
        for case_id, checks in recorder.get("checks", {}).items():
            for check in checks:
                if check["status"] == "success":
                    continue
                failure = check.get("failure_info", {}).get("failure", {})
                case = recorder.get("cases", {}).get(case_id, {}).get("value", {})
                sent = {k: case[k] for k in ("path_parameters", "query", "body") if case.get(k)}
                key = f"{failure.get('operation', recorder['label'])}: {failure.get('title')}"
                into.add(key, f"{caller}, {json.dumps(sent)[:300]}")


@pytest.fixture(params=["postgresql", "sqlite"])
def fuzzed_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty, migrated database (the server process would migrate SQLite itself, but the
    tokens are created before it starts)."""
    if request.param == "postgresql":
        url: str = request.getfixturevalue("migrated_postgres_url")
        _truncate(url)
        return url
    url = f"sqlite:///{tmp_path / 'fleetwatch.db'}"
    db = Database(make_engine(ServerSettings(database_url=url)))
    upgrade(db.engine)
    db.dispose()
    return url


def _create_tokens(url: str) -> dict[str, str]:
    """One token per scope, named so that nobody can guess them: a generated
    ``DELETE /v1/tokens/{name}`` cannot revoke them."""
    db = Database(make_engine(ServerSettings(database_url=url)))
    made = {}
    with db.write() as conn:
        for scope in SCOPES:
            made[scope], _ = create_token(
                conn, name=f"st-{scope}-{secrets.token_hex(8)}", scope=scope
            )
    db.dispose()
    return made


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    fuzzed_database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = fuzzed_database_url
    tokens = _create_tokens(url)
    # No background jobs: webhooks the run subscribes must not be delivered to generated URLs.
    monkeypatch.setenv("FLEETWATCH_SERVER_BACKGROUND_JOBS", "false")
    # Generated `wait=` values must not hold GET /v1/evictions up to 60 s each.
    monkeypatch.setenv("FLEETWATCH_SERVER_LONG_POLL_MAX_S", "0.2")
    findings = Findings()
    database = url.split(":", 1)[0].split("+")[0]
    with live_server(url, tmp_path) as server:
        # Who may call what does not depend on the database: the callers other than admin run on
        # PostgreSQL only, which keeps the file near a minute and a half on 2 loaded cores.
        callers = ("no token", *SCOPES) if database == "postgresql" else ("admin",)
        for caller in callers:
            token = tokens.get(caller)
            full = caller == "admin"
            exclude = ["/api/v1/write", *(["/v1/tokens/{key}"] if full else [])]
            phases = "examples,coverage,fuzzing" if full else "fuzzing"
            report = tmp_path / f"{caller.replace(' ', '-')}.ndjson"
            before = (findings.cases, findings.server_errors)
            examples = MAX_EXAMPLES if full else max(1, MAX_EXAMPLES // 2)
            _st_run(server.url, token, report, tmp_path, phases, examples, *exclude)
            _read_report(report, caller, findings)
            print(  # noqa: T201
                f"{database}, {caller} ({phases}): {findings.cases - before[0]} cases, "
                f"{findings.server_errors - before[1]} answered 5xx"
            )
        for scope, token in tokens.items():  # no run revoked a token and narrowed the rest
            # An empty batch is refused (422) only once the token is accepted (else 401).
            answer = httpx.post(
                f"{server.url}/v1/ingest", json={}, headers={"Authorization": f"Bearer {token}"}
            )
            assert answer.status_code in (403, 422), (scope, answer.status_code, answer.text)
        log = server.log.read_text()
    print(  # noqa: T201
        f"schemathesis on {database}: {findings.cases} cases as {len(callers)} callers, "
        f"{findings.server_errors} answered 5xx, {len(findings.failures)} distinct failures"
    )
    for line in findings.lines():
        print(f"  {line}")  # noqa: T201
    assert findings.cases > 1000, "schemathesis ran too few cases to mean anything"
    assert not findings.failures, "\n".join(findings.lines())
    assert findings.server_errors == 0
    assert "Traceback" not in log, log[-4000:]
