"""Progress of a fit: one line per finished unit (part, pair), from one thread, and a bar.

Every estimator with ``verbose`` reports through :class:`Progress`, so that all of
them print the same way:

* one line per finished unit (a CA-SVM or BKRR part, an Asy-GCD class pair),
  ``[Name] part 3: ... (5/16)``, in the order the units finish: the unit's
  index (0-based, as the fitted attributes' rows and the warnings count), what
  it did, and how many units are done;
* only from the thread that created the :class:`Progress` (the thread that
  called ``fit``): the solvers run their units in worker threads and hand the
  results back to that thread, which prints. Lines from several threads would
  interleave; :meth:`Progress.update` raises if called from another thread, so
  a caller that gets this wrong fails in the tests instead of garbling output;
* a progress bar (``tqdm``, when it is installed) on stderr for fits that
  last: it appears only after :data:`BAR_DELAY` seconds, so short fits print
  lines alone. Without tqdm there is no bar and nothing else changes.

``verbose=0`` prints nothing and costs nothing.
"""

from __future__ import annotations

import sys
import threading

#: Seconds before the progress bar appears: a fit shorter than this shows no bar.
BAR_DELAY = 2.0


def _tqdm():
    """tqdm's class, or None when it is not installed (an optional dependency)."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


class Progress:
    """Per-unit progress lines (and a bar) of one fit; a no-op when ``verbose`` is 0.

    Parameters
    ----------
    name : str
        The estimator's name, the prefix of every line (``[name] ...``).
    total : int
        Units the fit will report (parts, pairs).
    verbose : int
        The estimator's ``verbose``; 0 prints nothing.
    unit : str
        What a unit is called in the lines and the bar ("part", "pair").
    """

    def __init__(self, name: str, total: int, verbose: int, unit: str = "part"):
        self.name = name
        self.total = int(total)
        self.verbose = int(verbose or 0)
        self.unit = unit
        self.done = 0
        self._owner = threading.get_ident()
        self._bar = None
        tqdm = _tqdm() if self.verbose and self.total > 1 else None
        if tqdm is not None:
            self._bar = tqdm(total=self.total, desc=name, unit=unit, delay=BAR_DELAY,
                             leave=False, file=sys.stderr)

    def __bool__(self):
        return self.verbose > 0

    def update(self, unit: int, message: str) -> None:
        """Report that unit ``unit`` (0-based) finished: ``[name] part k: message (done/total)``."""
        if not self.verbose:
            return
        if threading.get_ident() != self._owner:
            raise RuntimeError("Progress.update called from a worker thread: progress lines "
                               "are printed by the thread that started the fit only")
        self.done += 1
        line = f"[{self.name}] {self.unit} {unit}: {message} ({self.done}/{self.total})"
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
            self._bar.update(1)
        else:
            print(line, flush=True)

    def close(self, message: str | None = None) -> None:
        """Remove the bar and print the closing summary line, if any."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.verbose and message:
            print(f"[{self.name}] {message}", flush=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        return False
