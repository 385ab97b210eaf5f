// Talking to the audit service: API root, API key (session storage only) and JSON requests.

const KEY_STORAGE = "flaudit.apiKey";

/** Where the JSON API lives. The page may be served at "/", "/ui/" or "/static/"; the API
 * routes (/audits, ...) hang off the service root. `<meta name="flaudit-api-root">` overrides. */
export function apiRoot() {
  const meta = document.querySelector('meta[name="flaudit-api-root"]');
  if (meta && meta.content) return new URL(meta.content, location.href);
  const here = new URL(".", location.href);
  const path = here.pathname.replace(/(ui|static|dashboard)\/$/, "");
  return new URL(path, here);
}

export function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), apiRoot());
  if (params) {
    for (const [k, v] of Object.entries(params)) {
      if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, String(v));
    }
  }
  return url;
}

export function storedKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE);
  } catch {
    return null;
  }
}

export function setStoredKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    /* storage disabled: the key lives only until the page reloads */
  }
  memoryKey = key || null;
  window.dispatchEvent(new CustomEvent("flaudit:key-changed"));
}

let memoryKey = null;
let pendingKeyPrompt = null;
let keyDeclined = false;

function currentKey() {
  return storedKey() || memoryKey;
}

/** Ask for the API key in the modal dialog. Resolves to the key, or null when cancelled.
 * Concurrent callers share one prompt so the user is asked once. */
export function promptForKey(message) {
  if (pendingKeyPrompt) return pendingKeyPrompt;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  const text = document.getElementById("key-dialog-text");
  const extra = text.querySelector(".extra") || text.appendChild(document.createElement("strong"));
  extra.className = "extra";
  extra.textContent = message ? ` ${message}` : "";
  input.value = "";
  pendingKeyPrompt = new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        pendingKeyPrompt = null;
        const value = input.value.trim();
        input.value = "";
        if (dialog.returnValue === "forget") {
          setStoredKey(null);
          resolve(null);
        } else if (dialog.returnValue === "ok" && value) {
          keyDeclined = false;
          setStoredKey(value);
          resolve(value);
        } else {
          resolve(null);
        }
      },
      { once: true },
    );
    dialog.returnValue = "";
    dialog.showModal();
    input.focus();
  });
  return pendingKeyPrompt;
}

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.body = body;
  }
}

/** Turn a FastAPI error body into one readable line that names the field(s). */
export function errorMessage(status, body) {
  if (body && typeof body === "object") {
    const detail = body.detail ?? body.message ?? body.error;
    if (Array.isArray(detail)) {
      return detail
        .map((d) => {
          const loc = Array.isArray(d.loc) ? d.loc.filter((p) => p !== "body").join(".") : "";
          return loc ? `${loc}: ${d.msg}` : d.msg || JSON.stringify(d);
        })
        .join("; ");
    }
    if (typeof detail === "string") return detail;
    if (detail) return JSON.stringify(detail);
  }
  if (typeof body === "string" && body.trim()) return body.trim().slice(0, 300);
  return `HTTP ${status}`;
}

/** JSON request to the API. On 401 asks for the key once, stores it, and retries once. */
export async function request(method, path, { params, json, signal, askKey = true } = {}) {
  for (let attempt = 0; attempt < 2; attempt++) {
    const headers = { Accept: "application/json" };
    const key = currentKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    let body;
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    }
    const response = await fetch(apiUrl(path, params), { method, headers, body, signal, cache: "no-store" });
    // Background reads (polling) do not nag again after the user dismissed the prompt;
    // a user action (a mutating call or the "API key" button) asks again.
    const quiet = method === "GET" && keyDeclined;
    if (response.status === 401 && askKey && attempt === 0 && !quiet) {
      const hadKey = Boolean(key);
      if (hadKey) setStoredKey(null);
      const entered = await promptForKey(hadKey ? "The stored key was rejected." : "");
      if (!entered) {
        keyDeclined = true;
        throw new ApiError(401, "An API key is needed for this action.", null);
      }
      continue;
    }
    const text = await response.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = text;
      }
    }
    if (!response.ok) throw new ApiError(response.status, errorMessage(response.status, data), data);
    return data;
  }
  throw new ApiError(401, "An API key is needed for this action.", null);
}

export const api = {
  listAudits: (params, opts) => request("GET", "/audits", { params, ...opts }),
  getAudit: (id, opts) => request("GET", `/audits/${encodeURIComponent(id)}`, opts),
  getRounds: (id, opts) => request("GET", `/audits/${encodeURIComponent(id)}/rounds`, opts),
  getWebhookDeliveries: (id) => request("GET", `/audits/${encodeURIComponent(id)}/webhook-deliveries`, { askKey: false }),
  getCosinesCsv: (id) => request("GET", `/audits/${encodeURIComponent(id)}/cosines`, { params: { format: "csv" } }),
  createAudit: (spec) => request("POST", "/audits", { json: spec }),
  designAudit: (spec, opts) => request("POST", "/audits/design", { json: spec, askKey: false, ...opts }),
  cancelAudit: (id) => request("POST", `/audits/${encodeURIComponent(id)}/cancel`),
  deleteAudit: (id) => request("DELETE", `/audits/${encodeURIComponent(id)}`),
};
