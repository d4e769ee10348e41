"""Ctrl-C (SIGINT) and SIGTERM: one line, rank 0's, then the abort that ends every rank.

mpirun passes the signal on to every rank. Two things lost the line before: a rank
that aborted at once could end rank 0 before its line was out (it came in 2 of 5
SIGINTs), and Python runs a signal's handler only between bytecodes, so rank 0 inside
a blocking MPI call (waiting in an all-reduce for a rank the signal already stopped)
never answers at all. So a thread hears the signal at once: signal.set_wakeup_fd has
the C-level handler write the signal's number to a pipe the thread reads, whatever
the main thread is doing. Rank 0's thread says the line (the caller's `say`, which
waits until the launcher has read it) and aborts; rank r's first waits r x WAIT_S
for that abort to end it, so the lowest rank still running speaks only if rank 0
cannot. SIGTERM's handler does nothing itself: the thread ends the job.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import NoReturn

WAIT_S = 5.0  # rank r waits r times this for a lower rank's abort before it speaks
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal, as a shell says


class InterruptWatch:
    """`start()` in the main thread, `close()` after the job; `handle(signum)` is the
    one way an interrupted rank ends (from the thread, or from the main thread's
    KeyboardInterrupt): the first caller speaks and aborts, a later one only waits."""

    def __init__(
        self, rank: int, say: Callable[[signal.Signals], None], abort: Callable[[int], NoReturn]
    ) -> None:
        self.rank, self.say, self.abort = rank, say, abort
        self.claimed = threading.Lock()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set handlers: the caller's own then apply
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # the C handler must never block
        self.old_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        self.old_term = signal.signal(signal.SIGTERM, lambda signum, frame: None)
        self.thread = threading.Thread(target=self._listen, name="interrupts", daemon=True)
        self.thread.start()

    def _listen(self) -> None:
        while data := os.read(self.read_fd, 1):  # b"" once close() shuts the pipe
            if data[0] in EXIT_CODES:
                self.handle(signal.Signals(data[0]))

    def handle(self, signum: signal.Signals) -> NoReturn:
        if not self.claimed.acquire(blocking=False):
            while True:  # the other caller is ending the job
                time.sleep(1.0)
        time.sleep(WAIT_S * self.rank)
        self.say(signum)
        self.abort(EXIT_CODES[signum])

    def close(self) -> None:
        if self.thread is None:
            return
        signal.set_wakeup_fd(self.old_fd)
        signal.signal(signal.SIGTERM, self.old_term)
        os.close(self.write_fd)
        self.thread.join()
        os.close(self.read_fd)
        self.thread = None
