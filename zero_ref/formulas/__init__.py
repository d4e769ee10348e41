"""Closed forms from integers, no MPI: each rank's bytes per stage (memory.py), the bytes
a step should move (traffic.py), the order a step reads its units in (unit_order.py), and
an alpha-beta model of a step's time (step_model.py), which prices traffic.py's bytes."""
