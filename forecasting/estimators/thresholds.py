"""Every threshold the estimators use, in one place, each with the reason for its value.

Estimators import from here; nothing else in the codebase hard-codes a threshold.
"""

from __future__ import annotations

# --- ETA, slip, deadline risk, stall (forecasting/estimators/eta.py, slip.py, deadline.py, stalled.py)
# (ETA section: begin)
# (ETA section: end)

# --- Loss trend and divergence (forecasting/estimators/loss.py, divergence.py)
# (LOSS section: begin)
# (LOSS section: end)
