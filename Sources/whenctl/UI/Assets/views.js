// whenctl ui: the views besides the live stream — rejected events, sessions and a session's
// timeline, the screen flow, crash reports, pipelines and rates.
"use strict";

(() => {
  const { $, el, svg, link, recordLink, sessionHref, getJSON, setStatus, clear, time, summary } = window.W;
  const views = window.W.views;

  const cell = (...c) => el("td", null, ...c);
  const row = (...cells) => el("tr", null, ...cells.map((c) => (c instanceof HTMLElement && c.tagName === "TD" ? c : cell(c))));

  // --- Rejected events ---------------------------------------------------------------------

  let rejectionsTimer = null;
  async function loadRejections() {
    const body = $("rejections-table").tBodies[0];
    try {
      const r = await getJSON("/api/rejections");
      clear(body);
      if (!r.available) {
        setStatus("rejections-status", "Rejected events are not available from this whend: " + r.reason, "warn");
        return;
      }
      const list = (r.rejections || []).slice().reverse();
      setStatus("rejections-status", list.length ? `${list.length} most recent, newest first` : "whend has refused nothing lately");
      for (const x of list) {
        body.append(
          row(time(x.time), el("span", "code", x.code || ""), x.app || "", x.pid ?? "", x.uid ?? "", x.message || "", x.line === undefined || x.line === null ? el("em", null, "(not kept: longer than whend reads)") : el("code", "raw", x.line + (x.truncated ? " …" : ""))),
        );
      }
    } catch (e) {
      setStatus("rejections-status", e.message, "bad");
    }
  }
  // The tracking plan's violations, beside the rejections: counts by event and rule, and the
  // latest examples, stored (report) or refused (enforce).
  async function loadViolations() {
    const counts = $("violations-counts").tBodies[0];
    const latest = $("violations-latest").tBodies[0];
    try {
      const r = await getJSON("/api/plan-violations");
      clear(counts);
      clear(latest);
      if (!r.available) {
        setStatus("violations-status", "Plan violations are not available from this whend: " + r.reason, "warn");
        return;
      }
      const report = r.report || {};
      if (!report.plan) {
        setStatus("violations-status", "whend has no tracking plan (tracking_plan is not set)");
        return;
      }
      const list = (report.latest || []).slice().reverse();
      setStatus("violations-status", `plan ${report.plan}, mode ${report.mode}: ` + (list.length ? `${list.length} most recent, newest first` : "no violation since whend started"));
      for (const c of report.counts || []) counts.append(row(String(c.count), c.event || el("em", null, "(not in the plan)"), el("span", "code", c.rule)));
      for (const x of list) {
        latest.append(row(time(x.time), x.stored ? "stored" : "refused", x.app || "", x.event, el("span", "code", x.rule), el("code", null, x.path), x.message, el("code", "raw", x.line)));
      }
    } catch (e) {
      setStatus("violations-status", e.message, "bad");
    }
  }
  views.rejections = {
    enter() {
      loadRejections();
      loadViolations();
      rejectionsTimer = setInterval(() => {
        loadRejections();
        loadViolations();
      }, 5000);
    },
    leave() {
      clearInterval(rejectionsTimer);
    },
  };

  // --- Sessions ----------------------------------------------------------------------------

  async function loadSessions() {
    const body = $("sessions-table").tBodies[0];
    const app = $("sessions-app").value.trim();
    try {
      const r = await getJSON("/api/sessions" + (app ? "?app=" + encodeURIComponent(app) : ""));
      clear(body);
      if (r.problem) {
        setStatus("sessions-status", r.problem, "warn");
        return;
      }
      setStatus("sessions-status", `${r.count} session(s), indexed through _seq ${r.indexed_through}; most recent first`);
      for (const s of r.sessions) {
        const counts = Object.entries(s.counts || {}).map(([k, v]) => `${k} ${v}`).join(", ");
        const records = Object.values(s.counts || {}).reduce((a, b) => a + b, 0);
        const tr = row(s.app, link(sessionHref(s.app, s.session), s.session), records, `${s.firstSeq}…${s.lastSeq}`, time(s.firstTime), time(s.lastTime), counts);
        tr.className = "session-row";
        tr.dataset.session = s.session;
        body.append(tr);
      }
    } catch (e) {
      setStatus("sessions-status", e.message, "bad");
    }
  }
  views.sessions = { enter: loadSessions };

  // --- A session's timeline: its records as they were stored, live from then on -------------

  let timelineStream = null;
  views.session = {
    async enter([app, session]) {
      if (timelineStream) timelineStream.close();
      $("session-title").textContent = `${app}/${session}`;
      const list = $("timeline");
      const chips = $("timeline-screens");
      clear(list);
      clear(chips);
      setStatus("session-status", "reading…");
      // Where the session starts, from the index when there is one; else the whole journal.
      let after = null;
      try {
        const r = await getJSON("/api/sessions?app=" + encodeURIComponent(app));
        const s = r.sessions.find((x) => x.session === session);
        if (s) after = Math.max(0, s.firstSeq - 1);
      } catch (e) {
        /* the whole journal, then */
      }
      const openScreens = {};
      let count = 0;
      const params = { app, session };
      if (after === null) params.from = "oldest";
      else params.after = after;
      timelineStream = window.W.stream(params, {
        record: (r) => {
          count++;
          if (r.type === "screen_time" && openScreens[r.name]) {
            const item = openScreens[r.name];
            item.querySelector(".duration").textContent = `${r.seconds} s on screen`;
            delete openScreens[r.name];
          }
          const item = timelineItem(r);
          if (!item) return;
          // A derived record stands after the record that caused it, not where the journal has it
          // (a pipeline stores it later): a screen view right after its navigation or lifecycle.
          item.dataset.key = r._origin && r._cause ? r._cause + 0.5 : r._seq;
          let before = list.lastElementChild;
          while (before && parseFloat(before.dataset.key) > parseFloat(item.dataset.key)) before = before.previousElementSibling;
          if (before) before.after(item);
          else list.prepend(item);
          if (r.type === "screen" && r._origin) {
            openScreens[r.name] = item;
            const chip = link("#record/" + r._seq, r.name, "chip");
            if (chips.childElementCount) chips.append(el("span", "arrow", "→"));
            chips.append(chip);
          }
        },
        caughtUp: () => setStatus("session-status", `${count} record(s); new ones appear as whend stores them`, "ok"),
        state: (text, kind) => kind !== "ok" && setStatus("session-status", text, kind),
      });
    },
    leave() {
      if (timelineStream) timelineStream.close();
      timelineStream = null;
    },
  };

  function timelineItem(r) {
    if (r.type === "screen_time") return null;
    const screen = r.type === "screen" && r._origin;
    const kind = screen ? "tl-screen" : "tl-" + (r.type || "other");
    const li = el("li", "tl-item " + kind + (r.type === "error" ? " tl-error" : ""));
    li.dataset.seq = r._seq;
    const when = time(r.ts || r._rt);
    if (screen) {
      li.dataset.name = r.name;
      li.append(
        recordLink(r._seq),
        el("span", "time", when),
        el("span", "screen-name", r.name),
        el("span", "via", "via " + (r.via || "?")),
        el("span", "duration", "on screen"),
      );
    } else {
      li.append(recordLink(r._seq), el("span", "time", when), el("span", "type t-" + r.type, r.type), el("span", "what", summary(r)));
    }
    li.addEventListener("click", (ev) => {
      if (ev.target.tagName !== "A") location.hash = "#record/" + r._seq;
    });
    return li;
  }

  // --- The screen flow: screens as nodes, transitions as edges with counts ------------------

  // An app's flow, the busiest app's until another (or every app) is chosen.
  let flowChosen = false;
  async function loadFlow() {
    const app = $("flow-app").value;
    setStatus("flow-status", "reading the journal's screen views…");
    try {
      const f = await getJSON("/api/flow" + (app ? "?app=" + encodeURIComponent(app) : ""));
      const select = $("flow-app");
      for (const a of f.apps) {
        if (![...select.options].some((o) => o.value === a)) select.append(new Option(a, a));
      }
      if (!flowChosen && !app && f.apps.length > 1) {
        flowChosen = true;
        // The app with the most screen views.
        select.value = f.apps.reduce((a, b) => ((f.app_views[b] || 0) > (f.app_views[a] || 0) ? b : a));
        return loadFlow();
      }
      if (f.problem) setStatus("flow-status", f.problem, "bad");
      else setStatus("flow-status", f.edges.length ? `${f.nodes.length} screens, ${f.edges.length} transitions` : "no screen views (is the screens pipeline running?)", f.edges.length ? "" : "warn");
      drawFlow(f);
    } catch (e) {
      setStatus("flow-status", e.message, "bad");
    }
  }
  views.flow = { enter: loadFlow };

  // Columns by distance from (start) (breadth first), rows in order of discovery; an edge back to
  // an earlier column arcs above the nodes.
  function drawFlow(f) {
    const root = $("flow-svg");
    clear(root);
    const out = {};
    for (const e of f.edges) (out[e.from] = out[e.from] || []).push(e);
    const names = f.nodes.map((n) => n.name);
    const layer = {};
    const queue = names.includes("(start)") ? ["(start)"] : names.slice(0, 1);
    for (const q of queue) layer[q] = 0;
    while (queue.length) {
      const n = queue.shift();
      for (const e of out[n] || []) {
        if (layer[e.to] === undefined) {
          layer[e.to] = layer[n] + 1;
          queue.push(e.to);
        }
      }
    }
    let extra = Math.max(0, ...Object.values(layer)) + 1;
    for (const n of names) if (layer[n] === undefined) layer[n] = extra++;
    const columns = {};
    for (const n of names) (columns[layer[n]] = columns[layer[n]] || []).push(n);
    const W = 170, H = 70, BW = 130, BH = 34, TOP = 60;
    const pos = {};
    let maxRows = 1;
    for (const [c, ns] of Object.entries(columns)) {
      ns.forEach((n, i) => (pos[n] = { x: 20 + c * W, y: TOP + i * H }));
      maxRows = Math.max(maxRows, ns.length);
    }
    const width = 40 + Object.keys(columns).length * W;
    const height = TOP + maxRows * H + 20;
    root.setAttribute("viewBox", `0 0 ${width} ${height}`);
    root.setAttribute("width", width);
    root.setAttribute("height", height);
    const defs = svg("defs");
    const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 9, markerHeight: 9, markerUnits: "userSpaceOnUse", orient: "auto-start-reverse" });
    marker.append(svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "arrowhead" }));
    defs.append(marker);
    root.append(defs);
    const most = Math.max(1, ...f.edges.map((e) => e.count));
    for (const e of f.edges) {
      const a = pos[e.from], b = pos[e.to];
      if (!a || !b) continue;
      let d, lx, ly;
      if (layer[e.to] > layer[e.from]) {
        const x1 = a.x + BW, y1 = a.y + BH / 2, x2 = b.x, y2 = b.y + BH / 2;
        d = `M ${x1} ${y1} C ${x1 + 30} ${y1}, ${x2 - 30} ${y2}, ${x2} ${y2}`;
        // By the arrowhead: edges leaving one node keep their counts apart.
        lx = x2 - 16;
        ly = y2 - 6;
      } else {
        const x1 = a.x + BW / 2 + 12, x2 = b.x + BW / 2 - 12, y = Math.min(a.y, b.y);
        const lift = 30 + Math.abs(layer[e.from] - layer[e.to]) * 10;
        d = `M ${x1} ${a.y} C ${x1} ${y - lift}, ${x2} ${y - lift}, ${x2} ${b.y}`;
        lx = (x1 + x2) / 2;
        ly = y - lift * 0.75;
      }
      const g = svg("g", { class: "edge" });
      g.append(svg("path", { d, "marker-end": "url(#arrow)", "stroke-width": 1 + (4 * e.count) / most }));
      g.append(svg("text", { x: lx, y: ly, "text-anchor": "middle", class: "count" }, String(e.count)));
      g.append(svg("title", {}, `${e.from} → ${e.to}: ${e.count}`));
      root.append(g);
    }
    for (const n of f.nodes) {
      const p = pos[n.name];
      const g = svg("g", { class: "node" + (n.name === "(start)" ? " start" : ""), "data-name": n.name });
      g.append(svg("rect", { x: p.x, y: p.y, width: BW, height: BH, rx: 6 }));
      const label = n.name.length > 18 ? n.name.slice(0, 17) + "…" : n.name;
      g.append(svg("text", { x: p.x + BW / 2, y: p.y + 15, "text-anchor": "middle" }, label));
      if (n.name !== "(start)") g.append(svg("text", { x: p.x + BW / 2, y: p.y + 28, "text-anchor": "middle", class: "views" }, `${n.views} view(s)`));
      g.append(svg("title", {}, n.name));
      root.append(g);
    }
  }

  // --- Crash reports -------------------------------------------------------------------------

  async function loadCrashes() {
    const body = $("crash-list").tBodies[0];
    try {
      const r = await getJSON("/api/crashes");
      clear(body);
      if (r.problem) setStatus("crashes-status", r.problem, "warn");
      else setStatus("crashes-status", r.reports.length ? `${r.reports.length} report(s), newest first` : "no crash reports");
      for (const c of r.reports) {
        const tr = row(link("#crash/" + c.seq, "#" + c.seq), time(c.time), c.app, link(sessionHref(c.app, c.session), c.session), c.screen || "", c.message, c.breadcrumbs);
        tr.className = "crash-row";
        tr.dataset.seq = c.seq;
        body.append(tr);
      }
    } catch (e) {
      setStatus("crashes-status", e.message, "bad");
    }
  }
  views.crashes = { enter: loadCrashes };

  views.crash = {
    async enter([seq]) {
      $("crash-title").textContent = "#" + seq;
      const detail = $("crash-detail");
      const body = $("crumbs").tBodies[0];
      clear(detail);
      clear(body);
      try {
        const c = await getJSON("/api/crashes/" + encodeURIComponent(seq));
        const error = c.error || {};
        const dl = el("dl", "summary");
        const item = (k, ...v) => dl.append(el("dt", null, k), el("dd", null, ...v));
        item("error", el("strong", "error-message", error.message || ""), error.fatal ? " (fatal)" : "");
        item("record", recordLink(c.seq), " ", c.kind || "");
        item("time", time(c.time));
        item("app / session", link(sessionHref(c.app, c.session), `${c.app}/${c.session}`));
        item("screen", c.screen || "unknown");
        if (c.user) item("user", c.user);
        detail.append(dl);
        if (error.stack && error.stack.length) detail.append(el("pre", "stack", error.stack.map((f) => "at " + f).join("\n")));
        for (const b of c.breadcrumbs || []) {
          const what = ["name", "action", "screen", "status", "message"].filter((k) => typeof b[k] === "string").map((k) => b[k]).join(" ");
          const tr = row(recordLink(b.seq), time(b.time), el("span", "type t-" + b.type, b.type || ""), what + (b.params ? " " + JSON.stringify(b.params) : ""));
          tr.className = "crumb";
          body.append(tr);
        }
      } catch (e) {
        detail.append(el("p", "status bad", e.message));
      }
    },
  };

  // --- Pipelines and rates, from whenctl ui's samples of whend's status ---------------------

  // Per second between the last two samples (or over `span` samples).
  function rate(samples, get, span = 1) {
    if (samples.length < 2) return null;
    const b = samples[samples.length - 1], a = samples[Math.max(0, samples.length - 1 - span)];
    const dt = b.t - a.t;
    const av = get(a), bv = get(b);
    return dt > 0 && av !== undefined && bv !== undefined ? (bv - av) / dt : null;
  }
  const fmt = (x) => (x === null ? "–" : x >= 100 ? Math.round(x) : Math.round(x * 10) / 10);

  function drawPipelines(o) {
    if (!o.status) {
      setStatus("pipelines-status", o.problem || "no status from whend yet", "bad");
      return;
    }
    setStatus("pipelines-status", o.problem ? "whend: " + o.problem : `as of the last sample (every ${o.interval} s)`, o.problem ? "bad" : "");
    const s = o.status;
    const body = $("pipelines-table").tBodies[0];
    clear(body);
    for (const p of s.pipelines) {
      const lost = p.lost_to_retention || p.skipped ? `${p.lost_to_retention} (skipped ${p.skipped})` : "0";
      const tr = row(p.name, p.plugins.join(" → "), p.state, p.pid, p.cursor, p.lag, fmt(rate(o.samples, (x) => x.pipelines[p.name] && x.pipelines[p.name].cursor, 5)), p.failures, p.dead_letters, p.restarts, lost, p.last_exit || "");
      tr.className = "pipeline-row" + (p.lost_to_retention || p.dead_letters ? " warn" : "");
      tr.dataset.pipeline = p.name;
      body.append(tr);
    }
    const dl = $("journal-summary");
    clear(dl);
    const j = s.journal;
    const item = (k, v) => dl.append(el("dt", null, k), el("dd", null, String(v)));
    item("journal", `${j.directory}: last _seq ${j.last_seq}, ${j.segments} segment(s), ${j.bytes} bytes, durability ${j.durability}`);
    if (j.failing) item("FAILING", j.failing);
    item("clients", `${s.connections} connected, ${s.connections_refused} refused`);
    item("received", `${s.events_received} events, ${s.bytes_received} bytes`);
    item("rejected", Object.entries(s.events_rejected).map(([k, v]) => `${k} ${v}`).join(", ") || "none");
    item("status", s.status_line);
    const ul = $("plugins-list");
    clear(ul);
    for (const p of s.plugins) ul.append(el("li", null, `${p.name} ${p.version || ""} — ${p.state}${p.routes ? " in " + p.routes.join(", ") : ""}`));
  }

  const colors = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

  // A line chart of `series` ([{name, points: [[t, v]]}]) into the svg `id`.
  function chart(id, title, unit, series) {
    const root = $(id);
    clear(root);
    const Wd = 900, Ht = 260, L = 60, R = 170, T = 30, B = 30;
    root.setAttribute("viewBox", `0 0 ${Wd} ${Ht}`);
    root.setAttribute("width", Wd);
    root.setAttribute("height", Ht);
    root.append(svg("text", { x: L, y: 18, class: "chart-title" }, title));
    const all = series.flatMap((s) => s.points);
    if (all.length < 1) {
      root.append(svg("text", { x: L, y: Ht / 2, class: "views" }, "waiting for two samples…"));
      return;
    }
    const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]), t0 + 1);
    const vmax = Math.max(1, ...all.map((p) => p[1]));
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (Wd - L - R);
    const y = (v) => Ht - B - (v / vmax) * (Ht - T - B);
    root.append(svg("line", { x1: L, y1: Ht - B, x2: Wd - R, y2: Ht - B, class: "axis" }));
    root.append(svg("line", { x1: L, y1: T, x2: L, y2: Ht - B, class: "axis" }));
    root.append(svg("text", { x: L - 6, y: T + 4, "text-anchor": "end", class: "tick" }, fmt(vmax)));
    root.append(svg("text", { x: L - 6, y: Ht - B, "text-anchor": "end", class: "tick" }, "0"));
    root.append(svg("text", { x: L, y: Ht - 8, class: "tick" }, `${Math.round((t1 - t0) / 60 * 10) / 10} min ago`));
    root.append(svg("text", { x: Wd - R, y: Ht - 8, "text-anchor": "end", class: "tick" }, "now"));
    series.forEach((s, i) => {
      if (!s.points.length) return;
      const color = colors[i % colors.length];
      const d = s.points.map((p, k) => `${k ? "L" : "M"} ${x(p[0]).toFixed(1)} ${y(p[1]).toFixed(1)}`).join(" ");
      root.append(svg("path", { d, class: "series", stroke: color }));
      root.append(svg("text", { x: Wd - R + 10, y: T + 14 + i * 16, fill: color, class: "legend" }, `${s.name}: ${fmt(s.points[s.points.length - 1][1])} ${unit}`));
    });
  }

  function drawRates(o) {
    const samples = o.samples || [];
    setStatus("rates-status", o.problem ? "whend: " + o.problem : `${samples.length} sample(s), one every ${o.interval} s, the last ${Math.round((o.capacity * o.interval) / 60)} minutes kept`, o.problem ? "bad" : "");
    const perSecond = (get) => {
      const pts = [];
      for (let i = 1; i < samples.length; i++) {
        const a = samples[i - 1], b = samples[i], dt = b.t - a.t;
        const av = get(a), bv = get(b);
        if (dt > 0 && av !== undefined && bv !== undefined) pts.push([b.t, Math.max(0, (bv - av) / dt)]);
      }
      return pts;
    };
    const names = [...new Set(samples.flatMap((s) => Object.keys(s.pipelines)))].sort();
    chart("rates-svg", "records per second", "/s", [
      { name: "ingest", points: perSecond((s) => s.received) },
      { name: "rejected", points: perSecond((s) => s.rejected) },
      ...names.map((n) => ({ name: n, points: perSecond((s) => s.pipelines[n] && s.pipelines[n].cursor) })),
    ]);
    chart("lag-svg", "pipeline lag (records behind the journal)", "", names.map((n) => ({ name: n, points: samples.filter((s) => s.pipelines[n]).map((s) => [s.t, s.pipelines[n].lag]) })));
  }

  window.W.overviewListeners.push((o) => {
    if (!$("view-pipelines").hidden) drawPipelines(o);
    if (!$("view-rates").hidden) drawRates(o);
  });

  views.pipelines = {
    enter() {
      if (window.W.overview) drawPipelines(window.W.overview);
    },
  };
  views.rates = {
    enter() {
      if (window.W.overview) drawRates(window.W.overview);
    },
  };

  document.addEventListener("DOMContentLoaded", () => {
    $("rejections-refresh").addEventListener("click", () => {
      loadRejections();
      loadViolations();
    });
    $("sessions-app").addEventListener("change", loadSessions);
    $("flow-refresh").addEventListener("click", loadFlow);
    $("flow-app").addEventListener("change", () => {
      flowChosen = true;
      loadFlow();
    });
    $("metrics-details").addEventListener("toggle", async () => {
      if (!$("metrics-details").open) return;
      try {
        const r = await W.get("/api/metrics");
        $("metrics-text").textContent = await r.text();
      } catch (e) {
        $("metrics-text").textContent = e.message;
      }
    });
  });
})();
