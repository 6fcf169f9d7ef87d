// From one POST /v1/infer result (softknn/infer/engine.py Engine.result) to DOM. No fetching here except
// the lazy provenance lookup, which the caller passes in (`loadEntry`). Every number shown carries
// its raw value in data-value, so the browser tests compare against the API exactly.

/** Element builder: h("p", {class: "x", dataset: {a: 1}}, "text", child, ...). Text is never parsed as HTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "dataset") Object.entries(v).forEach(([dk, dv]) => { el.dataset[dk] = String(dv); });
    else if (k === "style") Object.assign(el.style, v);
    else if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** 3 decimals; values that would print as 0.000 in exponent form. */
export function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "—";
  if (typeof x !== "number" || !Number.isFinite(x)) return String(x);
  if (x !== 0 && Math.abs(x) < 0.5 * 10 ** -digits) return x.toExponential(1);
  return x.toFixed(digits);
}

const num = (field, value, digits = 3) =>
  h("span", { class: "num", dataset: { field, value } }, fmt(value, digits));

// Sequential ramp (ColorBrewer OrRd), t in [0, 1] → CSS colour. Memory shares are absolute: 0 = none
// of the layer's attention went to the KB, 1 = all of it; panes and runs are comparable.
const STOPS = [[255, 247, 236], [253, 212, 158], [252, 141, 89], [215, 48, 31], [127, 0, 0]];
export function ramp(t) {
  const x = Math.min(1, Math.max(0, Number.isFinite(t) ? t : 0)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const c = STOPS[i].map((a, j) => Math.round(a + f * (STOPS[i + 1][j] - a)));
  return `rgb(${c.join(",")})`;
}
const ink = (t) => (t > 0.6 ? "#fff" : "#1c1917");

const tokenName = (t, n) => (t.special ? (t.index === 0 ? "[CLS]" : t.index === n - 1 ? "[SEP]" : "[special]") : t.text);
// The API names both special tokens "[special]"; position 0 is [CLS], any later one [SEP] (BERT-style
// models, which is what sentence-transformers serves here).
const qName = (q) => (q.text === "[special]" ? (q.index === 0 ? "[CLS]" : "[SEP]") : `“${q.text}”`);
const pulledBy = (qts) => qts.map((q) => `${qName(q)} ${fmt(q.weight)}`).join(", ");

// --- input tokens ---------------------------------------------------------------------------
function tokensView(result, inputText) {
  const toks = result.tokens;
  if (!toks) return h("p", { class: "muted" }, "no tokens returned");
  const line = h("p", { class: "tokens", "aria-label": "input tokens shaded by memory mass share" });
  let prevEnd = null;
  toks.forEach((t) => {
    if (!t.special && prevEnd !== null && t.start > prevEnd) line.append(inputText.slice(prevEnd, t.start));
    const share = t.memory_share;
    line.append(h("span", {
      class: `tok${t.special ? " special" : ""}`,
      dataset: { index: t.index, value: share },
      style: { background: ramp(share), color: ink(share) },
      title: `${tokenName(t, toks.length)} · token ${t.index} · memory share ${fmt(share)}`,
    }, tokenName(t, toks.length)));
    if (!t.special) prevEnd = t.end;
  });
  return line;
}

function legend() {
  return h("div", { class: "legend", "aria-hidden": "true" },
    h("span", {}, "0"), h("span", { class: "ramp" }), h("span", {}, "1"),
    h("span", { class: "muted" }, " share of attention mass on the KB"));
}

// --- head × token heat map -----------------------------------------------------------------
// Coloured over the map's own [min, max] so differences between heads show even when every share
// is near 1 (joint mixing); a uniform map (fixed mixing gives every cell exactly 1 − α) keeps the
// absolute colour. The legend prints the range either way.
function heatmap(result) {
  const hm = result.head_memory_share;
  const toks = result.tokens;
  if (!hm || !toks) return h("p", { class: "muted" }, "no per-head shares returned");
  const n = toks.length;
  const flat = hm.flat();
  const lo = Math.min(...flat), hi = Math.max(...flat);
  const spread = hi - lo > 1e-4;
  const colour = (v) => ramp(spread ? (v - lo) / (hi - lo) : v);
  const grid = h("div", {
    class: "heat", role: "img",
    "aria-label": `memory share per head (${hm.length} rows) and token (${n} columns), from ${fmt(lo)} to ${fmt(hi)}`,
    style: { gridTemplateColumns: `2.2rem repeat(${n}, minmax(1.05rem, 1fr))` },
  });
  grid.append(h("span", { class: "corner" }));
  toks.forEach((t) => grid.append(h("span", { class: "col", title: tokenName(t, n) }, tokenName(t, n))));
  hm.forEach((row, head) => {
    grid.append(h("span", { class: "row" }, `h${head}`));
    row.forEach((v, ti) => grid.append(h("span", {
      class: "cell", dataset: { head, index: ti, value: v }, style: { background: colour(v) },
      title: `head ${head} · ${tokenName(toks[ti], n)} · memory share ${fmt(v)}`,
    })));
  });
  const key = spread
    ? h("div", { class: "legend" }, num("heat_min", lo), h("span", { class: "ramp" }), num("heat_max", hi),
      h("span", { class: "muted" }, " colour spans this map's range"))
    : h("div", { class: "legend" }, h("span", { class: "muted" }, "every head and token: "), num("heat_min", lo),
      result.diagnostics.mixing === "fixed" && lo > 0
        ? h("span", { class: "muted", dataset: { field: "flat_note" } },
          " — the α rule gives each exactly 1 − α; joint mixing shows where the KB was used")
        : null);
  return h("div", {}, h("div", { class: "heat-wrap" }, grid), key);
}

// --- label scores, prediction / abstain ----------------------------------------------------
function verdict(result) {
  if (result.label_scores === null || result.label_scores === undefined) {
    return h("div", { class: "verdict" }, h("p", { class: "muted" }, "The KB carries no labels: no label scores."));
  }
  const head = result.abstained
    ? h("p", { class: "decision abstain", dataset: { prediction: "" } },
      h("strong", {}, "abstained"), " — ", result.abstain_reason || "no reason given")
    : h("p", { class: "decision", dataset: { prediction: result.prediction } },
      "prediction ", h("strong", {}, result.prediction));
  const list = h("ul", { class: "scores" });
  for (const [label, v] of Object.entries(result.label_scores)) {
    list.append(h("li", { dataset: { label, value: v }, class: label === result.prediction ? "best" : null },
      h("span", { class: "lab" }, label),
      h("span", { class: "track" }, h("span", { class: "fill", style: { width: `${(100 * v).toFixed(1)}%` } })),
      num("label_score", v)));
  }
  return h("div", { class: "verdict" }, head, list);
}

// --- diagnostics ---------------------------------------------------------------------------
const DIAG = [
  ["memory_share", "memory share", "mean over heads and tokens of the attention mass on the KB"],
  ["retrieved", "retrieved", "|R|: chunks the fused layer attended"],
  ["w_db_entropy", "H(w_db)", "entropy of the k-NN weights (nats)"],
  ["w_db_effective_k", "effective k (w_db)", "exp(H(w_db))"],
  ["attention_entropy", "H(attention)", "entropy of the fused attention, mean over heads/tokens"],
  ["attention_effective_k", "effective k (attention)", "exp(H(attention))"],
  ["attention_entropy_intra", "H(input-only attention)", "entropy of the input's own attention alone"],
  ["truncation_bound", "truncation bound", "upper bound on kernel mass lost to top-k truncation"],
  ["alpha", "α", "null for joint mixing"],
  ["mixing", "mixing", ""],
  ["k", "k", ""],
  ["knn_temperature", "τ", "k-NN bandwidth"],
  ["retrieval", "retrieval", "the similarity the k-NN ranked by: hybrid, dense or lexical (BM25)"],
  ["lexical_weight", "λ", "BM25 weight of the hybrid similarity"],
  ["nearest_similarity", "nearest similarity", "largest e_q·e_c over the KB (the abstain gate's s₁)"],
  ["kernel", "kernel", ""],
  ["search", "search", "exact, or the ANN index that answered"],
  ["memory_layer", "memory layer", ""],
  ["n_tokens", "tokens", ""],
  ["truncated", "truncated", "input cut to the token or character limit"],
];
function diagnostics(d) {
  const dl = h("dl", { class: "diag" });
  for (const [field, label, help] of DIAG) {
    if (!(field in d)) continue;
    const v = d[field];
    const shown = typeof v === "number" && !Number.isInteger(v) ? fmt(v) : v === null ? "—" : String(v);
    dl.append(h("div", { title: help || null },
      h("dt", {}, label), h("dd", { dataset: { field, value: v === null ? "null" : v } }, shown)));
  }
  return dl;
}

// --- evidence ------------------------------------------------------------------------------
function spanTitle(s) {
  return `“${s.text}” · weight ${fmt(s.weight)} (${(100 * s.share).toFixed(1)}% of this chunk's mass)` +
    `\npulled by: ${pulledBy(s.query_tokens)}`;
}

/** The chunk text with its weighted word spans as <mark>s; spans are document offsets, so − item.start. */
export function highlighted(item) {
  const text = item.text;
  const spans = item.spans
    .map((s) => ({ s, a: s.start - item.start, b: s.end - item.start }))
    // a span with no weight drew nothing (α = 1, say): left unmarked
    .filter(({ s, a, b }) => s.weight > 0 && a >= 0 && b <= text.length && b > a)
    .sort((x, y) => x.a - y.a);
  const maxW = Math.max(0, ...spans.map(({ s }) => s.weight));
  const p = h("p", { class: "chunk" });
  let pos = 0;
  for (const { s, a, b } of spans) {
    if (a < pos) continue; // word spans never overlap; be safe if a future core sends some that do
    p.append(text.slice(pos, a));
    const rel = maxW > 0 ? s.weight / maxW : 0;
    p.append(h("mark", {
      class: "hl", tabindex: 0, title: spanTitle(s),
      dataset: { start: s.start, end: s.end, weight: s.weight, share: s.share, q: s.query_tokens.map((q) => q.index).join(" ") },
      style: { background: `rgba(245, 158, 11, ${(0.18 + 0.72 * rel).toFixed(3)})` },
    }, text.slice(a, b)));
    pos = b;
  }
  p.append(text.slice(pos));
  return p;
}

function bar(cls, v, label) {
  return h("span", { class: `bar ${cls}`, role: "meter", "aria-label": label, "aria-valuemin": 0, "aria-valuemax": 1, "aria-valuenow": v },
    h("span", { class: "fill", style: { width: `${Math.min(100, 100 * v).toFixed(1)}%` } }));
}

function provenance(item, loadEntry) {
  const body = h("div", { class: "prov-body muted" }, "loading…");
  const det = h("details", { class: "prov" }, h("summary", {}, "provenance"), body);
  det.addEventListener("toggle", async () => {
    if (!det.open || det.dataset.loaded) return;
    det.dataset.loaded = "1";
    try {
      const e = (await loadEntry(item.chunk_id)).entry;
      const meta = Object.entries(e.metadata || {}).map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`);
      body.replaceChildren(h("dl", { class: "kv" },
        h("dt", {}, "document"), h("dd", {}, `${e.doc_id}, chars ${e.start}–${e.end}`),
        h("dt", {}, "bundle row"), h("dd", {}, String(e.row)),
        h("dt", {}, "memory tokens"), h("dd", {}, String(e.token_spans.length)),
        h("dt", {}, "label"), h("dd", {}, e.label ?? "—"),
        h("dt", {}, "metadata"), h("dd", {}, meta.length ? meta.join(" · ") : "—")));
    } catch (err) {
      det.dataset.loaded = "";
      body.replaceChildren(h("span", { class: "inline-error" }, `${err.status || ""} ${err.message}`));
    }
  });
  return det;
}

function evidenceItem(item, loadEntry) {
  const detail = h("p", { class: "span-detail", hidden: true, "aria-live": "polite" });
  const chunk = highlighted(item);
  chunk.addEventListener("click", (ev) => {
    const m = ev.target.closest("mark.hl");
    if (!m) return;
    const s = item.spans.find((x) => String(x.start) === m.dataset.start);
    detail.textContent = spanTitle(s).replace("\n", " · ");
    detail.hidden = false;
  });
  return h("li", { class: "item", dataset: { chunkId: item.chunk_id, rank: item.rank } },
    h("div", { class: "item-head" },
      h("span", { class: "rank" }, `#${item.rank + 1}`),
      h("span", { class: "cid", title: `document ${item.doc_id}, chars ${item.start}–${item.end}` }, item.chunk_id),
      h("span", { class: `tag${item.label ? "" : " none"}`, dataset: { label: item.label ?? "" } }, item.label ?? "no label")),
    h("div", { class: "bars" }, bar("w", item.weight, "k-NN weight w_db"), bar("m", item.mass_share, "memory mass share")),
    h("p", { class: "nums" },
      h("span", { class: "key w" }, "w_db "), num("weight", item.weight), " · ",
      h("span", { class: "key m" }, "mass share "), num("mass_share", item.mass_share), " · ",
      h("span", { title: "the similarity s_c the k-NN ranked and weighted by" }, "s "), num("similarity", item.similarity), " · ",
      h("span", { title: "‖Δout‖/‖out‖ of the memory layer if this chunk were removed" }, "influence "),
      num("influence", item.influence)),
    why(item),
    chunk,
    detail,
    item.query_tokens.some((q) => q.weight > 0) ? h("p", { class: "pulled muted" }, "pulled most by: ", pulledBy(item.query_tokens)) : null,
    provenance(item, loadEntry));
}

/** Why the k-NN retrieved the chunk: its dense similarity, its BM25 score and the words that matched. */
function why(item) {
  const parts = [h("span", { title: "e_q·e_c, the embeddings' cosine" }, "dense "), num("dense_similarity", item.dense_similarity)];
  if (item.bm25 !== null && item.bm25 !== undefined) {
    parts.push(" · ", h("span", { title: "BM25 score of the chunk for the input" }, "BM25 "), num("bm25", item.bm25));
    const words = item.matched_terms || [];
    parts.push(" · ", h("span", { title: "the input's words found in the chunk (after stemming)" }, "matched "),
      words.length ? h("span", { class: "matched", dataset: { field: "matched_terms" } }, words.join(", "))
        : h("span", { class: "muted", dataset: { field: "matched_terms" } }, "none"));
  }
  return h("p", { class: "nums why" }, ...parts);
}

function evidenceList(result, loadEntry) {
  if (!result.evidence.length) return h("p", { class: "muted" }, "no evidence (nothing retrieved)");
  const list = h("ol", { class: "evidence" }, result.evidence.map((it) => evidenceItem(it, loadEntry)));
  if (result.diagnostics.memory_share > 0) return list;
  return h("div", {}, h("p", { class: "note muted" }, "The KB got no attention mass (α = 1): the chunks the k-NN "
    + "retrieved are listed for reference; none of them shaped the output."), list);
}

// --- hover links between query tokens and the spans they pulled -----------------------------
function link(pane) {
  const clear = () => pane.querySelectorAll(".linked").forEach((e) => e.classList.remove("linked"));
  pane.addEventListener("mouseover", (ev) => {
    const tok = ev.target.closest(".tok");
    const mark = ev.target.closest("mark.hl");
    if (!tok && !mark) return;
    clear();
    if (tok) {
      const i = tok.dataset.index;
      pane.querySelectorAll("mark.hl").forEach((m) => { if (m.dataset.q.split(" ").includes(i)) m.classList.add("linked"); });
    } else {
      const qs = mark.dataset.q.split(" ");
      pane.querySelectorAll(".tok").forEach((t) => { if (qs.includes(t.dataset.index)) t.classList.add("linked"); });
    }
  });
  pane.addEventListener("mouseout", (ev) => { if (ev.target.closest(".tok, mark.hl")) clear(); });
}

// --- one pane per request --------------------------------------------------------------------
const section = (title, ...body) => h("section", { class: "block" }, h("h3", {}, title), ...body);

/** run: {variant, title, params, response, input}; the pane shows response.results[0]. */
export function pane(run, loadEntry) {
  const r = run.response.results[0];
  const d = r.diagnostics;
  const p = run.params;
  const how = d.retrieval === "hybrid" ? `hybrid λ ${d.lexical_weight}` : d.retrieval;
  const setting = (d.mixing === "joint" ? `joint · k ${d.k}` : `α ${d.alpha} · fixed · k ${d.k}`) + ` · τ ${d.knn_temperature} · ${how}`;
  const el = h("article", {
    class: "pane",
    dataset: { variant: run.variant, alpha: p.alpha, mixing: p.mixing, k: p.k, temperature: d.knn_temperature, retrieval: d.retrieval,
      requestId: run.response.request_id },
  },
  h("header", { class: "pane-head" },
    h("h2", {}, run.title), h("p", { class: "muted" }, setting),
    h("p", { class: "muted small" }, `request ${run.response.request_id} · bundle ${run.response.bundle_version} · ${run.response.model}`)),
  h("div", { class: "col-a" },
    section("Label scores · from the k-NN weights w_db", verdict(r)),
    section("Input tokens · memory mass share", tokensView(r, run.input), legend()),
    section("Heads × tokens · memory mass share", heatmap(r)),
    section("Diagnostics", diagnostics(d))),
  h("div", { class: "col-b" },
    section(`Evidence · ${r.evidence.length} of ${d.retrieved} retrieved`, evidenceList(r, loadEntry))));
  link(el);
  return el;
}

function cosine(a, b) {
  let dot = 0, na = 0, nb = 0;
  for (let i = 0; i < a.length; i++) { dot += a[i] * b[i]; na += a[i] * a[i]; nb += b[i] * b[i]; }
  return dot / Math.sqrt(na * nb || 1);
}

/** The side-by-side summary: how far the KB moved the output from the plain model (two requests). */
export function compareStrip(base, cur) {
  const a = base.response.results[0], b = cur.response.results[0];
  const cos = cosine(a.embedding, b.embedding);
  const pred = (r) => (r.label_scores === null ? "—" : r.abstained ? "abstain" : r.prediction);
  return h("div", { class: "compare-strip" },
    h("span", {}, "cos(embedding, α = 1 embedding) ", num("cosine", cos, 4)),
    h("span", {}, "memory share ", num("memory_share_base", a.diagnostics.memory_share), " → ",
      num("memory_share_current", b.diagnostics.memory_share)),
    h("span", { title: LABELS_NOTE }, "prediction ", h("strong", {}, pred(a)), " → ", h("strong", {}, pred(b)),
      h("span", { class: "muted" }, " (from the k-NN weights)")));
}

export const LABELS_NOTE = "Label scores are Σ w_db(c)·onehot(label_c): the k-NN weights over the chunks retrieved "
  + "with the plain model's embedding. They do not depend on α or the mixing, so they are the same with and without "
  + "the KB; what the KB changes is the model's own output.";

function nearList(field, items, other) {
  const ids = new Set(other.map((x) => x.chunk_id));
  return h("ol", { class: "near", dataset: { field } }, items.map((x) => h("li", {
    class: ids.has(x.chunk_id) ? null : "moved", dataset: { chunkId: x.chunk_id, value: x.similarity },
    title: ids.has(x.chunk_id) ? "among the nearest in both" : "only among the nearest on this side",
  }, h("span", { class: "cid" }, x.chunk_id), " ", h("span", { class: "muted" }, x.label ?? ""), " ",
  num("near_similarity", x.similarity))));
}

/** What the KB changed, from one result's versus_plain: the plain model's output e against the
 * knowledge-augmented e' — their cosine and distance, the KB entries nearest each — and where the
 * label scores come from. */
export function kbChange(result) {
  const v = result.versus_plain;
  if (!v) return null;
  const same = v.nearest_plain.map((x) => x.chunk_id).join() === v.nearest_augmented.map((x) => x.chunk_id).join();
  return h("section", { class: "kb-change", "aria-label": "what the KB changed" },
    h("h2", {}, "What the KB changed"),
    h("p", { class: "nums" },
      h("span", { title: "cos(e, e'): the plain model's sentence embedding against the knowledge-augmented one" },
        "cos(plain, augmented) "), num("vp_cosine", v.cosine, 4), " · ",
      h("span", { title: "‖e' − e‖ of the two normalised embeddings" }, "distance ‖e′ − e‖ "), num("vp_l2", v.l2, 4),
      " · memory share ", num("vp_memory_share", result.diagnostics.memory_share)),
    h("div", { class: "near-pair" },
      h("div", {}, h("h3", {}, "Nearest KB entries · plain model"), nearList("nearest_plain", v.nearest_plain, v.nearest_augmented)),
      h("div", {}, h("h3", {}, "Nearest KB entries · with the KB"), nearList("nearest_augmented", v.nearest_augmented, v.nearest_plain))),
    h("p", { class: "muted small" }, same ? "The same entries in the same order: this setting moved the embedding "
      + "but not its neighbourhood." : "Entries shaded are among the nearest on one side only."),
    h("p", { class: "note muted small", dataset: { field: "labels_note" } }, LABELS_NOTE));
}

/** The bundle line in the header, from GET /v1/index. */
export function bundleLine(data) {
  const ix = data.index;
  const c = ix.counts || {};
  const parts = [
    `bundle ${data.bundle_version}`,
    data.model,
    `${c.chunks ?? "?"} chunks from ${c.docs ?? "?"} documents`,
    ix.labels.length ? `${ix.labels.length} labels` : "unlabelled",
    `index ${ix.index?.kind ?? "?"}`,
    `memory layer ${ix.memory_layer}`,
  ];
  return parts.join(" · ");
}
