"""The docs' measured tables and figures, rendered from recorded results."""
