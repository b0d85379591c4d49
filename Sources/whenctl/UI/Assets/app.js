// whenctl ui: the page's core — helpers, the views' router, the live stream and one record.
// Records hold whatever apps sent: they are only ever put on the page as text (textContent),
// never as markup.
"use strict";

const W = (window.W = {});

// The token comes once, in the address's fragment (#token=…), which the browser sends nowhere.
// The page keeps it in local storage, which browsers keep apart by origin, port included
// (cookies they do not: another server on 127.0.0.1 would be sent one), so that a record or a
// session opened in a new tab has it too; and takes it out of the address bar and any
// screenshot (the browser's history may still hold the address it was opened with). `?token=`
// is taken the same way. A token of an earlier run on the same port
// is forgotten once the server refuses it.
const TOKEN_KEY = "whenctl-ui-token";
// True when the address carried a token (now kept, and gone from the address).
function takeToken() {
  const take = (part) => {
    const pieces = part.replace(/^[?#]/, "").split("&");
    const found = pieces.find((p) => p.startsWith("token="));
    return { token: found && found.slice(6), rest: pieces.filter((p) => p && !p.startsWith("token=")).join("&") };
  };
  const fromHash = take(location.hash);
  const fromQuery = take(location.search);
  if (fromHash.token === undefined && fromQuery.token === undefined) return false;
  const token = fromHash.token || fromQuery.token;
  if (token) localStorage.setItem(TOKEN_KEY, token);
  const query = fromQuery.rest ? "?" + fromQuery.rest : "";
  const hash = fromHash.rest ? "#" + fromHash.rest : "";
  history.replaceState(null, "", location.pathname + query + hash);
  return true;
}
takeToken();
// An address with a token opened over this page (the same page, so not loaded again): start
// over with that token.
window.addEventListener("hashchange", (ev) => {
  if (takeToken()) {
    ev.stopImmediatePropagation();
    location.reload();
  }
});
W.token = localStorage.getItem(TOKEN_KEY) || "";

W.$ = (id) => document.getElementById(id);

// An element with a class and children (strings become text).
W.el = (tag, cls, ...children) => {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
  }
  return e;
};

W.svg = (tag, attrs, text) => {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
};

W.link = (href, text, cls) => {
  const a = W.el("a", cls, text);
  a.href = href;
  return a;
};

W.recordLink = (seq) => W.link("#record/" + seq, "#" + seq, "seq");

W.sessionHref = (app, session) =>
  "#session/" + encodeURIComponent(app || "") + "/" + encodeURIComponent(session || "");

// A request for whend's data: the token goes as a header, never a cookie.
W.get = (path) =>
  fetch(path, { credentials: "omit", cache: "no-store", headers: { Authorization: "Bearer " + W.token } });

W.getJSON = async (path) => {
  const r = await W.get(path);
  const text = await r.text();
  if (r.status === 403 && text.includes("needs the token")) W.forgetToken();
  if (!r.ok) throw new Error(text.trim() || r.status + " " + r.statusText);
  return JSON.parse(text);
};

W.setStatus = (id, text, kind) => {
  const p = W.$(id);
  p.textContent = text || "";
  p.className = "status" + (kind ? " " + kind : "");
};

W.clear = (node) => {
  while (node.firstChild) node.removeChild(node.firstChild);
};

W.time = (rt) => (typeof rt === "string" ? rt.replace("T", " ").replace(/\.(\d{3})\d*Z$/, ".$1Z") : "");

// One line of what a record says, as `whenctl cat -o short` does.
W.summary = (r) => {
  const p = (o) => (o && Object.keys(o).length ? " " + JSON.stringify(o) : "");
  switch (r.type) {
    case "when":
      return (r.name || "") + p(r.params);
    case "lifecycle":
      return (r.screen || "") + " " + (r.status || "");
    case "navigation":
      return (r.action || "") + (r.screen ? " " + r.screen : "");
    case "screen":
      return (r.name || "") + (r.previous !== undefined ? " ← " + (r.previous === null ? "(start)" : r.previous) : "");
    case "screen_time":
      return (r.name || "") + " " + r.seconds + " s";
    case "error":
      return (r.fatal ? "FATAL " : "") + (r.message || "");
    case "diagnostic":
      return (r.problem || "") + (r.screen ? " (" + r.screen + ")" : "");
    default: {
      const rest = {};
      for (const [k, v] of Object.entries(r)) {
        if (!k.startsWith("_") && !["type", "app", "session", "ts", "id", "user"].includes(k)) rest[k] = v;
      }
      return JSON.stringify(rest);
    }
  }
};

// --- The views, one at a time, chosen by the address's fragment -----------------------------

W.views = {};
let current = null;

// A fragment that is not valid percent-encoding is taken as it is written.
const decoded = (text, decode) => {
  try {
    return decode(text);
  } catch {
    return text;
  }
};

function route() {
  const hash = decoded(location.hash.slice(1), decodeURI) || "live";
  const [name, ...rest] = location.hash.slice(1).split("/");
  const view = W.views[name || "live"] ? name || "live" : "live";
  if (current && current !== view && W.views[current].leave) W.views[current].leave();
  for (const s of document.querySelectorAll("section.view")) s.hidden = s.id !== "view-" + view;
  const tab = { session: "sessions", crash: "crashes", record: "live" }[view] || view;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === tab);
  current = view;
  W.views[view].enter(
    rest.map((part) => decoded(part, decodeURIComponent)),
    hash,
  );
}

