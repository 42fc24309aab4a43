"""`python -m bench.episodes DIR [--json] [--seed N] [--limit N] [--per-run K] [--trace]`: loss
divergences scored as episodes, from onset to recovery or the run's end, as a lead lives them.

The replay is bench/flagstream.py's (the real ingestion, forecasts, liveness sweep, dispatcher
and cooldowns in simulated time); this bench adds what a training logs besides its loss (the
set's checkpoint events, and its `grad_norm/<layer>` columns when it has them) and scores:

- documented episodes: EVENTS.csv rows with origin=documented: `divergence_onset` (or a `nan`
  with no onset before it) opens one, the first `recovered` after it closes it;
- injected episodes, in copies of the set's healthy runs (no documented fault): a blow-up that
  settles at 2-20x the level, a spike that recovers, an oscillation that grows, a NaN that stays.

Per episode: detection (the first divergence-kind flag raised or updated at or after the onset)
and its delay; seconds shown healthy (no open divergence-kind flag) between that detection and
the recovery or the run's end (a missed episode: all of onset to recovery or end); whether every
rollback step the episode's flags advised is at or before the onset; whether the state at the
last replayed point is right (a divergence flag open iff the episode has not recovered; the
closing of every flag by the run's end is not counted); and the divergence-kind notifications
sent from the onset on (raised, updated, resolved), and the raises and updates the alert gate
held (a cooldown, or "no worse than" the alert already sent). The healthy runs replayed
untouched give the false alerts, counted as bench/flagstream.py counts them.

A run with no checkpoint events is given one every 2% of its steps (data.CHECKPOINT_SHARE), so the
rollback can be scored on any set. The last line with --json is one JSON object.
"""
