"""Judging the fleet: rule verdicts, risk, node liveness and straggling training jobs."""
