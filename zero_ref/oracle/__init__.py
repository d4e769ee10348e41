"""The single-rank oracle, what one process holding everything computes and the reference
every stage is tested against (single_rank.py), and how far fast mode may stray from it
in one step (bound.py)."""
