// forkvisor's status page. Everything from the queue is written with textContent:
// a job may name itself anything, and the page shows it, never runs it.
"use strict";

const REFRESH_MS = 2000;
const STATES = ["incoming", "ready", "scheduled", "waiting", "claimed", "done", "dead"];
let timer = null;

// The token (on TCP) comes once in the URL `forkvisor web` printed, and is kept for this
// tab only: sessionStorage belongs to this origin, port included (a cookie for localhost
// would be sent to every other server on the host). The page's own files need none.
const token = (() => {
  const given = new URLSearchParams(location.search).get("token");
  if (given) {
    sessionStorage.setItem("forkvisor-token", given);
    history.replaceState(null, "", location.pathname + location.hash);  // not left in the address bar
  }
  return sessionStorage.getItem("forkvisor-token");
})();

async function api(path) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(path, { headers, cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

// -- building the page ------------------------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function table(headings, rows) {
  return el("table", {},
    el("thead", {}, el("tr", {}, ...headings.map((h) => el("th", { text: h })))),
    el("tbody", {}, ...rows));
}

function ago(seconds) {
  if (typeof seconds !== "number") return "–";
  if (seconds < 1) return (seconds * 1000).toFixed(0) + " ms";
  if (seconds < 120) return seconds.toFixed(1) + " s";
  if (seconds < 7200) return (seconds / 60).toFixed(1) + " min";
  if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
  return (seconds / 86400).toFixed(1) + " d";
}

function megabytes(bytes) {
  return typeof bytes === "number" ? (bytes / 1048576).toFixed(1) + " MiB" : "–";
}

function costText(cost, dropped) {
  const cpu = (n) => (typeof n === "number" ? n.toFixed(2) + " s" : "–");
  const parts = ["cpu " + cpu(cost.cpu_user) + " user, " + cpu(cost.cpu_system) + " system",
    "peak memory " + megabytes(cost.peak_memory) + (cost.from === "cgroup" ? "" : " (its largest process)")];
  if (cost.processes_seen) parts.push(cost.processes_seen + " processes seen (at least)");
  if (cost.oom_kills) parts.push(cost.oom_kills + " killed by the kernel at the memory limit");
  for (const [name, bytes] of Object.entries(dropped || {})) parts.push(name + ": " + bytes + " bytes dropped (output limit)");
  return parts.join(", ") + (cost.from === "cgroup" ? " (every process of the run)" : "");
}

function when(epoch) {
  return epoch ? new Date(epoch * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–";
}

function totalsLine(totals) {
  if (!totals) return null;
  const words = ["succeeded", "retried", "dead", "released"].map((k) => totals[k] + " " + k).join(", ");
  return el("p", { class: "muted", text: "runs counted by the managers, all told: " + words });
}

function shortList(names, shown) {
  return names.slice(0, shown).join(", ") + (names.length > shown ? " … and " + (names.length - shown) + " more" : "");
}

function progressCell(progress) {
  if (!progress) return el("td", { text: "–" });
  const share = typeof progress.total === "number" && progress.total > 0 ? Math.min(1, (progress.done || 0) / progress.total) : null;  // null: a number the server could not send (NaN)
  const bar = share === null ? null : el("progress", { max: "1", value: share.toFixed(3) });  // no style attribute: the CSP allows none
  const words = (share === null ? String(progress.done ?? "–") : (share * 100).toFixed(0) + "%") + (progress.message ? " " + progress.message : "");
  return el("td", {}, bar, words);
}

function chart(history) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", "chart");
  svg.setAttribute("viewBox", "0 0 600 110");
  svg.setAttribute("preserveAspectRatio", "none");
  const rates = [];
  for (let i = 1; i < history.length; i++) {
    const a = history[i - 1], b = history[i], minutes = Math.max((b.time - a.time) / 60, 1e-6);
    rates.push({
      succeeded: Math.max(0, b.succeeded - a.succeeded) / minutes,
      failed: Math.max(0, b.retried + b.dead - a.retried - a.dead) / minutes,
    });
  }
  const top = Math.max(1, ...rates.map((r) => Math.max(r.succeeded, r.failed)));
  const base = document.createElementNS(ns, "line");
  for (const [k, v] of [["x1", 0], ["y1", 105], ["x2", 600], ["y2", 105], ["class", "axis"]]) base.setAttribute(k, v);
  svg.append(base);
  for (const kind of ["succeeded", "failed"]) {
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", kind);
    const step = rates.length > 1 ? 600 / (rates.length - 1) : 0;
    line.setAttribute("points", rates.map((r, i) => (i * step).toFixed(1) + "," + (105 - (r[kind] / top) * 100).toFixed(1)).join(" "));
    svg.append(line);
  }
  const last = rates[rates.length - 1] || { succeeded: 0, failed: 0 };
  const legend = el("div", { class: "legend muted" },
    el("span", { class: "succeeded", text: "succeeded " + last.succeeded.toFixed(1) + "/min" }),
    el("span", { class: "failed", text: "failed " + last.failed.toFixed(1) + "/min" }),
    el("span", { text: rates.length ? "last " + Math.round((history[history.length - 1].time - history[0].time) / 60) + " min, peak " + top.toFixed(1) + "/min" : "collecting…" }));
  return el("div", {}, svg, legend);
}

// -- the overview -----------------------------------------------------------------

function queueCard(entry) {
  const status = entry.status;
  if (!status) return el("div", { class: "card" }, el("p", { class: "error", text: "queue " + entry.index + " cannot be read now" }));
  const counts = el("div", { class: "counts" }, ...STATES.filter((s) => s in status.counts).map((state) =>
    el("a", { class: "count " + state, href: "#/q/" + entry.index + "/" + state, "data-state": state },
      el("b", { text: String(status.counts[state]) }), state)));
  const alive = status.managers.filter((m) => m.live);
  const facts = el("div", { class: "facts" },
    el("span", { text: "oldest ready job waiting: " + (status.oldest_ready_age === null ? "none ready" : ago(status.oldest_ready_age)) }),
    el("span", { class: alive.length ? "" : "alert", text: "managers alive: " + alive.length }),
    status.paused ? el("span", { class: "alert", text: "PAUSED: " + status.paused }) : null,
    status.unserved.count ? el("span", { class: "alert", text: status.unserved.count + " ready job(s) no manager runs" }) : null);
  const managers = table(["owner", "host", "pid", "heartbeat", "busy", "contained by", "runs"], status.managers.map((m) =>
    el("tr", {}, el("td", {}, el("code", { text: m.owner })), el("td", { text: m.host }), el("td", { class: "num", text: String(m.pid) }),
      el("td", { class: m.live ? "" : "alert", text: ago(m.heartbeat_age) + " ago" + (m.reaping ? " (reaping)" : "") }),
      el("td", { class: "num", text: m.busy + "/" + (m.concurrency ?? "?") }),
      el("td", { text: m.containment ?? "?" }),
      el("td", { text: m.functions ? shortList(m.functions, 6) : "?" }))));
  const running = table(["job", "function", "attempt", "age", "cpu", "rss", "progress"], status.running.map((job) =>
    el("tr", {}, el("td", {}, el("a", { href: "#/job/" + entry.index + "/" + job.id, text: job.id })),
      el("td", { text: job.what }), el("td", { class: "num", text: job.attempt + "/" + job.max_attempts }),
      el("td", { class: "num", text: ago(job.age) }), el("td", { class: "num", text: typeof job.cpu === "number" ? job.cpu.toFixed(2) + " s" : "–" }),
      el("td", { class: "num", text: megabytes(job.rss) }), progressCell(job.progress))));
  return el("section", { class: "card queue", "data-queue": String(entry.index) },
    el("h2", {}, el("a", { href: "#/q/" + entry.index + "/ready", text: status.queue })),
    counts, facts,
    el("h3", { text: "runs per minute" }), chart(entry.history), totalsLine(entry.totals),
    el("h3", { text: "managers (" + status.managers.length + ")" }), status.managers.length ? managers : el("p", { class: "muted", text: "none" }),
    el("h3", { text: "running (" + status.running.length + ")" }), status.running.length ? running : el("p", { class: "muted", text: "none" }));
}

async function overview() {
  const data = await api("api/overview");
  render(...data.queues.map(queueCard));
}

// -- a list of jobs ---------------------------------------------------------------

async function jobList(index, state, query) {
  const params = new URLSearchParams({ queue: index, state, limit: 50 });
  for (const key of ["function", "after"]) if (query.get(key)) params.set(key, query.get(key));
  const data = await api("api/jobs?" + params);
  const form = el("form", { class: "filters" },
    el("select", { name: "state" }, ...STATES.map((s) => { const o = el("option", { value: s, text: s }); if (s === state) o.selected = true; return o; })),
    el("input", { name: "function", placeholder: "function", value: query.get("function") || "" }),
    el("button", { type: "submit", text: "show" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const fn = form.elements["function"].value.trim();
    location.hash = "#/q/" + index + "/" + form.elements["state"].value + (fn ? "?function=" + encodeURIComponent(fn) : "");
  });
  const rows = data.jobs.map((job) => el("tr", {},
    el("td", {}, el("a", { href: "#/job/" + index + "/" + job.id, text: job.id })),
    el("td", {}, el("span", { class: "state " + job.state, text: job.state })),
    el("td", { text: job.what }), el("td", { class: "num", text: job.attempts + "/" + job.max_attempts }),
    el("td", { text: when(job.created) }), el("td", { text: job.error || "" })));
  let next = null;
  if (data.next) {
    const more = new URLSearchParams(query);
    more.set("after", data.next);
    next = el("p", {}, el("a", { href: "#/q/" + index + "/" + state + "?" + more, text: "next page →" }));
  }
  render(el("p", {}, el("a", { href: "#/", text: "← all queues" })), el("h2", { text: state + " jobs of " + data.queue }), form,
    rows.length ? table(["job", "state", "what", "attempts", "created", "error"], rows)
      : el("p", { class: "muted", text: data.next ? "none of this function among the entries read for this page" : "no jobs here" }), next);
}

// -- one job ----------------------------------------------------------------------

async function jobPage(index, id) {
  const job = await api("api/job?" + new URLSearchParams({ queue: index, id }));
  const facts = table(["", ""], [
    ["state", job.state], ["what", job.what], ["attempts", job.attempts + "/" + job.max_attempts],
    ["created", when(job.created)], ["held by", job.owner || "–"], ["key", job.key || "–"],
    ["after", (job.depends_on || []).join(" ") || "–"],
    ["policy", Object.entries(job.policy).map(([k, v]) => k + " " + (v.value ?? "none") + " (" + v.source + ")").join(", ")],
  ].map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: String(v) }))));
  const parts = [el("p", {}, el("a", { href: "#/q/" + index + "/" + job.state, text: "← " + job.state + " jobs" })),
    el("h2", {}, "job ", el("code", { text: job.id }), " ", el("span", { class: "state " + job.state, text: job.state })), facts];
  if (job.error) parts.push(el("h3", { text: "cause" }), el("p", { class: "error cause", text: (job.error.reason || "") + ": " + (job.error.message || "") }));
  if (job.state === "done") parts.push(el("h3", { text: "result" }), el("pre", { text: JSON.stringify(job.result, null, 2) }));
  if (job.progress) parts.push(el("h3", { text: "progress" }), el("table", {}, el("tr", {}, progressCell(job.progress))));
  for (const run of [...job.history].reverse()) {
    const outcome = run.outcome || {};
    const error = outcome.error && outcome.error.message ? (outcome.error.type || "error") + ": " + outcome.error.message : "";
    parts.push(el("h3", { text: "run " + run.run + ": " + (outcome.status || "running") + (typeof outcome.wall_time === "number" ? ", " + outcome.wall_time.toFixed(3) + " s" : "") }));
    if (error) parts.push(el("p", { class: "error", text: error }));
    if (outcome.cost) parts.push(el("p", { class: "muted cost", text: costText(outcome.cost, outcome.output_dropped) }));
    const output = (job.output || {})[String(run.run)] || {};
    for (const name of ["stdout", "stderr"]) if (output[name]) parts.push(el("div", { class: "muted", text: name }), el("pre", { text: output[name] }));
  }
  parts.push(el("h3", { text: "events" }), el("pre", { text: job.events.join("\n") }));
  render(...parts);
}

// -- routing and refreshing -------------------------------------------------------

function render(...nodes) {
  document.getElementById("main").replaceChildren(...nodes.filter((n) => n));
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function show() {
  clearTimeout(timer);
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const parts = (path || "/").split("/").filter(Boolean);
  try {
    if (parts[0] === "q" && parts.length === 3) await jobList(parts[1], parts[2], new URLSearchParams(search || ""));
    else if (parts[0] === "job" && parts.length === 3) await jobPage(parts[1], parts[2]);
    else await overview();
  } catch (error) {
    render(el("p", { class: "error", text: String(error.message || error) }));
  }
  timer = setTimeout(show, REFRESH_MS);
}

window.addEventListener("hashchange", show);
show();
