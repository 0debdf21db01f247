"""Acting on the judgement: the eviction planner and the long-poll that tells schedulers."""
