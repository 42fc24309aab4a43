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
    onset: { color: "#c0392b", label: true, width: 2.5, strong: true },
    rollback: { color: "#1e8e3e", dash: [6, 3], label: true, width: 2, strong: true },
    straggler: { color: "#b0500f", dash: [5, 3], label: true, width: 2, strong: true },
  };
  const NONFINITE = "#c0392b";

  // Steps as short text that stays exact: 900, 12.5k, 10.25k, 12,345 (a tick at 10,250 read
  // "10.3k" and a rollback checkpoint at step 12,250 "12.3k": a step nobody can find).
  function stepText(v) {
    if (v == null) return "";
    const r = Math.round(v);
    if (Math.abs(v - r) > 1e-6) return v.toLocaleString("en-US", { maximumFractionDigits: 2 });
    if (Math.abs(r) >= 1e4 && r % 10 === 0) return +(r / 1e3).toFixed(2) + "k";
    return Math.abs(r) >= 1e4 ? r.toLocaleString("en-US") : String(r);
  }

  function markerText(m) {
    if (m.kind === "onset" || m.kind === "rollback" || m.kind === "straggler") return m.label + " · step " + stepText(m.step);
    return m.label;
  }

  // Consecutive NaN/Inf steps closer than `px` canvas pixels become one [from, to, count] group.
  function groupSteps(u, steps, px) {
    const out = [];
    for (const s of steps || []) {
      const last = out[out.length - 1];
      if (last && u.valToPos(s, "x", true) - u.valToPos(last[1], "x", true) <= px) {
        last[1] = s;
        last[2]++;
      } else out.push([s, s, 1]);
    }
    return out;
  }

  // Vertical markers at steps, NaN/Inf steps, and horizontal reference lines
  // ({y, label, color, dash}). Labels are placed where they overlap nothing drawn before them;
  // what was drawn is kept on the chart (u.runcastDrawn, canvas pixels) for the tests.
  function overlay(getMarkers, getLines, getNonfinite) {
    return {
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            const { left, top, width, height } = u.bbox;
            const px = devicePixelRatio || 1;
            const drawn = [];
            const boxes = [];
            const lineH = 15 * px;
            const overlaps = (b) => boxes.some((o) => b[0] < o[0] + o[2] && o[0] < b[0] + b[2] && b[1] < o[1] + o[3] && o[1] < b[1] + b[3]);
            // A label beside x (right of it, or left near the right edge), in the first free row
            // from the top, else from the bottom; fixed = the line labels that go where they are.
            function label(text, x, color, strong, fixed) {
              ctx.font = (strong ? "600 " : "") + 11 * px + "px system-ui, sans-serif";
              const tw = ctx.measureText(text).width;
              const w = tw + 6 * px, h = 14 * px;
              let bx = x + 8 * px + w > left + width ? x - 8 * px - w : x + 8 * px;
              bx = Math.max(left, bx);
              let by = fixed;
              if (by == null) {
                const rows = [];
                for (let r = 0; top + 2 * px + r * lineH + h <= top + height; r++) rows.push(top + 2 * px + r * lineH);
                by = rows.find((y) => !overlaps([bx, y, w, h]));
                if (by == null) by = rows[0];
              }
              const box = [bx, by, w, h];
              boxes.push(box);
              ctx.fillStyle = "rgba(255,255,255,0.9)";
              ctx.fillRect(bx, by, w, h);
              if (strong) {
                ctx.setLineDash([]);
                ctx.lineWidth = px;
                ctx.strokeStyle = color;
                ctx.strokeRect(bx + 0.5, by + 0.5, w - 1, h - 1);
              }
              ctx.fillStyle = color;
              ctx.fillText(text, bx + 3 * px, by + 2 * px);
              return box;
            }
            ctx.save();
            ctx.textBaseline = "top";
            ctx.textAlign = "left"; // uPlot leaves its axis alignment on the context
            // Reference lines first: their labels sit where they are, the rest avoid them.
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
              ctx.font = 11 * px + "px system-ui, sans-serif";
              const tw = ctx.measureText(line.label).width + 6 * px;
              const ty = Math.min(Math.max(line.above ? y - 16 * px : y + 2 * px, top), top + height - 14 * px);
              const tx = line.left ? left + 4 * px : left + width - tw - 4 * px;
              const box = label(line.label, tx - 8 * px, line.color, false, ty);
              drawn.push({ kind: "line", label: line.label, y, box });
            }
            // NaN/Inf steps: a red band over the steps and a triangle on the top edge.
            for (const [from, to, n] of groupSteps(u, getNonfinite ? getNonfinite() : [], 6 * px)) {
              const x0 = Math.round(u.valToPos(from, "x", true));
              const x1 = Math.round(u.valToPos(to, "x", true));
              if (x1 < left || x0 > left + width) continue;
              ctx.fillStyle = "rgba(192,57,43,0.16)";
              ctx.fillRect(x0 - px, top, Math.max(3 * px, x1 - x0 + 2 * px), height);
              ctx.fillStyle = NONFINITE;
              ctx.beginPath();
              const xm = (x0 + x1) / 2;
              ctx.moveTo(xm - 6 * px, top);
              ctx.lineTo(xm + 6 * px, top);
              ctx.lineTo(xm, top + 9 * px);
              ctx.closePath();
              ctx.fill();
              const text = "NaN/Inf " + (from === to ? "at step " + stepText(from) : "×" + n + " at steps " + stepText(from) + "–" + stepText(to));
              drawn.push({ kind: "nonfinite", step: from, x: x0, label: text, text, pending: true });
            }
            const pending = [];
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
              const item = { kind: m.kind, step: m.step, x, label: markerText(m) };
              drawn.push(item);
              if (style.label) pending.push([item, style]);
            }
            ctx.setLineDash([]);
            // Labels last, strongest first, so divergence labels get the top rows.
            const order = drawn.filter((d) => d.pending).map((d) => [d, { color: NONFINITE, strong: true }]).concat(pending);
            order.sort((a, b) => (b[1].strong ? 1 : 0) - (a[1].strong ? 1 : 0));
            for (const [item, style] of order) {
              delete item.pending;
              delete item.text;
              item.box = label(item.label, item.x, style.color, style.strong);
            }
            ctx.restore();
            u.runcastDrawn = drawn;
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

  const fmtStep = (u, vals) => vals.map((v) => (v == null ? "" : Math.abs(v) >= 1e4 ? stepText(v) : String(v)));

  // --- times: every time shown names its zone ------------------------------------------------
  const formats = {};
  const fmt = (o, d) => (formats[JSON.stringify(o)] ||= new Intl.DateTimeFormat(undefined, o)).format(d);
  const HM = { hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
  const HMS = { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };
  const WEEKDAY = { weekday: "short" };
  const DAY = { weekday: "short", day: "numeric", month: "short" };
  // The viewer's zone at that moment with its offset ("CET (UTC+1)", "UTC+1"), as every
  // <time> on the page names it (time.js, loaded first).
  function zoneName(v) {
    return window.runcastZone(v == null ? new Date() : new Date(v * 1000));
  }
  const fmtEpoch = (v) => (v == null ? "–" : fmt({ weekday: "short", ...HM }, new Date(v * 1000)) + " " + zoneName(v));
  const fmtClock = (v) => (v == null ? "" : fmt(HM, new Date(v * 1000)));

  // Tick steps for time axes, seconds to weeks (uPlot's own list jumps from 1 to 5 minutes).
  const m = 60, hr = 3600, day = 86400;
  const TIME_INCRS = [1, 2, 5, 10, 15, 30, m, 2 * m, 5 * m, 10 * m, 15 * m, 20 * m, 30 * m, hr, 2 * hr, 3 * hr, 4 * hr, 6 * hr, 8 * hr, 12 * hr, day, 2 * day, 3 * day, 7 * day, 14 * day, 28 * day, 91 * day, 182 * day, 365 * day];
  // Tick labels that follow the tick step: 14:02:30 under a minute, 14:30 under a day (the first
  // tick of each day with its weekday, a midnight tick as the date), dates from a day up.
  function timeValues(u, splits, axisIdx, space, incr) {
    let prevDay = null;
    return splits.map((v) => {
      if (v == null) return null;
      const d = new Date(v * 1000);
      const dayKey = d.toDateString();
      const newDay = dayKey !== prevDay;
      prevDay = dayKey;
      if (incr >= day) return fmt(DAY, d);
      if (incr >= m && d.getHours() === 0 && d.getMinutes() === 0) return fmt(DAY, d);
      const t = fmt(incr < m ? HMS : HM, d);
      return newDay ? fmt(WEEKDAY, d) + " " + t : t;
    });
  }

  // --- numbers: ticks that are distinct and read back as their values -------------------------
  const trimExp = (t) => t.replace(/\.?0+e/, "e").replace("e+", "e");
  function numText(v, mode, p) {
    if (v === 0) return "0";
    if (mode === "exp") return trimExp(v.toExponential(p));
    if (mode === "sig") return Number(v.toPrecision(p)).toLocaleString(undefined, { maximumFractionDigits: 20 });
    return v.toLocaleString(undefined, { minimumFractionDigits: p, maximumFractionDigits: p });
  }
  function numRound(v, mode, p) {
    if (mode === "exp") return Number(v.toExponential(p));
    if (mode === "sig") return Number(v.toPrecision(p));
    return Number(v.toFixed(p));
  }
  // Plain decimals for ordinary magnitudes, 2.5e-4 for small steps and huge values, the fewest
  // digits that keep every tick distinct and within 1% of a tick step (of itself on log axes).
  function numValues(u, splits, axisIdx, space, incr) {
    const sc = u.scales[u.axes[axisIdx].scale];
    const log = sc && sc.distr === 3;
    const vals = splits.filter((v) => v != null && isFinite(v));
    const big = Math.max(0, ...vals.map(Math.abs));
    const small = log ? Math.min(...vals.filter((v) => v !== 0).map(Math.abs)) : incr;
    const mode = big >= 1e6 || small < 1e-3 ? "exp" : log ? "sig" : "fixed";
    const first = mode === "fixed" ? Math.max(0, Math.ceil(-Math.log10(incr) - 1e-9)) : mode === "sig" ? 1 : 0;
    for (let p = first; p <= first + 10; p++) {
      const ok = vals.every((v) => Math.abs(numRound(v, mode, p) - v) <= 0.01 * (log ? Math.abs(v) : incr));
      const texts = splits.map((v) => (v == null || !isFinite(v) ? null : numText(v, mode, mode === "sig" ? Math.max(1, p) : p)));
      if (ok && new Set(texts.filter((t) => t != null)).size === vals.length) return texts;
    }
    return splits.map((v) => (v == null ? null : String(v)));
  }

  // --- axes sized to their labels, so an axis title never sits on the tick labels -------------
  const measure = document.createElement("canvas").getContext("2d");
  function axisSize(u, values, axisIdx) {
    const a = u.axes[axisIdx];
    if (values == null) return a.side % 2 ? 50 : 30;
    const px = u.pxRatio || devicePixelRatio || 1;
    const tick = a.ticks && a.ticks.show !== false ? a.ticks.size : 0;
    const lines = values.filter((v) => v != null).map((v) => String(v).split("\n"));
    if (a.side % 2 === 0) {
      const rows = Math.max(1, ...lines.map((l) => l.length));
      return Math.ceil(tick + a.gap + (a.font[1] / px) * 1.2 * rows + 4);
    }
    measure.font = a.font[0];
    const w = Math.max(0, ...lines.flat().map((t) => measure.measureText(t).width)) / px;
    return Math.ceil(tick + a.gap + w + 6);
  }
  // An axis with Runcast's defaults: measured size, readable numbers.
  const axis = (o) => Object.assign({ size: axisSize, values: numValues }, o || {});
  const timeAxis = (o) => Object.assign({ size: axisSize, values: timeValues, incrs: TIME_INCRS, space: 90 }, o || {});

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

  return { getJSON, ema, stepText, fmtClock, logRange, bucketsFor, rangeQuery, overlay, merge, fmtStep, fmtEpoch, zoneName, numValues, timeValues, axis, timeAxis, axisSize, positive, rangeChart, zoomCursor };
})();
