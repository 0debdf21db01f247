"""Refitting the risk models in the background, one version per refit.

A refit reads the training frame (:mod:`fleetwatch.server.upkeep.training_frame`) and the
landmark rows (:mod:`fleetwatch.server.upkeep.landmark_frame`), fits a
:class:`~fleetwatch.models.registry.RiskBundle` and stores it as a new version in ``risk_models``,
scoring by the part (landmark, AFT or Weibull) that did best on the held-out window.
The version is promoted (``ok``: the newest ``ok`` version serves) only if it scores at least as
well as the version in service on the most recent held-out window; otherwise it is stored as
``rejected`` and the version in service stays (:mod:`fleetwatch.server.upkeep.promotion`). A fit
that fails is stored too, with status ``failed`` and its error, and the error is raised to the
caller (the background loop logs it): a refit is never lost silently. When a group (or the
fleet) enters wear-out between the version in service and a promoted refit, a fleet-wide
``wear_out_onset`` event (``node_id`` NULL) records the evidence.

Refits run in threads, never inside a request. On PostgreSQL a session advisory lock keeps two
replicas from refitting at once; in one process :class:`Refitter` runs one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from prometheus_client import Counter
from sqlalchemy import Connection, select

from fleetwatch.config import ServerSettings
from fleetwatch.models.base import ModelFitError
from fleetwatch.models.registry import RiskBundle
from fleetwatch.models.wear_out import wear_out_onsets
from fleetwatch.server.db.base import utcnow
from fleetwatch.server.db.session import Database
from fleetwatch.server.db.tables import risk_models
from fleetwatch.server.repo.events import record_fleet_event
from fleetwatch.server.repo.models import StoredModel, Trigger, latest_ok_model, store_model
from fleetwatch.server.runtime.locks import LockKey, session_lock
from fleetwatch.server.upkeep.landmark_frame import landmark_frame
from fleetwatch.server.upkeep.promotion import Recipe, evaluate, not_fitted
from fleetwatch.server.upkeep.training_frame import training_frame

__all__ = [
    "STARTUP_DELAY_S",
    "Refitter",
    "bundle_recipe",
    "landmark_horizons_days",
    "run_refit",
]

logger = logging.getLogger(__name__)

STARTUP_DELAY_S = 10.0
"""The first scheduled refit waits this long after startup, so the server answers first."""


def landmark_horizons_days(settings: ServerSettings) -> list[float]:
    """The landmark model's horizons: every horizon the server scores (``/metrics``' and the
    notices'), in days."""
    hours = {*settings.risk_horizons_h, settings.notice_horizon_h}
    return sorted(h / 24.0 for h in hours)


def bundle_recipe(settings: ServerSettings) -> Recipe:
    """The refit's fit on what was stored by a given moment: used at ``now`` and, for the
    evaluation, at the held-out window's start, so that both are the same recipe."""
    horizons = landmark_horizons_days(settings)

    def fit(conn: Connection, at: datetime) -> RiskBundle:
        frame = training_frame(
            conn,
            now=at,
            window_days=settings.model_window_days,
            location_pattern=settings.location_pattern,
        )
        landmarks = landmark_frame(
            conn,
            now=at,
            span_days=settings.model_landmark_span_days,
            window_days=settings.model_window_days,
            horizons_days=horizons,
            max_rows=settings.model_landmark_max_rows,
            location_pattern=settings.location_pattern,
        )
        return RiskBundle.fit(
            frame,
            min_group_events=settings.model_min_events,
            min_aft_events=settings.model_min_aft_events,
            landmarks=landmarks,
            landmark_horizons=horizons,
        )

    return fit


def _readable(stored: StoredModel | None) -> RiskBundle | None:
    """``stored``'s bundle, None when there is none or this version cannot read its format (a
    refit then replaces it: see :func:`~fleetwatch.server.upkeep.promotion.evaluate`)."""
    try:
        return stored.bundle() if stored is not None else None
    except ModelFitError:
        return None


