"""Every threshold the estimators and the forecasting services use, in one place, each with the
reason for its value.

Estimators (forecasting/estimators/) import their tuned thresholds from here; the GPU
estimator's `Settings` takes its defaults from here (GPU section), and so do the server's GPU
check (forecasting/gpu/check.py), the straggler window (forecasting/stragglers.py), the flags'
hysteresis (forecasting/hysteresis.py) and the board's risk order (forecasting/board.py). What
stays inline is the arithmetic of a method (a MAD's 1.4826 to a normal's sd, how many samples a
statistic needs, a sampling period of alignment jitter, the gaps a sensor skips), a cost cap
(eta._TREND_MAX_BINS), the defaults of the tools baselines.py imitates, and three operating
values of the liveness sweep and the task queue beside the code that uses them
(forecasting/liveness.py: the gap that counts as an outage and how long a silent web probe is
believed; forecasting/tasks.py: the forecast debounce). The sweep's period is the
RUNCAST_SWEEP_PERIOD_S setting.
"""

from __future__ import annotations

# --- ETA, slip, deadline risk, stall (estimators eta.py, slip.py, deadline.py, stalled.py)
# (ETA section: begin)
# A forecast needs at least two intervals to see a rate and one more to tell noise from it.
ETA_MIN_POINTS = 3
# An interval counts as a gap (pause or downtime) when it took this many times longer than its
# steps should have at the typical pace: slow steps and logging jitter stay well below 4x.
ETA_GAP_FACTOR = 4.0
# ... and when the extra time is also this many typical log intervals, so that a run logging
# every step does not call each slightly late line a gap.
ETA_GAP_MIN_INTERVALS = 3.0
# Gaps seen at least this often, of similar size, are the job's own rhythm (eval, checkpoint):
# their cost is spread over the steps as overhead instead of being modelled as interruptions.
ETA_RECURRING_MIN_COUNT = 3
# "Similar size" for recurring pauses: within this factor of their median length. An outage is
# usually tens of times longer than an eval pause.
ETA_RECURRING_SPREAD = 5.0
# A gap that is neither recurring nor longer than this many usual log intervals (or than this
# many of the job's own recurring pauses) is pace noise (an eval, a save, a burst of contention
# from other load), not an interruption: it stays compute time. An outage (relaunch, reload) costs
# minutes, i.e. tens to thousands of log intervals; counting eval pauses as outages made a run
# slowed by other load look steady (a 24 s-wide band at 50% that was 4.6 min short) and
# inflated the interruption rate.
ETA_PAUSE_MAX_INTERVALS = 10.0
ETA_PAUSE_MAX_RECURRING = 3.0
# Bins in the running median that a pause is measured against when its cost is spread over the
# steps as overhead (eta._regime_level): wide enough that one pause does not move the median.
ETA_PAUSE_WINDOW = 9
# A run whose first forecast finds this much logged history (an import, a client that spooled
# through an outage before the server first heard of it, the demo's replay) gets its ETA history
# reconstructed (forecasting.compute._eta_backfill): as-of forecasts at this many times of its
# own data, each from the points logged by then. Its ETA chart then starts at its start instead
# of being one point at the right edge of hours of empty axis.
ETA_BACKFILL_MIN_SPAN_S = 600.0
ETA_BACKFILL_POINTS = 48
# Leading rate bins slower than this multiple of the median are warm-up (torch.compile, data
# loader start, cache fill) and are not used for the rate: compiled steps are 1.5-60x faster.
ETA_WARMUP_FACTOR = 1.5
# Warm-up never covers more than this fraction of the history; beyond it the slowness is the rate.
ETA_WARMUP_MAX_FRACTION = 0.5
# The rate model works on at most this many equal-work bins, so a million points cost the same
# as a thousand (binning is a linear pass; everything after it is O(bins)).
ETA_MAX_BINS = 400
# The current pace is the mean since the last level shift (whole history when there is none):
# the longest window that still describes the run averages eval rhythm and slow steps best.
# A shift needs this many standard errors: at 4 a steady run of 60 bins calls a false shift in
# well under 1% of forecasts, while a 5% slowdown is caught within a few bins.
ETA_SHIFT_MIN_T = 4.0
# Each regime (and the trend fit) needs at least this many bins ...
ETA_RECENT_MIN_BINS = 4
# ... except the newest one, so a big shift (a slower batch-size stage, a throttled GPU) is
# followed after two bins (~2% of the history), as a progress bar's recent rate would.
ETA_SHIFT_MIN_NEW_BINS = 2
# The pace trend (seconds per step against progress) is extrapolated at this fraction of its
# fitted slope: schedules that lengthen steps (sequence/window warm-up) tend to saturate.
ETA_TREND_DAMPING = 0.5
# ... and only when the fitted slope is this many standard errors above zero: bin-to-bin noise
# extrapolated 10x ahead would otherwise dominate the forecast.
ETA_TREND_MIN_T = 3.0
# A ramp (steps lengthening all through the run, in increments too small to test one by one) is
# extrapolated at this fraction of its slope over the whole history.
ETA_RAMP_DAMPING = 0.5
# ... unless the current regime is flatter than the ramp by this many standard errors of its own
# slope (a one-sided test at ~2.5%): then the rise was a staircase that has reached its top.
ETA_RAMP_ENDED_T = 2.0
# A forecast is early (flagged, and damped: the pace is the mean since the warm-up, with no
# regime or trend, and the spread comes from the prior alone) while fewer rate intervals are seen
# after the warm-up than a level-shift test can split (4 + 2 bins) ...
ETA_EARLY_MIN_INTERVALS = 6
# ... or less than this share of the planned steps: a regime of a few percent of the run,
# extrapolated 20x and more, follows its last slow batch or eval rather than the run.
ETA_EARLY_MIN_SHARE = 0.05
# Back-test origins, as fractions of the history after warm-up: the model is fitted up to each
# and scored on the rest; the errors choose between step and ramp models and size the spread.
ETA_BACKTEST_ORIGINS = (1 / 3, 1 / 2, 2 / 3)
# The trend may change the pace by at most this factor over the rest of the run.
ETA_TREND_MAX_FACTOR = 1.5
# Least log-space spread of the remaining compute time (clock rounding). Above it the floor is
# the run's own bin-to-bin pace noise averaged over the bins still to come: the former fixed
# 0.04 (+-5%) made late intervals 5-10x wider than the errors (97% coverage at 75%).
ETA_SIGMA_FLOOR = 0.005
# Future pace changes (stages, throttling, contention): a Poisson process over the run's
# progress whose rate has a gamma prior of this many changes per run, worth this many runs of
# observation (weak: half a change per run, so one shift seen doubles the expected rate) ...
ETA_CHANGE_PRIOR_COUNT = 0.5
ETA_CHANGE_PRIOR_RUNS = 1.0
# ... each change a log-normal step in pace, of prior size 0.3 (x1.35, the order of a batch-size
# or sequence stage, or a node swapped for a slower one), worth one observed shift ...
ETA_CHANGE_PRIOR_LOG = 0.3
ETA_CHANGE_PRIOR_WEIGHT = 1.0
# ... and at most this many changes drawn in the rest of one run (a bound for the Monte Carlo).
ETA_CHANGE_MAX_DRAWN = 6
# Prior log error per unit of extrapolation (remaining work / observed work), used before the
# run's own back-test says more; weight of that prior in back-test units.
ETA_SIGMA_PER_RATIO_PRIOR = 0.08
ETA_SIGMA_PRIOR_WEIGHT = 1.0
# Cap on that spread: beyond a factor ~3.6 either way (P10..P90) an interval says nothing more.
ETA_SIGMA_MAX = 1.0
# Interruption rate prior: log-uniform between one a month (a healthy reserved node) and one
# every 10 minutes (a preempted spot fleet, a crash-looping job): the rate of a given job is
# unknown by orders of magnitude, so the prior only sets the range and the run's own record
# (events seen over its wall clock) picks the scale. Large multi-node runs sit mid-range
# (GLM-130B's logbook: ~1 per 2 days; OPT-175B: several per week). Grid points on that range.
ETA_RATE_MIN_PER_S = 1.0 / (30 * 24 * 3600.0)
ETA_RATE_MAX_PER_S = 1.0 / 600.0
ETA_RATE_GRID = 40
ETA_RATE_TYPICAL_PER_S = 1.0 / 3600.0
# Prior recovery time (detect, relaunch, reload checkpoint): ~15 min, worth one observation.
ETA_PRIOR_RECOVERY_S = 900.0
ETA_PRIOR_RECOVERY_WEIGHT = 1.0
# Monte Carlo draws for the wall-clock distribution; fixed seed so a forecast is reproducible.
ETA_MC_SAMPLES = 4000
ETA_MC_SEED = 20240601
# Silence after the last point longer than this many usual intervals is treated as downtime
# already in progress, not as compute.
ETA_SILENCE_INTERVALS = 3.0

