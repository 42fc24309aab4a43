"""Runs in the shared curve format (INDEX.csv, EVENTS.csv, runs/*.csv), loaded with pandas.

Neutral ground: no Django, no server. The offline evaluation (bench/evaluate), the demo replay
and the dashboard test fixtures all read curves through here.
"""

from curveset.load import (
    COLUMNS,
    CurveRow,
    CurveRun,
    Event,
    curve_rows,
    load_run_file,
    load_runs,
    row_clock,
    run_timeline,
)

__all__ = [
    "COLUMNS",
    "CurveRow",
    "CurveRun",
    "Event",
    "curve_rows",
    "load_run_file",
    "load_runs",
    "row_clock",
    "run_timeline",
]
