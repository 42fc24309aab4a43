// Shared chart helpers: JSON fetches (recorded for tests), smoothing, drag-to-zoom that asks the
// server for the finer data of the selected range, and the marker/threshold overlay.
window.Runcast = (function () {
  const fetches = [];
  window.runcastFetches = fetches;
  window.runcastCharts = {};

  async function getJSON(url) {
    fetches.push(url);
    const res = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!res.ok) throw new Error(url + " → " + res.status);
    return res.json();
  }

  // Exponential smoothing over bucket means, in index space; nulls pass through.
  function ema(ys, span) {
    const alpha = 2 / (span + 1);
    let s = null;
    return ys.map((y) => {
      if (y === null || !isFinite(y)) return s === null ? null : s;
      s = s === null ? y : s + alpha * (y - s);
      return s;
    });
  }

  function bucketsFor(el) {
    return Math.max(100, Math.min(2000, Math.round(el.clientWidth || 900)));
  }

  function rangeQuery(x0, x1) {
    return x0 == null ? "" : "&x0=" + encodeURIComponent(x0) + "&x1=" + encodeURIComponent(x1);
  }

  // Drag-select asks for the range's own data instead of stretching the overview.
  function zoomCursor(onZoom) {
    return {
      cursor: { drag: { x: true, y: false, setScale: false } },
      hooks: {
        setSelect: [
          (u) => {
            if (u.select.width < 4) return;
            const x0 = u.posToVal(u.select.left, "x");
            const x1 = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            onZoom(x0, x1);
          },
        ],
      },
    };
  }

  const MARK = {
    checkpoint: { color: "rgba(90,100,120,0.55)", tick: 7, label: false },
    eval: { color: "rgba(120,70,180,0.7)", tick: 12, label: false },
    resume: { color: "#d9822b", dash: [4, 3], label: true },
    restart: { color: "#d9822b", dash: [4, 3], label: true },
    onset: { color: "#c0392b", label: true, width: 1.5 },
    rollback: { color: "#1e8e3e", dash: [6, 3], label: true, width: 1.5 },
  };

  // Vertical markers at steps, and horizontal reference lines ({y, label, color, dash}).
  function overlay(getMarkers, getLines) {
    return {
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            const { left, top, width, height } = u.bbox;
            const px = devicePixelRatio || 1;
            ctx.save();
            ctx.font = 11 * px + "px system-ui, sans-serif";
            ctx.textBaseline = "top";
            let lastLabelX = -1e9;
            let row = 0;
            for (const m of getMarkers() || []) {
              const style = MARK[m.kind];
              if (!style) continue;
              const x = Math.round(u.valToPos(m.step, "x", true));
              if (x < left || x > left + width) continue;
              ctx.strokeStyle = style.color;
              ctx.lineWidth = (style.width || 1) * px;
              ctx.setLineDash((style.dash || []).map((d) => d * px));
              ctx.beginPath();
              const y0 = style.tick ? top + height - style.tick * px : top;
              ctx.moveTo(x, y0);
              ctx.lineTo(x, top + height);
              ctx.stroke();
              if (style.label) {
                // Stagger labels that would collide with the previous one.
                row = x - lastLabelX < 110 * px ? (row + 1) % 3 : 0;
                lastLabelX = x;
                const text = m.label;
                const tw = ctx.measureText(text).width;
                const tx = x + 3 * px + tw > left + width ? x - 3 * px - tw : x + 3 * px;
                const ty = top + 3 * px + row * 14 * px;
                ctx.fillStyle = "rgba(255,255,255,0.85)";
                ctx.fillRect(tx - 1, ty - 1, tw + 2, 13 * px);
                ctx.fillStyle = style.color;
                ctx.fillText(text, tx, ty);
              }
            }
            for (const line of getLines() || []) {
              const y = Math.round(u.valToPos(line.y, line.scale || "y", true));
              if (!isFinite(y) || y < top || y > top + height) continue;
              ctx.strokeStyle = line.color;
              ctx.lineWidth = 1.5 * px;
              ctx.setLineDash((line.dash || []).map((d) => d * px));
              ctx.beginPath();
              ctx.moveTo(left, y);
              ctx.lineTo(left + width, y);
              ctx.stroke();
              const tw = ctx.measureText(line.label).width;
              const ty = line.above ? y - 15 * px : y + 2 * px;
              const tx = line.left ? left + 4 * px : left + width - tw - 4 * px;
              ctx.fillStyle = "rgba(255,255,255,0.85)";
              ctx.fillRect(tx - 2 * px, ty - 1, tw + 4 * px, 13 * px);
              ctx.fillStyle = line.color;
              ctx.fillText(line.label, tx, ty);
            }
            ctx.restore();
          },
        ],
      },
    };
  }

  function merge(...parts) {
    const out = { hooks: {} };
    for (const p of parts) {
      for (const [k, v] of Object.entries(p)) {
        if (k === "hooks") {
          for (const [h, fns] of Object.entries(v)) out.hooks[h] = (out.hooks[h] || []).concat(fns);
        } else out[k] = v;
      }
    }
    return out;
  }

  const fmtStep = (u, vals) => vals.map((v) => (v == null ? "" : Math.abs(v) >= 1e4 ? (v / 1e3).toFixed(v % 1e3 ? 1 : 0) + "k" : String(v)));
  const dtf = new Intl.DateTimeFormat(undefined, { weekday: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  const fmtEpoch = (v) => (v == null ? "–" : dtf.format(new Date(v * 1000)));
  const clock = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", hourCycle: "h23" });
  const fmtClock = (v) => (v == null ? "" : clock.format(new Date(v * 1000)));
  // A log axis fitted to the data (uPlot's default snaps to whole decades: 1–100 for a 2–22 loss).
  // Ends snap to 1, 1.5, 2, 3, 5, 7 × 10^k so the end labels read as round numbers.
  const NICE = [1, 1.5, 2, 3, 5, 7, 10];
  function niceLog(v, up) {
    const k = Math.floor(Math.log10(v));
    const m = v / Math.pow(10, k);
    const pick = up ? NICE.find((n) => n >= m) : NICE.slice().reverse().find((n) => n <= m);
    return pick * Math.pow(10, k);
  }
  const logRange = (u, lo, hi) => (lo > 0 && hi > 0 ? [niceLog(lo / 1.02, false), niceLog(hi * 1.02, true)] : [lo, hi]);

  function positive(arrays) {
    for (const a of arrays) for (const v of a || []) if (v !== null && v <= 0) return false;
    return true;
  }

  // One chart whose data depends on the visible step range: fetch(x0, x1) → {data, opts}.
  function rangeChart(el, build) {
    const state = { x0: null, x1: null, plot: null, busy: false };
    async function load() {
      if (state.busy) return;
      state.busy = true;
      try {
        const { data, opts } = await build(state.x0, state.x1, bucketsFor(el));
        const full = merge(
          { width: el.clientWidth || 900, height: el.classList.contains("short") ? 240 : 340 },
          zoomCursor((x0, x1) => {
            state.x0 = x0;
            state.x1 = x1;
            load();
          }),
          opts
        );
        if (state.x0 != null) {
          full.scales = full.scales || {};
          full.scales.x = Object.assign({}, full.scales.x || {}, { auto: false, range: [state.x0, state.x1] });
        }
        if (state.plot) state.plot.destroy();
        state.plot = new uPlot(full, data, el);
        state.plot.over.addEventListener("dblclick", reset);
        el.dataset.zoomed = state.x0 == null ? "0" : "1";
      } finally {
        state.busy = false;
      }
    }
    function reset() {
      state.x0 = state.x1 = null;
      load();
    }
    window.addEventListener("resize", () => state.plot && state.plot.setSize({ width: el.clientWidth, height: state.plot.height }));
    return { load, reset, state };
  }

  return { getJSON, ema, fmtClock, logRange, bucketsFor, rangeQuery, overlay, merge, fmtStep, fmtEpoch, positive, rangeChart, zoomCursor };
})();
