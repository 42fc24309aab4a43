// Rewrites every <time data-fmt> from its ISO datetime into the viewer's local time, on load and
// after each htmx swap, each naming its zone ("Thu 14:02 CET": the browser's abbreviation, GMT+1
// in en-US). The server's text (UTC) stays as the no-JS fallback.
(function () {
  const tz = Intl.DateTimeFormat().resolvedOptions().timeZone;
  const fmts = {
    local: { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    short: { weekday: "short", hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    when: { weekday: "short", day: "numeric", hour: "2-digit", minute: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    clock: { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" },
    // Timeline ticks on the board stay bare: its header names the zone once.
    "tick-time": { hour: "2-digit", minute: "2-digit", hourCycle: "h23" },
    "tick-day": { weekday: "short", day: "numeric", month: "short" },
  };
  const cache = {};
  function fmt(name) {
    if (!cache[name]) cache[name] = new Intl.DateTimeFormat(undefined, fmts[name] || fmts.local);
    return cache[name];
  }
  function localise(root) {
    (root || document).querySelectorAll("time[data-fmt]").forEach((el) => {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      let name = el.dataset.fmt;
      // A time tick at local midnight names the day instead.
      if (name === "tick-time" && d.getHours() === 0 && d.getMinutes() === 0) name = "tick-day";
      el.textContent = fmt(name).format(d);
      if (!el.title) el.title = d.toISOString().replace(".000Z", "Z") + " (UTC)";
    });
  }
  window.runcastLocalise = localise;
  document.addEventListener("DOMContentLoaded", () => {
    localise(document);
    const v = document.getElementById("viewer-tz");
    if (v) v.textContent = "times in " + tz;
  });
  // outerHTML swaps replace the event's target, so re-read the whole (small) document.
  document.addEventListener("htmx:afterSettle", () => localise(document));
})();
