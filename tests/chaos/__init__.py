"""The randomized crash suite: one streaming query, many faults, one oracle (see suite.py)."""
