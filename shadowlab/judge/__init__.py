"""Judging a run directory: per-turn verdicts, identity, plausibility, expectations, budgets, the gate."""
