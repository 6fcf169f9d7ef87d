// The public HTTP API, as the page uses it: POST v1/infer, GET v1/kbs, GET v1/index, GET v1/entries/{id}.
// With a KB chosen (setKb), every call names it: `kb` in a POST body, a query parameter on a GET.
// Paths are relative so the page also works behind a proxy that mounts the service under a prefix.

const KEY_STORAGE = "softknn.apiKey";

export class ApiError extends Error {
  /** One error shape for the page: the service's {"error": {type, message, field}} plus the HTTP status. */
  constructor(status, type, message, field = null, retryAfter = null) {
    super(message);
    this.status = status;
    this.type = type;
    this.field = field;
    this.retryAfter = retryAfter;
  }
}

export function getKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return ""; // storage disabled (privacy mode, file://): the key lives only in the field
  }
}

export function setKey(value) {
  try {
    if (value) localStorage.setItem(KEY_STORAGE, value);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage disabled: nothing to persist */
  }
}

let chosenKb = null; // null: the service's default for this key (its only KB, or the one named default)

export function setKb(name) {
  chosenKb = name || null;
}

function withKb(path, method, body) {
  if (!chosenKb) return [path, body];
  if (method === "GET") return [`${path}${path.includes("?") ? "&" : "?"}kb=${encodeURIComponent(chosenKb)}`, body];
  return [path, body && body.kb === undefined ? { ...body, kb: chosenKb } : body];
}

async function call(path0, { method = "GET", body: body0, kbScoped = true } = {}) {
  const [path, body] = kbScoped ? withKb(path0, method, body0) : [path0, body0];
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const key = getKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let res;
  try {
    res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    throw new ApiError(0, "network_error", `could not reach the service (${e.message})`);
  }
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null; // a proxy's HTML error page, say: reported below with its status
  }
  if (!res.ok) {
    const e = data && data.error ? data.error : null;
    throw new ApiError(
      res.status,
      e ? e.type : `http_${res.status}`,
      e ? e.message : (text.trim().slice(0, 300) || res.statusText || "request failed"),
      e ? e.field : null,
      res.headers.get("Retry-After"),
    );
  }
  if (data === null) throw new ApiError(res.status, "bad_response", "the service answered with no JSON body");
  return data;
}

export const infer = (body) => call("v1/infer", { method: "POST", body });
export const indexSummary = () => call("v1/index");
/** The KBs this key may name: {kbs: [{name, status, bundle_version, chunks, error}], default, write}. */
export const kbList = () => call("v1/kbs", { kbScoped: false });
export const entry = (chunkId) => call(`v1/entries/${encodeURIComponent(chunkId)}`);

/** The request fields of POST /v1/infer from the OpenAPI document, their bounds (null when it can't be read). */
export async function inferSchema() {
  try {
    const res = await fetch("openapi.json", { headers: { Accept: "application/json" } });
    if (!res.ok) return null;
    const doc = await res.json();
    return doc?.components?.schemas?.InferRequest?.properties ?? null;
  } catch {
    return null;
  }
}

/** POST v1/generate (one JSON answer; 409 generator_unavailable when the bundle has no generator). */
export const generate = (body) => call("v1/generate", { method: "POST", body: { ...body, stream: false } });
