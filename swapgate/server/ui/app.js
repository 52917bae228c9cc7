// swapgate's dashboard: follows GET /admin/events (a snapshot, then what changed) and acts
// through the admin API. Every name from the config is written as text, never as markup.
"use strict";

const TOKEN_KEY = "swapgate-admin-token";
let state = null;
let stream = null; // the AbortController of the stream being read
let retry = 1000;
let drawing = false;

const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function headers() {
  return { Authorization: "Bearer " + token(), "Content-Type": "application/json" };
}

// -- logging in and out ------------------------------------------------------------------

function showLogin(message) {
  if (stream) stream.abort();
  stream = null;
  sessionStorage.removeItem(TOKEN_KEY);
  $("board").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  setLive(false, "offline");
}

function showBoard() {
  $("login").hidden = true;
  $("board").hidden = false;
  readActivity();
  $("logout").hidden = false;
}

function setLive(on, text) {
  const live = $("live");
  live.textContent = text;
  live.className = "status " + (on ? "on" : "off");
}

// -- the event stream --------------------------------------------------------------------

async function follow() {
  const controller = new AbortController();
  stream = controller;
  let response;
  try {
    response = await fetch("/admin/events", {
      headers: headers(), signal: controller.signal, cache: "no-store",
    });
  } catch (error) {
    return reconnect(controller);
  }
  if (response.status === 401 || response.status === 404) {
    const body = await response.json().catch(() => ({}));
    return showLogin((body.error && body.error.message) || "the token was refused");
  }
  if (!response.ok || !response.body) return reconnect(controller);
  showBoard();
  setLive(false, "connecting"); // live once its snapshot is drawn from
  retry = 1000;
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        dispatch(block);
      }
    }
  } catch (error) {
    // cut: reconnect below
  }
  reconnect(controller);
}

function reconnect(controller) {
  if (stream !== controller || !token()) return; // logged out, or replaced
  setLive(false, "reconnecting");
  setTimeout(() => { if (stream === controller) follow(); }, retry);
  retry = Math.min(retry * 2, 10000);
}

function dispatch(block) {
  let kind = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) kind = line.slice(7);
    else if (line.startsWith("data: ")) data.push(line.slice(6));
  }
  if (!data.length) return; // a comment: the stream is alive
  apply(kind, JSON.parse(data.join("\n")));
}

function apply(kind, data) {
  if (kind === "snapshot") {
    state = data;
    draw(); // at once: "live" means the page shows this state
    setLive(true, "live");
    return;
  }
  if (!state) {
    return;
  } else if (kind === "instance") {
    const others = state.instances.filter((i) => i.name !== data.name);
    state.instances = data.removed ? others : mergeInstance(data);
  } else if (kind === "swap") {
    state.swaps.running = state.swaps.running.filter((r) => r.id !== data.id);
    if (data.event === "started" || data.event === "progress") state.swaps.running.push(data);
    else state.swaps.recent = state.swaps.recent.concat([data]).slice(-50);
  } else if (kind === "reload") {
    notice("configuration reloaded: " + data.instances.join(", "));
  } else if (kind === "dropped") {
    notice("this page fell behind and is reconnecting");
  } else if (kind in state) {
    state[kind] = data;
  }
  schedule();
}

function loading() {
  return Boolean(state) && (state.swaps.running.length > 0 ||
    state.instances.some((i) => Object.values(i.models).some((m) => m.state === "loading")));
}

function mergeInstance(data) {
  const list = state.instances.slice();
  const at = list.findIndex((i) => i.name === data.name);
  if (at >= 0) list[at] = data; else list.push(data);
  return list;
}

function notice(text) {
  $("notice").textContent = text + " (" + new Date().toLocaleTimeString() + ")";
}

function schedule() {
  if (drawing) return;
  drawing = true;
  requestAnimationFrame(() => { drawing = false; draw(); });
}

// -- drawing -----------------------------------------------------------------------------

function draw() {
  if (!state) return;
  $("replica").textContent = state.replica ? "replica " + state.replica : "";
  drawGrid();
  drawRunning();
  drawPlacements();
  drawSwaps();
  drawModels();
  drawCluster();
  drawKeys();
  drawPreload();
  drawJobs();
}

