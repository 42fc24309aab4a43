from __future__ import annotations

import pytest

from tracker.project_settings.services import parse_targets
from tracker.services import ServiceError


@pytest.mark.parametrize("value", ["nan", "inf", "-Infinity"])
def test_it_refuses_a_target_that_is_not_a_finite_number(value):
    # A project's targets are JSON: PostgreSQL's jsonb cannot hold NaN or Infinity.
    with pytest.raises(ServiceError) as error:
        parse_targets({"val_loss": value})
    assert error.value.field == "val_loss"


def test_it_reads_targets_and_skips_blanks():
    assert parse_targets({"val_loss": "3.28", "acc": ""}) == {"val_loss": 3.28}