// --- The daemon's state in the header, from whenctl ui's samples ----------------------------

W.overview = null;
async function refreshHeader() {
  try {
    const o = await W.getJSON("/api/overview");
    W.overview = o;
    const s = o.status;
    const d = W.$("daemon");
    if (o.problem || !s) {
      d.textContent = "whend: " + (o.problem || "no status yet");
      d.className = "daemon bad";
    } else {
      d.textContent = `whend ${s.version} pid ${s.pid} · ${s.events_per_second} events/s · last _seq ${s.journal.last_seq}`;
      d.className = "daemon ok";
    }
    for (const f of W.overviewListeners) f(o);
  } catch (e) {
    W.$("daemon").textContent = e.message.startsWith("whenctl ui:") ? e.message : "whenctl ui: " + e.message;
    W.$("daemon").className = "daemon bad";
  }
}
W.overviewListeners = [];

// --- A subscription as an EventSource -------------------------------------------------------

// Opens /api/stream with `params`; `on.record(r, raw)`, `on.caughtUp(seq)`, `on.problem(p)`,
// `on.gap(g)`, `on.state(text, kind)`. The browser reconnects by itself with Last-Event-ID,
// which resumes the subscription after the last record seen.
W.stream = (params, on) => {
  // Each value percent-encoded (a space as %20: URLSearchParams would write "+", which the
  // server reads as itself). An EventSource cannot send headers: the token goes in the query,
  // to this origin only.
  const q = Object.entries({ ...params, token: W.token })
    .filter(([, v]) => v !== "" && v !== undefined && v !== null)
    .map(([k, v]) => encodeURIComponent(k) + "=" + encodeURIComponent(v))
    .join("&");
  const es = new EventSource("/api/stream?" + q);
  const state = on.state || (() => {});
  // What whend (or whenctl ui, failing to reach it) said last, shown while the browser retries.
  let problem = null;
  es.onopen = () => state("connected", "ok");
  es.onmessage = (m) => {
    problem = null;
    let r;
    try {
      r = JSON.parse(m.data);
    } catch (e) {
      return;
    }
    on.record(r, m.data);
  };
  es.addEventListener("caught_up", (m) => on.caughtUp && on.caughtUp(JSON.parse(m.data).seq));
  es.addEventListener("gap", (m) => on.gap && on.gap(JSON.parse(m.data)));
  es.addEventListener("problem", (m) => {
    const p = JSON.parse(m.data);
    problem = p.code + ": " + p.message;
    // What whend will refuse again is not asked again.
    if (["forbidden", "invalid_field", "unsupported_protocol"].includes(p.code)) es.close();
    if (on.problem) on.problem(p);
    state(p.code + ": " + p.message, "bad");
  });
  es.onerror = () => {
    if (es.readyState === EventSource.CLOSED) state("stream closed" + (problem ? " (" + problem + ")" : ""), "bad");
    else state("reconnecting…" + (problem ? " (" + problem + ")" : ""), "warn");
  };
  return es;
};

// --- Live ------------------------------------------------------------------------------------

const live = {
  es: null,
  paused: false,
  raw: false,
  held: [],
  shown: 0,
  max: 1000,
  caughtUp: false,
};

function recordRow(r, raw) {
  const li = W.el("li", "record" + (r._origin ? " derived" : "") + (r.type === "error" ? " error" : ""));
  li.dataset.seq = r._seq;
  if (r.session) li.dataset.session = r.session;
  if (r.app) li.dataset.app = r.app;
  li.dataset.type = r.type || "";
  if (live.raw) {
    li.append(W.el("code", "raw", raw));
    return li;
  }
  const who = W.link(W.sessionHref(r.app, r.session), (r.app || "?") + "/" + (r.session || "-"), "who");
  li.append(W.recordLink(r._seq), W.el("span", "time", W.time(r._rt)), who);
  li.append(W.el("span", "type t-" + (r.type || "none"), r.type || "?"));
  if (r._origin) li.append(W.el("span", "badge", r._origin));
  li.append(W.el("span", "what", W.summary(r)));
  li.addEventListener("click", (ev) => {
    if (ev.target.tagName === "A") return;
    const open = li.querySelector("pre");
    if (open) open.remove();
    else li.append(W.el("pre", "json", JSON.stringify(r, null, 2)));
  });
  return li;
}

