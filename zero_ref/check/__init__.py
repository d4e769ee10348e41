"""zero_ref.check: check another framework's training run against the single-rank math."""
