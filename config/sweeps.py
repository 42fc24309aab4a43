"""One unit of a periodic sweep at a time: a unit that raises is logged and the sweep goes on.

Every beat sweep walks many independent units (active runs, GPU hosts, unprocessed flags, run
endings, projects' digests, forecast histories). One unit whose data makes its check raise
must not stop the checks of every unit after it: the GPU sweep once died on one host's data six
times in a row and no host was checked for as long. The failed unit is logged with its id and
left as it was; the next sweep lists it again, so it is retried without a queue of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from celery.exceptions import SoftTimeLimitExceeded

logger = logging.getLogger("runcast.sweeps")


@contextmanager
def unit(what: str, unit_id: object) -> Iterator[None]:
    """Run the body as one unit of a sweep: an exception is logged with `what` and `unit_id`
    (and its traceback) and does not propagate.

    The task's soft time limit does propagate: it is the whole sweep's budget running out, not
    this unit failing, and the units left over wait for the next tick.
    """
    try:
        yield
    except SoftTimeLimitExceeded:
        raise
    except Exception:
        logger.exception(
            "sweep: %s %s failed; the sweep goes on and the next one retries it", what, unit_id
        )
