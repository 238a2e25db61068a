"""Where the suite's minutes go, for the CI log: each lab's `lab up` and every playbook run of
the lab tests, with its time, listed at the end of the run (tests/conftest.py), so that the
next drift shows where it comes from. pytest's --durations gives the slowest tests and
fixture setups; this names the work inside them.

Workers of pytest-xdist are processes of their own: each appends JSON lines to the file the
controller names in GPUPROV_TEST_TIMINGS.
"""

from __future__ import annotations

import json
import os
import time

ENV = "GPUPROV_TEST_TIMINGS"


def record_setup(what: str, seconds: float) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    line = json.dumps({"what": what, "seconds": round(seconds, 1),
                       "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                       "at": time.time()})
    with open(path, "a", encoding="utf-8") as out:  # one write per line: appends stay whole
        out.write(line + "\n")


def read(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as lines:
            return [json.loads(line) for line in lines if line.strip()]
    except OSError:
        return []
