// Rewrites every <time data-fmt> from its ISO datetime into the viewer's local time, on load and
// after each htmx swap, each naming its zone with the offset, as messages do ("Thu 14:02 CET
// (UTC+1)"; "UTC+1" where the browser has no letters for it, en-US's "GMT+1"): the clock rule,
// docs/alerts.md. The server's text (UTC) stays as the no-JS fallback. Loaded before the charts,
// which name their zone with `runcastZone` too.
(function () {
  const tz = Intl.DateTimeFormat().resolvedOptions().timeZone;
  const HM = { hour: "2-digit", minute: "2-digit", hourCycle: "h23" };
  const HMS = { ...HM, second: "2-digit" };
  // `zone: false`: timeline ticks on the board stay bare, its header names the zone once.
  const fmts = {
    local: { weekday: "short", day: "numeric", month: "short", ...HM },
    short: { weekday: "short", ...HM },
    when: { weekday: "short", day: "numeric", ...HM },
    clock: HMS,
    // To the second, where the server judged the span short (formatting.needs_seconds).
    "local-s": { weekday: "short", day: "numeric", month: "short", ...HMS },
    "short-s": { weekday: "short", ...HMS },
    "when-s": { weekday: "short", day: "numeric", ...HMS },
    "tick-time": { ...HM, zone: false },
    "tick-day": { weekday: "short", day: "numeric", month: "short", zone: false },
  };
  const cache = {};
  function fmt(name) {
    if (!cache[name]) {
      const { zone: named, ...options } = fmts[name] || fmts.local;
      cache[name] = new Intl.DateTimeFormat(undefined, options);
    }
    return cache[name];
  }
  const letters = new Intl.DateTimeFormat(undefined, { timeZoneName: "short" });
  // "CET (UTC+1)", "UTC+5:30", "UTC": the zone at that moment, always with its offset.
  function zone(d) {
    const minutes = -d.getTimezoneOffset();
    const abs = Math.abs(minutes);
    const offset = minutes === 0 ? "UTC" : "UTC" + (minutes < 0 ? "-" : "+") + Math.floor(abs / 60) + (abs % 60 ? ":" + String(abs % 60).padStart(2, "0") : "");
    const part = letters.formatToParts(d).find((p) => p.type === "timeZoneName");
    const name = part ? part.value : "";
    return /^[A-Z]{2,5}$/.test(name) && name !== "UTC" && name !== "GMT" ? name + " (" + offset + ")" : offset;
  }
  function format(name, d) {
    const text = fmt(name).format(d);
    return (fmts[name] || fmts.local).zone === false ? text : text + " " + zone(d);
  }
  // Stored text holds its times as stamps ("⟦2026-12-05T03:30Z⟧", forecasting formatting.stamp);
  // a title cannot hold <time> elements, so an element's data-stamped-title is written here.
  const STAMP = /\u27e6(\d{4}-\d\d-\d\dT\d\d:\d\d(:\d\d)?)Z\u27e7/g;
  function unstamp(text) {
    return text.replace(STAMP, (m, iso, secs) => format(secs ? "when-s" : "when", new Date(iso + "Z")));
  }
  function localise(root) {
    (root || document).querySelectorAll("time[data-fmt]").forEach((el) => {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      let name = el.dataset.fmt;
      // A time tick at local midnight names the day instead.
      if (name === "tick-time" && d.getHours() === 0 && d.getMinutes() === 0) name = "tick-day";
      el.textContent = format(name, d);
      if (!el.title) el.title = d.toISOString().replace(".000Z", "Z") + " (UTC)";
    });
    (root || document).querySelectorAll("[data-stamped-title]").forEach((el) => {
      el.title = unstamp(el.dataset.stampedTitle);
    });
  }
  window.runcastLocalise = localise;
  window.runcastZone = zone;
  document.addEventListener("DOMContentLoaded", () => {
    localise(document);
    const v = document.getElementById("viewer-tz");
    if (v) v.textContent = "times in " + tz + ", " + zone(new Date());
  });
  // outerHTML swaps replace the event's target, so re-read the whole (small) document.
  document.addEventListener("htmx:afterSettle", () => localise(document));
})();
