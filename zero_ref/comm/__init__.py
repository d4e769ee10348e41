"""Communication: the only package that imports mpi4py (collectives.py), and its ledger."""