# Slip: the P50 finish moved later by more than this share of the remaining time ...
SLIP_REL_THRESHOLD = 0.10
# ... and by at least this many seconds (a 10-min run moving 30 s is not news) ...
SLIP_MIN_S = 120.0
# ... within a window of this share of the run's forecast lifetime, clamped to [min, max]:
# long enough to ignore one noisy forecast, short enough that old slips age out.
SLIP_WINDOW_FRACTION = 0.25
SLIP_WINDOW_MIN_S = 600.0
SLIP_WINDOW_MAX_S = 3 * 24 * 3600.0
# Needs this many forecasts in the window to call a trend.
SLIP_MIN_FORECASTS = 3

# Deadline: the probability the plan targets (P90 = on time in 9 of 10 comparable runs).
DEADLINE_TARGET_P = 0.9
# Below this chance of making the cutoff a run reads "likely late" (between it and the target:
# "at risk"). Pages, the digest and messages all take their tone from deadline.on_time_tone.
DEADLINE_LIKELY_LATE_P = 0.5

# Stall: silent for more than this many usual intervals ...
STALL_FACTOR = 5.0
# ... and at least this long (sub-minute heartbeats jitter with GC pauses and network).
STALL_MIN_S = 60.0
# After the server comes back from an outage, a client needs up to its longest probe interval
# (client/runcast/settings.py probe_interval_max) to notice and replay its spool: the server
# counts itself as having heard every run until then.
STALL_RECONNECT_GRACE_S = 60.0
# Usual interval = median of the last this-many intervals (recent cadence, not the warm-up).
STALL_RECENT_INTERVALS = 50
# No progress for this many times the longest of those intervals is a stall even under
# STALL_FACTOR usual ones: a log with a steady cadence (an MLPerf run reporting every 286 s, not
# one interval off by more than 13%) stopped for 15 min went 1,186 s silent, 4.1 usual intervals,
# and was never flagged. Offline, at every sweep of the developer set's healthy replays, progress
# silence reached 1.5x the longest recent interval on one run and 2x on none (3x leaves room for
# an eval or checkpoint pause longer than any seen lately). The heartbeat (crash) limit is not
# tightened: only STALL_FACTOR applies to it.
STALL_LONGEST_FACTOR = 3.0
# (ETA section: end)

