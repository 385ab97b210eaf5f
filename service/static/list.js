// The audit list and the "start an audit" form.

import { api, ApiError } from "./api.js";
import { h, fill, toast } from "./dom.js";
import { fmtEps, fmtPercent, fmtTime, STATUS_ICON, STATUS_WORD, TERMINAL, VERDICT_STYLE } from "./format.js";

const PAGE_SIZE = 20;

/** The verdict's heading word (``verdict.status``; its sentence is the tooltip and, whole, on
 * the audit's page). A succeeded audit shows it instead of its status badge (the worker's exit
 * status says nothing about the claim); a failed or cancelled one under its badge. A running
 * audit's badge says enough. */
function verdictLine(verdict, { badge = false } = {}) {
  const style = VERDICT_STYLE[verdict?.status];
  if (!style || verdict.status === "running") return null;
  return h("div", { class: `list-verdict tone-${style.tone}${badge ? " verdict-badge" : ""}`, "data-verdict": verdict.status, title: verdict.summary || "" }, h("span", { "aria-hidden": "true" }, `${style.icon} `), style.title);
}

/** The list's number: the verdict's valid lower bound on ε (what the verdict rests on, never an
 * estimate that can sit above a claim the audit found consistent), the claim beside it. */
function boundCell(verdict) {
  const bound = verdict?.largest_valid_bound;
  const claim = verdict?.claim;
  const conf = typeof bound?.confidence === "number" ? `, ${fmtPercent(bound.confidence)} confidence` : "";
  const title = bound ? `Valid lower bound on ε at δ = ${bound.delta ?? claim?.delta ?? "–"}${conf}` : "No valid lower bound above zero";
  return h(
    "td",
    { class: "num bound", title },
    bound && bound.epsilon != null ? `ε ≥ ${fmtEps(bound.epsilon)}` : "–",
    claim && claim.epsilon != null ? h("div", { class: "muted small" }, `claim ε = ${fmtEps(claim.epsilon)}`) : null,
  );
}

export function statusBadge(status) {
  return h("span", { class: `badge status-${status}`, "data-status": status }, h("span", { "aria-hidden": "true" }, STATUS_ICON[status] || "•"), ` ${STATUS_WORD[status] || status}`);
}

export function progressCell(progress, status) {
  const p = progress || {};
  const round = p.round ?? 0;
  const total = p.num_rounds ?? 0;
  const fraction = p.fraction ?? (total ? round / total : 0);
  return h(
    "div",
    { class: "progress-cell" },
    h("progress", { max: 1, value: Math.max(0, Math.min(1, fraction || 0)), "aria-label": `round ${round} of ${total}` }),
    h("span", { class: "muted small" }, total ? `${round}/${total}` : status === "queued" ? "queued" : "–"),
  );
}

