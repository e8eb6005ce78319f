// The memory browser's behaviour: calls the HTTP API of the server that served the page (with the bearer token kept
// in sessionStorage when the server asks for one), lists namespaces and a namespace's memories newest first, searches,
// adds, deletes after a confirmation, and polls the store's stats for a chart of hot share and mean latency.
// Ids are handled as strings (id_str) throughout: JavaScript numbers lose the digits of 63-bit ids.

const params = new URLSearchParams(location.search);
const POLL_MS = Math.max(250, 1000 * Number(params.get("poll") || 2));
const CHART_POINTS = 60;
const $ = (id) => document.getElementById(id);

const state = {
  token: sessionStorage.getItem("tiered-recall-token") || "",
  namespace: null,   // the namespace listed (its stored name), null for every one
  cursors: [],       // the cursor of each page shown so far (null for the newest)
  next: null,        // the cursor of the next, older page
  samples: [],       // {searches, hot, meanUs} from store_metrics, one per poll
  points: [],        // {hotShare, meanMs} per interval, null where no search ran
};

class ApiError extends Error {}

async function api(path, { method = "GET", body } = {}) {
  const headers = {};
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await response.json().catch(() => ({}));
  if (response.status === 401) {
    askToken(data.message || "This server needs a token.");
    throw new ApiError(data.message || "a token is needed");
  }
  if (!response.ok) throw new ApiError(data.message || `${response.status} ${response.statusText}`);
  return data;
}

function showError(error) {
  $("error-line").textContent = error instanceof Error ? error.message : String(error);
}

function clearError() {
  $("error-line").textContent = "";
}

function askToken(reason) {
  $("token-reason").textContent = reason;
  if (!$("token-dialog").open) $("token-dialog").showModal();
}

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text ?? "";
  if (className) td.className = className;
  return td;
}

function when(iso) {
  return new Date(iso).toLocaleString(undefined, { dateStyle: "short", timeStyle: "medium" });
}

function deleteButton(memory, after) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "delete";
  button.dataset.id = memory.id_str;
  button.textContent = "delete";
  button.addEventListener("click", async () => {
    const shown = memory.text.length > 80 ? `${memory.text.slice(0, 77)}…` : memory.text;
    if (!confirm(`Delete this memory?\n\n“${shown}”\n\n(id ${memory.id_str}, namespace ${memory.namespace})`)) return;
    try {
      await api(`/v1/memories/${memory.id_str}`, { method: "DELETE" });
      clearError();
      await after();
    } catch (error) {
      showError(error);
    }
  });
  return button;
}

// ---- namespaces ------------------------------------------------------------------------------
async function loadNamespaces() {
  const found = await api("/v1/namespaces");
  const list = $("namespaces");
  list.replaceChildren();
  const entries = [{ namespace: null, memories: found.memories, hot: null }, ...found.namespaces];
  for (const entry of entries) {
    const item = document.createElement("li");
    item.dataset.namespace = entry.namespace ?? "";
    if (entry.namespace === state.namespace) item.className = "selected";
    const button = document.createElement("button");
    button.type = "button";
    const name = document.createElement("span");
    name.textContent = entry.namespace ?? "(every namespace)";
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = entry.hot === null ? `${entry.memories}` : `${entry.memories} · ${entry.hot} hot`;
    button.append(name, count);
    button.addEventListener("click", () => selectNamespace(entry.namespace));
    item.append(button);
    list.append(item);
  }
  $("namespaces-total").textContent = `${found.namespaces.length} namespaces, ${found.memories} memories`;
}

async function selectNamespace(namespace) {
  state.namespace = namespace;
  state.cursors = [null];
  if (namespace) $("add-namespace").value = namespace;
  await refresh();
}