# --- Loss trend and divergence (forecasting/estimators/loss.py, divergence.py)
# (LOSS section: begin)
# Loss forecast (loss.py)
LOSS_MIN_POINTS = 3  # fewer finite points cannot even give a level and a direction
LOSS_MIN_FIT_POINTS = 4  # a 3-parameter curve needs at least one spare point to be checked
LOSS_FIT_MAX_POINTS = 400  # block medians: keeps 1M-point curves fast and drops lone spikes
LOSS_LEVEL_WINDOW_FRACTION = 0.05  # smoothed level = robust local line over the last 5% of points
LOSS_LEVEL_MIN_POINTS = 3  # a line through fewer points is just the last value
LOSS_LEVEL_MAX_POINTS = 500  # caps the window on dense logs: 500 steps average out batch noise
LOSS_WARMUP_SEARCH_FRACTION = 0.2  # the warm-up peak (if any) lies in the first 20% of points
LOSS_FIT_START_FRACTION = 0.02  # the first 2% of steps is warm-up transient, not power law
# Exponents c of L = a + b * s**-c tried by grid search: loss curves have c in ~0.05..1.5;
# a grid is robust where a nonlinear optimiser would wander off on a short noisy prefix.
LOSS_POWER_EXPONENTS = tuple(
    float(c)
    for c in (
        0.03,
        0.05,
        0.08,
        0.12,
        0.17,
        0.23,
        0.3,
        0.4,
        0.5,
        0.65,
        0.8,
        1.0,
        1.25,
        1.6,
        2.0,
        2.5,
        3.0,
    )
)
LOSS_RECENCY_POWER = 1.0  # fit weight grows linearly with step: recent shape matters most
# Log-log line (pure power law) through the recent loss: fitted on steps >= 25% of the current
# step, i.e. after the fast early drop whose slope would not continue.
LOSS_LOGLOG_START_FRACTION = 0.25
# Up to 3x the current step the line alone is used; further out it overshoots on runs without an
# anneal, so it is averaged with the a + b*s^-c fit, down to equal weights (10x and beyond).
LOSS_LOGLOG_FULL_RATIO = 3.0
LOSS_LOGLOG_MIN_WEIGHT = 0.5
LOSS_SCHEDULE_GRID = 2048  # uniform step grid for the learning-rate areas S1, S2
LOSS_ANNEAL_MOMENTUM = 0.999  # lambda of the annealing momentum (Tissue et al. 2024 default)
LOSS_LR_SLOPE_FRACTION = 0.1  # unlogged future LR continues the slope of the last 10% of steps
LOSS_TARGET_GRID = 512  # resolution of the search for the step where a target is reached
# Early loss forecasts: below this many points, or this share of the run's steps, the fitted
# change is damped towards the current level (linearly) and the forecast is flagged early. Four
# points is the fewest that fit a 3-parameter curve with one to check it (at 10 points the
# damping cost 60% more error at 25-50% on sparse val-loss logs); a 5% prefix lies in the fast
# early drop, whose slope does not continue.
LOSS_EARLY_MIN_POINTS = 4
LOSS_EARLY_MIN_SHARE = 0.05
LOSS_INTERVAL_Z = 1.2816  # 80% central interval of a normal error
LOSS_INTERVAL_GAP_SHARE = 0.5  # the unkept part of the extrapolated change is model uncertainty
LOSS_INTERVAL_REL_PER_LOG_HORIZON = 0.01  # 1% of the loss per e-fold of remaining steps
# The lower side of the interval allows the loss to keep its recent linear rate (an anneal),
# measured over this last share of the prefix: long enough to average out batch noise, short
# enough to see a warmdown that began in the last fifth of the run (see loss._anneal_drop).
LOSS_ANNEAL_WINDOW = 0.2
# Divergence detection (divergence.py); all on log-loss, windows counted in logged points
DIV_MIN_POINTS = 5  # below this there is no baseline to compare with (NaN is still flagged)
DIV_SPIKE_WINDOW = 50  # trailing baseline: long enough to ignore noise, short enough to track
DIV_SPIKE_MIN_HISTORY = 3  # a baseline from 3 points already exposes a x2 jump (short excerpts)
DIV_MAD_DIFF_TO_SD = 0.954  # median |x_t - x_t-1| of Gaussian noise = 0.954 sd
DIV_SCALE_FLOOR = 0.01  # 1% noise floor: a perfectly flat loss must not page on a 2% blip
DIV_SPIKE_Z_SINGLE = 8.0  # a lone point must be far outside the noise (z >= 8) ...
DIV_SPIKE_SINGLE_RATIO = 2.0  # ... and double the loss to page alone (else: one noisy batch)
DIV_SPIKE_Z_EXTREME = 20.0  # ... or lie 20 robust sd out (impossible as batch noise) ...
DIV_SPIKE_EXTREME_RATIO = 1.25  # ... and be 25% above baseline (smaller is not worth a page)
DIV_SPIKE_Z_PERSIST = 5.0  # moderate excursions (z >= 5) page when they persist ...
DIV_SPIKE_PERSIST_POINTS = 2  # ... for 2 consecutive logged points (not a single bad batch)
DIV_SPIKE_MIN_RATIO = 1.1  # and are at least 10% above baseline (smaller is noise to a human)
DIV_ONSET_Z = 3.0  # walking back from the alarm, the excursion starts where z drops below 3
DIV_RECENT_POINTS = 200  # a spike/NaN episode that ended over 200 points ago is not open
DIV_EPISODE_GAP_POINTS = 20  # alarms closer than this belong to one episode
DIV_TAIL_POINTS = 8192  # spikes are scored on the recent tail only (older ones are not open)
DIV_TREND_BINS = 1000  # rise/regression work on at most 1000 block medians of the curve
DIV_RISE_BINS = 100  # rise: the recent tail in 100 bins, so a slow climb beats bin noise
DIV_RISE_MIN_BINS = 8  # CUSUM needs a handful of increments
DIV_CUSUM_DRIFT = 0.5  # allowance per increment (in sd): ignores slow noise-level wander
DIV_CUSUM_LIMIT = 8.0  # decision limit (sd): ~8 sd of cumulated rise is not noise
DIV_RISE_MIN_FRACTION = 0.03  # and the smoothed loss must be up at least 3%
DIV_OSC_WINDOW = 50  # amplitude compared over three consecutive 50-point windows
DIV_OSC_BASE_POINTS = 21  # centred rolling median that the oscillation swings around
DIV_OSC_RATIO = 2.5  # newest window's swing at least 2.5x the oldest one's
DIV_OSC_MIN_AMPLITUDE = 0.03  # and at least ~3% mean swing, else it is ordinary batch noise
DIV_OSC_MIN_FLIPS = 0.3  # residual changes sign on >= 30% of steps: it swings, not drifts
DIV_REGRESSION_MIN_BINS = 10  # need some history to talk about an earlier level
DIV_REGRESSION_LEVEL_BINS = 5  # level now / best level = medians over 5 bins (not one blip)
DIV_REGRESSION_MIN_FRACTION = 0.05  # at least 5% above the best smoothed loss
# ... and above what noise alone gives: the best is the minimum of many noisy smoothed levels,
# biased low by about sqrt(2 ln n) of their noise; the level now must stand this many noise
# units of the difference (now minus best, two estimates) beyond that bias.
DIV_REGRESSION_NOISE_Z = 2.5
# The progress given back must span at least 10% of the run so far: a loss that wanders back to
# where it stood a few hundred steps ago is noise (spikes and rises have their own detectors);
# a regression is "back at its level of ten days ago".
DIV_REGRESSION_MIN_LOST_SHARE = 0.10
DIV_REGRESSION_ONSET_SHARE = 0.25  # onset: last time the loss was within 25% of the lost ground
# Validation curves (one point per evaluation, each averaged over many batches): see
# divergence._eval_rise_flag. On the developer set no healthy validation curve ever stood above
# its running best at two consecutive evaluations; these margins leave room for noisier eval sets.
DIV_EVAL_SUSTAIN_POINTS = 2  # the rise must hold at two consecutive evaluations (not one odd eval)
DIV_EVAL_MIN_HISTORY = 3  # evaluations before them: a best and a noise scale to compare with
DIV_EVAL_MIN_FRACTION = 0.05  # at least 5% above the best evaluation so far ...
DIV_EVAL_NOISE_MULT = 3.0  # ... and 3x the largest rise between two evaluations before them
DIV_LAYER_Z = 5.0  # a layer's grad norm "moved": 5 robust sd off its baseline, held 2 points
DIV_LAYER_LOOKBACK_FRACTION = 0.2  # look for first movers up to 20% of the run before onset
DIV_LAYERS_MAX = 5  # a list longer than this does not point anywhere
# (LOSS section: end)

