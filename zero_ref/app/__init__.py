"""The command line and what a run needs around the engine: configs, data, tasks,
the oracle check, reports, failure handling; and the commands `python -m
zero_ref.app.estimate` (estimate.py) and `python -m zero_ref.app.consolidate` (consolidate.py)."""
