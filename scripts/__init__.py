"""The project's scripts: benchmarks (scripts/bench), the docs' tables and figures
(scripts/docs), examples and tools. A package so that a script imports its neighbours as
`scripts.bench.x` / `scripts.docs.x`, the same way when run by path
(`python scripts/bench/x.py`, which first puts the project root on sys.path), as a module
(`python -m scripts.bench.x`) or from the tests. Not installed with zero_ref."""