/** Render the list page. Returns a cleanup function. */
export function renderList(root, { focusForm = false } = {}) {
  let stopped = false;
  let timer = null;
  let offset = 0;
  let statusFilter = "";

  const tbody = h("tbody");
  const summary = h("p", { class: "muted small", "aria-live": "polite" });
  const pager = h("div", { class: "pager" });
  const filter = h(
    "select",
    {
      id: "status-filter",
      onchange: () => {
        statusFilter = filter.value;
        offset = 0;
        refresh();
      },
    },
    h("option", { value: "" }, "all"),
    ["queued", "running", "succeeded", "failed", "cancelled"].map((s) => h("option", { value: s }, STATUS_WORD[s] || s)),
  );

  const listSection = h(
    "section",
    { class: "card list-card", "aria-labelledby": "audits-title" },
    h("div", { class: "card-head" }, h("h1", { id: "audits-title" }, "Audits"), h("div", { class: "filter" }, h("label", { for: "status-filter" }, "Status "), filter)),
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "audits", id: "audits-table" },
        h("caption", { class: "visually-hidden" }, "All audits, newest first"),
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Name"), h("th", { scope: "col" }, "Status"), h("th", { scope: "col" }, "Progress"), h("th", { scope: "col", class: "num bound-head", title: "The largest valid lower bound on ε the verdict reports (at its confidence), with the claimed ε" }, "Valid lower bound on ε"), h("th", { scope: "col" }, "Created"))),
        tbody,
      ),
    ),
    summary,
    pager,
  );

  const form = auditForm();
  fill(root, h("div", { class: "list-layout" }, listSection, form));
  if (focusForm) form.querySelector("input")?.focus();

  async function refresh() {
    clearTimeout(timer);
    try {
      const data = await api.listAudits({ status: statusFilter, limit: PAGE_SIZE, offset });
      if (stopped) return;
      renderRows(data);
      const active = (data.items || []).some((a) => !TERMINAL.has(a.status));
      schedule(active ? 2000 : 8000);
    } catch (err) {
      if (stopped) return;
      fill(tbody, h("tr", {}, h("td", { colspan: 5, class: "error-text" }, `Could not load audits: ${err.message}`)));
      schedule(5000);
    }
  }

  function schedule(ms) {
    if (!stopped) timer = setTimeout(refresh, ms);
  }

  function renderRows(data) {
    const items = data.items || [];
    if (!items.length) {
      fill(tbody, h("tr", {}, h("td", { colspan: 5, class: "empty" }, statusFilter ? `No ${statusFilter} audits.` : "No audits yet. Start one with the form.")));
    } else {
      fill(
        tbody,
        items.map((a) => {
          const verdict = a.status === "succeeded" ? verdictLine(a.verdict, { badge: true }) : null;
          return h(
            "tr",
            { "data-audit-id": a.id },
            h("th", { scope: "row" }, h("a", { href: `#/audits/${encodeURIComponent(a.id)}` }, a.name || a.id)),
            h("td", {}, verdict || [statusBadge(a.status), verdictLine(a.verdict)]),
            h("td", {}, progressCell(a.progress, a.status)),
            boundCell(a.verdict),
            h("td", { class: "small" }, fmtTime(a.created_at)),
          );
        }),
      );
    }
    const total = data.total ?? items.length;
    summary.textContent = total ? `${offset + 1}–${offset + items.length} of ${total}` : "";
    fill(
      pager,
      offset > 0 ? h("button", { type: "button", onclick: () => { offset = Math.max(0, offset - PAGE_SIZE); refresh(); } }, "← Newer") : null,
      offset + items.length < total ? h("button", { type: "button", onclick: () => { offset += PAGE_SIZE; refresh(); } }, "Older →") : null,
    );
  }

  refresh();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// --- the form -------------------------------------------------------------------------------

/** Main AuditSpec knobs with the defaults of auditor/spec.py. */
const FIELDS = [
  { name: "name", label: "Name", type: "text", value: "audit", hint: "Free-text label." },
  { name: "task", label: "Task", type: "text", value: "synthetic", list: ["synthetic", "digits"], hint: "Built-in task or module.path:factory." },
  { name: "num_rounds", label: "Rounds T", type: "number", value: 20, min: 1, step: 1 },
  { name: "num_clients", label: "Clients", type: "number", value: 100, min: 1, step: 1 },
  { name: "clients_per_round", label: "Clients per round m", type: "number", value: 10, min: 1, step: 1 },
  { name: "num_canaries", label: "Canaries k", type: "number", value: 100, min: 2, step: 1, hint: "Seen + unseen." },
  { name: "noise_multiplier", label: "Noise multiplier z", type: "number", value: 1.0, min: 0, step: "any" },
  { name: "clip_norm", label: "Clip norm S", type: "number", value: 1.0, min: 0, step: "any" },
  { name: "delta", label: "δ", type: "text", numeric: true, value: "1e-6", hint: "For every ε reported." },
  { name: "participation", label: "Participation", type: "select", value: "poisson", options: ["poisson", "uniform", "shuffled", "batch_then_shuffle"], optionLabels: { poisson: "Poisson sampling", uniform: "uniform without replacement", shuffled: "shuffled epochs", batch_then_shuffle: "batch then shuffle (deliberately wrong)" } },
  { name: "canary_repeats", label: "Canary repeats", type: "select", value: "1", options: ["1", "2", "4", "8"], integer: true },
];

