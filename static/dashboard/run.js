// Draws one metric: the min/max envelope of every bucket (so no spike is hidden) and its mean.
(function () {
  const el = document.getElementById("chart");
  if (!el) return;
  const select = document.getElementById("metric-key");
  const info = document.getElementById("chart-info");
  let plot = null;

  async function draw(key) {
    const url = el.dataset.url + "?key=" + encodeURIComponent(key) + "&buckets=1000";
    const res = await fetch(url, { credentials: "same-origin" });
    const d = await res.json();
    const data = [d.x, d.min, d.max, d.mean];
    const opts = {
      width: el.clientWidth || 900,
      height: 360,
      scales: { x: { time: false } },
      series: [
        { label: "step" },
        { label: "min", stroke: "rgba(60,120,200,0.35)" },
        { label: "max", stroke: "rgba(60,120,200,0.35)" },
        { label: key, stroke: "#1f4e8c", width: 1.5 },
      ],
      bands: [{ series: [2, 1], fill: "rgba(60,120,200,0.15)" }],
    };
    if (plot) plot.destroy();
    plot = new uPlot(opts, data, el);
    el.dataset.drawnPoints = String(d.points);
    const nonfinite = d.nonfinite_steps.length
      ? " · non-finite values at steps " + d.nonfinite_steps.slice(0, 10).join(", ")
      : "";
    info.textContent = d.points + " points in " + d.x.length + " buckets" + nonfinite;
  }

  draw(el.dataset.key);
  if (select) select.addEventListener("change", () => draw(select.value));
})();
