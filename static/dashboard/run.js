// The run page: loss (envelope + smoothed + forecast fan + markers), ETA history, throughput and
// any other metric. Every chart re-fetches for the visible range on zoom and while the run is live.
(function () {
  const root = document.getElementById("charts");
  if (!root) return;
  const R = window.Runcast;
  const urls = root.dataset;
  let ov = null; // overview.json: ETA history, deadline, loss forecast, target, markers

  async function refreshOverview() {
    ov = await R.getJSON(urls.overview);
  }

  function info(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }

  function sourceText(d) {
    // Name every NaN/Inf step up to 8; past that say how many there are (the server sends up to
    // 1,000): a list cut at 8 with no count read as 8 beside the chart's "NaN/Inf ×18".
    const nf = d.nonfinite_steps || [];
    const list = (steps) => steps.map((s) => s.toLocaleString()).join(", ");
    const count = nf.length >= 1000 ? "1,000+" : nf.length.toLocaleString();
    const nonfinite = !nf.length ? "" : nf.length <= 8 ? " · NaN/Inf at steps " + list(nf) : " · NaN/Inf at " + count + " steps, first " + list(nf.slice(0, 8)) + ", …";
    return d.points.toLocaleString() + " points → " + d.x.length + " buckets (" + d.source + ", every bucket's min and max kept)" + nonfinite + " · drag to zoom, double-click to reset";
  }

  // --- loss ----------------------------------------------------------------------------------
  const lossEl = document.getElementById("chart-loss");
  const logBox = document.getElementById("loss-log");
  const loss = R.rangeChart(lossEl, async (x0, x1, buckets) => {
    const key = (ov && ov.loss_key) || urls.lossKey;
    const d = await R.getJSON(urls.series + "?key=" + encodeURIComponent(key) + "&buckets=" + buckets + R.rangeQuery(x0, x1));
    const smooth = R.ema(d.mean, Math.max(3, Math.round(d.x.length / 60)));
    const tables = [[d.x, d.min, d.max, d.mean, smooth]];
    const f = ov && ov.loss_forecast;
    if (f) tables.push([f.x, f.p10, f.p50, f.p90]);
    else tables.push([[], [], [], []]);
    const data = tables[1][0].length ? uPlot.join(tables) : tables[0].concat([[], [], []].map(() => d.x.map(() => null)));
    const log = logBox.checked && R.positive([d.min]);
    info("info-loss", sourceText(d));
    lossEl.dataset.points = String(d.points);
    return {
      data,
      opts: R.merge(
        {
          scales: { x: { time: false }, y: log ? { distr: 3, range: R.logRange } : {} },
          axes: [R.axis({ values: R.fmtStep, label: "step", labelSize: 18 }), R.axis()],
          series: [
            { label: "step" },
            { label: "min", stroke: "rgba(31,78,140,0.25)", width: 1, points: { show: false } },
            { label: "max", stroke: "rgba(31,78,140,0.25)", width: 1, points: { show: false } },
            { label: "mean", stroke: "rgba(31,78,140,0.45)", width: 1, points: { show: false } },
            { label: "smoothed", stroke: "#1f4e8c", width: 2, points: { show: false } },
            { label: "P10", stroke: "rgba(217,130,43,0.6)", width: 1, dash: [4, 4], spanGaps: true, points: { show: false } },
            { label: "forecast P50", stroke: "#d9822b", width: 2, dash: [6, 4], spanGaps: true, points: { show: false } },
            { label: "P90", stroke: "rgba(217,130,43,0.6)", width: 1, dash: [4, 4], spanGaps: true, points: { show: false } },
          ],
          bands: [
            { series: [2, 1], fill: "rgba(31,78,140,0.14)" },
            { series: [7, 5], fill: "rgba(217,130,43,0.14)" },
          ],
        },
        R.overlay(
          () => (ov ? ov.markers.filter((m) => m.kind !== "straggler") : []),
          () => (ov && ov.target != null ? [{ y: ov.target, label: "target " + ov.target, color: "#1e8e3e", dash: [8, 4] }] : []),
          () => d.nonfinite_steps
        ),
        { hooks: { ready: [(u) => (window.runcastCharts.loss = u)] } }
      ),
    };
  });
  logBox.addEventListener("change", () => loss.load());

  // --- ETA history ---------------------------------------------------------------------------
  const etaEl = document.getElementById("chart-eta");
  let etaPlot = null;
  function drawEta() {
    const h = (ov && ov.eta_history) || [];
    const data = [h.map((r) => r[0]), h.map((r) => r[1]), h.map((r) => r[2]), h.map((r) => r[3])];
    const dl = ov && ov.deadline;
    const lines = [];
    // Labels at the left end: the right end is where the latest forecast always is, and a label
    // there covered the newest P50 and its whisker.
    if (dl) {
      lines.push({ y: dl.cutoff, label: "cutoff " + R.fmtEpoch(dl.cutoff), color: "#c0392b", above: true, left: true });
      if (dl.train_by !== dl.cutoff) lines.push({ y: dl.train_by, label: "train by " + R.fmtEpoch(dl.train_by), color: "#c0392b", dash: [6, 4], left: true });
    }
    // Early forecasts are wide; the range follows the medians, the latest band and the cutoff
    // so the recent history stays readable (the early band is clipped, not hidden).
    const last = h.length ? h[h.length - 1] : null;
    const ys = h.map((r) => r[2]).concat(lines.map((l) => l.y)).concat(last ? [last[1], last[3]] : []).filter((v) => v != null);
    const lo = Math.min(...ys), hi = Math.max(...ys);
    const pad = Math.max(600, (hi - lo) * 0.25);
    // x runs from the run's start to the latest forecast (a minute at least), so one early
    // forecast sits where it was made, not at the edge of a fixed hour.
    const first = h.length ? h[0][0] : null;
    const x0 = ov && ov.started_at != null && first != null ? Math.min(ov.started_at, first) : first;
    const x1 = last ? Math.max(last[0], x0 + 60) : null;
    const xpad = (x1 - x0) * 0.03;
    const few = h.length <= 3;
    const opts = R.merge(
      {
        width: etaEl.clientWidth || 600,
        height: 240,
        scales: {
          x: { time: true, auto: false, range: () => [x0, x1 + xpad] },
          y: { time: true, auto: false, range: () => [lo - pad, hi + pad] },
        },
        axes: [
          R.timeAxis({ label: "forecast made (" + R.zoneName(last && last[0]) + ")", labelSize: 18 }),
          R.timeAxis({ label: "finish (" + R.zoneName(last && last[2]) + ")", labelSize: 18, space: 40 }),
        ],
        series: [
          { label: "forecast at", value: (u, v) => R.fmtEpoch(v) },
          { label: "P10", stroke: "rgba(31,78,140,0.35)", value: (u, v) => R.fmtEpoch(v), points: { show: false } },
          { label: "P50 finish", stroke: "#1f4e8c", width: 2, value: (u, v) => R.fmtEpoch(v), points: { show: h.length < 40, size: few ? 10 : 6, width: 2, fill: "#1f4e8c" } },
          { label: "P90", stroke: "rgba(31,78,140,0.35)", value: (u, v) => R.fmtEpoch(v), points: { show: false } },
        ],
        bands: [{ series: [3, 1], fill: "rgba(31,78,140,0.12)" }],
      },
      R.overlay(() => [], () => lines),
      // With a forecast or three the band has no width: each one's P10–P90 is a whisker.
      { hooks: { draw: few ? [whiskers] : [], ready: [(u) => (window.runcastCharts.eta = u)] } }
    );
    if (etaPlot) etaPlot.destroy();
    if (!h.length) {
      // An ended run will get none: "needs a planned total" read as a fault on a finished run
      // that had both (it ended before the first forecast).
      info("info-eta", urls.active === "1" ? "No ETA forecast yet: the run needs a planned total and a few progress points." : "No ETA forecast: the run ended before one was made.");
      return;
    }
    etaPlot = new uPlot(opts, data, etaEl);
    // Forecasts rebuilt from history the run logged before Runcast first forecast it (an
    // import, a spooled outage, the demo's replay) are said as such: nobody saw them live.
    const rebuilt = (ov && ov.eta_history_rebuilt) || 0;
    info("info-eta", h.length + (h.length === 1 ? " forecast" : " forecasts") + (rebuilt ? " (the first " + rebuilt + " rebuilt from the history it logged before its first forecast)" : "") + " · latest median finish " + R.fmtEpoch(last[2]));
  }

  function whiskers(u) {
    const ctx = u.ctx;
    const px = devicePixelRatio || 1;
    ctx.save();
    ctx.strokeStyle = "rgba(31,78,140,0.6)";
    ctx.lineWidth = 1.5 * px;
    u.data[0].forEach((t, i) => {
      const p10 = u.data[1][i], p90 = u.data[3][i];
      if (p10 == null || p90 == null) return;
      const x = Math.round(u.valToPos(t, "x", true));
      const ya = u.valToPos(p10, "y", true), yb = u.valToPos(p90, "y", true);
      ctx.beginPath();
      ctx.moveTo(x, ya);
      ctx.lineTo(x, yb);
      for (const y of [ya, yb]) {
        ctx.moveTo(x - 5 * px, y);
        ctx.lineTo(x + 5 * px, y);
      }
      ctx.stroke();
    });
    ctx.restore();
  }

  // --- throughput ----------------------------------------------------------------------------
  const rateEl = document.getElementById("chart-rate");
  const rate = R.rangeChart(rateEl, async (x0, x1, buckets) => {
    const d = await R.getJSON(urls.throughput + "?buckets=" + Math.min(400, buckets) + R.rangeQuery(x0, x1));
    const ms = d.rate.map((r) => (r ? 1000 / r : null));
    info("info-rate", d.key ? "from " + d.key + " (" + d.source + ") · " + d.x.length + " buckets" : "no progress series yet");
    return {
      data: [d.x, d.min, d.max, d.rate, ms],
      // A straggler's onset: from there the whole job runs at the slow rank's pace.
      opts: R.merge(
        R.overlay(() => (ov ? ov.markers.filter((m) => m.kind === "straggler") : []), () => []),
        { hooks: { ready: [(u) => (window.runcastCharts.rate = u)] } },
        {
        scales: { x: { time: false }, ms: {} },
        axes: [
          R.axis({ values: R.fmtStep }),
          R.axis({ label: "steps/s", labelSize: 18 }),
          R.axis({ scale: "ms", side: 1, label: "ms/step", labelSize: 18, grid: { show: false } }),
        ],
        series: [
          { label: "step" },
          { label: "slowest", stroke: "rgba(30,142,62,0.25)", points: { show: false } },
          { label: "fastest", stroke: "rgba(30,142,62,0.25)", points: { show: false } },
          { label: "steps/s", stroke: "#1e8e3e", width: 2, points: { show: false } },
          { label: "ms/step", scale: "ms", stroke: "rgba(120,70,180,0.8)", width: 1, dash: [4, 3], points: { show: false } },
        ],
        bands: [{ series: [2, 1], fill: "rgba(30,142,62,0.12)" }],
        }
      ),
    };
  });

  // --- other metrics -------------------------------------------------------------------------
  const metricEl = document.getElementById("chart-metric");
  const select = document.getElementById("metric-key");
  const metric = R.rangeChart(metricEl, async (x0, x1, buckets) => {
    const key = select.value;
    const d = await R.getJSON(urls.series + "?key=" + encodeURIComponent(key) + "&buckets=" + buckets + R.rangeQuery(x0, x1));
    info("info-metric", sourceText(d));
    return {
      data: [d.x, d.min, d.max, d.mean],
      opts: {
        scales: { x: { time: false } },
        axes: [R.axis({ values: R.fmtStep }), R.axis()],
        series: [
          { label: "step" },
          { label: "min", stroke: "rgba(80,80,90,0.3)", points: { show: false } },
          { label: "max", stroke: "rgba(80,80,90,0.3)", points: { show: false } },
          { label: key, stroke: "#333a48", width: 1.5, points: { show: false } },
        ],
        bands: [{ series: [2, 1], fill: "rgba(80,80,90,0.12)" }],
        hooks: { ready: [(u) => (window.runcastCharts.metric = u)] },
      },
    };
  });
  if (select) select.addEventListener("change", () => metric.reset());

  const charts = { loss, rate, metric };
  document.querySelectorAll("[data-reset]").forEach((b) => b.addEventListener("click", () => charts[b.dataset.reset].reset()));

  async function refresh() {
    await refreshOverview();
    drawEta();
    await Promise.all([loss.load(), rate.load(), select && select.value ? metric.load() : null]);
    root.dataset.ready = "1";
  }
  refresh();
  // Live: re-read every chart at its current zoom while the run is active.
  if (urls.active === "1") setInterval(refresh, 15000);
  window.addEventListener("resize", () => etaPlot && etaPlot.setSize({ width: etaEl.clientWidth, height: 240 }));
})();
