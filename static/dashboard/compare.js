// Compare: several runs' smoothed curves on one step axis, each with its loss forecast (dashed).
(function () {
  const el = document.getElementById("chart-compare");
  if (!el) return;
  const R = window.Runcast;
  const runs = JSON.parse(document.getElementById("compare-runs").textContent);
  if (!runs.length) return;
  const logBox = document.getElementById("cmp-log");
  const colors = ["#1f4e8c", "#d9822b", "#1e8e3e", "#c0392b", "#7b4bb3", "#11808a", "#8a6d1f", "#555d6e"];
  let overviews = null;
  // Run names come from trainers and the key from the URL: text, never markup.
  const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  const chart = R.rangeChart(el, async (x0, x1, buckets) => {
    if (!overviews) overviews = await Promise.all(runs.map((r) => R.getJSON(r.overview)));
    const key = (i) => el.dataset.key || overviews[i].loss_key || "loss";
    const series = await Promise.all(
      runs.map((r, i) => R.getJSON(r.series + "?key=" + encodeURIComponent(key(i)) + "&buckets=" + Math.min(800, buckets) + R.rangeQuery(x0, x1)))
    );
    const tables = [];
    const opts = [{ label: "step" }];
    series.forEach((d, i) => {
      const c = colors[i % colors.length];
      tables.push([d.x, R.ema(d.mean, Math.max(3, Math.round(d.x.length / 60)))]);
      opts.push({ label: runs[i].name, stroke: c, width: 2, points: { show: false } });
      // The dashed line is the run's loss forecast: drawn over its loss key only, never under
      // another key's name.
      const f = key(i) === overviews[i].loss_key ? overviews[i].loss_forecast : null;
      tables.push(f ? [f.x, f.p50] : [[], []]);
      opts.push({ label: runs[i].name + " forecast", stroke: c, width: 1.5, dash: [6, 4], spanGaps: true, points: { show: false } });
    });
    const usable = tables.filter((t) => t[0].length);
    // uPlot.join needs at least one table: with none (no run logs the key, or none in the
    // zoomed range) the chart is drawn empty on fixed scales rather than not at all.
    const empty = !usable.length;
    const data = empty ? [[]] : uPlot.join(usable);
    const kept = [opts[0]].concat(opts.slice(1).filter((_, i) => tables[i][0].length));
    const log = !empty && logBox.checked && R.positive(series.map((d) => d.mean));
    // x_min is null only for a run with no point of the key at all (not one zoomed past them).
    const missing = runs.map((_, i) => i).filter((i) => series[i].x_min == null);
    const keys = [...new Set(missing.map(key))].join(" or ");
    document.getElementById("compare-note").textContent = !missing.length
      ? ""
      : missing.length === runs.length
        ? "No run logs " + keys + "."
        : missing.map((i) => runs[i].name).join(", ") + (missing.length === 1 ? " does" : " do") + " not log " + keys + ".";
    const rows = runs.map((r, i) => {
      const l = overviews[i].loss;
      return "<tr><td><i class='sw' style='background:" + colors[i % colors.length] + "'></i>" + esc(r.name) + "</td><td>" + esc(key(i)) + "</td><td>" +
        (overviews[i].last_step ?? "–") + " / " + (overviews[i].total_steps ?? "–") + "</td><td>" +
        (l ? (+l.smoothed_last).toPrecision(4) + " → " + (+l.p50).toPrecision(4) + " (P10–P90 " + (+l.p10).toPrecision(4) + "–" + (+l.p90).toPrecision(4) + ")" : "–") + "</td></tr>";
    });
    document.getElementById("compare-table").innerHTML =
      "<table class='plain small'><thead><tr><th>Run</th><th>Key</th><th>Step</th><th>Loss now → at planned end</th></tr></thead><tbody>" + rows.join("") + "</tbody></table>";
    return {
      data,
      opts: {
        height: 420,
        scales: {
          // Empty: the chosen runs' steps so far on x, nothing to read on y.
          x: empty ? { time: false, auto: false, range: [0, Math.max(1, ...overviews.map((o) => o.last_step || 0))] } : { time: false },
          y: empty ? { auto: false, range: [0, 1] } : log ? { distr: 3, range: R.logRange } : {},
        },
        axes: [{ values: R.fmtStep, label: "step", labelSize: 18 }, empty ? { size: 56, values: (u, vals) => vals.map(() => "") } : { size: 56 }],
        series: kept,
        hooks: { ready: [(u) => (window.runcastCharts.compare = u)] },
      },
    };
  });
  logBox.addEventListener("change", () => chart.load());
  document.querySelector("[data-reset=compare]").addEventListener("click", () => chart.reset());
  chart.load().then(() => (el.dataset.ready = "1"));
})();
