# FleetWatch issue 11, regroup of src/fleetwatch/server (phase A: module moves).
# Apply to Python/Markdown files: sed -E -i -f regroup-moves.sed FILE...
# Dotted module paths (imports, mock/patch strings, logger names, docstrings).
s/\bfleetwatch\.server\.background\b/fleetwatch.server.judge.assessor/g
s/\bfleetwatch\.server\.isolation\b/fleetwatch.server.jobs.isolation/g
s/\bfleetwatch\.server\.leader\b/fleetwatch.server.jobs.leader/g
s/\bfleetwatch\.server\.rollups\b/fleetwatch.server.jobs.rollups/g
s/\bfleetwatch\.server\.lifecycle\b/fleetwatch.server.jobs.lifecycle/g
s/\bfleetwatch\.server\.refit\b/fleetwatch.server.jobs.refit/g
s/\bfleetwatch\.server\.training\b/fleetwatch.server.jobs.training/g
s/\bfleetwatch\.reports\.schedule\b/fleetwatch.server.jobs.weekly_report/g
s/\bfleetwatch\.server\.assessment\b/fleetwatch.server.judge.assessment/g
s/\bfleetwatch\.server\.judging\b/fleetwatch.server.judge.judging/g
s/\bfleetwatch\.server\.liveness\b/fleetwatch.server.judge.liveness/g
s/\bfleetwatch\.server\.straggler_detector\b/fleetwatch.server.judge.straggler_detector/g
s/\bfleetwatch\.server\.planner\b/fleetwatch.server.act.planner/g
s/\bfleetwatch\.server\.eviction_watch\b/fleetwatch.server.act.eviction_watch/g
s/\bfleetwatch\.server\.alerting\b/fleetwatch.server.tell.alerting/g
s/\bfleetwatch\.server\.outbox\b/fleetwatch.server.tell.outbox/g
s/\bfleetwatch\.server\.exposition\b/fleetwatch.server.metrics.exposition/g
s/\bfleetwatch\.server\.eviction_exposition\b/fleetwatch.server.metrics.eviction_exposition/g
s/\bfleetwatch\.server\.risk_exposition\b/fleetwatch.server.metrics.risk_exposition/g
s/\bfleetwatch\.server\.rates\b/fleetwatch.rules.rates/g
s/\bfleetwatch\.server\.checkpoint\b/fleetwatch.models.checkpoint/g
s/\bfleetwatch\.server\.stragglers\b/fleetwatch.models.stragglers/g
s/\bfleetwatch\.server\.webhooks\b/fleetwatch.notify.webhooks/g
s/\bfleetwatch\.reports\.data\b/fleetwatch.server.repo.report_rows/g
# "from fleetwatch.server import X" forms (one module per line; extend as needed).
s/^(\s*)from fleetwatch\.server import alerting, planner$/\1from fleetwatch.server.act import planner\n\1from fleetwatch.server.tell import alerting/
s/^(\s*)from fleetwatch\.server import (alerting|outbox)$/\1from fleetwatch.server.tell import \2/
s/^(\s*)from fleetwatch\.server import (planner|eviction_watch)$/\1from fleetwatch.server.act import \2/
s/^(\s*)from fleetwatch\.server import (isolation|leader|rollups|lifecycle|refit|training)$/\1from fleetwatch.server.jobs import \2/
s/^(\s*)from fleetwatch\.server import (assessment|judging|liveness|straggler_detector)$/\1from fleetwatch.server.judge import \2/
s/^(\s*)from fleetwatch\.server import (exposition|eviction_exposition|risk_exposition)$/\1from fleetwatch.server.metrics import \2/
s/^(\s*)from fleetwatch\.server import rates$/\1from fleetwatch.rules import rates/
s/^(\s*)from fleetwatch\.server import checkpoint$/\1from fleetwatch.models import checkpoint/
s/^(\s*)from fleetwatch\.server import stragglers$/\1from fleetwatch.models import stragglers/
s/^(\s*)from fleetwatch\.server import webhooks$/\1from fleetwatch.notify import webhooks/
s/^(\s*)from fleetwatch\.server import background$/\1from fleetwatch.server.judge import assessor/
s/^(\s*)from fleetwatch\.reports import schedule$/\1from fleetwatch.server.jobs import weekly_report as schedule/
s/^(\s*)from fleetwatch\.reports import data$/\1from fleetwatch.server.repo import report_rows as data/
# Source paths in prose (docstrings, comments, Markdown).
s#\bserver/background\.py\b#server/judge/assessor.py#g
s#\bserver/(isolation|leader|rollups|lifecycle|refit|training)\.py\b#server/jobs/\1.py#g
s#\breports/schedule\.py\b#server/jobs/weekly_report.py#g
s#\bserver/(assessment|judging|liveness|straggler_detector)\.py\b#server/judge/\1.py#g
s#\bserver/(planner|eviction_watch)\.py\b#server/act/\1.py#g
s#\bserver/(alerting|outbox)\.py\b#server/tell/\1.py#g
s#\bserver/(exposition|eviction_exposition|risk_exposition)\.py\b#server/metrics/\1.py#g
s#\bserver/rates\.py\b#rules/rates.py#g
s#\bserver/checkpoint\.py\b#models/checkpoint.py#g
s#\bserver/stragglers\.py\b#models/stragglers.py#g
s#\bserver/webhooks\.py\b#notify/webhooks.py#g
s#\breports/data\.py\b#server/repo/report_rows.py#g
# Bare "server.X" in prose ("see server.isolation"); the fleetwatch.-prefixed forms are done above.
s/(^|[^.a-z_])server\.background\b/\1server.judge.assessor/g
s/(^|[^.a-z_])server\.(isolation|leader|rollups|lifecycle|refit|training)\b/\1server.jobs.\2/g
s/(^|[^.a-z_])server\.(assessment|judging|liveness|straggler_detector)\b/\1server.judge.\2/g
s/(^|[^.a-z_])server\.(planner|eviction_watch)\b/\1server.act.\2/g
s/(^|[^.a-z_])server\.(alerting|outbox)\b/\1server.tell.\2/g
s/(^|[^.a-z_])server\.(exposition|eviction_exposition|risk_exposition)\b/\1server.metrics.\2/g
# Globs over the moved modules (tests/unit/test_prometheus_rules.py).
s#"server/\*exposition\.py"#"server/metrics/*exposition.py"#g