const ADVANCED = [
  { name: "dim", label: "Model dimension d (synthetic)", type: "number", value: "", min: 1, step: 1, optionKey: true, hint: "Model size of the synthetic task; blank: its default." },
  { name: "local_epochs", label: "Local epochs", type: "number", value: 1, min: 1, step: 1 },
  { name: "client_learning_rate", label: "Client learning rate", type: "number", value: 0.1, min: 0, step: "any" },
  { name: "server_learning_rate", label: "Server learning rate η", type: "number", value: 1.0, min: 0, step: "any" },
  { name: "batch_size", label: "Batch size", type: "number", value: 32, min: 1, step: 1 },
  { name: "data_seed", label: "Data seed (not secret)", type: "number", value: 0, min: 0, step: 1 },
  { name: "timeout_seconds", label: "Timeout (s)", type: "number", value: 3600, min: 1, step: "any" },
];

function field(f) {
  const id = `f-${f.name}`;
  let input;
  if (f.type === "select") {
    input = h("select", { id, name: f.name }, f.options.map((o) => h("option", { value: o, selected: o === String(f.value) }, f.optionLabels?.[o] ?? o)));
  } else {
    input = h("input", { id, name: f.name, type: f.type, value: f.value, min: f.min, step: f.step, list: f.list ? `${id}-list` : null, "aria-describedby": `${id}-msg`, inputmode: f.type === "number" || f.numeric ? "decimal" : null, autocomplete: "off" });
  }
  return h(
    "div",
    { class: "field", "data-field": f.name },
    h("label", { for: id }, f.label),
    input,
    f.list ? h("datalist", { id: `${id}-list` }, f.list.map((o) => h("option", { value: o }))) : null,
    h("small", { id: `${id}-msg`, class: "field-msg" }, f.hint || ""),
  );
}

function specFromForm(form) {
  const spec = { task_options: {} };
  for (const f of [...FIELDS, ...ADVANCED]) {
    const input = form.elements[f.name];
    const raw = input.value.trim();
    if (raw === "") continue;
    let value = raw;
    if (f.type === "number" || f.integer || f.numeric) {
      value = Number(raw);
      if (Number.isNaN(value)) value = raw; // let the server name the field
    }
    if (f.optionKey) spec.task_options[f.name] = value;
    else spec[f.name] = value;
  }
  const threats = [...form.querySelectorAll('input[name="threat_models"]:checked')].map((i) => i.value);
  spec.threat_models = threats;
  if (!Object.keys(spec.task_options).length) delete spec.task_options;
  return spec;
}

