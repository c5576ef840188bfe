"""A one-line progress bar on stderr (only when stderr is a terminal, unless forced)."""
import sys
import time


class Progress:
    def __init__(self, total, label, enabled=None, stream=None):
        self.total, self.label, self.n = total, label, 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()
        self._last = 0.0

    def update(self, n=1, note=""):
        self.n += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.n >= self.total):
            self._last = now
            frac = self.n / self.total if self.total else 1.0
            bar = "#" * int(30 * frac)
            self.stream.write(f"\r{self.label} [{bar:<30}] {self.n}/{self.total} {now - self.t0:5.1f}s {note}")
            self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
        return time.perf_counter() - self.t0
