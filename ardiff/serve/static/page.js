// The page of `ardiff serve`: start a session, watch its frames, steer it with the keys of
// `ardiff play`, switch its prompt, pause it, download its video, see the server's sessions.
// Nothing is fetched from elsewhere. With a token, it is asked for once (kept for the tab):
// on the first 401 of the page's load or of a click, never by the 2 s refresh.
//
//   /v1/info -> the form's defaults and the key map     POST /v1/sessions -> {id, stream}
//   WS stream -> | 4-byte length | JSON header | image | -> drawn in order on the canvas
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_NAMES = { ArrowLeft: "left", ArrowRight: "right", ArrowUp: "up", ArrowDown: "down",
                    " ": "space", Enter: "enter", Tab: "tab" };
const KEY_SIGNS = { left: "←", right: "→", up: "↑", down: "↓" };
let token = sessionStorage.getItem("ardiff-token");
let declined = false;  // the token prompt was cancelled: asked again on a click only
let info = null, session = null, socket = null, paused = false;
let drawing = Promise.resolve();  // frames are drawn one after another, in arrival order
let shown = [];  // when recent frames were drawn, for the fps

function askToken() {  // window.prompt blocks the page: one question at a time
  const answer = declined ? null : window.prompt("This server needs a token:");
  declined = answer === null;
  if (answer === null) return false;
  token = answer.trim();
  sessionStorage.setItem("ardiff-token", token);
  return true;
}

// fetch with the token; `ask`: on a 401, ask for the token (once) and try again.
async function api(path, options = {}, ask = true) {
  const sent = token;
  const headers = Object.assign({}, options.headers || {});
  if (sent) headers.Authorization = "Bearer " + sent;
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status !== 401 || !ask) return response;
  // A request sent before another one's answer retries with that token, without asking.
  if (token === sent && !askToken()) return response;
  return api(path, options, false);
}

async function errorOf(response) {
  try { return (await response.json()).error || response.statusText; }
  catch (e) { return response.statusText; }
}

function describeKeys(keys) {
  const byAction = {};
  for (const [key, action] of Object.entries(keys)) {
    (byAction[action] = byAction[action] || []).push(KEY_SIGNS[key] || key);
  }
  return Object.entries(byAction).map(([action, names]) => `${action} ${names.join(" ")}`);
}

function takesPrompts() {  // the pipeline's PipelineInputs (none declared: it may)
  return !(info && info.inputs && info.inputs.prompt === "ignored");
}

async function loadInfo() {
  const response = await api("/v1/info");
  if (!response.ok) { $("start-error").textContent = await errorOf(response); return; }
  info = await response.json();
  const d = info.defaults;
  const workers = info.workers ? ` on ${info.workers} workers` : "";
  $("server").textContent = `${info.pipeline} · ${info.capacity} sessions${workers}`;
  const fill = (id, value) => { if (!$(id).dataset.edited) $(id).value = value; };  // the user's stay
  if (takesPrompts() && typeof d.prompt === "string") fill("prompt", d.prompt);
  for (const id of ["prompt", "new-prompt", "on-switch", "switch"]) {  // a model that ignores them
    $(id).disabled = !takesPrompts();
    $(id).title = takesPrompts() ? "" : "this pipeline ignores prompts";
  }
  fill("seed", d.seed);
  fill("frames", d.frames === null ? "" : d.frames);
  const keys = describeKeys(info.keys);
  $("keys").textContent = keys.length ? "keys: " + keys.join(" · ") : "";
}

async function start(event) {
  event.preventDefault();
  $("start-error").textContent = "";
  declined = false;
  if (info === null) await loadInfo();
  if (info === null) return;
  const body = { image: "jpeg" };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  if (takesPrompts() && ($("prompt").value || typeof info.defaults.prompt === "string")) {
    body.prompt = $("prompt").value;
  }
  body.frames = $("frames").value === "" ? null : Number($("frames").value);
  if ($("mode").value) body.mode = $("mode").value;
  const response = await api("/v1/sessions", { method: "POST", body: JSON.stringify(body),
                                               headers: { "Content-Type": "application/json" } });
  if (!response.ok) { $("start-error").textContent = await errorOf(response); return; }
  const previous = session;
  disconnect();
  session = await response.json();
  if (previous) api(`/v1/sessions/${previous.id}`, { method: "DELETE" }, false);  // its slot back
  $("session-id").textContent = session.id.slice(0, 8) + "…";
  $("session-id").title = session.id;
  $("live").hidden = false;
  showEnd("", false);
  paused = false;
  $("pause").textContent = "Pause";
  connect();
  $("screen").focus();
  refreshSessions();
}

