// One audit, live: polls GET /audits/{id} (and /rounds) while it runs.

import { api, ApiError, promptForKey } from "./api.js";
import { DASHES, MARKERS, PALETTE, densityChart, lineChart, nullDensity, swatch, toDensity } from "./charts.js";
import { h, fill, toast } from "./dom.js";
import {
  ABOVE_CLAIM_NOTE,
  TERMINAL,
  boundViolations,
  defaultSeries,
  diagnosticHint,
  diagnosticPurpose,
  diagnosticValue,
  epsValue,
  estimateAboveClaim,
  estimateLabel,
  estimatorLong,
  fmtDuration,
  fmtEps,
  fmtNum,
  fmtTime,
  humanize,
  isLowerBound,
  seriesKey,
  threatLabel,
} from "./format.js";
import { statusBadge } from "./list.js";
import { logMaxNullDensity, sphereCosineDensity } from "./stats.js";

const POLL_MS = 1500;
const ESTIMATOR_ORDER = ["two_gaussian", "lower_bound", "one_run", "sequential", "analytic"];
const VARIANCE_ORDER = ["null", "fitted", "n/a"];
const CORRECTION_ORDER = ["bonferroni", "split", "none", "n/a"];
const THREAT_ORDER = ["final_model", "all_iterates"];

function orderIndex(list, v) {
  const i = list.indexOf(v);
  return i < 0 ? list.length : i;
}

export function compareEstimates(a, b) {
  return (
    orderIndex(ESTIMATOR_ORDER, a.estimator) - orderIndex(ESTIMATOR_ORDER, b.estimator) ||
    orderIndex(THREAT_ORDER, a.threat_model) - orderIndex(THREAT_ORDER, b.threat_model) ||
    String(a.threat_model).localeCompare(String(b.threat_model)) ||
    orderIndex(VARIANCE_ORDER, a.variance) - orderIndex(VARIANCE_ORDER, b.variance) ||
    orderIndex(CORRECTION_ORDER, a.correction) - orderIndex(CORRECTION_ORDER, b.correction)
  );
}

const REF_STYLES = [
  { color: "var(--ref)", dash: "10 4" },
  { color: "var(--ref)", dash: "3 3" },
  { color: "var(--ref)", dash: "14 3 3 3" },
  { color: "var(--ref)", dash: "" },
];

