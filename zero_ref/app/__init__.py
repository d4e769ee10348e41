"""The command line and what a run needs around the engine: configs, data, tasks,
the oracle check, reports, failure handling."""
