// The explorer's wiring: the form → POST v1/infer (twice when comparing with α = 1) → render.js.
import { ApiError, entry, getKey, indexSummary, infer, inferSchema, kbList, setKb, setKey } from "./api.js";
import { bundleLine, compareStrip, h, kbChange, pane } from "./render.js";

const $ = (id) => document.getElementById(id);
const CONTROLS = ["alpha", "mixing", "k", "temperature", "retrieval", "lexical_weight"];
let runSeq = 0; // a slower, older answer never overwrites a newer one

// --- form values -----------------------------------------------------------------------------
function readNumber(id) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined; // left empty: the service's default applies
  const v = Number(raw);
  return Number.isFinite(v) ? v : raw; // the service refuses a non-number with its own message
}

function params() {
  return {
    alpha: readNumber("alpha"), mixing: $("mixing").value, k: readNumber("k"), knn_temperature: readNumber("temperature"),
    retrieval: $("retrieval").value || undefined, // auto: the service picks hybrid where the bundle has BM25
    lexical_weight: readNumber("lexical_weight"),
  };
}

/** Bounds from the service's OpenAPI document, and the values it gives a parameter a request leaves
 * unset (GET v1/index `defaults.infer`, its settings), so the controls match this deployment. */
async function applySchema() {
  const props = await inferSchema();
  if (!props) return;
  let defaults = {};
  try {
    defaults = (await indexSummary()).defaults?.infer ?? {};
  } catch {
    // not ready yet, or no key: the page's own values stand
  }
  for (const id of ["alpha", "k", "temperature", "lexical_weight"]) {
    const name = id === "temperature" ? "knn_temperature" : id; // the τ control sends knn_temperature
    const p = props[name];
    if (!p) continue;
    if (name in defaults) $(id).value = defaults[name] === null ? "" : defaults[name]; // null: "auto"
    const branch = (p.anyOf ?? [p]).find((b) => b.type !== "null") ?? {};
    if (branch.maximum !== undefined) $(id).max = branch.maximum;
  }
  // The mixing the service applies to a request that names none (defaults.mixing): the page opens on
  // the answer the CLI and the API give, and joint mixing is one choice away.
  if (defaults.mixing) $("mixing").value = defaults.mixing;
  if (defaults.retrieval) $("retrieval").value = defaults.retrieval;
  syncAlpha("alpha");
  alphaHint();
}

function syncAlpha(from) {
  if (from === "alpha") {
    const v = Number($("alpha").value);
    if (Number.isFinite(v)) $("alpha-range").value = String(Math.min(1, Math.max(0, v)));
  } else {
    $("alpha").value = $("alpha-range").value;
  }
}

function alphaHint() {
  $("alpha-hint").textContent = $("mixing").value === "joint" ? "ignored by joint mixing" : "input's own attention";
}

// --- errors ----------------------------------------------------------------------------------
const FIELD_CONTROL = {
  alpha: "alpha", mixing: "mixing", k: "k", knn_temperature: "temperature", temperature: "temperature", retrieval: "retrieval", lexical_weight: "lexical_weight",
};

function clearError() {
  $("error").hidden = true;
  $("error").replaceChildren();
  document.querySelectorAll("[aria-invalid]").forEach((el) => el.removeAttribute("aria-invalid"));
}

function describe(err) {
  if (!(err instanceof ApiError)) return { title: "Error", text: String(err?.message || err) };
  const s = err.status;
  if (s === 429) {
    const wait = err.retryAfter ? ` Retry after ${err.retryAfter} s.` : " Retry in a moment.";
    return { title: "429 · service busy", text: `${err.message}.${wait}` };
  }
  if (s === 401) return { title: "401 · unauthorised", text: `${err.message}. Set the API key (top right) and run again.` };
  if (s === 403) return { title: "403 · forbidden", text: err.message };
  if (s === 422) return { title: "422 · invalid request", text: err.message };
  if (s === 413) return { title: "413 · too large", text: err.message };
  if (s === 503) return { title: "503 · not ready", text: `${err.message}. The service is loading or overloaded; try again shortly.` };
  if (s === 0) return { title: "network error", text: err.message };
  return { title: `${s} · ${err.type}`, text: err.message };
}

function showError(err) {
  const { title, text } = describe(err);
  const box = $("error");
  box.dataset.status = err?.status ?? "";
  box.dataset.type = err?.type ?? "";
  box.replaceChildren(h("strong", {}, title), " ", h("span", { class: "msg" }, text),
    err?.field ? h("span", { class: "field" }, ` (field: ${err.field})`) : null);
  box.hidden = false;
  const field = err?.field || "";
  const id = FIELD_CONTROL[field] ?? (field.startsWith("inputs") ? "text" : null);
  if (id) $(id).setAttribute("aria-invalid", "true");
}

