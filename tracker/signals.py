"""Signals the write path sends after commit.

They exist so tracker (the lower layer) never imports forecasting or alerts: those layers
subscribe and enqueue their own tasks. Receivers must only enqueue, never do work inline.
"""

from __future__ import annotations

from django.dispatch import Signal

# Sent after a batch commits; kwargs: run_id.
run_ingested = Signal()
# Sent after a run is marked finished/failed/crashed; kwargs: run_id.
run_finished = Signal()