function show(r, raw) {
  const list = W.$("live-list");
  list.prepend(recordRow(r, raw));
  live.shown++;
  while (list.childElementCount > live.max) list.lastElementChild.remove();
}

function liveStatus() {
  const held = live.held.length ? ` · paused, ${live.held.length} new held` : live.paused ? " · paused" : "";
  W.setStatus("live-status", `${live.state || ""} · ${live.shown} shown${held}`, live.stateKind);
}

function startLive() {
  if (live.es) live.es.close();
  W.clear(W.$("live-list"));
  live.held = [];
  live.shown = 0;
  const params = {
    app: W.$("f-app").value.trim(),
    session: W.$("f-session").value.trim(),
    type: W.$("f-type").value.trim(),
    name: W.$("f-name").value.trim(),
    derived: W.$("f-derived").value,
  };
  const start = W.$("f-start").value;
  if (start === "recent") params.recent = 500;
  else params.from = start;
  live.es = W.stream(params, {
    record: (r, raw) => {
      if (live.paused) {
        live.held.push([r, raw]);
        if (live.held.length > live.max) live.held.shift();
      } else show(r, raw);
      liveStatus();
    },
    caughtUp: () => {
      live.state = "live";
      live.stateKind = "ok";
      liveStatus();
    },
    gap: (g) => {
      const li = W.el(
        "li",
        "record gap",
        `records ${g.from}…${g.through} are gone from the journal (deleted by retention, or damaged: whenctl verify says which)`,
      );
      W.$("live-list").prepend(li);
    },
    state: (text, kind) => {
      live.state = text;
      live.stateKind = kind;
      liveStatus();
    },
  });
}

W.views.live = {
  enter() {
    if (!live.es || live.es.readyState === EventSource.CLOSED) startLive();
  },
};

// The live stream runs while other views are shown too (its rows are kept), until filters change.
function setupLive() {
  W.$("filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    startLive();
  });
  W.$("f-clear").addEventListener("click", () => {
    for (const id of ["f-app", "f-session", "f-type", "f-name"]) W.$(id).value = "";
    W.$("f-derived").value = "";
    startLive();
  });
  W.$("pause").addEventListener("click", () => {
    live.paused = !live.paused;
    W.$("pause").textContent = live.paused ? "Resume" : "Pause";
    W.$("pause").classList.toggle("on", live.paused);
    if (!live.paused) {
      for (const [r, raw] of live.held) show(r, raw);
      live.held = [];
    }
    liveStatus();
  });
  W.$("view-mode").addEventListener("click", () => {
    live.raw = !live.raw;
    W.$("view-mode").textContent = live.raw ? "Pretty" : "Raw";
    startLive();
  });
}

// --- One record, by its _seq -----------------------------------------------------------------

W.views.record = {
  async enter([seq]) {
    const n = parseInt(seq, 10);
    W.$("record-title").textContent = "#" + n;
    W.$("record-prev").onclick = () => (location.hash = "#record/" + Math.max(1, n - 1));
    W.$("record-next").onclick = () => (location.hash = "#record/" + (n + 1));
    W.$("record-json").textContent = "…";
    W.clear(W.$("record-links"));
    try {
      const r = await W.getJSON("/api/record/" + n);
      W.$("record-json").textContent = JSON.stringify(r, null, 2);
      const links = W.$("record-links");
      if (r.session) links.append("session ", W.link(W.sessionHref(r.app, r.session), r.app + "/" + r.session), " ");
      if (r._cause) links.append(" caused by ", W.recordLink(r._cause));
    } catch (e) {
      W.$("record-json").textContent = e.message;
    }
  },
};

// Nothing answers without the token: say what to open instead of failing everywhere.
function showNoToken() {
  const main = document.querySelector("main");
  W.clear(main);
  main.append(
    W.el(
      "p",
      "status bad",
      "whenctl ui: this page needs the token whenctl ui printed with its address (" +
        location.origin +
        "/#token=…); open that address.",
    ),
  );
  W.$("daemon").textContent = "no token";
  W.$("daemon").className = "daemon bad";
}

// The token kept is not this run's (whenctl ui was started again on the same port).
W.forgetToken = () => {
  if (!W.token) return;
  W.token = "";
  localStorage.removeItem(TOKEN_KEY);
  if (live.es) live.es.close();
  showNoToken();
};

document.addEventListener("DOMContentLoaded", () => {
  if (!W.token) {
    showNoToken();
    return;
  }
  setupLive();
  W.$("jump").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const n = parseInt(W.$("jump-seq").value, 10);
    if (n > 0) location.hash = "#record/" + n;
  });
  refreshHeader();
  setInterval(refreshHeader, 2000);
  window.addEventListener("hashchange", route);
  // views.js registers the other views before this runs (both are deferred, in order).
  route();
  if (current !== "live") startLive();
});