function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  return seconds < 90 ? seconds.toFixed(0) + " s" : (seconds / 60).toFixed(0) + " min";
}

function bytes(n) {
  return n === null || n === undefined ? "?" : (n / 2 ** 30).toFixed(1) + " GiB";
}

function allModels() {
  const names = new Set();
  for (const inst of state.instances) {
    for (const m of inst.serves) names.add(m);
    for (const m of Object.keys(inst.models)) names.add(m);
  }
  return [...names].sort();
}

function drawGrid() {
  const models = allModels();
  const head = el("tr", {}, el("th", {}, "instance"), models.map((m) => el("th", {}, m)));
  const rows = state.instances.map((inst) => el("tr", { "data-instance": inst.name },
    el("th", {}, instanceHeader(inst)),
    models.map((m) => el("td", { class: "cell", "data-model": m }, cell(inst, m)))));
  $("grid").replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
}

function instanceHeader(inst) {
  const condition = !inst.up ? "down" : inst.drained ? "drained" : "up";
  const parts = [
    el("strong", {}, inst.name), " ",
    el("span", { class: "state " + (inst.up ? "warm" : "down") }, condition),
    el("div", { class: "small" }, inst.kind + " · " + inst.inflight + " in flight"),
  ];
  if (inst.memory !== null) {
    parts.push(el("div", { class: "small" }, "memory " + bytes(inst.memory_used) + " of " + bytes(inst.memory)));
  }
  if (inst.backoff_until) {
    const why = inst.failure ? inst.failure.model + ": " + inst.failure.error : "failed loads";
    parts.push(el("div", { class: "small error" }, "backoff until " + new Date(inst.backoff_until).toLocaleTimeString() + " (" + why + ")"));
  }
  parts.push(el("div", {}, el("button", {
    type: "button", class: "drain",
    onclick: () => act("/admin/instances/" + encodeURIComponent(inst.name) + (inst.drained ? "/undrain" : "/drain")),
  }, inst.drained ? "undrain" : "drain")));
  return parts;
}

function cell(inst, model) {
  if (!inst.serves.includes(model) && !inst.models[model]) return "";
  const view = inst.models[model];
  const st = view ? view.state : "cold";
  const out = [el("span", { class: "state " + st, "data-state": st }, st)];
  const running = state.swaps.running.find((r) => r.instance === inst.name && r.model === model);
  if (st === "loading") {
    const eta = running ? running.eta_seconds : state.models[model] && state.models[model].eta_seconds[inst.name];
    out.push(el("div", { class: "small" }, ago(view.since) + " of ~" + Math.round(eta || 0) + " s"));
    if (running && running.figure) out.push(el("div", { class: "small" }, running.figure.text));
  }
  if (view && view.inflight) out.push(el("div", { class: "small" }, view.inflight + " in flight"));
  // Its weights in the host's page cache: a swap of it then reads RAM, not disk (docs/host-cache.md)
  const weights = state.models[model] && state.models[model].weights;
  if (st !== "warm" && weights && weights.bytes) {
    const share = Math.round(100 * weights.resident_bytes / weights.bytes);
    out.push(el("div", { class: "small", "data-weights": String(share) }, "weights " + share + "% in RAM"));
  }
  if (view && view.diagnosis) out.push(diagnosis(view.diagnosis));
  if (view && view.pinned_until) {
    out.push(el("div", { class: "small" }, "pinned until " + new Date(view.pinned_until).toLocaleTimeString()));
  }
  // A model that cannot load here now, and why: its own backoff, not its instance's
  if (view && view.unreachable) {
    out.push(el("div", { class: "small error", "data-unreachable": "" }, "unreachable: " + view.unreachable));
  } else if (view && view.backoff_until) {
    out.push(el("div", { class: "small error", "data-backoff": view.backoff_until, title: view.failure || "" },
      "backoff until " + new Date(view.backoff_until).toLocaleTimeString() + " (its load failed)"));
  }
  if (st === "warm" || st === "asleep") {
    out.push(el("button", { type: "button", class: "unload", onclick: () => unload(inst, model, view) }, "unload"));
  }
  return out;
}

