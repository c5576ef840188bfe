"""One progress facility for every command that runs a while: a tqdm line on stderr.

    bar = Progress(total, "calibrating")    # total 0: unknown yet (set bar.total later)
    bar.update(n, note)                     # n more done; note: shown after the counts (PPL 12.3)
    bar.write(text)                         # a line of its own, printed above the bar
    bar.close()                             # -> seconds since the bar was made

Shown only where someone watches: stderr a terminal, not quieted (cli/main.py calls quiet() under
--json), enabled not False. tqdm does the drawing, the throttling (10 redraws a second at most)
and the estimate of the time left. delay: seconds before the line first shows, so that a step
which turns out quick (kernels already in numba's cache) prints nothing.
"""
import sys
import time

from tqdm import tqdm

_quiet = False
BAR = "{desc}: {n_fmt}/{total_fmt} [{bar:30}] {elapsed}<{remaining}{postfix}"     # a known total
COUNT = "{desc}: {n_fmt} {unit} {elapsed}{postfix}"                                # not known yet


def quiet(on=True):
    """Every bar made after this is silent (machine-readable output: --json)."""
    global _quiet
    _quiet = on


def _watched(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):           # a closed or file-less stream
        return False


class Progress:
    def __init__(self, total, label, enabled=None, stream=None, delay=0.0, unit="it", fmt=None):
        """fmt: tqdm's bar_format, for a line of another shape (the kernels' compile)"""
        self.stream = stream or sys.stderr
        self.enabled = (not _quiet and _watched(self.stream)) if enabled is None else bool(enabled)
        self.label, self.n = label, 0
        self.t0 = time.perf_counter()
        self._bar = tqdm(total=total or None, desc=label, file=self.stream, disable=not self.enabled, delay=delay,
                         unit=unit, mininterval=0.1, dynamic_ncols=True,
                         bar_format=fmt or (BAR if total else COUNT))
        self._fmt = fmt

    @property
    def total(self):
        return self._bar.total or 0

    @total.setter
    def total(self, value):
        if value and value != self._bar.total:
            self._bar.total = value
            self._bar.bar_format = self._fmt or BAR

    def update(self, n=1, note=""):
        self.n += n
        if self.enabled:
            if note:
                self._bar.set_postfix_str(note, refresh=not n)      # a new note alone: draw it now
            if n:
                self._bar.update(n)

    def write(self, text):
        """A line of its own (an eval's losses): above the bar when it shows, plain otherwise."""
        if self.enabled:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self):
        self._bar.close()
        return time.perf_counter() - self.t0
