"""A bound on a test's time for code that may hang in a collective (no pytest plugin here)."""

import threading

import pytest


def bounded(fn, seconds=120.0, hint=""):
    """Run ``fn`` in a daemon thread; fail instead of hanging past ``seconds``."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"did not finish within {seconds} s{hint}")
    if "error" in box:
        raise box["error"]
    return box.get("value")
