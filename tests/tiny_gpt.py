"""A tiny GPT and a tiny corpus for tests that run python -m zero_ref.train end to end
(tests/test_trace.py, tests/test_stages_figures.py): seconds per run, real bytes. The
corpus is tests/conftest.py's `tiny_corpus` fixture, TEXT repeated."""

from __future__ import annotations

TEXT = "Whan that Aprille with his shoures soote the droghte of March hath perced to the roote.\n"
TINY_GPT = [
    *("--model", "gpt", "--n-layer", "1", "--n-head", "2", "--d-model", "8"),
    *("--context", "6", "--batch-size", "4", "--sample-chars", "0", "--quiet"),
]
