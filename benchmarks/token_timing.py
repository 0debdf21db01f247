"""Does a bearer token's check take as long for an unknown token id as for a wrong secret?

In process, against a real database: one stored token, then ``--tries`` checks of each kind,
interleaved (unknown id, wrong secret, unknown id, ...) so that drift in the machine's speed hits
both alike. Prints the median and the 10th/90th percentiles of each, and the difference of the
medians. Also the page's session cookie (fleet page), whose check has the same two paths, and
the median of a valid token's check (the price of the narrow first lookup).

    .venv/bin/python benchmarks/token_timing.py [--tries 20000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleetwatch.config import ServerSettings
from fleetwatch.errors import Unauthenticated
from fleetwatch.server.auth import authenticate, authenticate_session, create_token, page_session
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.migrate import upgrade
from fleetwatch.server.db.session import Database, make_engine


def _time_failure(check: Callable[[], object]) -> float:
    started = time.perf_counter_ns()
    try:
        check()
    except Unauthenticated:
        pass
    else:
        raise AssertionError("the check was meant to fail")
    return (time.perf_counter_ns() - started) / 1000.0


def _compare(
    label: str, tries: int, unknown: Callable[[], object], wrong: Callable[[], object]
) -> None:
    for _ in range(200):  # warm caches and the connection
        _time_failure(unknown)
        _time_failure(wrong)
    a: list[float] = []
    b: list[float] = []
    for _ in range(tries):
        a.append(_time_failure(unknown))
        b.append(_time_failure(wrong))

    def show(name: str, values: list[float]) -> float:
        deciles = statistics.quantiles(values, n=10)
        median = statistics.median(values)
        print(
            f"  {name:<14} median {median:7.1f} µs   p10 {deciles[0]:7.1f}   p90 {deciles[-1]:7.1f}"
        )
        return median

    print(f"{label}:")
    m_unknown = show("unknown id", a)
    m_wrong = show("wrong secret", b)
    print(f"  difference of medians (wrong - unknown): {m_wrong - m_unknown:+.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20_000)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.database_url or f"sqlite:///{Path(tmp) / 'fw.db'}"
        db = Database(make_engine(ServerSettings(database_url=url)))
        upgrade(db.engine)
        with db.write() as conn:
            token, info = create_token(conn, name=f"bench-{secrets.token_hex(3)}", scope="read")
        prefix, token_id, secret = token.split("_", 2)
        unknown = f"{prefix}_{secrets.token_hex(6)}_{secret}"
        wrong = f"{prefix}_{token_id}_{secrets.token_urlsafe(32)}"
        print(f"database: {db.engine.dialect.name}; {args.tries} tries of each, interleaved")
        with db.read() as conn:
            for _ in range(200):
                authenticate(conn, token)
            valid = []
            for _ in range(args.tries):
                started = time.perf_counter_ns()
                authenticate(conn, token)
                valid.append((time.perf_counter_ns() - started) / 1000.0)
            print(f"valid token: median {statistics.median(valid):.1f} µs")
            _compare(
                "bearer token",
                args.tries,
                lambda: authenticate(conn, unknown),
                lambda: authenticate(conn, wrong),
            )
            session = page_session(token, info.token_id, now=utcnow())
            version, sid, expiry, mac = session.split(".")
            forged_unknown = f"{version}.{secrets.token_hex(6)}.{expiry}.{mac}"
            forged_wrong = f"{version}.{sid}.{expiry}.{secrets.token_urlsafe(32)}"
            _compare(
                "page session",
                args.tries,
                lambda: authenticate_session(conn, forged_unknown, now=utcnow()),
                lambda: authenticate_session(conn, forged_wrong, now=utcnow()),
            )
        db.dispose()


if __name__ == "__main__":
    main()
