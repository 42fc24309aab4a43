from __future__ import annotations

import json
import math

import numpy as np

from forecasting.estimators.jsonable import plain


def test_it_turns_numpy_and_non_finite_values_into_strict_json():
    value = {"a": np.float64(1.5), "b": np.int64(3), "c": math.nan, "d": [np.inf, np.bool_(True)]}
    out = plain(value)
    assert out == {"a": 1.5, "b": 3, "c": None, "d": [None, True]}
    json.dumps(out, allow_nan=False)
    assert type(out["b"]) is int
