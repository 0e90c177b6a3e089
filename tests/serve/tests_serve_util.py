"""Small helpers shared by the serving tests."""

import time


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout` seconds pass; its last value."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value or time.time() > deadline:
            return bool(value)
        time.sleep(interval)
