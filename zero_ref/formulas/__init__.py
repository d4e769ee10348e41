"""Closed forms from integers, no MPI: each rank's bytes per stage (memory.py) and an
alpha-beta model of a step's time (step_model.py), which prices comm/ledger.py's bytes."""