# --- Stragglers (estimator straggler_detect.py)
# (STRAGGLER section: begin)
# A rank's compute is compared with the median rank's at the same step; a row counts only when
# at least this share of the ranks reported in it (a median of three ranks is not "the job").
STRAGGLER_MIN_REPORTING = 0.5
# Rows of history before any alarm: a rank's own level (its offset to the median rank) and the
# noise are estimated from the history so far; fewer rows than this give neither.
STRAGGLER_MIN_ROWS = 48  # three 16-row blocks: the wander of a rank's level is visible
# The level and noise are re-estimated at this many checkpoints over the history (each from the
# rows before it, so the scan stays causal), and from at most this many rows each (evenly spaced)
# so 1,024 ranks x a long history cost the same as a short one.
STRAGGLER_CHECKPOINTS = 16
STRAGGLER_LEVEL_MAX_ROWS = 400
# The noise is re-estimated only when the rows behind it have grown by this factor.
STRAGGLER_NOISE_GROWTH = 1.5
# Rows are autocorrelated (the trace holds 41-60% of values over two samples; lag-1
# autocorrelation 0.5-0.75), so the noise that matters for a persistent shift is that of block
# means, not of single rows: moving means over these many rows (x sqrt of it) give the long-run
# scale, the largest of them (ranks on a shared cluster also wander over tens of rows).
STRAGGLER_BLOCK_ROWS = (8, 16, 32, 64)
# A block length is measured only where the history holds this many blocks of it; a longer one
# is extrapolated (STRAGGLER_NOISE_GROWTH_EXP).
STRAGGLER_MEASURED_BLOCKS = 3
# The long-run noise is never below this multiple of the row noise: the rows are autocorrelated
# (above), so a shift that lasts must beat more than the noise of single rows.
STRAGGLER_LONGRUN_MIN_FACTOR = 1.5
# A block longer than a third of the history cannot be measured: its noise is extrapolated from
# the longest measured block's as x (b / b_measured)^this. 0.5 is a random walk (a level that
# wanders without bound), 0 a noise that no longer grows. The trace's wandering job (job 1)
# grows by 0.37, 0.11 and 0.42 per doubling from 8 to 64 rows, its quiet one (job 2) by 0.19,
# 0 and -0.3: 0.4 is about the steepest growth measured, where the random walk assumed before is
# a bound no series of the trace reaches (its thresholds, noise squared, were ~15% higher per
# extrapolated doubling). Bench (seeds 0 / 1): 0.4 finds 3 / 5 points more of the findable 5%
# injections at the same false alarms; 0.3 (job 1's mean growth) alarms more in clean 64-rank
# worlds (14 alarms against 6 on seed 1) and 0.2 exceeds the budget (1.7 per job-day).
STRAGGLER_NOISE_GROWTH_EXP = 0.4
# A rank's own long-run noise more than this many of its standard errors (sampling error of a
# MAD over its block means) above the ranks' middle is truly noisier than the rest (a noisy
# host), not sampling error: it keeps its own; the other ranks share the pool's. Three: in a
# job whose ranks share their noise about one rank in 700 keeps its own, by chance.
STRAGGLER_NOISE_OUTLIER_SE = 3.0
# The pool's long-run noise is the root mean square of the ranks' block means, each clipped at
# this many of their pooled (MAD) spreads: the normal's variance loses 1% to it, a straggler
# episode in the history (a block mean many spreads out) adds no more than a moderate tail.
STRAGGLER_WINSOR_MADS = 3.0
# Floor on the relative noise: timers resolve ~0.1%, and a perfectly steady rank must not make a
# 0.01% wobble an alarm.
STRAGGLER_MIN_NOISE = 0.003
# CUSUM bank on the log ratio to the median rank, each tuned for a shift twice its k (log units):
# 2%, 5-6%, and >= 20% (fast on big transient episodes). A shift is found by the CUSUM whose k
# is about half of it; the bank covers the sizes without one slow compromise.
STRAGGLER_CUSUM_K = (0.01, 0.03, 0.1)
# ... and the block length (STRAGGLER_BLOCK_ROWS) whose noise sets each one's threshold: roughly
# the rows it takes to find its shift (a 20% jump: a few rows; a 2% drift: tens), plus the
# absolute-level test last.
STRAGGLER_CUSUM_BLOCK = (64, 32, 8, 16)
# Single rows are clipped at this many (row-level) noise units before they enter a CUSUM: one
# heavy-tailed row (the trace's p99.9 is 1.17x) then cannot make an alarm alone.
STRAGGLER_CLIP_SIGMAS = 6.0
# The CUSUM's reference k grows by this many standard errors of the rank's estimated level (the
# level's own error would read as a shift; two made a 5% shift unreachable in a 100-row history).
STRAGGLER_LEVEL_SE = 1.0
# Each row is read in units of the job's cross-rank scale (a smoothed MAD of the ranks'
# deviations from their levels). A single row wider than that scale (a burst of contention that
# hits every rank: the CoV of the trace's jobs swings 1.3-4.5x between its p50 and p95) is shrunk
# further by its excess beyond this many standard errors of a spread over m series (1/sqrt(m)),
# so a burst does not push many CUSUMs over at once.
STRAGGLER_BURST_FACTOR = 1.5
# Each row's deviations are divided by the job's cross-rank spread (MAD) at that row, averaged
# over enough rows that its relative sampling error is about STRAGGLER_SCALE_ERROR: a MAD of m
# normal values has a relative error of ~1.17/sqrt(m) (asymptotic efficiency 37%), so ten ranks
# average 14 rows and 136 ranks or more use the row alone; never more than the max rows (a lasting
# change of the job's noise must reach the scale within a few tens of rows).
STRAGGLER_MAD_EFFICIENCY = 1.17
STRAGGLER_SCALE_ERROR = 0.1
STRAGGLER_SCALE_MAX_ROWS = 32
# An alarm needs its excursion to have lasted this many rows (the trace labels need three
# flagged samples for an episode): one or two tall rows are a blip.
STRAGGLER_PERSIST_ROWS = 3
# False-alarm budget: one per this many job-days, split over every test (ranks x CUSUMs + hosts:
# Bonferroni), with a safety factor on the Brownian approximation of the run length. It is 1:
# the approximation exp(2kh/sigma^2) is itself below Siegmund's corrected run length (h grows by
# ~1.17 sigma), the tests on one series are correlated (Bonferroni over them overcounts), and
# the factor of 4 had covered a noise read from a history of another regime, which the row scale
# now handles (bench, seeds 0 / 1: 0.38 / 0.08 false alarms per job-day at 1; 0 on the
# noise-change set).
STRAGGLER_FALSE_ALARM_DAYS = 1.0
STRAGGLER_FA_SAFETY = 1.0
# When the caller does not say how many rows a day holds, we assume one per 10 s (the trace's
# sampling; a client batching per-rank timings every few steps is in that range), clipped.
STRAGGLER_DEFAULT_ROW_S = 10.0
# A rank persistently this much slower than the median rank is a straggler whatever its own
# history says (the labelled "persistent offset" of the rank trace: median ratio >= 1.15).
STRAGGLER_LEVEL_RATIO = 1.15
# ... tested by a CUSUM tuned for 1.2x (k = half the log distance between 1.15 and 1.25).
STRAGGLER_LEVEL_K = 0.04
# An alarm is current while its CUSUM has not fallen more than this share of its threshold below
# its peak over the last this many rows (a recovered rank's CUSUM falls by k per row; a
# persistent one keeps climbing).
STRAGGLER_CURRENT_DROP = 0.5
STRAGGLER_CURRENT_ROWS = 50
# A rank in alarm, or this share of the way there on its most sensitive CUSUM, keeps its level:
# a straggler must not become its own normal.
STRAGGLER_FREEZE_SHARE = 0.5
# A host is the straggler when its ranks' mean shows the change and at least this share of its
# ranks moved (the host mean also moves when one of its ranks is very slow).
STRAGGLER_HOST_SHARE = 0.6
# Last to arrive: with wait_s, the rank that waits least is the one the others wait for. It is
# flagged when it is last in at least this share of recent rows (chance is 1/ranks) ...
STRAGGLER_LAST_SHARE = 0.5
# ... over this many recent rows, with at least this many ranks (with two, one is always last).
STRAGGLER_LAST_ROWS = 30
STRAGGLER_LAST_MIN_RANKS = 4
# (STRAGGLER section: end)