/** Render one audit page. Returns a cleanup function that stops polling. */
export function renderAudit(root, id) {
  let stopped = false;
  let timer = null;
  let failures = 0;
  let lastRound = -1;
  let lastStatus = null;
  let audit = null;
  let rounds = [];
  const styles = new Map(); // series key -> {color, dash, marker}, stable across polls
  const visible = new Map(); // series key -> boolean chosen by the user or by default
  let legendKeys = "";
  let zoom = true; // cap the epsilon axis at twice the largest analytic epsilon

  // Static skeleton; sections are refilled on each poll so focus and <details> state survive.
  const title = h("h1", { id: "audit-title" }, "Audit");
  const badgeSlot = h("span", { class: "badge-slot" });
  const idLine = h("p", { class: "muted small mono" }, `id ${id}`);
  const actions = h("div", { class: "actions" });
  const alerts = h("div", { class: "alerts", id: "alerts" });
  const reason = h("div", { id: "reason" });
  const progressBox = h("div", { class: "progress-box", id: "progress" });
  const tiles = h("div", { class: "tiles", id: "tiles" });
  const epsChart = h("div", { class: "chart", id: "eps-chart", role: "img", tabindex: "0", "aria-label": "Epsilon over rounds: no data yet" });
  const epsLegend = h("fieldset", { class: "legend", id: "eps-legend" });
  const epsTable = h("div", { class: "table-wrap" });
  const densityFinal = h("div", { class: "chart", id: "density-final_model", role: "img", tabindex: "0", "aria-label": "Cosine densities, final model: no data yet" });
  const densityAll = h("div", { class: "chart", id: "density-all_iterates", role: "img", tabindex: "0", "aria-label": "Cosine densities, all iterates: no data yet" });
  const densityLegendFinal = h("div", { class: "legend static-legend" });
  const densityLegendAll = h("div", { class: "legend static-legend" });
  const densityNoteFinal = h("p", { class: "muted small" });
  const densityNoteAll = h("p", { class: "muted small" });
  const estimatesBody = h("tbody");
  const diagnostics = h("ul", { class: "diagnostics", id: "diagnostics" });
  const roundsBody = h("tbody");
  const specPre = h("pre", { class: "spec-json" });
  const metaList = h("dl", { class: "meta" });
  const live = h("p", { class: "visually-hidden", "aria-live": "polite", id: "live-status" });

  fill(
    root,
    h(
      "div",
      { class: "audit-page" },
      h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/" }, "← All audits")),
      h("div", { class: "audit-head" }, h("div", {}, h("div", { class: "title-row" }, title, badgeSlot), idLine), actions),
      live,
      alerts,
      reason,
      h("section", { class: "card", "aria-labelledby": "progress-title" }, h("h2", { id: "progress-title", class: "visually-hidden" }, "Progress"), progressBox, tiles),
      h(
        "section",
        { class: "card", "aria-labelledby": "eps-title" },
        h("h2", { id: "eps-title" }, "ε over rounds"),
        h("p", { class: "muted small" }, "Estimates and lower bounds after each round; grey reference lines are the analytic ε of the accountant(s). Toggle series with the checkboxes."),
        epsChart,
        epsLegend,
        h(
          "label",
          { class: "legend-item zoom-toggle" },
          h("input", { type: "checkbox", id: "eps-zoom", checked: true, onchange: (ev) => { zoom = ev.target.checked; drawCharts(); } }),
          " Zoom to 2× the analytic ε (larger values and ∞ show as ⬆ at the top edge)",
        ),
        h("details", { class: "data-table", ontoggle: (ev) => { if (ev.target.open && audit) drawEpsTable(); } }, h("summary", {}, "Show the chart's numbers as a table"), epsTable),
      ),
      h(
        "div",
        { class: "two-col" },
        h("section", { class: "card", "aria-labelledby": "dens-final-title" }, h("h2", { id: "dens-final-title" }, "Cosines: final model"), h("p", { class: "muted small" }, "cos(canary, θ_T − θ_0) per canary (Andrew et al. Alg. 2)."), densityFinal, densityLegendFinal, densityNoteFinal),
        h("section", { class: "card", "aria-labelledby": "dens-all-title" }, h("h2", { id: "dens-all-title" }, "Cosines: all iterates"), h("p", { class: "muted small" }, "max over rounds of cos(canary, Δ_t) per canary (Alg. 3)."), densityAll, densityLegendAll, densityNoteAll),
      ),
      h(
        "section",
        { class: "card", "aria-labelledby": "est-title" },
        h("h2", { id: "est-title" }, "Every estimate"),
        h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "estimates", id: "estimates-table" },
            h("caption", { class: "visually-hidden" }, "Every epsilon estimate with how it was obtained"),
            h(
              "thead",
              {},
              h(
                "tr",
                {},
                ["Estimate", "ε", "Estimator", "Threat model", "Variance", "Correction", "Confidence", "δ", "Method"].map((c) => h("th", { scope: "col", class: c === "ε" || c === "δ" || c === "Confidence" ? "num" : null }, c)),
              ),
            ),
            estimatesBody,
          ),
        ),
      ),
      h("section", { class: "card", "aria-labelledby": "diag-title" }, h("h2", { id: "diag-title" }, "Diagnostics"), diagnostics),
      h(
        "section",
        { class: "card", "aria-labelledby": "more-title" },
        h("h2", { id: "more-title" }, "Run details"),
        metaList,
        h(
          "details",
          {},
          h("summary", {}, "Rounds"),
          h(
            "div",
            { class: "table-wrap" },
            h(
              "table",
              { class: "rounds" },
              h("thead", {}, h("tr", {}, ["Round", "Clip norm S(t)", "Cohort", "Canaries inserted", "Failures"].map((c) => h("th", { scope: "col", class: "num" }, c)))),
              roundsBody,
            ),
          ),
        ),
        h("details", {}, h("summary", {}, "Spec"), specPre),
        h(
          "p",
          { class: "downloads" },
          h("button", { type: "button", class: "secondary", id: "download-cosines", onclick: downloadCosines }, "Download per-canary cosines (CSV)"),
          h("span", { class: "muted small" }, " Every estimate can be recomputed from these; seen/unseen labels are included once the audit has ended."),
        ),
      ),
    ),
  );

  const resize = new ResizeObserver(() => {
    if (audit) drawCharts();
  });
  resize.observe(epsChart);

  let inFlight = false;

  /** Poll now unless a poll is already under way (it reschedules itself). */
  function pollSoon() {
    if (!inFlight) poll();
  }

  async function poll() {
    clearTimeout(timer);
    inFlight = true;
    try {
      const next = await api.getAudit(id);
      if (stopped) return;
      const round = next.progress?.round ?? 0;
      const terminal = TERMINAL.has(next.status);
      if (round !== lastRound || (terminal && next.status !== lastStatus)) {
        try {
          const data = await api.getRounds(id);
          rounds = Array.isArray(data?.items) ? data.items : [];
        } catch (err) {
          if (!(err instanceof ApiError && err.status === 404)) throw err;
        }
        if (stopped) return;
      }
      if (next.status !== lastStatus && lastStatus !== null) {
        toast(`Audit ${next.status}.`);
        live.textContent = `Audit ${next.status}.`;
      }
      lastRound = round;
      lastStatus = next.status;
      audit = next;
      failures = 0;
      update();
      if (!terminal) timer = setTimeout(poll, POLL_MS);
    } catch (err) {
      if (stopped) return;
      if (err instanceof ApiError && err.status === 404) {
        fill(root, h("div", { class: "card" }, h("h1", {}, "Audit not found"), h("p", {}, `There is no audit with id ${id}.`), h("a", { href: "#/" }, "← All audits")));
        return;
      }
      if (err instanceof ApiError && err.status === 401) {
        // Reads need the key here and the user dismissed the prompt: wait for them.
        fill(
          reason,
          h(
            "div",
            { class: "banner banner-warning", role: "status" },
            "This service needs the API key to show audits. ",
            h("button", { type: "button", onclick: async () => { if (await promptForKey("")) pollSoon(); } }, "Enter API key"),
          ),
        );
        return;
      }
      failures += 1;
      fill(reason, h("p", { class: "banner banner-warning", role: "status" }, `Lost contact with the service (${err.message}); retrying…`));
      timer = setTimeout(poll, Math.min(10000, POLL_MS * 2 ** failures));
    } finally {
      inFlight = false;
    }
  }

  function update() {
    const a = audit;
    title.textContent = a.name || a.spec?.name || "Audit";
    document.title = `${title.textContent} · ${a.status} · flaudit`;
    fill(badgeSlot, statusBadge(a.status));
    renderActions(a);
    renderAlerts(a);
    renderReason(a);
    renderProgress(a);
    renderTiles(a);
    updateLegend();
    drawCharts();
    renderEstimates(a);
    renderDiagnostics(a);
    renderRunDetails(a);
  }

  function renderActions(a) {
    const terminal = TERMINAL.has(a.status);
    const key = terminal ? "delete" : "cancel";
    if (actions.dataset.mode === key) return;
    actions.dataset.mode = key;
    if (!terminal) {
      fill(
        actions,
        h(
          "button",
          {
            type: "button",
            class: "secondary",
            id: "cancel-audit",
            onclick: async () => {
              if (!confirm("Cancel this audit? The run stops and its estimates so far are kept.")) return;
              try {
                await api.cancelAudit(id);
                toast("Cancel requested.");
                pollSoon();
              } catch (err) {
                toast(`Could not cancel: ${err.message}`);
              }
            },
          },
          "Cancel audit",
        ),
      );
    } else {
      fill(
        actions,
        h(
          "button",
          {
            type: "button",
            class: "danger",
            id: "delete-audit",
            onclick: async () => {
              if (!confirm("Delete this audit and all its data?")) return;
              try {
                await api.deleteAudit(id);
                toast("Audit deleted.");
                location.hash = "#/";
              } catch (err) {
                toast(`Could not delete: ${err.message}`);
              }
            },
          },
          "Delete",
        ),
      );
    }
  }

  // The DP alarm is the service's (claim tests with one false-alarm guarantee over all looks):
  // its alerts are shown as sent, with the guarantee sentence under them. Lower bounds above an
  // analytic ε are only highlighted in the estimates table (per-look, outside the guarantee).
  function renderAlerts(a) {
    const items = Array.isArray(a.alerts) ? [...a.alerts] : [];
    const sig = JSON.stringify([items, a.bug_injected, a.alarm_guarantee]);
    if (alerts.dataset.sig === sig) return;
    alerts.dataset.sig = sig;
    const banners = items.map((x) => {
      const level = ["error", "warning", "info"].includes(x.level) ? x.level : "info";
      const word = { error: "Alert", warning: "Warning", info: "Note" }[level];
      return h("div", { class: `banner banner-${level}`, role: level === "error" ? "alert" : "status" }, h("strong", {}, h("span", { "aria-hidden": "true" }, level === "error" ? "⚠ " : level === "warning" ? "! " : "i "), `${word}: `), x.message);
    });
    if (a.bug_injected) {
      banners.unshift(h("div", { class: "banner banner-warning", role: "status", id: "bug-injected" }, h("strong", {}, h("span", { "aria-hidden": "true" }, "! "), "Testing: "), a.bug_injected));
    }
    if (a.alarm_guarantee) {
      const noClaim = /^no dp claim/i.test(a.alarm_guarantee);
      banners.push(h("p", { class: noClaim ? "banner banner-info" : "muted small", id: "alarm-guarantee" }, h("strong", {}, noClaim ? "No DP claim. " : "Alarm guarantee: "), noClaim ? a.alarm_guarantee.replace(/^no dp claim:\s*/i, "") : a.alarm_guarantee));
    }
    fill(alerts, banners);
  }

  function renderReason(a) {
    if (a.status === "failed" || a.status === "cancelled") {
      fill(reason, h("div", { class: `banner ${a.status === "failed" ? "banner-error" : "banner-info"}`, id: "failure-reason" }, h("strong", {}, a.status === "failed" ? "Failed: " : "Cancelled: "), a.reason || "no reason given"));
    } else {
      fill(reason);
    }
  }

  function renderProgress(a) {
    const p = a.progress || {};
    const round = p.round ?? 0;
    const total = p.num_rounds ?? a.spec?.num_rounds ?? 0;
    const fraction = p.fraction ?? (total ? round / total : 0);
    let text;
    let sub = "";
    if (a.status === "queued") text = "Waiting to start";
    else text = `Round ${round} of ${total}`;
    if (a.status === "running" && round === 0) sub = "starting the Flower run…";
    else if (a.status === "running") sub = p.eta_seconds != null ? `about ${fmtDuration(p.eta_seconds)} left` : "estimating time left…";
    else if (TERMINAL.has(a.status) && a.started_at && a.finished_at) sub = `took ${fmtDuration((new Date(a.finished_at) - new Date(a.started_at)) / 1000)}`;
    fill(
      progressBox,
      h("div", { class: "progress-text" }, h("span", { class: "round-counter", id: "round-counter", "data-round": round, "data-total": total }, text), sub ? h("span", { class: "muted", id: "eta" }, ` · ${sub}`) : null),
      h("progress", { max: 1, value: Math.max(0, Math.min(1, fraction || 0)), "aria-label": `Training progress: ${text}` }),
    );
  }

  function pick(estimates, pred) {
    return estimates.filter(pred).sort(compareEstimates)[0];
  }

  function renderTiles(a) {
    const est = a.estimates || [];
    const defaults = defaultSeries(est);
    const estFinal = pick(est, (e) => e.estimator === "two_gaussian" && e.threat_model === "final_model" && defaults.has(seriesKey(e)));
    const estAll = pick(est, (e) => e.estimator === "two_gaussian" && e.threat_model === "all_iterates" && defaults.has(seriesKey(e)));
    // Only valid bounds: the paper's uncorrected epsilon_lo (correction "none") is not a 95% bound.
    const bounds = est.filter(isLowerBound).filter((e) => e.correction !== "none" && epsValue(e.epsilon) !== null);
    const bestBound = bounds.sort((x, y) => epsValue(y.epsilon) - epsValue(x.epsilon))[0];
    const analytic = est.filter((e) => e.estimator === "analytic" && epsValue(e.epsilon) !== null).sort((x, y) => epsValue(x.epsilon) - epsValue(y.epsilon));
    const tile = (label, e, note) =>
      h("div", { class: "tile" }, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, e ? fmtEps(e.epsilon) : "–"), h("div", { class: "tile-note muted small" }, e ? note(e) : "not yet"));
    const m = a.metrics || {};
    // an estimate above the claim says on screen why it is not an alarm
    const estNote = (e) => {
      const soFar = e.details?.so_far ? `, so far: θ_t − θ_0 after round ${e.details.round}` : "";
      const variance = (e.variance === "null" ? "σ² = 1/d" : `${e.variance} σ`) + soFar;
      return estimateAboveClaim(e, est) ? h("span", { class: "above-claim" }, `${variance}; ${ABOVE_CLAIM_NOTE}`) : variance;
    };
    fill(
      tiles,
      tile("ε_est, final model", estFinal, estNote),
      tile("ε_est, all iterates", estAll, estNote),
      tile("Largest valid lower bound", bestBound, (e) => `${estimateLabel(e)}${e.confidence ? `, ${Math.round(e.confidence * 100)}%` : ""}`),
      tile("Analytic ε (tightest)", analytic[0], (e) => threatLabel(e.threat_model)),
      h(
        "div",
        { class: "tile" },
        h("div", { class: "tile-label" }, "Model"),
        h("div", { class: "tile-value" }, m.accuracy != null ? `${(m.accuracy * 100).toFixed(1)}%` : "–"),
        h("div", { class: "tile-note muted small" }, m.accuracy != null ? `accuracy${m.loss != null ? `, loss ${fmtNum(m.loss)}` : ""}` : `d = ${a.dim ?? "?"}`),
      ),
    );
  }

  // --- epsilon over rounds -------------------------------------------------------------------

  function epsSeries() {
    const byKey = new Map();
    const add = (round, e) => {
      if (e.estimator === "analytic") return;
      const key = seriesKey(e);
      if (!byKey.has(key)) byKey.set(key, { key, label: estimateLabel(e), sample: e, points: new Map() });
      const v = epsValue(e.epsilon);
      if (v !== null) byKey.get(key).points.set(round, v);
    };
    for (const r of rounds) for (const e of r.estimates || []) add(r.round, e);
    const current = audit.progress?.round;
    if (current) for (const e of audit.estimates || []) if (!byKey.get(seriesKey(e))?.points.has(current)) add(current, e);
    const list = [...byKey.values()].sort((a, b) => compareEstimates(a.sample, b.sample));
    for (const s of list) s.points = [...s.points.entries()].sort((a, b) => a[0] - b[0]);
    return list;
  }

  function styleFor(key) {
    if (!styles.has(key)) {
      const i = styles.size;
      styles.set(key, { color: PALETTE[i % 7], dash: DASHES[i % DASHES.length], marker: MARKERS[i % MARKERS.length] });
    }
    return styles.get(key);
  }

  function analyticRefs() {
    return (audit.estimates || [])
      .filter((e) => e.estimator === "analytic" && Number.isFinite(epsValue(e.epsilon)))
      .sort(compareEstimates)
      .map((e, i) => ({ key: seriesKey(e), label: estimateLabel(e), shortLabel: `${estimateLabel(e)} = ${fmtEps(e.epsilon)}`, tinyLabel: `${threatLabel(e.threat_model).split(" ")[0]}${e.details?.accountant ? ` ${String(e.details.accountant).toUpperCase()}` : ""} ${fmtEps(e.epsilon)}`, y: epsValue(e.epsilon), style: REF_STYLES[i % REF_STYLES.length], sample: e }));
  }

  function updateLegend() {
    const series = epsSeries();
    const refs = analyticRefs();
    const defaults = defaultSeries(series.map((s) => s.sample));
    for (const s of series) {
      styleFor(s.key);
      if (!visible.has(s.key)) visible.set(s.key, defaults.has(s.key));
    }
    for (const r of refs) if (!visible.has(r.key)) visible.set(r.key, true);
    const keys = [...series.map((s) => s.key), ...refs.map((r) => `${r.key}:${r.shortLabel}`)].join(",");
    if (keys === legendKeys) return;
    const focusedKey = document.activeElement?.dataset?.seriesKey;
    legendKeys = keys;
    const item = (key, label, style) => {
      const id = `lg-${key.replace(/[^a-z0-9]+/gi, "-")}`;
      return h(
        "label",
        { class: "legend-item", for: id },
        h("input", { type: "checkbox", id, checked: visible.get(key), dataset: { seriesKey: key }, onchange: (ev) => { visible.set(key, ev.target.checked); drawCharts(); } }),
        swatch(style),
        h("span", {}, label),
      );
    };
    fill(
      epsLegend,
      h("legend", { class: "visually-hidden" }, "Series shown in the chart"),
      series.length || refs.length ? null : h("span", { class: "muted small" }, "Series appear after the first round."),
      series.map((s) => item(s.key, s.label, styles.get(s.key))),
      refs.map((r) => item(r.key, r.shortLabel, { ...r.style, color: "#6b7280" })),
    );
    if (focusedKey) epsLegend.querySelector(`[data-series-key="${CSS.escape(focusedKey)}"]`)?.focus();
  }

  function drawEps() {
    const series = epsSeries().filter((s) => visible.get(s.key));
    const refs = analyticRefs().filter((r) => visible.get(r.key));
    const total = audit.progress?.num_rounds ?? audit.spec?.num_rounds ?? 1;
    const analyticMax = Math.max(0, ...analyticRefs().map((r) => r.y));
    lineChart(epsChart, {
      series: series.map((s) => ({ ...s, style: styleFor(s.key) })),
      refs,
      yCap: zoom && analyticMax > 0 ? 2 * analyticMax : null,
      xDomain: [1, Math.max(2, total)],
      xLabel: "round",
      yLabel: "ε",
      emptyText: audit.status === "queued" ? "Waiting for the run to start" : TERMINAL.has(audit.status) ? "No round was completed" : "Waiting for the first round",
    });
    epsChart.dataset.points = String(series.reduce((n, s) => n + s.points.length, 0));
    const summary = series.map((s) => (s.points.length ? `${s.label} ${fmtEps(s.points[s.points.length - 1][1])} at round ${s.points[s.points.length - 1][0]}` : null)).filter(Boolean);
    const refText = refs.map((r) => `${r.label} ${fmtEps(r.y)}`);
    epsChart.setAttribute("aria-label", summary.length || refText.length ? `Epsilon over rounds. Latest: ${[...summary, ...refText].join("; ")}.` : "Epsilon over rounds: no data yet");
    if (epsTable.closest("details").open) drawEpsTable();
  }

  /** The chart's numbers as a table (for screen readers and for copying); built only while
   * its <details> is open. */
  function drawEpsTable() {
    const all = epsSeries();
    const roundsSeen = [...new Set(all.flatMap((s) => s.points.map((p) => p[0])))].sort((x, y) => x - y);
    fill(
      epsTable,
      h(
        "table",
        { class: "eps-table" },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Round"), all.map((s) => h("th", { scope: "col", class: "num" }, s.label)))),
        h(
          "tbody",
          {},
          roundsSeen.map((r) => h("tr", {}, h("th", { scope: "row" }, String(r)), all.map((s) => {
            const p = s.points.find((q) => q[0] === r);
            return h("td", { class: "num" }, p ? fmtEps(p[1]) : "–");
          }))),
        ),
      ),
    );
  }

  // --- cosine densities ----------------------------------------------------------------------

  function drawDensity(tm, container, legend, note) {
    const hist = audit.histograms?.[tm];
    const d = audit.dim;
    const wanted = !audit.spec?.threat_models || audit.spec.threat_models.includes(tm);
    if (!hist || !Array.isArray(hist.bin_edges) || hist.bin_edges.length < 2) {
      densityChart(container, { bins: [], layers: [], emptyText: !wanted ? "Threat model not requested" : TERMINAL.has(audit.status) ? "No cosines" : "No cosines yet" });
      fill(legend);
      note.textContent = "";
      container.setAttribute("aria-label", `Cosine densities, ${threatLabel(tm)}: no data yet`);
      return;
    }
    const edges = hist.bin_edges;
    const layers = [];
    const counts = [];
    if (Array.isArray(hist.seen) || Array.isArray(hist.unseen)) {
      if (Array.isArray(hist.seen)) {
        layers.push({ label: "seen canaries", values: toDensity(hist.seen, edges), style: { color: PALETTE[1], dash: "", pattern: "hatch" } });
        counts.push(`${sum(hist.seen)} seen`);
      }
      if (Array.isArray(hist.unseen)) {
        layers.push({ label: "unseen canaries", values: toDensity(hist.unseen, edges), style: { color: PALETTE[0], dash: "6 3", pattern: "dots" } });
        counts.push(`${sum(hist.unseen)} unseen`);
      }
      note.textContent = "";
    } else if (Array.isArray(hist.canaries)) {
      layers.push({ label: "all canaries (labels hidden until the audit ends)", values: toDensity(hist.canaries, edges), style: { color: "#6b7280", dash: "", pattern: "dots" } });
      counts.push(`${sum(hist.canaries)} canaries`);
      note.textContent = "Which canaries were seen stays secret while the audit runs; the split is shown when it ends.";
    }
    const curves = [];
    const lo = edges[0];
    const hi = edges[edges.length - 1];
    const xsFine = Array.from({ length: 241 }, (_, i) => lo + ((hi - lo) * i) / 240);
    let nullLabel = null;
    const kind = hist.null_kind || (tm === "final_model" ? "N(0, 1/d)" : null);
    const nullStyle = { color: "var(--fg)", dash: "2 3", width: 2 };
    const smooth = Number.isFinite(d) && d > 0 && (kind === "exact" || kind === "N(0, 1/d)");
    if (smooth && tm === "final_model") {
      // The final-model null is known in closed form: draw it smoothly rather than at bin centres.
      nullLabel = kind === "exact" ? `null: exact cosine density, d = ${d}` : `null N(0, 1/d), d = ${d}`;
      curves.push({ label: nullLabel, points: xsFine.map((x) => [x, kind === "exact" ? sphereCosineDensity(x, d) : nullDensity(x, d)]), style: nullStyle });
    } else if (Array.isArray(hist.null) && hist.null.length === edges.length - 1) {
      nullLabel = kind ? `null: ${kind}` : "null";
      curves.push({ label: nullLabel, points: hist.null.map((v, i) => [(edges[i] + edges[i + 1]) / 2, Number(v)]), style: nullStyle });
    } else if (Number.isFinite(d) && d > 0) {
      if (tm === "final_model") {
        nullLabel = `null N(0, 1/d), d = ${d}`;
        curves.push({ label: nullLabel, points: xsFine.map((x) => [x, nullDensity(x, d)]), style: nullStyle });
      } else {
        const T = Math.max(1, audit.progress?.round || 1);
        nullLabel = `null ≈ max of ${T} independent N(0, 1/d)`;
        curves.push({ label: nullLabel, points: xsFine.map((x) => [x, Math.exp(logMaxNullDensity(x, d, T))]), style: nullStyle });
      }
    }
    densityChart(container, { bins: edges, layers, curves, xLabel: "cosine" });
    fill(
      legend,
      layers.map((l) => h("span", { class: "legend-item" }, swatch({ color: l.style.color, dash: l.style.dash, fill: "none" }), h("span", {}, l.label))),
      curves.map((c) => h("span", { class: "legend-item" }, swatch({ color: "currentColor", dash: c.style.dash }), h("span", {}, c.label))),
    );
    container.setAttribute("aria-label", `Cosine densities, ${threatLabel(tm)}: ${counts.join(", ")}${nullLabel ? `, with ${nullLabel}` : ""}.`);
  }

  function drawCharts() {
    if (!audit) return;
    drawEps();
    drawDensity("final_model", densityFinal, densityLegendFinal, densityNoteFinal);
    drawDensity("all_iterates", densityAll, densityLegendAll, densityNoteAll);
  }

  // --- tables --------------------------------------------------------------------------------

  function renderEstimates(a) {
    const est = [...(a.estimates || [])].sort(compareEstimates);
    const violating = new Set(boundViolations(est).map((v) => v.bound));
    if (!est.length) {
      fill(estimatesBody, h("tr", {}, h("td", { colspan: 9, class: "empty" }, a.status === "failed" ? "No estimates: the run failed before the first round." : "Estimates appear after the first round.")));
      return;
    }
    fill(
      estimatesBody,
      est.map((e) => {
        const details = Object.entries(e.details || {})
          .filter(([, v]) => v === null || ["number", "string", "boolean"].includes(typeof v))
          .slice(0, 8)
          .map(([k, v]) => `${humanize(k)} = ${typeof v === "number" ? fmtNum(v) : v}`)
          .join(", ");
        return h(
          "tr",
          { class: violating.has(e) ? "violation" : null, "data-estimator": e.estimator },
          h("th", { scope: "row" }, estimateLabel(e)),
          h("td", { class: "num eps-cell", "data-label": "ε" }, fmtEps(e.epsilon), violating.has(e) ? h("span", { class: "flag", title: "exceeds the analytic ε" }, " ⚠ exceeds analytic") : null),
          h("td", { "data-label": "Estimator" }, estimatorLong(e.estimator)),
          h("td", { "data-label": "Threat model" }, threatLabel(e.threat_model)),
          h("td", { "data-label": "Variance" }, e.variance === "null" ? "σ² = 1/d" : e.variance || "n/a"),
          h("td", { "data-label": "Correction" }, e.correction || "n/a"),
          h("td", { class: "num", "data-label": "Confidence" }, e.confidence != null ? `${fmtNum(e.confidence * 100, 3)}%` : "point estimate"),
          h("td", { class: "num", "data-label": "δ" }, fmtNum(e.delta)),
          h("td", { class: "method", "data-label": "Method" },
            estimateAboveClaim(e, est) ? h("div", { class: "above-claim" }, `ε ${ABOVE_CLAIM_NOTE}`) : null,
            e.method || "", details ? h("div", { class: "muted small" }, details) : null),
        );
      }),
    );
  }

  function renderDiagnostics(a) {
    const diags = a.diagnostics || [];
    if (!diags.length) {
      fill(diagnostics, h("li", { class: "muted" }, "Diagnostics appear after the first round."));
      return;
    }
    fill(
      diagnostics,
      diags.map((d) =>
        h(
          "li",
          { class: `diag ${d.ok ? "ok" : "bad"}` },
          h("span", { class: "diag-icon", "aria-hidden": "true" }, d.ok ? "✓" : "!"),
          h("div", {}, h("div", { class: "diag-head" }, h("strong", {}, humanize(d.name)), h("span", { class: "diag-state" }, d.ok ? " OK" : " needs attention"), h("span", { class: "muted small" }, ` · ${diagnosticValue(d)}`)), h("div", { class: "diag-hint" }, diagnosticHint(d)), diagnosticPurpose(d) ? h("div", { class: "muted small" }, diagnosticPurpose(d)) : null),
        ),
      ),
    );
  }

  function renderRunDetails(a) {
    const s = a.spec || {};
    const row = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    fill(
      metaList,
      row("Task", `${s.task ?? "?"}${a.dim ? ` (d = ${a.dim})` : ""}`),
      row("Rounds × cohort", `${s.num_rounds ?? "?"} × ${s.clients_per_round ?? "?"} of ${s.num_clients ?? "?"} clients (${s.participation ?? "?"})`),
      row("Canaries", `${s.num_canaries ?? "?"}, repeats ${s.canary_repeats ?? 1}`),
      row("Noise / clip", `z = ${s.noise_multiplier ?? "?"}, S = ${s.clip_norm ?? "adaptive"}`),
      row("δ", fmtNum(s.delta)),
      row("Created", fmtTime(a.created_at)),
      row("Started", fmtTime(a.started_at)),
      row("Finished", fmtTime(a.finished_at)),
    );
    fill(
      roundsBody,
      [...rounds].reverse().slice(0, 200).map((r) =>
        h("tr", {}, h("td", { class: "num" }, String(r.round)), h("td", { class: "num" }, fmtNum(r.clip_norm)), h("td", { class: "num" }, fmtNum(r.cohort_size)), h("td", { class: "num" }, fmtNum(r.num_canaries_inserted)), h("td", { class: "num" }, fmtNum(r.num_failures))),
      ),
    );
    const text = JSON.stringify(s, null, 2);
    if (specPre.textContent !== text) specPre.textContent = text;
  }

  async function downloadCosines() {
    try {
      const text = await api.getCosinesCsv(id);
      const url = URL.createObjectURL(new Blob([typeof text === "string" ? text : JSON.stringify(text)], { type: "text/csv" }));
      const link = h("a", { href: url, download: `${id}-cosines.csv` });
      document.body.appendChild(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    } catch (err) {
      toast(`Could not download the cosines: ${err.message}`);
    }
  }

  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    resize.disconnect();
  };
}

function sum(arr) {
  return arr.reduce((a, b) => a + (Number(b) || 0), 0);
}
