"""What every rank's process needs below the engine, importing nothing of the package: its
thread budget (threads.py, set before NumPy loads BLAS) and the error all ranks raise together."""