# --- GPU activity (estimators gpu_activity/: the defaults of its Settings, and the hang rule)
# (GPU section: begin)
# Near a phase boundary a sample may belong to either side (timestamps and sampling jitter): it
# is held against the band of every regime present within +-this many seconds.
GPU_TOLERANCE_S = 10.0
# An episode needs this many seconds of evidence (each reading's time to the next; for a burst
# weighed by how far past the band it lies), and is explained when what is left of it outside
# the run's event windows has less.
GPU_MIN_DURATION_S = 8.0
# Departing samples this far apart still belong to one episode.
GPU_MERGE_GAP_S = 6.0
# A sample departs when it lies outside its band by more than max(z * spread, rel * level).
GPU_Z = 5.0
GPU_REL = 0.05
# Floor of the spread, as a fraction of the level: 1-Hz readings quantise.
GPU_MIN_REL_SPREAD = 0.01
# The later passes' level is a centred rolling median over this window: long, so a burst or
# throttle covering less than half of it cannot become the reference.
GPU_WINDOW_S = 900.0
# Against peers, a series is compared as the median of the readings spanning this many
# seconds (episodes._peer_departure): the same time base whatever the sampling period.
GPU_SMOOTH_S = 3.0
# Idle's level is a low quantile: the GPU's idle is its floor, and foreign work only adds to it.
GPU_IDLE_QUANTILE = 0.2
# The first seconds of training (compilation, autotuning, the data pipeline filling) and
# of a resumed run are the run's own, whatever they look like: until the readings settle
# at the regime's level (learnt per run, _warmups), at most this long.
GPU_WARMUP_S = 30.0
# Passes of learning the levels without what the previous pass found (stops when stable);
# more than two measured no better on the dev set (F1 0.78 with four).
GPU_PASSES = 2
# Share of a regime a second level must hold to be taken as its usual one when nearer the
# reference (nearest_level): 10%, 30 s of a 5-min run; 20% left an untouched 13% start of a
# run unused.
GPU_LEVEL_SHARE = 0.1
# An up-episode longer than this is a plateau, not a burst.
GPU_PLATEAU_S = 600.0
# Step-time change points: relative shift in the median step time that splits a regime.
GPU_STEP_CHANGE_REL = 0.15
GPU_STEP_CHANGE_WINDOW = 8
# `hang`: GPUs busy while neither the step counter nor any event has moved for this many usual
# step (or eval) durations, and at least this long (the BLOOM-176B eval deadlock) ...
GPU_HANG_FACTOR = 20.0
GPU_HANG_MIN_S = 300.0
# ... where busy is at least this share of the run's usual training activity ...
GPU_HANG_BUSY_REL = 0.5
# ... in at least this share of the readings since the last progress.
GPU_HANG_BUSY_SHARE = 0.9
# How far apart the clocks of a run's nodes may be (clock.peer_offsets' search): the meters of
# Dell's 8xXE9680 are up to 17 s apart. The reach is more than half its runs' 36-s train/eval
# cycle, where a repeating pattern alone could match the next eval; the parts of a run that do
# not repeat (its start, its longer first block) decide, and every offset found on those runs
# matches the one fitted per node to the logged evals, to within a reading.
GPU_CLOCK_MAX_OFFSET_S = 30.0
# (GPU section: end)