def run_refit(
    db: Database,
    settings: ServerSettings,
    *,
    trigger: Trigger,
    now: datetime | None = None,
    min_interval_s: float | None = None,
) -> int | None:
    """Fit, evaluate and store a new version (promoted or rejected); return its number.

    Returns None without fitting when another replica holds the refit lock, or when a version was
    stored less than ``min_interval_s`` ago (so N workers on one schedule refit once, not N
    times). A failed fit is stored as ``failed`` and its exception re-raised.
    """
    now = now or utcnow()
    with session_lock(db.engine, LockKey.REFIT) as got:
        if not got:
            logger.info("refit (%s) skipped: another replica is refitting", trigger)
            return None
        with db.read() as conn:
            if min_interval_s is not None:
                newest = conn.execute(
                    select(risk_models.c.trained_at).order_by(risk_models.c.version.desc()).limit(1)
                ).scalar()
                if newest is not None and now - newest < timedelta(seconds=min_interval_s):
                    logger.info("refit (%s) skipped: version trained at %s", trigger, newest)
                    return None
        bundle: RiskBundle | None = None
        recipe = bundle_recipe(settings)
        champion = None
        try:
            with db.read() as conn:
                champion = latest_ok_model(conn)
                bundle = recipe(conn, now)
            with db.read() as conn:
                evaluation = evaluate(
                    conn,
                    now=now,
                    holdout_days=settings.model_holdout_days,
                    recipe=recipe,
                    champion=champion,
                    min_failures=settings.model_holdout_min_failures,
                    window_days=settings.model_window_days,
                    location_pattern=settings.location_pattern,
                    scorers=bundle.scorers,
                )
            bundle = bundle.with_scorer(evaluation.scorer)
            promoted = evaluation.promoted
            # Wear-out onsets are news only when the model that shows them serves; a rejected
            # refit's would be raised again by every refit until one is promoted.
            onsets = wear_out_onsets(_readable(champion), bundle) if promoted else []
        except Exception as exc:
            # Any failure of the refit is recorded, whatever raised it, then passed on.
            sizes = None
            if bundle is not None:
                sizes = {"n": bundle.metrics["n"], "events": bundle.metrics["events"]}
            error = f"{type(exc).__name__}: {exc}"
            with db.write() as conn:
                version = store_model(
                    conn,
                    None,
                    trigger=trigger,
                    trained_at=now,
                    error=error,
                    metrics=sizes,
                    evaluation=not_fitted(
                        now=now,
                        holdout_days=settings.model_holdout_days,
                        error=error,
                        serving=champion.version if champion else None,
                    ),
                )
            log = logger.warning if isinstance(exc, ModelFitError) else logger.error
            log("refit (%s) failed, stored as version %d: %s", trigger, version, exc)
            raise
        with db.write() as conn:
            version = store_model(
                conn,
                bundle,
                trigger=trigger,
                trained_at=now,
                evaluation=evaluation.to_json(),
                promoted=promoted,
            )
            for onset in onsets:
                evidence = {
                    **onset,
                    "model_version": version,
                    "previous_version": champion.version if champion else None,
                }
                record_fleet_event(
                    conn,
                    kind="wear_out_onset",
                    now=now,
                    message=f"wear-out onset in {onset['group']}: shape rose from "
                    f"{onset['previous_rho']:.2f} to {onset['rho']:.2f} "
                    f"(95% CI {onset['rho_ci'][0]:.2f}-{onset['rho_ci'][1]:.2f})",
                    details=evidence,
                )
    logger.info(
        "refit (%s) stored version %d, %s (%s): %d lifetimes, %d failures, %d group fits, "
        "AFT %s, landmark model %s, scoring by %s, %d wear-out onsets",
        trigger,
        version,
        "promoted" if promoted else "rejected",
        evaluation.decision.reason,
        bundle.metrics["n"],
        bundle.metrics["events"],
        len(bundle.weibulls) - 1,
        "yes" if bundle.has_aft else "no",
        "yes" if bundle.has_landmark else "no",
        bundle.scorer,
        len(onsets),
    )
    return version


class Refitter:
    """Runs refits in the background, one at a time per process.

    ``refit`` is the job (``run_refit`` by default); tests pass a slower or failing one.
    """

    def __init__(
        self,
        db: Database,
        settings: ServerSettings,
        *,
        refit: Callable[..., int | None] = run_refit,
        failures: Counter | None = None,
    ) -> None:
        self.failures = failures  # a Prometheus counter child, counting refits that crashed
        self.db = db
        self.settings = settings
        self._refit = refit
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    @property
    def running(self) -> bool:
        return not self._idle.is_set()

    def _claim(self) -> bool:
        with self._lock:
            if not self._idle.is_set():
                return False
            self._idle.clear()
            return True

    def _run(self, trigger: Trigger, min_interval_s: float | None = None) -> int | None:
        # The top of a background job: every failure is logged here, none escapes the thread.
        try:
            return self._refit(
                self.db, self.settings, trigger=trigger, min_interval_s=min_interval_s
            )
        except ModelFitError as exc:
            # Expected while the fleet has too few failures to fit: already stored as a failed
            # version with its reason (run_refit logged it); no traceback for a known condition.
            logger.debug("background refit (%s) did not fit: %s", trigger, exc)
            return None
        except Exception:
            if self.failures is not None:
                self.failures.inc()
            logger.exception("background refit (%s) failed", trigger)
            return None
        finally:
            self._idle.set()

    def request(self, trigger: Trigger = "manual") -> bool:
        """Start a refit in a daemon thread; False when one is already running."""
        if not self._claim():
            return False
        threading.Thread(
            target=self._run, args=(trigger,), name=f"fleetwatch-refit-{trigger}", daemon=True
        ).start()
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no refit is running (True) or ``timeout`` passes (False)."""
        return self._idle.wait(timeout)

    async def run_schedule(
        self, interval_s: float, *, first_delay_s: float = STARTUP_DELAY_S
    ) -> None:
        """Refit ``first_delay_s`` after startup (trigger ``startup``), then every ``interval_s``
        (``schedule``), until cancelled. A tick while a manual refit runs is skipped."""
        delay = first_delay_s
        trigger: Trigger = "startup"
        while True:
            await asyncio.sleep(delay)
            if self._claim():
                # Half an interval: with several workers on one schedule, the first one refits.
                await asyncio.to_thread(self._run, trigger, interval_s / 2)
            delay, trigger = interval_s, "schedule"
