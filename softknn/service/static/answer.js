// The "Answer" view: one question → POST v1/generate twice (with the KB in the generator's attention,
// and the plain model, use_kb: false), side by side. Each generated token of the KB answer is a span
// whose title names the chunk it drew on most and its memory share; the evidence list follows.
import { ApiError, generate } from "./api.js";
import { fmt, h, ramp } from "./render.js";

const $ = (id) => document.getElementById(id);
let seq = 0;

function tokens(answer) {
  return h("p", { class: "tokens gen-tokens" }, answer.tokens.map((t) => h("span", {
    class: "tok",
    title: `${t.top_chunk ?? "no chunk"} · memory share ${fmt(t.memory_share)}`,
    dataset: { value: t.memory_share, chunk: t.top_chunk ?? "" },
    style: { background: ramp(t.memory_share), color: t.memory_share > 0.6 ? "#fff" : "#1c1917" },
  }, t.text)));
}

function evidence(answer) {
  if (!answer.evidence.length) return h("p", { class: "muted" }, "no evidence (no KB)");
  return h("ol", { class: "gen-evidence" }, answer.evidence.map((e) => h("li", { dataset: { chunk: e.chunk_id } },
    h("code", {}, e.chunk_id), " ",
    h("span", { class: "num", dataset: { value: e.mass_share }, title: "mean memory mass over the answer" },
      fmt(e.mass_share)),
    h("div", { class: "small muted" }, e.text),
    e.spans.length ? h("div", { class: "small" }, "drew on: ",
      e.spans.flatMap((s, i) => [i ? ", " : "", h("mark", { class: "hl", title: `${fmt(s.share)} of its mass` }, s.text)])) : null)));
}

function answerPane(title, variant, answer) {
  const d = answer.diagnostics;
  return h("article", { class: "pane", dataset: { variant } },
    h("div", { class: "pane-head" }, h("h2", {}, title),
      h("p", { class: "muted" }, `${answer.finish_reason} · ${answer.usage.completion_tokens} tokens · memory share `
        + `${fmt(d.memory_share)} · ${d.memory_source}`)),
    h("div", { class: "block" }, h("h3", {}, "answer"), variant === "kb" ? tokens(answer) : h("p", {}, answer.text)),
    variant === "kb" ? h("div", { class: "block" }, h("h3", {}, "evidence"), evidence(answer)) : null);
}

async function ask(ev) {
  ev?.preventDefault();
  const mine = ++seq;
  const question = $("question").value.trim();
  const out = $("answers");
  if (!question) return;
  const body = { messages: [{ role: "user", content: question }], max_tokens: Number($("answer-tokens").value) || 64 };
  $("answer-run").disabled = true;
  $("answer-status").textContent = "generating (with the KB and without)…";
  try {
    const [kb, plain] = await Promise.all([generate({ ...body, use_kb: true }), generate({ ...body, use_kb: false })]);
    if (mine !== seq) return;
    out.className = "results compare";
    out.replaceChildren(h("div", { class: "panes" },
      answerPane("Plain model · no KB", "baseline", plain), answerPane("With the KB in attention", "kb", kb)));
    $("answer-status").textContent = "";
  } catch (err) {
    if (mine !== seq) return;
    const type = err instanceof ApiError ? `${err.status} · ${err.type}: ` : "";
    $("answer-status").textContent = `${type}${err?.message || err}`;
  } finally {
    if (mine === seq) $("answer-run").disabled = false;
  }
}

$("answer-form").addEventListener("submit", ask);