// ---- a namespace's memories, newest first ------------------------------------------------------
async function loadMemories() {
  const query = new URLSearchParams({ limit: "20" });
  if (state.namespace) query.set("namespace", state.namespace);
  const cursor = state.cursors[state.cursors.length - 1];
  if (cursor) query.set("cursor", cursor);
  const page = await api(`/v1/memories?${query}`);
  const body = $("memories").tBodies[0];
  body.replaceChildren();
  for (const memory of page.memories) {
    const row = body.insertRow();
    row.dataset.id = memory.id_str;
    cell(row, when(memory.created_at));
    cell(row, memory.namespace);
    cell(row, memory.role);
    cell(row, memory.text, "text");
    cell(row, memory.id_str, "id");
    row.insertCell().append(deleteButton(memory, refresh));
  }
  state.next = page.next_cursor;
  $("memories-older").disabled = !page.next_cursor;
  $("memories-title").textContent = `Memories of ${state.namespace ?? "every namespace"}, newest first`;
  const pageNumber = state.cursors.length;
  $("memories-status").textContent = page.memories.length ? `page ${pageNumber}` : "no memories here yet";
}

// ---- search ----------------------------------------------------------------------------------
async function search(event) {
  event?.preventDefault();
  const query = $("search-query").value.trim();
  if (!query) return;
  const body = { query, k: Number($("search-k").value) || 10, explain: true };
  if ($("search-vector-only").checked) body.stages = false;
  if (state.namespace) body.namespace = state.namespace;
  const started = performance.now();
  let found;
  try {
    found = await api("/v1/search", { method: "POST", body });
    clearError();
  } catch (error) {
    showError(error);
    return;
  }
  const roundTrip = performance.now() - started;
  const table = $("search-results");
  const rows = table.tBodies[0];
  rows.replaceChildren();
  found.hits.forEach((hit, rank) => {
    const row = rows.insertRow();
    row.dataset.id = hit.id_str;
    cell(row, String(rank + 1), "num");
    cell(row, hit.score.toFixed(3), "num score");
    const tier = document.createElement("span");
    tier.className = `tier ${hit.tier}`;
    tier.textContent = hit.tier;
    row.insertCell().append(tier);
    cell(row, hit.namespace);
    cell(row, hit.role);
    cell(row, hit.text, "text");
    row.insertCell().append(deleteButton(hit, async () => { await refresh(); await search(); }));
  });
  table.hidden = found.hits.length === 0;
  $("search-meta").textContent = `${found.hits.length} hits · rule ${found.rule} · path ${found.path} · ` +
    `${(found.seconds * 1e3).toFixed(2)} ms in the store (${roundTrip.toFixed(1)} ms with HTTP)`;
}

// ---- add -------------------------------------------------------------------------------------
async function add(event) {
  event.preventDefault();
  const text = $("add-text").value.trim();
  const namespace = $("add-namespace").value.trim();
  if (!text || !namespace) return;
  const memory = { text };
  const role = $("add-role").value.trim();
  if (role) memory.role = role;
  try {
    const added = await api("/v1/memories", { method: "POST", body: { memories: [memory], namespace } });
    $("add-status").textContent = `added ${added.id_strs[0]} to ${added.namespace}`;
    $("add-text").value = "";
    clearError();
    await refresh();
  } catch (error) {
    showError(error);
  }
}

// ---- stats and the chart -----------------------------------------------------------------------
function statLine(list, name, value) {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value ?? "–";
  dd.dataset.stat = name;
  list.append(dt, dd);
}

async function pollStats() {
  let stats;
  try {
    stats = await api("/v1/stats");
  } catch (error) {
    $("stats").replaceChildren();
    $("chart-line").textContent = error.message;  // a scoped token may not read the whole store's stats
    return;
  }
  const list = $("stats");
  list.replaceChildren();
  statLine(list, "memories", stats.cold_rows);
  statLine(list, "hot rows", `${stats.hot_rows} of ${stats.hot_capacity}`);
  statLine(list, "hot tier", stats.hot_backend ?? `none (${stats.hot_error ?? "off"})`);
  statLine(list, "embedder", stats.embedder ?? "none (vectors)");
  const metrics = stats.store_metrics ?? {};
  statLine(list, "searches", metrics.searches);
  statLine(list, "adds", metrics.adds);
  $("store-line").textContent = `${stats.path} · ${stats.dim}-wide · ${stats.cold_rows} memories`;
  state.samples.push({ searches: metrics.searches ?? 0, hot: (metrics.searches_by_path ?? {}).hot ?? 0,
                       meanUs: metrics.search_mean_us ?? 0 });
  if (state.samples.length >= 2) {
    const [before, now] = state.samples.slice(-2);
    const searches = now.searches - before.searches;
    state.points.push(searches > 0 ? {
      hotShare: (now.hot - before.hot) / searches,
      meanMs: (now.meanUs * now.searches - before.meanUs * before.searches) / searches / 1e3,
    } : null);
    state.points = state.points.slice(-CHART_POINTS);
    state.samples = state.samples.slice(-2);
    drawChart();
  }
}