function auditForm() {
  const errorBox = h("div", { class: "form-error", role: "alert", id: "form-error" });
  const jsonArea = h("textarea", { id: "spec-json", name: "spec_json", rows: 10, spellcheck: "false", placeholder: '{"name": "my audit", "num_rounds": 5, ...}', "aria-describedby": "spec-json-help" });
  const jsonDetails = h(
    "details",
    { class: "json-spec", id: "json-details" },
    h("summary", {}, "Paste a JSON spec instead"),
    h("p", { id: "spec-json-help", class: "muted small" }, "When this box is not empty, its JSON object is sent as the spec and the fields above are ignored."),
    jsonArea,
    h(
      "button",
      {
        type: "button",
        class: "secondary",
        onclick: () => {
          jsonArea.value = JSON.stringify(specFromForm(form), null, 2);
          jsonArea.focus();
        },
      },
      "Copy the form into JSON",
    ),
  );
  const submit = h("button", { type: "submit", class: "primary", id: "start-audit" }, "Start audit");
  const preview = h("div", { class: "design-preview", id: "design-preview", "aria-live": "polite" });
  const form = h(
    "form",
    { class: "card audit-form", id: "new-audit", "aria-labelledby": "new-title", novalidate: true },
    h("h2", { id: "new-title" }, "Start an audit"),
    h("p", { class: "muted small" }, "DP-FedAvg with random canary clients; defaults are the service's."),
    h("div", { class: "fields" }, FIELDS.map(field)),
    h(
      "fieldset",
      { class: "threats" },
      h("legend", {}, "Threat models"),
      ["final_model", "all_iterates"].map((t) => h("label", { class: "check" }, h("input", { type: "checkbox", name: "threat_models", value: t, checked: true }), ` ${t.replace("_", " ")}`)),
    ),
    h("details", { class: "advanced" }, h("summary", {}, "More options"), h("div", { class: "fields" }, ADVANCED.map(field))),
    jsonDetails,
    preview,
    errorBox,
    h("div", { class: "form-actions" }, submit),
  );

  // What this audit can detect, from POST /audits/design, as the fields change.
  let previewTimer = null;
  let previewAbort = null;
  async function refreshPreview() {
    let spec;
    try {
      spec = jsonArea.value.trim() ? JSON.parse(jsonArea.value) : specFromForm(form);
    } catch {
      fill(preview);
      return;
    }
    previewAbort?.abort();
    previewAbort = new AbortController();
    try {
      const design = await api.designAudit(spec, { signal: previewAbort.signal });
      fill(
        preview,
        h("div", { class: "tile-label" }, "This audit can detect"),
        h("p", { class: "design-summary", id: "design-summary" }, design.summary || "–"),
        design.advice ? h("p", { class: "small design-advice", id: "design-advice" }, design.advice) : null,
      );
      preview.dataset.testable = String(Boolean(design.testable));
    } catch (err) {
      if (err?.name === "AbortError") return;
      if (err instanceof ApiError && err.status === 422) fill(preview, h("p", { class: "muted small" }, `Fix the fields to see what this audit can detect (${err.message}).`));
      else fill(preview); // a service without the design route: no preview
    }
  }
  const schedulePreview = () => {
    clearTimeout(previewTimer);
    previewTimer = setTimeout(refreshPreview, 300);
  };
  form.addEventListener("input", schedulePreview);
  form.addEventListener("change", schedulePreview);
  schedulePreview();

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    errorBox.textContent = "";
    for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
    for (const node of form.querySelectorAll(".field-msg.error")) {
      node.classList.remove("error");
      node.textContent = node.dataset.hint || "";
    }
    let spec;
    if (jsonArea.value.trim()) {
      try {
        spec = JSON.parse(jsonArea.value);
      } catch (err) {
        errorBox.textContent = `The pasted spec is not valid JSON: ${err.message}`;
        jsonArea.setAttribute("aria-invalid", "true");
        jsonArea.focus();
        return;
      }
      if (!spec || typeof spec !== "object" || Array.isArray(spec)) {
        errorBox.textContent = "The pasted spec must be a JSON object.";
        jsonArea.focus();
        return;
      }
    } else {
      spec = specFromForm(form);
    }
    submit.disabled = true;
    submit.textContent = "Starting…";
    try {
      const audit = await api.createAudit(spec);
      toast(`Audit ${audit.name || audit.id} started.`);
      location.hash = `#/audits/${encodeURIComponent(audit.id)}`;
    } catch (err) {
      showErrors(err);
    } finally {
      submit.disabled = false;
      submit.textContent = "Start audit";
    }
  });

  function showErrors(err) {
    errorBox.textContent = err instanceof ApiError ? `Not started: ${err.message}` : `Not started: ${err.message || err}`;
    const detail = err?.body?.detail;
    if (!Array.isArray(detail)) return;
    let first = null;
    for (const d of detail) {
      const loc = (d.loc || []).filter((p) => p !== "body");
      const name = loc[0] === "task_options" ? loc[1] : loc[0];
      const wrap = name ? form.querySelector(`[data-field="${CSS.escape(String(name))}"]`) : null;
      if (!wrap) continue;
      const input = wrap.querySelector("input, select");
      const msg = wrap.querySelector(".field-msg");
      input.setAttribute("aria-invalid", "true");
      msg.dataset.hint = msg.dataset.hint ?? msg.textContent;
      msg.textContent = d.msg;
      msg.classList.add("error");
      first = first || input;
      const adv = wrap.closest("details");
      if (adv) adv.open = true;
    }
    first?.focus();
  }
  return form;
}
