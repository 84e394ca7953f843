"""Progress of a fit's rounds on stderr (``verbose``)."""

from __future__ import annotations

import sys
import time

__all__ = []


class _Progress:
    """Progress on stderr: ``verbose=1`` a bar on a terminal, plain lines elsewhere (logs);
    ``verbose>=2`` one line per round.

    The bar is redrawn at most every ``_REDRAW_SECONDS`` (a redraw costs ~50 us, a round of a
    small problem ~1 ms); off a terminal a line is written at each tenth of the rounds and at
    least every ``_LOG_SECONDS``, never a carriage return.
    """

    _REDRAW_SECONDS = 0.1
    _LOG_SECONDS = 30.0

    def __init__(self, label, total, verbose, keys=("objective", "train_rmse", "eval_rmse"),
                 stream=None):
        self.label, self.total, self.verbose, self.keys = label, total, verbose, keys
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty())
        self.done, self.t0 = 0, time.perf_counter()
        self.last_shown, self.last_tenth, self.shown = self.t0, 0, 0

    def update(self, record):
        self.done += 1
        if not self.verbose:
            return
        now = time.perf_counter()
        final = self.done >= self.total
        if self.verbose >= 2:
            self._line(record, now)
        elif self.terminal:
            if final or now - self.last_shown >= self._REDRAW_SECONDS or not self.shown:
                self._bar(record, now)
        else:
            tenth = 10 * self.done // max(self.total, 1)
            if final or tenth > self.last_tenth or now - self.last_shown >= self._LOG_SECONDS:
                self.last_tenth = tenth
                self._line(record, now)

    def _extra(self, record):
        return "".join(f" {key}={record[key]:.4g}" for key in self.keys if key in record)

    def _line(self, record, now):
        self.last_shown, self.shown = now, self.done
        print(f"[{self.label}] round {self.done}/{self.total}{self._extra(record)} "
              f"({now - self.t0:.1f}s)", file=self.stream, flush=True)

    def _bar(self, record, now):
        self.last_shown, self.shown, width = now, self.done, 30
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        print(f"\r{self.label:>10} [{bar}] {self.done}/{self.total}{self._extra(record)} "
              f"{now - self.t0:.1f}s\033[K", end="", file=self.stream, flush=True)

    def close(self, record=None):
        """End the display; a fit stopped early (``tol``, callback) shows its last round."""
        if self.verbose != 1 or not self.done:
            return
        if record is not None and self.shown != self.done:
            (self._bar if self.terminal else self._line)(record, time.perf_counter())
        if self.terminal:
            print(file=self.stream, flush=True)
