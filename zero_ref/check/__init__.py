"""zero_ref.check: check another framework's training run against the single-rank math.

Torch-free: everything that reads records and decides (record.py, checker.py,
diagnoses.py, records_io.py); torch_watch.py, the only module that imports torch,
records a torch run. docs/check_reference.md describes the format, the bound and each
diagnosis.
"""