// A warm engine's diagnosis and the figures behind it, worded as `swapgate status` words them
// (docs/operations.md, "Is the decay local?").
function diagnosis(d) {
  let figures = "TTFT baseline not ready";
  if (d.ttft_drift_ratio !== null) {
    figures = "TTFT p95 " + d.ttft_drift_ratio.toFixed(1) + "× baseline";
    if (d.rss_slope_bytes_per_hour !== null) {
      const mib = d.rss_slope_bytes_per_hour / 2 ** 20;
      figures += ", memory " + (mib >= 0 ? "+" : "") + mib.toFixed(0) + " MiB/h";
    }
    if (d.relay_drift_ratio !== null) figures += ", relay " + d.relay_drift_ratio.toFixed(1) + "×";
  }
  const detail = "TTFT p50 " + d.ttft_p50_ms + " ms, p95 " + d.ttft_p95_ms + " ms (baseline " +
    d.ttft_baseline_p95_ms + " ms, " + d.prompt_band + " prompts) · " + d.requests_per_second + " req/s";
  return el("div", { class: "small diagnosis " + d.state, "data-diagnosis": d.state, title: detail },
    d.state + " · " + figures);
}

const CLASSES = { 10: "interactive", 0: "default", "-10": "batch" };

function priorityClass(priority) {
  return priority in CLASSES ? CLASSES[priority] + " (" + priority + ")" : String(priority);
}

function drawKeys() {
  const keys = Object.entries(state.keys || {});
  $("keys-section").hidden = keys.length === 0;
  // With replicas, a limited key's use across all of them (what its limits count) follows
  const shared = (state.cluster && state.cluster.keys) || {};
  const use = (name, key, what, limit) => {
    const all = shared[name] && shared[name][what];
    return key[what] + (all !== undefined ? " here, " + all + " in all" : "") + (limit ? " of " + limit : "");
  };
  const rows = keys.map(([name, key]) => el("tr", { "data-key": name },
    el("td", {}, name), el("td", {}, priorityClass(key.priority)),
    el("td", {}, key.models.join(", ")),
    el("td", { "data-use": "in_flight" }, use(name, key, "in_flight", key.concurrency)),
    el("td", { "data-use": "last_minute" }, use(name, key, "last_minute", key.rpm)),
    el("td", {}, key.expires ? new Date(key.expires).toLocaleString() : "never")));
  $("keys").tBodies[0].replaceChildren(...rows);
}

function drawRunning() {
  const items = state.swaps.running.map((r) => el("li", {},
    el("strong", {}, r.model), " → " + r.instance + " (" + r.kind + ") · ",
    ago(new Date(r.started_at * 1000).toISOString()) + " of ~" + Math.round(r.eta_seconds) + " s · ",
    r.waiters + " waiting",
    r.figure ? el("div", { class: "small", "data-figure": String(r.figure.ratio) }, r.figure.text) : null,
    r.victims.length ? el("div", { class: "small" }, "evicting " + r.victims.join(", ") + " (" + r.reason + ")") : null));
  $("running").replaceChildren(...(items.length ? items : [el("li", { class: "small" }, "none")]));
}

function drawPlacements() {
  const counts = state.placements.counts;
  const total = Object.values(counts).reduce((a, b) => a + b, 0);
  const rows = [];
  for (const kind of ["warm", "swap", "queued", "relay"]) {
    const n = counts[kind] || 0;
    const share = total ? " (" + (100 * n / total).toFixed(1) + "%)" : "";
    rows.push(el("dt", {}, kind), el("dd", { "data-placement": kind }, n + share));
  }
  rows.push(el("dt", {}, "thrash"), el("dd", {}, String(state.placements.thrash)));
  $("placements").replaceChildren(...rows);
}

function drawSwaps() {
  const rows = state.swaps.recent.slice().reverse().map((r) => el("tr", { "data-swap": r.id, id: "swap-" + r.id },
    el("td", {}, new Date((r.started_at + (r.seconds || 0)) * 1000).toLocaleTimeString()),
    el("td", {}, r.model), el("td", {}, r.instance), el("td", {}, r.kind),
    el("td", { class: r.result === "ok" ? "" : "error", "data-result": r.result }, r.result + (r.error ? ": " + r.error : "")),
    el("td", { "data-seconds": "" }, r.seconds === null ? "" : r.seconds.toFixed(2)),
    el("td", {}, r.victims.join(", ")), el("td", {}, r.reason)));
  $("swaps").tBodies[0].replaceChildren(...rows);
}

