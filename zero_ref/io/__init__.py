"""Files: atomic whole-file writes, tensor files read in ranges and written as a
stream, and the append-only metrics log."""