function showEnd(text, isError) {
  $("live-error").textContent = text;
  $("live-error").className = isError ? "error" : "note";
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const query = token ? "?token=" + encodeURIComponent(token) : "";
  const ws = new WebSocket(`${scheme}//${location.host}${session.stream}${query}`);
  ws.binaryType = "arraybuffer";
  ws.onmessage = (message) => {
    if (typeof message.data === "string") {
      const event = JSON.parse(message.data);
      if (event.event === "error" || event.error) showEnd(event.error, true);
      else showEnd(`session ${event.event} after ${event.frames} frames`, false);
      return;
    }
    drawing = drawing.then(() => draw(message.data)).catch((e) => showEnd(String(e), true));
  };
  ws.onclose = (close) => {
    if (close.code !== 1000) {
      showEnd(close.reason || `the stream closed (code ${close.code}); start a new session`,
              true);
    }
    refreshSessions();
  };
  socket = ws;
}

function disconnect() {  // the page's own close: not an error to show
  if (socket) { socket.onclose = null; socket.onmessage = null; socket.close(); }
  socket = null;
}

async function draw(buffer) {
  // | 4 bytes: header length, big-endian | JSON header | image |
  const length = new DataView(buffer).getUint32(0);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buffer, 4, length)));
  const image = new Blob([new Uint8Array(buffer, 4 + length)], { type: "image/" + header.format });
  const bitmap = await createImageBitmap(image);
  const canvas = $("screen");
  if (canvas.width !== bitmap.width || canvas.height !== bitmap.height) {
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
  }
  canvas.getContext("2d").drawImage(bitmap, 0, 0);
  bitmap.close();
  const now = performance.now();
  shown = shown.filter((t) => now - t < 1000).concat([now]);
  $("stats").textContent = `frame ${header.frame} · ${shown.length} fps · latency ` +
    `${header.latency_ms.toFixed(1)} ms · dropped ${header.dropped} · actions ` +
    `${(header.actions || []).join(",") || "-"}`;
  $("now-prompt").textContent = header.prompt ? "prompt: " + header.prompt : "";
}

function send(message) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
}

function onKey(event) {
  const typing = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
  if (!info || !session || typing || event.ctrlKey || event.metaKey || event.altKey) return;
  const named = KEY_NAMES[event.key] || event.key;
  const action = info.keys[named] ?? info.keys[named.toLowerCase()];
  if (action === undefined) return;
  event.preventDefault();
  send({ action });
}

async function download() {
  const response = await api(`/v1/sessions/${session.id}/video`);
  if (!response.ok) { showEnd(await errorOf(response), true); return; }
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = "ardiff-session.mp4";
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60000);
}

async function refreshSessions() {
  const response = await api("/v1/sessions", {}, false);
  if (!response.ok) {
    $("kv").textContent = response.status === 401 ? "a token is needed to list the sessions" : "";
    return;
  }
  const data = await response.json();
  $("kv").textContent = `KV pages in use: ${data.kv_pages_in_use ?? "-"} of ` +
    `${data.kv_pages_total ?? "-"} · sessions ${data.sessions.length} of ${data.capacity}`;
  const byWorker = data.sessions.some((s) => s.worker !== undefined);  // --workers N
  $("worker-column").hidden = !byWorker;
  const rows = data.sessions.map((s) => {
    const row = document.createElement("tr");
    if (session && s.id === session.id) row.className = "mine";
    const p50 = s.latency_ms && s.latency_ms.p50 !== null ? s.latency_ms.p50.toFixed(1) : "-";
    const values = [s.id.slice(0, 6) + "…", s.status, s.mode, s.frames, p50, s.kv_pages,
                    s.clients].concat(byWorker ? [s.worker] : []);
    for (const value of values) {  // a session lost with its worker has only id and status
      const cell = document.createElement("td");
      cell.textContent = value === undefined || value === null ? "-" : String(value);
      if (value === s.status && s.error) cell.title = s.error;
      row.appendChild(cell);
    }
    return row;
  });
  $("session-rows").replaceChildren(...rows);
}

$("start-form").addEventListener("submit", start);
$("start-form").addEventListener("input", (event) => { event.target.dataset.edited = "1"; });
$("switch-form").addEventListener("submit", (event) => {
  event.preventDefault();
  send({ prompt: $("new-prompt").value, on_switch: $("on-switch").value });
  $("screen").focus();
});
$("pause").addEventListener("click", () => {
  paused = !paused;
  send({ pause: paused });
  $("pause").textContent = paused ? "Resume" : "Pause";
});
$("video").addEventListener("click", download);
$("close").addEventListener("click", async () => {
  disconnect();
  const closing = session;
  session = null;
  $("live").hidden = true;
  await api(`/v1/sessions/${closing.id}`, { method: "DELETE" });
  refreshSessions();
});
$("screen").addEventListener("click", () => $("screen").focus());
document.addEventListener("keydown", onKey);
loadInfo().then(refreshSessions);
setInterval(refreshSessions, 2000);
