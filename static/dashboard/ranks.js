// The run page's ranks panel: a ranks × time heat map of compute time relative to the median
// rank (per host by default for large jobs; pick a host to see its ranks) and the slowest ranks.
// The server aggregates (ranks.json): the page never receives more than rows × buckets numbers.
(function () {
  const panel = document.getElementById("ranks-panel");
  if (!panel) return;
  const R = window.Runcast;
  const el = document.getElementById("chart-ranks");
  const select = document.getElementById("ranks-host");
  const body = document.querySelector("#slowest-ranks tbody");
  const info = document.getElementById("info-ranks");
  let plot = null;

  // 1.0 (the median) is white; slower goes to red (saturating at +50%), faster to blue (-30%).
  // What the slowest-ranks table rounds to +0% is the median's pace and gets no tint: a lone
  // rank, or ranks all at one pace, are each their own median (1.0), not "slower".
  function colour(v) {
    if (v == null) return "rgba(200,200,205,0.5)";
    if (pct(v) === 0) return "rgba(255,255,255,0)";
    if (v >= 1) {
      const a = Math.min(1, (v - 1) / 0.5);
      return "rgba(192,57,43," + (0.08 + 0.92 * a).toFixed(3) + ")";
    }
    const a = Math.min(1, (1 - v) / 0.3);
    return "rgba(31,78,140," + (0.08 + 0.7 * a).toFixed(3) + ")";
  }

  // A ratio to the median as the table says it: a whole percent over (+) or under (-).
  function pct(ratio) {
    return Math.round((ratio - 1) * 100) || 0; // never "-0"
  }

  function cells(d) {
    return (u) => {
      const ctx = u.ctx;
      const n = d.x.length;
      if (!n) return;
      const step = n > 1 ? (d.x[n - 1] - d.x[0]) / (n - 1) : 1;
      ctx.save();
      d.values.forEach((row, r) => {
        const y0 = u.valToPos(r - 0.5, "y", true), y1 = u.valToPos(r + 0.5, "y", true);
        row.forEach((v, i) => {
          const x0 = u.valToPos(d.x[i] - step / 2, "x", true), x1 = u.valToPos(d.x[i] + step / 2, "x", true);
          ctx.fillStyle = colour(v);
          ctx.fillRect(x0, Math.min(y0, y1), Math.max(1, x1 - x0 + 0.5), Math.max(1, Math.abs(y1 - y0) - 0.5));
        });
      });
      ctx.restore();
    };
  }

  function draw(d) {
    const rows = d.rows.length;
    const height = Math.max(160, Math.min(520, 40 + rows * 18));
    const every = Math.max(1, Math.ceil(rows / 24)); // at most ~24 row labels
    const opts = {
      width: el.clientWidth || 800,
      height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: false }, y: { auto: false, range: [-0.5, Math.max(0.5, rows - 0.5)], dir: -1 } },
      axes: [
        R.axis({ values: R.fmtStep, label: "step", labelSize: 18 }),
        R.axis({
          size: 110,
          splits: () => d.rows.map((_, i) => i).filter((i) => i % every === 0),
          values: (u, splits) => splits.map((i) => d.rows[i] || ""),
          grid: { show: false },
        }),
      ],
      series: [{ label: "step" }, { label: "row", show: false }],
      hooks: { draw: [cells(d)], ready: [(u) => ((window.runcastCharts || {}).ranks = u)] },
    };
    if (plot) plot.destroy();
    plot = new uPlot(opts, [d.x, d.x.map(() => null)], el);
    plot.runcastHeatmap = d;
  }

  function slowest(d) {
    body.textContent = "";
    for (const s of d.slowest) {
      const tr = document.createElement("tr");
      const p = pct(s.ratio);
      for (const text of ["rank " + s.rank, s.host || "–", (p >= 0 ? "+" : "") + p + "%"]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      if (p >= 15) tr.className = "neg";
      body.appendChild(tr);
    }
  }

  async function load() {
    const host = select.value;
    const d = await R.getJSON(panel.dataset.ranks + "?buckets=" + R.bucketsFor(el) + (host ? "&host=" + encodeURIComponent(host) : ""));
    if (select.options.length <= 1) {
      for (const h of d.hosts) {
        const o = document.createElement("option");
        o.value = o.textContent = h;
        select.appendChild(o);
      }
    }
    draw(d);
    slowest(d);
    const many = (n, word) => n + " " + word + (n === 1 ? "" : "s");
    // The heading counts the job's GPUs (world size); say how many of them send timings, so
    // "8 ranks" above and "1 ranks reporting" below no longer read as a contradiction.
    const world = Number(panel.dataset.world) || 0;
    const reporting = (world > d.ranks ? d.ranks + " of " + world : String(d.ranks)) + (world === 1 || (!world && d.ranks === 1) ? " rank" : " ranks") + " reporting";
    const alone = d.ranks === 1 ? " (a single rank: no other rank to compare it with)" : "";
    const what = d.mode === "hosts" ? " · " + many(d.rows.length, "host") + " (each the slowest of its ranks)" : host ? " · " + many(d.rows.length, "rank") + " on " + host : "";
    const win = d.window ? " · steps " + d.window[0].toLocaleString() + "–" + d.window[1].toLocaleString() : "";
    info.textContent = reporting + alone + what + win;
    panel.dataset.ready = "1";
  }

  select.addEventListener("change", load);
  load();
  const root = document.getElementById("charts");
  if (root && root.dataset.active === "1") setInterval(load, 15000);
  window.addEventListener("resize", () => plot && plot.setSize({ width: el.clientWidth, height: plot.height }));
})();