# --- When the forecasting service raises and updates flags (forecasting/services.py)
# A deadline flag opens below 90% odds: the deadline-risk estimator reports the speed-up needed
# to get back to 90%, so anything under it is actionable. Alert rules pick their own cut-off
# (default 50%) from the flag's p_on_time.
FLAG_DEADLINE_AT_RISK_P = 0.9
# ... and closes only once the odds are clearly back: a run hovering at 88-91% is not news.
FLAG_DEADLINE_RESOLVE_P = 0.95
# Conditions that trend (rise, regression, oscillation, deadline, slip) raise only once every
# computation over a window has found them, and resolve only once none has: one noisy forecast
# neither pages nor un-pages. The window is a share of the run so far, within bounds: early in a
# run 45 s (three forecasts), a day into it 20 min. NaN, spike and stall are events: at once.
FLAG_SUSTAIN_FRACTION = 0.05
FLAG_SUSTAIN_MIN_S = 45.0
FLAG_SUSTAIN_MAX_S = 1200.0
FLAG_SUSTAIN_MIN_COMPUTATIONS = 3
# ... and, for the ETA-driven kinds (deadline, slip), over at least two progress reports: a run
# that reports every few minutes is otherwise judged on one reading recomputed three times.
FLAG_SUSTAIN_MIN_INPUTS = 2
# The computations found must reach back over two thirds of the window (forecasts are not evenly
# spaced: they follow the data) for it to count as covered.
FLAG_SUSTAIN_COVERAGE = 2 / 3
# A flag that resolved within the last hour comes back only when its condition has held four
# windows long: "at risk, fine, at risk" within an hour is one worry, not three messages.
FLAG_REOPEN_GUARD_S = 3600.0
FLAG_REOPEN_WINDOWS = 4.0
# An open deadline flag gets an "updated" row when its odds cross one of these, so an alert
# rule with any threshold sees the crossing (odds drifting 62% -> 61% is not news).
FLAG_DEADLINE_BANDS = (0.75, 0.5, 0.25, 0.1, 0.01)
# An open slip flag is updated each time the total slip doubles (1 h, 2 h, 4 h, ...).
FLAG_SLIP_BAND_BASE_S = 3600.0