// --- running ---------------------------------------------------------------------------------
async function run(ev) {
  ev?.preventDefault();
  const seq = ++runSeq;
  clearError();
  const input = $("text").value;
  const p = params();
  const body = (q) => ({ inputs: [input], ...q, return_tokens: true });
  const compare = $("compare").checked;
  const baseP = { ...p, alpha: 1, mixing: "fixed" };
  $("run").disabled = true;
  $("results").setAttribute("aria-busy", "true");
  $("status").textContent = compare ? "running (current setting and α = 1)…" : "running…";
  const t0 = performance.now();
  try {
    const [cur, base] = await Promise.all([infer(body(p)), compare ? infer(body(baseP)) : null]);
    if (seq !== runSeq) return;
    const runs = [{ variant: "current", title: "Current setting", params: p, response: cur, input }];
    if (base) runs.unshift({ variant: "baseline", title: "Plain model · α = 1, no KB", params: baseP, response: base, input });
    if (base) runs[1].title = "With the KB";
    show(runs, compare);
    $("status").textContent = `done in ${Math.round(performance.now() - t0)} ms`;
  } catch (err) {
    if (seq !== runSeq) return;
    showError(err);
    const kept = $("results").childElementCount > 0;
    $("results").classList.toggle("stale", kept);
    $("status").textContent = kept ? "below: the last run that succeeded" : "";
  } finally {
    if (seq === runSeq) {
      $("run").disabled = false;
      $("results").removeAttribute("aria-busy");
      document.body.dataset.done = String(seq); // runs finished (answer or error); the browser tests wait on it
    }
  }
}

function show(runs, compare) {
  const out = $("results");
  out.className = `results ${compare ? "compare" : "single"}`;
  const panes = runs.map((r) => pane(r, entry));
  const strip = compare ? compareStrip(runs[0], runs[1]) : null;
  const change = kbChange(runs[runs.length - 1].response.results[0]);
  out.replaceChildren(...[change, strip].filter(Boolean), h("div", { class: "panes" }, panes));
}

// --- header: bundle summary and API key --------------------------------------------------------
async function loadIndex() {
  try {
    $("bundle").textContent = bundleLine(await indexSummary());
    $("bundle").classList.remove("warn");
  } catch (err) {
    $("bundle").textContent = err.status === 401 ? "The service needs an API key: set it (top right)."
      : `index summary unavailable: ${err.message}`;
    $("bundle").classList.add("warn");
  }
}

/** The KB picker: shown when this key sees several KBs; opens on the service's default for the key
 * (or the first KB when there is none) and names the choice in every request from then on. */
async function loadKbs() {
  const field = $("kb-field");
  const select = $("kb");
  let listing;
  try {
    listing = await kbList();
  } catch {
    field.hidden = true; // 401 and the like: loadIndex says why
    setKb(null);
    return;
  }
  const names = listing.kbs.map((k) => k.name);
  const keep = names.includes(select.value) ? select.value : (listing.default ?? names[0] ?? "");
  select.replaceChildren(...listing.kbs.map((k) => h("option", { value: k.name },
    k.status === "ready" ? `${k.name} · ${k.chunks} chunks` : `${k.name} · ${k.status}`)));
  select.value = keep;
  field.hidden = names.length < 2;
  setKb(names.length < 2 ? null : keep);
}

async function loadHeader() {
  await loadKbs();
  await loadIndex();
}

function keyState() {
  $("key-state").textContent = getKey() ? "(set)" : "(none)";
}

function init() {
  $("api-key").value = getKey();
  keyState();
  $("api-key").addEventListener("change", () => { setKey($("api-key").value.trim()); keyState(); loadHeader(); });
  $("auth-form").addEventListener("submit", (ev) => { ev.preventDefault(); $("api-key").dispatchEvent(new Event("change")); });
  $("key-clear").addEventListener("click", () => { $("api-key").value = ""; setKey(""); keyState(); loadHeader(); });
  $("kb").addEventListener("change", () => { setKb($("kb").value); loadIndex(); });
  $("alpha").addEventListener("input", () => syncAlpha("alpha"));
  $("alpha-range").addEventListener("input", () => syncAlpha("range"));
  $("mixing").addEventListener("change", alphaHint);
  CONTROLS.forEach((id) => $(id).addEventListener("input", () => $(id).removeAttribute("aria-invalid")));
  $("query").addEventListener("submit", run);
  $("text").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) run(ev); });
  alphaHint();
  Promise.all([loadHeader(), applySchema()]).finally(() => { document.body.dataset.ready = "1"; });
}

init();