function svg(name, attributes, text) {
  const element = document.createElementNS("http://www.w3.org/2000/svg", name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

function drawChart() {
  const chart = $("chart");
  const [width, height, left, right, top, bottom] = [300, 140, 28, 34, 8, 14];
  const inner = { w: width - left - right, h: height - top - bottom };
  const measured = state.points.filter(Boolean);
  const maxMs = Math.max(0.1, ...measured.map((p) => p.meanMs)) * 1.1;
  const x = (i) => left + (inner.w * i) / (CHART_POINTS - 1);
  const yShare = (share) => top + inner.h * (1 - share);
  const yMs = (ms) => top + inner.h * (1 - ms / maxMs);
  chart.replaceChildren(
    svg("line", { class: "grid", x1: left, x2: width - right, y1: yShare(0), y2: yShare(0) }),
    svg("line", { class: "grid", x1: left, x2: width - right, y1: yShare(1), y2: yShare(1) }),
    svg("text", { x: 2, y: yShare(1) + 3 }, "100%"),
    svg("text", { x: 2, y: yShare(0) + 3 }, "0%"),
    svg("text", { x: width - right + 3, y: yMs(maxMs) + 6 }, `${maxMs.toFixed(maxMs < 1 ? 2 : 1)} ms`),
    svg("text", { x: width - right + 3, y: yMs(0) + 3 }, "0 ms"),
    svg("text", { x: left, y: height - 2 }, `the last ${CHART_POINTS} polls, ${POLL_MS / 1000} s apart`),
  );
  const offset = CHART_POINTS - state.points.length;
  for (const [key, y, className] of [["hotShare", yShare, "hot"], ["meanMs", yMs, "latency"]]) {
    let run = [];
    const flush = () => {
      if (run.length) chart.append(svg("polyline", { class: className, points: run.join(" ") }));
      run = [];
    };
    state.points.forEach((point, i) => {
      if (point === null) flush();
      else run.push(`${x(offset + i).toFixed(1)},${y(point[key]).toFixed(1)}`);
    });
    flush();
  }
  const last = measured[measured.length - 1];
  $("chart-line").textContent = last ?
    `last interval: ${(100 * last.hotShare).toFixed(0)}% hot, ${last.meanMs.toFixed(3)} ms mean` :
    "no searches yet";
}

// ---- start -----------------------------------------------------------------------------------
async function refresh() {
  try {
    await Promise.all([loadNamespaces(), loadMemories()]);
    clearError();
  } catch (error) {
    showError(error);
  }
}

function start() {
  $("token-form").addEventListener("submit", () => {
    state.token = $("token-input").value.trim();
    sessionStorage.setItem("tiered-recall-token", state.token);
    $("token-change").hidden = false;
    refresh();
    pollStats();
  });
  $("token-change").addEventListener("click", () => askToken("Give another token."));
  $("token-change").hidden = !state.token;
  $("search-form").addEventListener("submit", search);
  $("add-form").addEventListener("submit", add);
  $("memories-newest").addEventListener("click", () => { state.cursors = [null]; loadMemories().catch(showError); });
  $("memories-older").addEventListener("click", () => {
    if (!state.next) return;
    state.cursors.push(state.next);
    loadMemories().catch(showError);
  });
  state.cursors = [null];
  refresh();
  pollStats();
  setInterval(pollStats, POLL_MS);
}

start();