# --- The deadline board's risk order (forecasting/board.py): which run a lead sees first
# (BOARD RISK section: begin)
# A run's risk is 1 - its odds of making the cutoff, plus the weights below; higher sorts first.
# Aimed at a cutoff with no deadline forecast yet: unknown is not safe, so it sits with a
# coin-flip run rather than below every run that has odds.
BOARD_RISK_NO_FORECAST = 0.5
# Each open flag adds this, up to BOARD_RISK_FLAGS_MAX flags: open problems break ties among
# runs with similar odds, yet three flags (0.45) do not outweigh a run that is likely late.
BOARD_RISK_PER_FLAG = 0.15
BOARD_RISK_FLAGS_MAX = 3
# Crashed, failed or stalled: above every running run whatever its odds (risk from odds and flags
# stays under 1.45), the run that most needs someone.
BOARD_RISK_TROUBLE = 3.0
# A run that ended (and is not in trouble) sinks below every running run of its lane: its
# question is answered.
BOARD_RISK_ENDED_SINK = 2.0
# (BOARD RISK section: end)

# -- the GPU check on the server (forecasting.gpu.check) ----------------------------------------
# How far back each check reads a host's agent series: an episode is judged once it has ended,
# and the sweep runs every 30 s, so half an hour holds every episode still being judged.
GPU_CHECK_LOOKBACK_S = 1800.0
# Runcast events are instants (an eval logged when it ran): activity within this of one is the
# run's. The message quotes it.
GPU_EVENT_WINDOW_S = 60.0
# The estimator's tolerance and relative margin on the server's 1-s bins (its Settings).
GPU_CHECK_TOLERANCE_S = 5.0
GPU_CHECK_REL = 0.1
# Below this mean utilisation the GPUs are not "busy": a silent run on idle GPUs is the liveness
# sweep's stall, not a hang.
GPU_HANG_BUSY_FLOOR = 20.0
# Per-process attribution of an episode (gpu_attribution.gpu_drivers): each process's SM share is
# held against its own level over this long before the episode (a trainer at 55% is not "what
# moved" unless it rose), and a process of no run that added at least this many SM-percent-
# seconds on a GPU during it (5% of the SM for the 8 s an episode needs) makes that GPU's part
# unexplained, whatever the run logged then: a run's checkpoint explains the run's activity,
# not a stranger's.
GPU_ATTRIBUTION_BEFORE_S = 60.0
GPU_FOREIGN_MIN_SM_S = 40.0
# Per-process data decides even where the GPU's utilisation stays in its band: a process of no
# run at or above this SM share for an episode's length (GPU_MIN_DURATION_S, readings no more
# than GPU_MERGE_GAP_S apart) adding GPU_FOREIGN_MIN_SM_S is an unexplained episode of its own.
# 5 %: GPU_FOREIGN_MIN_SM_S spread over GPU_MIN_DURATION_S.
GPU_FOREIGN_FLOOR = 5.0
# A GPU takes part in an episode found on the GPUs' mean when its own median over the episode
# moved from its median before it by this share of its level, or this many points (an idle GPU).
GPU_MOVED_REL = 0.1
GPU_MOVED_POINTS = 5.0

