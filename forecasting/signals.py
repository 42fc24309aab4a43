"""Signals the flag writer sends after its transaction commits.

Forecasting (a lower layer than alerts) never imports alerts: the one writer of Flag rows
(`forecasting.flags`) sends `flags_written` explicitly, on commit, and alerts subscribes and
enqueues its dispatch. Receivers only enqueue; no work starts from a model's `post_save`.
"""

from __future__ import annotations

from django.dispatch import Signal

# Sent after rows of the Flag outbox commit; kwargs: flag_ids (list[int]).
flags_written = Signal()