function drawModels() {
  const cards = Object.entries(state.models).map(([name, info]) => {
    const demand = info.demand;
    const peaks = new Set(demand.peaks);
    const top = Math.max(1, ...demand.today);
    const bars = el("div", { class: "bars", title: "today's requests by quarter-hour (UTC)" },
      demand.today.map((n, slot) => {
        const bar = el("span", { class: peaks.has(slot) ? "peak" : "" });
        bar.style.height = Math.round(100 * n / top) + "%"; // CSSOM: allowed by the CSP
        return bar;
      }));
    const job = (state.jobs || []).find((j) => j.model === name && j.next_run);
    // Its loads fail fleet-wide: answered at once until its next probe (docs/operations.md)
    const failing = info.failing
      ? el("div", { class: "small error", "data-failing": name, title: info.failing.error },
        "failing: " + info.failing.error + " · next try in " + Math.round(info.failing.next_probe_in) + "s")
      : null;
    return el("div", { class: "card", "data-model": name },
      el("strong", {}, name),
      failing,
      el("div", { class: "small" }, "queue " + info.queue + " · warm on " + (info.warm_on.join(", ") || "none")),
      bars,
      el("div", { class: "small" }, "peaks " + (demand.peaks.map(slotTime).join(", ") || "none learned") +
        (job ? " · next preload " + new Date(job.next_run).toLocaleString() : "")));
  });
  $("models").replaceChildren(...cards);
}

function drawCluster() {
  const cluster = state.cluster;
  $("cluster-section").hidden = !cluster;
  if (!cluster) return;
  const locks = Object.entries(cluster.swap_locks).map(([inst, lock]) => inst + ": " + lock.model + " by " + lock.replica);
  $("cluster").replaceChildren(
    el("dt", {}, "this replica"), el("dd", {}, cluster.replica),
    el("dt", {}, "redis"), el("dd", {}, cluster.redis_up ? "up" : "down: each replica on its own"),
    el("dt", {}, "replicas"), el("dd", {}, cluster.replicas.map((r) => r.id).join(", ")),
    el("dt", {}, "swap locks"), el("dd", { id: "swap-locks" }, locks.join("; ") || "none"),
    el("dt", {}, "schedules run by"), el("dd", {}, cluster.scheduler || "nobody yet"));
}

function slotTime(slot) {
  const minutes = slot * 15;
  return String(Math.floor(minutes / 60)).padStart(2, "0") + ":" + String(minutes % 60).padStart(2, "0");
}

function drawPreload() {
  fillSelect($("preload-model"), Object.keys(state.models), null);
  fillSelect($("preload-instance"), state.instances.map((i) => i.name), "where placed");
}

function fillSelect(select, names, any) {
  const current = select.value;
  const wanted = (any ? [""] : []).concat(names);
  const have = [...select.options].map((o) => o.value);
  if (have.join("\n") === wanted.join("\n")) return;
  select.replaceChildren(...wanted.map((n) => el("option", { value: n }, n || any)));
  if (wanted.includes(current)) select.value = current;
}

function drawJobs() {
  const items = (state.jobs || []).map((job) => el("li", {},
    el("strong", {}, job.name), " " + job.model + (job.auto ? " (auto)" : " (" + job.cron + ")"),
    el("div", { class: "small" }, "next " + (job.next_run ? new Date(job.next_run).toLocaleString() : "none") +
      (job.last_result ? " · last " + (job.last_result.ok ? "ok" : "failed") : "")),
    el("button", { type: "button", onclick: () => act("/admin/jobs/" + encodeURIComponent(job.name) + "/run") }, "run now")));
  $("jobs").replaceChildren(...(items.length ? items : [el("li", { class: "small" }, "none")]));
}

// -- acting ------------------------------------------------------------------------------

async function act(path, body) {
  const response = await fetch(path, { method: "POST", headers: headers(), body: body ? JSON.stringify(body) : null });
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) return showLogin("the token was refused");
  notice(response.ok ? path.split("/").slice(2).join(" ") + ": done" : (answer.error && answer.error.message) || "failed: " + response.status);
  return answer;
}

