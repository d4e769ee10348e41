"""A slow writer for tests/test_failures.py to SIGKILL half-way through:

    python tests/atomic_fault_writer.py file|log PATH

`file` writes PATH through zero_ref.io.atomic.atomic_write, `log` through the
metrics log (zero_ref.io.metrics_log.JsonlLog), one 64 KiB chunk (or line) at a
time, printing "chunk N" after each so the test knows the file is half written
when it kills us.
"""

from __future__ import annotations

import sys
import time

from zero_ref.io.atomic import atomic_write
from zero_ref.io.metrics_log import JsonlLog

CHUNKS, CHUNK_BYTES = 1000, 1 << 16


def slow_chunks(write) -> None:
    for i in range(CHUNKS):
        write(i)
        print(f"chunk {i}", flush=True)
        time.sleep(0.01)


def main(kind: str, path: str) -> None:
    if kind == "file":
        atomic_write(path, lambda f: slow_chunks(lambda i: f.write(bytes([i % 256]) * CHUNK_BYTES)))
    else:
        log = JsonlLog(path)
        slow_chunks(lambda i: log.write({"step": i, "pad": "x" * 1000}))
        log.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
