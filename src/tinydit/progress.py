"""Progress of long work (training, sampling, evaluation, sweeps, teacher paths), readable anywhere.

On a terminal it is a tqdm bar. Anywhere else (a log file, CI, a pipe) a bar's carriage-return redraws
would pile up in the file, so it is one plain line every ``every`` seconds instead, with the rate and
the time left, plus one at the end:

    train: step 1200/2000 (60%), loss 0.1234, 712 img/s, 00:05:31 elapsed, 00:03:40 left
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm.auto import tqdm

__all__ = ["Progress", "LINE_EVERY"]

LINE_EVERY = 15.0  # seconds between progress lines when the output is not a terminal


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts work done out of ``total`` (None: unknown) and shows it; ``set`` adds fields such as the
    loss. ``left`` (seconds) given to ``set`` overrides the estimate from the rate (a time budget)."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "step",
        initial: int = 0,
        enabled: bool = True,
        every: float = LINE_EVERY,
        stream: TextIO | None = None,
    ):
        self.total, self.desc, self.unit, self.enabled, self.every = total, desc, unit, enabled, every
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.start_count, self.fields = initial, initial, {}
        self.started = self.last_line = time.monotonic()
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            file=self.stream,
            dynamic_ncols=True,
            disable=not (enabled and tty),
        )
        self.lines = enabled and not tty

    def update(self, n: int = 1) -> None:
        self.done += n
        self.bar.update(n)
        if self.lines and time.monotonic() - self.last_line >= self.every:
            self._line()

    def set(self, **fields) -> None:
        """Fields shown beside the count (``left=`` in seconds is the time left, if known better)."""
        self.fields.update(fields)
        self.bar.set_postfix({k: v for k, v in self.fields.items() if k != "left"}, refresh=False)

    def close(self) -> None:
        self.bar.close()
        if self.lines and self.done > self.start_count:
            self._line()
        self.lines = False

    def _line(self) -> None:
        now = time.monotonic()
        elapsed, rate = now - self.started, (self.done - self.start_count) / max(now - self.started, 1e-9)
        count = f"{self.unit} {self.done}"
        if self.total:
            count += f"/{self.total} ({100 * self.done / self.total:.0f}%)"
        left = self.fields.get("left")
        if left is None and self.total and rate > 0:
            left = (self.total - self.done) / rate
        parts = [count, *(f"{k} {v}" for k, v in self.fields.items() if k != "left"), f"{_clock(elapsed)} elapsed"]
        if left is not None:
            parts.append(f"{_clock(left)} left")
        print(f"{self.desc}: " + ", ".join(parts), file=self.stream, flush=True)
        self.last_line = now