function unload(inst, model, view) {
  const busy = view ? view.inflight : 0;
  if (busy && !confirm(model + " on " + inst.name + " serves " + busy + " request(s) now; unloading cuts them. Unload?")) return;
  act("/admin/unload", { model, instance: inst.name });
}

// -- activity: each request's row, read from the admin API every few seconds -------------------

const ACTIVITY_EVERY = 2000;

let newestRow; // the newest row's id when the counts were last read

async function readActivity() {
  if (!token() || $("board").hidden) return;
  try {
    const page = await getJson("/admin/activity?limit=30");
    drawActivity(page.rows, page.trace_url);
    const newest = page.rows.length ? page.rows[0].id : null;
    if (newest !== newestRow) { // the counts scan an hour of rows: only when some came
      drawTraffic(await getJson("/admin/activity/counts?since=1h&bucket=5m"));
      newestRow = newest;
    }
  } catch (error) {
    notice("the activity log cannot be read: " + error.message);
  }
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) throw new Error(path + " answered " + response.status);
  return response.json();
}

function ms(value) {
  if (value === null) return "";
  return value >= 1000 ? (value / 1000).toFixed(2) + " s" : value.toFixed(0) + " ms";
}

// A request's trace in the backend's own UI, where tracing.ui_url says it is
function traceLink(traceId, traceUrl) {
  if (!traceId || !traceUrl) return null;
  const href = traceUrl.replace("{trace_id}", encodeURIComponent(traceId));
  return el("a", { href, target: "_blank", rel: "noopener", "data-trace-link": traceId }, " trace");
}

function drawActivity(rows, traceUrl) {
  $("activity").tBodies[0].replaceChildren(...rows.map((r) => el("tr", { "data-request": r.request_id },
    el("td", {}, new Date(r.at * 1000).toLocaleTimeString()), el("td", {}, r.key || ""),
    el("td", {}, r.model), el("td", {}, r.instance || ""), el("td", { "data-placement": r.placement }, r.placement),
    el("td", {}, r.swap_id === null ? "" : el("a", { href: "#swap-" + r.swap_id, "data-swap-link": r.swap_id }, "#" + r.swap_id)),
    el("td", {}, ms(r.wait_ms)), el("td", {}, ms(r.ttft_ms)), el("td", {}, ms(r.duration_ms)),
    el("td", {}, r.tokens_in === null && r.tokens_out === null ? "" : (r.tokens_in ?? "?") + " → " + (r.tokens_out ?? "?")),
    el("td", { class: r.status >= 400 ? "error" : "" }, r.status + (r.error ? " " + r.error : "")),
    el("td", { class: "id" }, r.request_id, traceLink(r.trace_id, traceUrl)))));
}

function drawTraffic(body) {
  const slots = [...new Set(body.counts.map((c) => c.at))].sort((a, b) => a - b);
  const series = new Map();
  for (const c of body.counts) {
    const name = (c.key || "(no key)") + " · " + c.model;
    if (!series.has(name)) series.set(name, new Map());
    series.get(name).set(c.at, c.requests);
  }
  $("traffic").tHead.replaceChildren(el("tr", {}, el("th", {}, "key · model"),
    slots.map((at) => el("th", {}, new Date(at * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })))));
  $("traffic").tBodies[0].replaceChildren(...[...series.entries()].map(([name, counts]) =>
    el("tr", { "data-series": name }, el("td", {}, name), slots.map((at) => el("td", {}, String(counts.get(at) || 0))))));
}

// -- start -------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value);
    $("token").value = "";
    $("login-error").textContent = "";
    follow();
  });
  $("logout").addEventListener("click", () => showLogin(""));
  $("preload").addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { model: $("preload-model").value, count: Number($("preload-count").value) || 1, pin_for: $("preload-pin").value || "0s" };
    if ($("preload-instance").value) body.instance = $("preload-instance").value;
    act("/admin/preload?wait=false", body);
  });
  setInterval(() => { if (loading()) schedule(); }, 1000); // elapsed times move
  setInterval(readActivity, ACTIVITY_EVERY);
  if (token()) follow(); else showLogin("");
});
