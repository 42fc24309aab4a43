"""config/sweeps.py: a unit that raises is logged with its id and the sweep goes on; the task's
soft time limit is no unit's failure and still ends the sweep."""

from __future__ import annotations

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from config import sweeps


def test_a_failing_unit_is_logged_with_its_id_and_the_rest_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done = []
    for unit_id in (1, 2, 3):
        with sweeps.unit("check of thing", unit_id):
            if unit_id == 2:
                raise ValueError("zero-size array to reduction operation maximum")
            done.append(unit_id)

    assert done == [1, 3]
    (record,) = [r for r in caplog.records if r.name == "runcast.sweeps"]
    assert record.getMessage() == (
        "sweep: check of thing 2 failed; the sweep goes on and the next one retries it"
    )
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_the_tasks_soft_time_limit_ends_the_sweep() -> None:
    with pytest.raises(SoftTimeLimitExceeded), sweeps.unit("check of thing", 1):
        raise SoftTimeLimitExceeded()