# -- stragglers on the server (forecasting.stragglers) ------------------------------------------
# Steps of every rank the detector reads (bounded in cells and rows by tracker.rank_timings).
STRAGGLER_WINDOW_STEPS = 2_000

# --- Loss episodes (estimators/episodes.py): a divergence judged against the run before it
# The reference is the level of the points just before the onset, over the spike detector's own
# baseline window: what "its recent level" meant when the episode began, never re-learned from
# the diverged stretch (a trailing baseline absorbs a loss that settled 9x higher in 50 points).
EPISODE_REFERENCE_POINTS = DIV_SPIKE_WINDOW
# "Now" is the median of the last few points: one good batch inside a diverged stretch is not a
# recovery, one bad batch after it is not a relapse.
EPISODE_RECENT_POINTS = 5
# Elevated: the recent level stands above the reference by more than its noise allows (z of the
# difference of two medians) and by at least the spike detector's smallest ratio.
EPISODE_BAND_Z = 3.0
# Recovered: back inside the band for as many points as separate two alarms of one episode
# (DIV_EPISODE_GAP_POINTS): a shorter calm inside a blow-up is the same episode.
EPISODE_RECOVER_POINTS = DIV_EPISODE_GAP_POINTS
# A spike still elevated this many points after its onset has diverged: the loss settled at a
# new level rather than coming back.
EPISODE_DIVERGED_POINTS = DIV_EPISODE_GAP_POINTS
# Where an episode began: the detectors' onset is where their own test fired (a growing
# oscillation's is the start of its second window, well after the swings began). Searched back
# over as many points as the oscillation test reads (three windows and its baseline) before that
# onset, for the earliest change of level or spread the points allow: every split whose
# likelihood is within the 95% chi-squared bound (one degree of freedom) of the best one.
EPISODE_ONSET_SEARCH_POINTS = 3 * DIV_OSC_WINDOW + DIV_SPIKE_WINDOW
EPISODE_ONSET_LR_BOUND = 3.84
