# FleetWatch issue 11 regroup, phase B: names that moved between modules (apply AFTER
# regroup-moves.sed; sed -E). Only single-name import lines are rewritten; an import line naming
# several of these needs splitting by hand (grep for the module names below).
s/^(\s*)from fleetwatch\.server\.judge\.assessor import (Waker|periodic)$/\1from fleetwatch.server.jobs.scheduler import \2/
s/^(\s*)from fleetwatch\.server\.judge\.assessor import RollupJob$/\1from fleetwatch.server.jobs.rollups import RollupJob/
s/^(\s*)from fleetwatch\.server\.judge\.assessor import run_lifecycle$/\1from fleetwatch.server.jobs.lifecycle import run_lifecycle/
# load_rules now takes the path: load_rules(settings) -> load_rules(settings.rules_file)
s/^(\s*)from fleetwatch\.server\.judge\.assessor import load_rules$/\1from fleetwatch.rules.overrides import load_rules/
s/\bload_rules\(settings\)/load_rules(settings.rules_file)/g
s/^(\s*)from fleetwatch\.metrics import ServerMetrics$/\1from fleetwatch.server.metrics.families import ServerMetrics/
s/^(\s*)from fleetwatch\.reports\.weekly import compute_weekly$/\1from fleetwatch.server.repo.report_rows import compute_weekly/
s/^(\s*)from fleetwatch\.server\.tell\.alerting import (Condition|derive_conditions)$/\1from fleetwatch.server.tell.conditions import \2/
# Not sed-able, by hand:
# - reports.data.WeekData / CONFIRM_WINDOW -> fleetwatch.reports.rows (load_week stays in
#   server.repo.report_rows); reports.calibration.calibration(conn, ...) -> calibration(model, ...)
#   with the model row from WeekData.model; reports.weekly.compute_weekly(conn, ...) is
#   server.repo.report_rows.compute_weekly; the pure one is reports.weekly.build_weekly.
# - app.py's lifespan job wiring (_lead, _judge_and_plan, _register_leader_gauge, the jobs list)
#   -> server/jobs/registry.py BackgroundJobs (+ jobs/scheduler.py Scheduler, Job); a new job is
#   one Job(...) line in BackgroundJobs.leader_jobs() or process_jobs().
# - app.py's /healthz, /readyz, /metrics -> server/operations.py.
# - advisory locks: pg_(try_)advisory_(xact_)lock with a private key -> server.jobs.locks
#   (LockKey.<JOB>, try_transaction_lock / transaction_lock / session_lock). planner.py's
#   _PLANNER_LOCK and straggler_detector.py's _LOCK/_singleton are LockKey.PLANNER/STRAGGLERS.
# - rules/health.py internals (_Judge, _FLAG_RULES, _ev) -> rules/health_evidence.py (GpuEvidence,
#   Rule, at_sample), rules/health_state.py, rules/health_rates.py.
