"""Models written as ordered lists of units, each with hand-written backward."""
