// One audit, live: polls GET /audits/{id} (and /rounds) while it runs.
//
// Top to bottom: the verdict (the API's sentence, never rebuilt here), three tiles (the claim,
// the largest valid lower bound, what this audit can detect), the f-DP picture, the bounds over
// rounds against the claim, then the details (every estimate, checks, histograms, the run),
// collapsed.

import { api, ApiError, apiUrl, promptForKey } from "./api.js";
import { densityChart, nullDensity, roundsChart, toDensity, tradeoffChart } from "./charts.js";
import { h, fill, toast } from "./dom.js";
import {
  ESTIMATORS,
  TERMINAL,
  VERDICT_STYLE,
  correctionLabel,
  diagnosticName,
  diagnosticState,
  diagnosticPurpose,
  diagnosticValue,
  epsValue,
  estimateKind,
  estimateLabel,
  fmtDelta,
  fmtDuration,
  fmtEps,
  fmtNum,
  fmtPercent,
  fmtTime,
  humanText,
  lookAlarm,
  threatLabel,
  VOCABULARY,
} from "./format.js";
import { statusBadge } from "./list.js";
import { sphereCosineDensity, logMaxNullDensity } from "./stats.js";

const POLL_MS = 1500;
const ESTIMATOR_ORDER = ["normal_scores", "gdp_lower_bound", "fdp_one_run", "lower_bound", "one_run", "two_gaussian", "sequential", "analytic"];
const THREAT_ORDER = ["known_rounds", "final_model", "all_iterates", "poisson_subsampled"];
const CORRECTION_ORDER = ["bonferroni", "split", "n/a", "none"];

function orderIndex(list, v) {
  const i = list.indexOf(v);
  return i < 0 ? list.length : i;
}

export function compareEstimates(a, b) {
  return (
    orderIndex(ESTIMATOR_ORDER, a.estimator) - orderIndex(ESTIMATOR_ORDER, b.estimator) ||
    orderIndex(THREAT_ORDER, a.threat_model) - orderIndex(THREAT_ORDER, b.threat_model) ||
    orderIndex(CORRECTION_ORDER, a.correction) - orderIndex(CORRECTION_ORDER, b.correction) ||
    String(a.variance).localeCompare(String(b.variance))
  );
}

/** The series of the bounds-over-rounds chart: valid lower bounds on μ, per adversary. */
const MU_BOUNDS = VOCABULARY.round_bounds;

/** Render one audit page. Returns a cleanup function that stops polling. */
export function renderAudit(root, id) {
  let stopped = false;
  let timer = null;
  let failures = 0;
  let lastRound = -1;
  let lastStatus = null;
  let audit = null;
  let rounds = [];

  const title = h("h1", { id: "audit-title" }, "Audit");
  const badgeSlot = h("span", { class: "badge-slot" });
  const idLine = h("p", { class: "muted small mono" }, `id ${id}`);
  const actions = h("div", { class: "actions" });
  const verdictBox = h("div", { id: "verdict" });
  const notes = h("div", { class: "alerts", id: "alerts" });
  const reason = h("div", { id: "reason" });
  const progressBox = h("div", { class: "progress-box", id: "progress" });
  const tiles = h("div", { class: "tiles tiles-3", id: "tiles" });
  const picture = h("div", { class: "chart", id: "fdp-chart", role: "img", tabindex: "0", "aria-label": "Trade-off picture: no data yet" });
  const pictureNote = h("p", { class: "muted small", id: "fdp-note" });
  const boundsChart = h("div", { class: "chart", id: "bounds-chart", role: "img", tabindex: "0", "aria-label": "Lower bounds over rounds: no data yet" });
  const boundsNote = h("p", { class: "muted small" });
  const estimatesBody = h("tbody");
  const estimatesCount = h("span", { class: "muted" });
  const diagnostics = h("ul", { class: "diagnostics", id: "diagnostics" });
  const alarmLog = h("div", { id: "alarm-log" });
  const webhookLog = h("div", { id: "webhook-deliveries" });
  const densityFinal = h("div", { class: "chart", id: "density-final_model", role: "img", tabindex: "0" });
  const densityAll = h("div", { class: "chart", id: "density-all_iterates", role: "img", tabindex: "0" });
  const densityNote = h("p", { class: "muted small" });
  const roundsBody = h("tbody");
  const specPre = h("pre", { class: "spec-json" });
  const metaList = h("dl", { class: "meta" });
  const live = h("p", { class: "visually-hidden", "aria-live": "polite", id: "live-status" });
  let detailsOpen = false;
  // each picture says which adversary it shows; the one the verdict rests on comes first
  const fdpLead = h("p", { class: "rests", id: "fdp-rests" });
  const boundsLead = h("p", { class: "rests", id: "bounds-rests" });
  const fdpSection = h(
    "section",
    { class: "card", "aria-labelledby": "fdp-title", "data-threat-model": "final_model", id: "fdp-section" },
    h("h2", { id: "fdp-title" }, "Can an attacker tell inserted canaries from the others?"),
    h("p", { class: "adversary" }, `Adversary: ${threatLabel("final_model")} (the inserted canaries' final-model scores).`),
    fdpLead,
    h(
      "p",
      { class: "muted small" },
      "Each point is a test that calls a canary “inserted” when its score is high: it wrongly flags a fraction α of canaries the model never saw and misses a fraction β of those it saw. ",
      "The claim promises that every test stays on or above the dashed curve; a measured curve below it means the model leaks more than claimed.",
    ),
    picture,
    pictureNote,
  );
  const boundsSection = h(
    "section",
    { class: "card", "aria-labelledby": "bounds-title", "data-threat-model": "known_rounds", id: "bounds-section" },
    h("h2", { id: "bounds-title" }, "Lower bounds on μ after each round, against the claim"),
    h("p", { class: "adversary" }, `Adversary: one line each (${[...new Set(MU_BOUNDS.map((b) => threatLabel(b.threat_model)))].join("; ")}).`),
    boundsLead,
    h("p", { class: "muted small" }, "μ is the Gaussian-DP privacy parameter (larger μ = more leakage). A valid lower bound above the claim line refutes the claim."),
    boundsChart,
    boundsNote,
  );
  const chartsRow = h("div", { class: "two-col charts-row" }, fdpSection, boundsSection);

  fill(
    root,
    h(
      "div",
      { class: "audit-page" },
      h("nav", { class: "crumbs", "aria-label": "Breadcrumb" }, h("a", { href: "#/" }, "← All audits")),
      h("div", { class: "audit-head" }, h("div", {}, h("div", { class: "title-row" }, title, badgeSlot), idLine), progressBox, actions),
      live,
      verdictBox,
      reason,
      h("section", { class: "tiles-section", "aria-labelledby": "summary-title" }, h("h2", { id: "summary-title", class: "visually-hidden" }, "Claim, measurement and power"), tiles, notes),
      chartsRow,
      h(
        "details",
        { class: "card details-card", id: "details", ontoggle: (ev) => { detailsOpen = ev.target.open; if (detailsOpen && audit) renderDetails(audit); } },
        h("summary", {}, h("h2", { class: "inline-h2" }, "Details: every estimate, checks and the run "), estimatesCount),
        h("h3", {}, "Every estimate"),
        h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "estimates", id: "estimates-table" },
            h("caption", { class: "visually-hidden" }, "Every estimate with what it assumes"),
            h("thead", {}, h("tr", {}, ["Estimate", "ε", "μ", "What it is", "Adversary", "Assumes", "In one line"].map((c) => h("th", { scope: "col", class: c === "ε" || c === "μ" ? "num" : null }, c)))),
            estimatesBody,
          ),
        ),
        h("h3", {}, "Checks"),
        diagnostics,
        h("h3", {}, "Alarm"),
        alarmLog,
        h("h3", {}, "Webhook deliveries"),
        webhookLog,
        h("h3", {}, "Canary scores"),
        densityNote,
        h("div", { class: "two-col" }, h("div", {}, h("h4", {}, "Adversary sees the final model"), densityFinal), h("div", {}, h("h4", {}, "Adversary sees every round (largest score over rounds)"), densityAll)),
        h("h3", {}, "The run"),
        metaList,
        h("details", {}, h("summary", {}, "Rounds"), h("div", { class: "table-wrap" }, h("table", { class: "rounds" }, h("thead", {}, h("tr", {}, ["Round", "Clip norm S(t)", "Cohort", "Canaries inserted", "Failures"].map((c) => h("th", { scope: "col", class: "num" }, c)))), roundsBody))),
        h("details", {}, h("summary", {}, "Spec as submitted (JSON)"), specPre),
        h(
          "p",
          { class: "downloads" },
          h("button", { type: "button", class: "secondary", id: "download-cosines", onclick: downloadCosines }, "Download per-canary cosines (CSV)"),
          h("span", { class: "muted small" }, " Every estimate can be recomputed from these; which canaries were inserted is included once the audit has ended."),
        ),
      ),
    ),
  );

  const resize = new ResizeObserver(() => {
    if (audit) drawCharts();
  });
  resize.observe(picture);

  let inFlight = false;
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
        live.textContent = `Audit ${next.status}. ${next.verdict?.summary || ""}`;
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
        fill(reason, h("div", { class: "banner banner-warning", role: "status" }, "This service needs the API key to show audits. ", h("button", { type: "button", onclick: async () => { if (await promptForKey("")) pollSoon(); } }, "Enter API key")));
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
    if (a.level === "record") {
      fill(root, recordCard(a));
      return;
    }
    title.textContent = a.name || a.spec?.name || "Audit";
    document.title = `${title.textContent} · ${VERDICT_STYLE[a.verdict?.status]?.title || a.status} · flaudit`;
    fill(badgeSlot, statusBadge(a.status));
    renderActions(a);
    renderVerdict(a);
    renderReason(a);
    renderProgress(a);
    renderTiles(a);
    renderNotes(a);
    renderEvidenceOrder(a);
    drawCharts();
    estimatesCount.textContent = `(${(a.estimates || []).length} estimates, ${(a.diagnostics || []).length} checks)`;
    if (detailsOpen) renderDetails(a);
  }

  function renderDetails(a) {
    renderEstimates(a);
    renderDiagnostics(a);
    renderAlarmLog(a);
    renderWebhooks();
    drawDensities();
    renderRunDetails(a);
  }

  function renderActions(a) {
    const terminal = TERMINAL.has(a.status);
    const key = terminal ? "delete" : "cancel";
    if (actions.dataset.mode === key) return;
    actions.dataset.mode = key;
    const onCancel = async () => {
      if (!confirm("Cancel this audit? The run stops and its estimates so far are kept.")) return;
      try {
        await api.cancelAudit(id);
        toast("Cancel requested.");
        pollSoon();
      } catch (err) {
        toast(`Could not cancel: ${err.message}`);
      }
    };
    const onDelete = async () => {
      if (!confirm("Delete this audit and all its data?")) return;
      try {
        await api.deleteAudit(id);
        toast("Audit deleted.");
        location.hash = "#/";
      } catch (err) {
        toast(`Could not delete: ${err.message}`);
      }
    };
    // an ended audit's printable report: one self-contained HTML file (GET /audits/{id}/report)
    const report = h("a", { class: "button secondary", id: "download-report", href: String(apiUrl(`/audits/${encodeURIComponent(id)}/report`)), download: `${id}-report.html` }, "Download report");
    fill(actions, terminal ? [report, h("button", { type: "button", class: "danger", id: "delete-audit", onclick: onDelete }, "Delete")] : h("button", { type: "button", class: "secondary", id: "cancel-audit", onclick: onCancel }, "Cancel audit"));
  }

  // --- the verdict -----------------------------------------------------------------------------

  function renderVerdict(a) {
    const v = a.verdict;
    const sig = JSON.stringify([v?.status, v?.summary, a.bug_injected]);
    if (verdictBox.dataset.sig === sig) return;
    verdictBox.dataset.sig = sig;
    const testing = a.bug_injected
      ? h("p", { class: "verdict-testing", id: "bug-injected" }, h("strong", {}, "Testing: "), humanText(a.bug_injected))
      : null;
    if (!v || !v.status) {
      fill(verdictBox, h("div", { class: "verdict verdict-neutral", role: "status" }, h("div", { class: "verdict-title" }, "No verdict"), h("p", { class: "verdict-summary", id: "verdict-summary" }, "This service does not report a verdict for this audit."), testing));
      return;
    }
    const style = VERDICT_STYLE[v.status] || { title: "Verdict", tone: "neutral", icon: "•" };
    fill(
      verdictBox,
      h(
        "div",
        { class: `verdict verdict-${style.tone}`, role: v.status === "claim_refuted" ? "alert" : "status", "data-status": v.status },
        h("div", { class: "verdict-title" }, h("span", { class: "verdict-icon", "aria-hidden": "true" }, style.icon), style.title),
        h("p", { class: "verdict-summary", id: "verdict-summary" }, v.summary || ""),
        testing,
      ),
    );
  }

  /** The picture the verdict rests on first (a refutation names its test's adversary), and
   * each other picture saying it shows another adversary. */
  function renderEvidenceOrder(a) {
    const v = a.verdict;
    // refuted by something no picture shows (e.g. the weighting): no picture leads
    const by = v?.status === "claim_refuted" && VOCABULARY.threat_models[v.refuted_by?.threat_model] ? v.refuted_by : null;
    const tm = by?.threat_model;
    const rests = !by ? null : tm === "final_model" ? fdpSection : boundsSection;
    const sig = JSON.stringify([tm, by?.name]);
    if (chartsRow.dataset.sig === sig) return;
    chartsRow.dataset.sig = sig;
    for (const [section, lead] of [[fdpSection, fdpLead], [boundsSection, boundsLead]]) {
      if (!rests) lead.textContent = "";
      else if (section === rests) lead.textContent = `The verdict rests on this: ${humanText(by.name || "the claim test")} refuted the claim (adversary ${threatLabel(tm)}).`;
      else lead.textContent = `Not the evidence of the verdict: the claim was refuted for the adversary who ${threatLabel(tm)} (the first picture); this one shows another adversary.`;
      section.classList.toggle("evidence", section === rests);
      lead.hidden = !rests;
    }
    if (rests && chartsRow.firstElementChild !== rests) chartsRow.insertBefore(rests, chartsRow.firstElementChild);
  }

  function renderReason(a) {
    if (a.status === "failed" || a.status === "cancelled") {
      fill(reason, h("div", { class: `banner ${a.status === "failed" ? "banner-error" : "banner-info"}`, id: "failure-reason" }, h("strong", {}, a.status === "failed" ? "Failed: " : "Cancelled: "), humanText(a.reason || "no reason given")));
    } else {
      fill(reason);
    }
  }

  // An attached audit ends "the run never started" if no run claims it in time (start_timeout_seconds).
  function waitingText(a) {
    const limit = a.started_at ? null : (a.spec?.start_timeout_seconds ?? 600);
    return limit == null ? "waiting for your Flower app…" : `waiting for your Flower app… (the audit ends if no run starts within ${fmtDuration(limit)} of its creation)`;
  }

  function renderProgress(a) {
    const p = a.progress || {};
    const round = p.round ?? 0;
    const total = p.num_rounds ?? a.spec?.num_rounds ?? 0;
    const fraction = p.fraction ?? (total ? round / total : 0);
    const text = a.status === "queued" ? "Waiting to start" : `Round ${round} of ${total}`;
    let sub = "";
    // what the run waits for (the service's words: its start, round t+1's updates with the wait
    // so far beside the earlier rounds' pace, the final model), then the time left
    if (a.status === "running" && round === 0 && a.spec?.engine === "external" && !a.started_at) sub = waitingText(a);
    else if (a.status === "running") {
      const left = round === 0 || round >= total ? "" : p.eta_seconds != null ? `about ${fmtDuration(p.eta_seconds)} left` : "time left known after round 2";
      sub = [p.waiting_for || (round === 0 ? "starting the Flower run…" : ""), left].filter(Boolean).join(" · ");
    }
    else if (a.status === "queued" && p.waiting_for) sub = p.waiting_for;
    else if (TERMINAL.has(a.status) && a.started_at && a.finished_at) sub = `took ${fmtDuration((new Date(a.finished_at) - new Date(a.started_at)) / 1000)}`;
    fill(
      progressBox,
      h("div", { class: "progress-text" }, h("span", { class: "round-counter", id: "round-counter", "data-round": round, "data-total": total }, text), sub ? h("span", { class: "muted", id: "eta" }, ` · ${sub}`) : null),
      h("progress", { max: 1, value: Math.max(0, Math.min(1, fraction || 0)), "aria-label": `Training progress: ${text}` }),
    );
  }

  // --- tiles -----------------------------------------------------------------------------------

  function tile(id, label, value, note) {
    return h("div", { class: "tile", id }, h("div", { class: "tile-label" }, label), h("div", { class: "tile-value" }, value), h("div", { class: "tile-note muted small" }, note));
  }

  function renderTiles(a) {
    const v = a.verdict || {};
    const claim = v.claim;
    const noClaim = v.status === "no_dp_claim" || (claim == null && Number(a.spec?.noise_multiplier) === 0);
    const claimTile = noClaim
      ? tile("tile-claim", "Claimed", "No DP claim", "noise multiplier 0: there is no privacy promise to test")
      : claim
        ? tile("tile-claim", "Claimed", `ε = ${fmtEps(claim.epsilon)}`, `at δ = ${fmtDelta(claim.delta)}; equivalently Gaussian DP with μ = ${fmtNum(claim.mu)}`)
        : tile("tile-claim", "Claimed", "–", "known once the run declares its settings");
    const b = v.largest_valid_bound;
    const boundValue = b && epsValue(b.epsilon) !== null ? `ε ≥ ${fmtEps(b.epsilon)}` : TERMINAL.has(a.status) ? "none" : "none yet";
    const boundTile = h(
      "div",
      { class: "tile", id: "tile-measured", "data-epsilon": b ? String(b.epsilon) : "", "data-mu": b && b.mu != null ? String(b.mu) : "" },
      h("div", { class: "tile-label" }, "Measured: valid lower bound"),
      h("div", { class: "tile-value" }, boundValue),
      h(
        "div",
        { class: "tile-note muted small" },
        b
          ? [`${b.mu != null ? `μ ≥ ${fmtNum(b.mu)}, ` : ""}${b.confidence != null ? `${fmtPercent(b.confidence)} confidence` : ""}`, h("div", {}, `${b.name || estimateLabel(b)}${b.threat_model ? `; adversary ${threatLabel(b.threat_model)}` : ""}`), b.validity ? h("div", {}, b.validity) : null]
          : TERMINAL.has(a.status) ? "no lower bound above zero" : "appears after the first round",
      ),
    );
    const design = v.design;
    const designTile = h(
      "div",
      { class: "tile tile-text", id: "tile-design" },
      h("div", { class: "tile-label" }, "This audit can detect"),
      h("div", { class: "tile-sentence" }, design?.summary ? humanText(design.summary) : "–"),
      design?.advice ? h("div", { class: "tile-note small" }, humanText(design.advice)) : null,
    );
    fill(tiles, claimTile, boundTile, designTile);
  }

  function renderNotes(a) {
    // Service notes that are not the alarm (e.g. waiting for the ServerApp); the alarm's own
    // messages are in the details: the verdict above states its outcome.
    const items = (Array.isArray(a.alerts) ? a.alerts : []).filter((x) => x.level === "info" && !/^no dp claim/i.test(x.message || ""));
    fill(notes, items.map((x) => h("p", { class: "note small" }, h("span", { "aria-hidden": "true" }, "ℹ "), humanText(x.message))));
  }

  // --- charts ----------------------------------------------------------------------------------

  function drawCharts() {
    if (!audit) return;
    drawPicture();
    drawBounds();
    if (detailsOpen) drawDensities();
  }

  function drawPicture() {
    const t = { ...(audit.tradeoff || {}) };
    const conf = fmtPercent(t.confidence ?? 0.95);
    const names = {
      claim: t.claim_mu != null ? `claimed (μ = ${fmtNum(t.claim_mu)})` : "claimed",
      empirical: `measured from ${t.num_seen || 0} inserted canaries`,
      band: `${conf} confidence band if scores were independent (a picture, not the test)`,
      mu_lo: t.mu_lo_value != null ? `proven at least this leaky (valid bound μ ≥ ${fmtNum(t.mu_lo_value)})` : "proven at least this leaky (valid bound)",
    };
    // a bound of μ = 0 proves nothing: its curve (the diagonal) is left out, not drawn as news
    if (!(t.mu_lo_value > 0)) t.mu_lo = null;
    const parts = [];
    if (t.claim) parts.push(names.claim);
    if (t.empirical) parts.push(names.empirical);
    if (t.mu_lo) parts.push(names.mu_lo);
    tradeoffChart(picture, t, names, {
      emptyText: audit.status === "queued" ? "Waiting for the run to start" : "Nothing to draw yet: no claim and no bound",
      summary: parts.length ? `Trade-off picture: false-negative against false-positive rate; curves: ${parts.join("; ")}.` : "Trade-off picture: no data yet",
    });
    const lines = [];
    if (!t.empirical) lines.push(TERMINAL.has(audit.status) ? "No measured curve: the run stored no final-model scores." : "The measured curve and its band appear when the audit ends: which canaries were inserted stays secret while it runs.");
    else lines.push(`Scores: each canary's final-model cosine mapped to a normal score (exactly standard normal for a canary the model never saw). The ${conf} band holds at every α at once. ${t.band_assumes || ""}`);
    if (!t.claim) lines.push("No claimed curve: this run makes no DP claim.");
    if (t.mu_lo_value === 0) lines.push("No lower-bound curve: these scores prove no leakage (μ ≥ 0).");
    pictureNote.textContent = lines.join(" ");
  }

  function boundLines() {
    const lines = [];
    for (const spec of MU_BOUNDS) {
      const points = [];
      const pick = (list) => (list || []).find((e) => e.estimator === spec.estimator && e.threat_model === spec.threat_model && e.correction !== "none" && typeof e.details?.mu === "number");
      for (const r of rounds) {
        const e = pick(r.estimates);
        if (e) points.push([r.round, e.details.mu]);
      }
      const current = audit.progress?.round;
      const e = pick(audit.estimates);
      if (current && e && !points.some((p) => p[0] === current)) points.push([current, e.details.mu]);
      if (points.length) lines.push({ id: `${spec.estimator}:${spec.threat_model}`, label: spec.label, points: points.sort((x, y) => x[0] - y[0]) });
    }
    return lines;
  }

  function drawBounds() {
    const lines = boundLines();
    const claimMu = audit.verdict?.claim?.mu ?? audit.tradeoff?.claim_mu;
    const claim = Number.isFinite(claimMu) ? { label: `claimed μ = ${fmtNum(claimMu)}`, y: claimMu } : null;
    roundsChart(boundsChart, {
      lines,
      claim,
      numRounds: audit.progress?.num_rounds ?? audit.spec?.num_rounds,
      yLabel: "μ (Gaussian DP)",
      emptyText: audit.status === "queued" ? "Waiting for the run to start" : TERMINAL.has(audit.status) ? "No round was completed" : "Waiting for the first round",
      summary: lines.length ? `Lower bounds on μ over rounds: ${lines.map((l) => `${l.label} ${fmtNum(l.points[l.points.length - 1][1])} at round ${l.points[l.points.length - 1][0]}`).join("; ")}${claim ? `; ${claim.label}` : ""}.` : "Lower bounds over rounds: no data yet",
    });
    boundsChart.dataset.points = String(lines.reduce((n, l) => n + l.points.length, 0));
    boundsNote.textContent = claim ? "" : "No claim line: this run makes no DP claim, so the bounds only say how much it leaks.";
  }

  function drawDensities() {
    const wanted = (tm) => !audit.spec?.threat_models || audit.spec.threat_models.includes(tm);
    let merged = false;
    for (const [tm, container] of [["final_model", densityFinal], ["all_iterates", densityAll]]) {
      const hist = audit.histograms?.[tm];
      const d = audit.dim;
      const edges = hist?.bin_edges;
      if (!Array.isArray(edges) || edges.length < 2) {
        densityChart(container, { edges: null, emptyText: !wanted(tm) ? "Not requested for this audit" : TERMINAL.has(audit.status) ? "No scores" : "No scores yet", summary: "Canary scores: none yet" });
        continue;
      }
      const layers = [];
      if (Array.isArray(hist.seen)) layers.push({ id: "seen", label: "inserted canaries", values: toDensity(hist.seen, edges) });
      if (Array.isArray(hist.unseen)) layers.push({ id: "unseen", label: "held-out canaries", values: toDensity(hist.unseen, edges) });
      if (!layers.length && Array.isArray(hist.canaries)) {
        merged = true;
        layers.push({ id: "all", label: "all canaries", values: toDensity(hist.canaries, edges) });
      }
      let nullCurve = null;
      if (Number.isFinite(d) && d > 0) {
        if (tm === "final_model") nullCurve = { label: "never seen (random direction)", f: (x) => (d < 1000 ? sphereCosineDensity(x, d) : nullDensity(x, d)) };
        else {
          const T = Math.max(1, audit.progress?.round || 1);
          nullCurve = { label: `never seen (largest of ${T} random cosines)`, f: (x) => Math.exp(logMaxNullDensity(x, d, T)) };
        }
      }
      densityChart(container, { edges, layers, nullCurve, summary: `Canary scores, adversary ${threatLabel(tm)}: ${layers.map((l) => l.label).join(", ")}${nullCurve ? `, with the density of a canary never seen` : ""}.` });
    }
    densityNote.textContent = merged ? "Which canaries were inserted stays secret while the audit runs; the split is shown when it ends." : "";
  }

  // --- details ---------------------------------------------------------------------------------

  function renderEstimates(a) {
    const est = [...(a.estimates || [])].sort(compareEstimates);
    if (!est.length) {
      fill(estimatesBody, h("tr", {}, h("td", { colspan: 7, class: "empty" }, a.status === "failed" ? "No estimates: the run failed before the first round." : "Estimates appear after the first round.")));
      return;
    }
    fill(
      estimatesBody,
      est.map((e) => {
        const info = ESTIMATORS[e.estimator] || { assumes: "", explains: "" };
        const mu = e.details?.mu;
        const correction = correctionLabel(e.correction);
        return h(
          "tr",
          { "data-estimator": e.estimator, class: e.correction === "none" ? "not-valid" : null },
          h("th", { scope: "row" }, estimateLabel(e)),
          h("td", { class: "num eps-cell", "data-label": "ε" }, fmtEps(e.epsilon)),
          h("td", { class: "num", "data-label": "μ" }, typeof mu === "number" ? fmtNum(mu) : "–"),
          h("td", { "data-label": "What it is" }, estimateKind(e), correction && e.correction !== "none" ? h("div", { class: "muted small" }, correction) : null),
          h("td", { "data-label": "Adversary" }, threatLabel(e.threat_model)),
          h("td", { "data-label": "Assumes", class: "small" }, info.assumes),
          h("td", { "data-label": "In one line", class: "small method" }, info.explains, ` At δ = ${fmtDelta(e.delta)}.`),
        );
      }),
    );
  }

  function renderDiagnostics(a) {
    const diags = a.diagnostics || [];
    if (!diags.length) {
      fill(diagnostics, h("li", { class: "muted" }, "Checks appear after the first round."));
      return;
    }
    fill(
      diagnostics,
      diags.map((d) =>
        h(
          "li",
          { class: `diag ${d.ok ? "ok" : "bad"}` },
          h("span", { class: "diag-icon", "aria-hidden": "true" }, d.ok ? "✓" : "!"),
          h("div", {}, h("div", { class: "diag-head" }, h("strong", {}, diagnosticName(d)), h("span", { class: "diag-state" }, ` · ${diagnosticState(d)}`), h("span", { class: "muted small" }, ` · ${diagnosticValue(d)}`)), h("div", { class: "muted small" }, diagnosticPurpose(d))),
        ),
      ),
    );
  }

  function renderAlarmLog(a) {
    const items = Array.isArray(a.alerts) ? a.alerts.filter((x) => x.level !== "info") : [];
    fill(
      alarmLog,
      items.length ? h("ul", { class: "alarm-list" }, items.map((x) => h("li", { class: `alarm-${x.level}` }, h("strong", {}, x.level === "error" ? "Alarm: " : "Warning: "), humanText(x.message)))) : h("p", { class: "muted small" }, "No alarm has fired."),
      a.alarm_guarantee ? h("p", { class: "muted small", id: "alarm-guarantee" }, humanText(a.alarm_guarantee)) : null,
    );
  }

  async function renderWebhooks() {
    let items;
    try {
      items = (await api.getWebhookDeliveries(id))?.items || [];
    } catch {
      return; // an older service, or no read access: keep what is shown
    }
    if (stopped) return;
    const cols = ["Event", "Time", "Status", "Attempts", "Last error"];
    fill(
      webhookLog,
      items.length
        ? h("div", { class: "table-wrap" }, h("table", { class: "webhooks" }, h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, items.map((d) => h("tr", {}, h("td", {}, d.event), h("td", {}, fmtTime(d.delivered_at || d.created_at)), h("td", {}, d.status), h("td", { class: "num" }, String(d.attempts)), h("td", {}, d.last_error || "—"))))))
        : h("p", { class: "muted small" }, "No webhook events for this audit (subscribe with POST /webhooks)."),
    );
  }

  function renderRunDetails(a) {
    const s = a.spec || {};
    const row = (k, v) => [h("dt", {}, k), h("dd", {}, v)];
    const participation = { poisson: "Poisson sampling", uniform: "uniform without replacement", shuffled: "shuffled epochs", batch_then_shuffle: "batch then shuffle" }[s.participation] || "as the app samples";
    fill(
      metaList,
      row("Training", s.engine === "external" ? "your Flower app (attached)" : `built-in task ${s.task ?? "?"}`),
      row("Model dimension d", a.dim ? String(a.dim) : "–"),
      row("Rounds × cohort", `${s.num_rounds ?? "?"} × ${s.clients_per_round ?? "?"} of ${s.num_clients ?? "?"} clients (${participation})`),
      row("Canaries", s.num_canaries === "auto" ? "chosen for the federation when your ServerApp declares it" : `${s.num_canaries ?? "?"}, each inserted in ${s.canary_repeats ?? 1} round(s)`),
      row("Noise / clip", `noise multiplier ${s.noise_multiplier ?? "?"}, clip norm ${s.clip_norm ?? "adaptive"}`),
      row("δ", fmtDelta(s.delta)),
      row("Created", fmtTime(a.created_at)),
      row("Started", fmtTime(a.started_at)),
      row("Finished", fmtTime(a.finished_at)),
    );
    fill(roundsBody, [...rounds].reverse().slice(0, 200).map((r) => h("tr", {}, h("td", { class: "num" }, String(r.round)), h("td", { class: "num" }, fmtNum(r.clip_norm)), h("td", { class: "num" }, fmtNum(r.cohort_size)), h("td", { class: "num" }, fmtNum(r.num_canaries_inserted)), h("td", { class: "num" }, fmtNum(r.num_failures)))));
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
    for (const c of [picture, boundsChart, densityFinal, densityAll]) c._plot?.destroy();
  };
}

/** A record-level audit (issue #37): the verdict with its cause, the claim over the run and per
 * round client by client (each client by its Flower node id, the API's `client_keys`), the
 * design line and every look (its alarm in words: "no alarm" / "alarm"); the verdict's and the
 * cause's sentences are the API's own. */
function recordCard(a) {
  const v = a.verdict;
  const claim = a.claim || {};
  const looks = a.looks || [];
  const row = (cells, tag = "td") => h("tr", {}, ...cells.map((c) => h(tag, {}, String(c))));
  return h(
    "div",
    { class: "card", id: "record-audit" },
    h("a", { href: "#/" }, "← All audits"),
    h("h1", { id: "audit-title" }, a.name || "Record-level audit"),
    h("p", { class: "muted small" }, `record-level audit · id ${a.id} · ${a.status} · round ${a.progress?.last_round ?? 0} of ${a.progress?.num_rounds ?? "?"}`),
    h(
      "div",
      { id: "verdict", class: "verdict", role: v?.status === "claim_refuted" ? "alert" : "status" },
      h("p", { class: "verdict-summary", id: "verdict-summary" }, v ? v.summary : a.alarm ? `Alarm at round ${a.alarm.round}: the claim is refuted so far.` : "Running: no alarm so far."),
      a.cause ? h("p", { id: "cause" }, h("strong", {}, "Cause: "), a.cause.sentence) : null,
    ),
    h("h2", {}, "The claim"),
    h("p", {}, `Record-level epsilon over the run: ${fmtNum(epsValue(claim.epsilon))} at delta = ${claim.delta ?? "?"}; per round (what a per-round PrivacyEngine prints): ${fmtNum(epsValue(claim.epsilon_per_round))}.`),
    h(
      "table",
      { id: "record-claim" },
      row(["clients (Flower node id)", "noise multiplier", "sample rate", "steps", "epsilon (run)", "epsilon (round)"], "th"),
      ...(claim.groups || []).map((g) => row([(g.client_keys || g.clients).join(", "), g.noise_multiplier, fmtNum(g.sample_rate), g.steps, fmtNum(epsValue(g.epsilon)), fmtNum(epsValue(g.epsilon_per_round))])),
    ),
    h("h2", {}, "Design"),
    h("p", { id: "record-design" }, a.design?.summary || "Designed once the first round is reported."),
    h("h2", {}, "Looks"),
    h(
      "table",
      { id: "record-looks" },
      row(["round", "alarm", "steps", "claim epsilon", "p-value"], "th"),
      ...looks.map((l) => row([l.round ?? "end", lookAlarm(l.status), l.steps, fmtNum(epsValue(l.claim_epsilon)), fmtNum(l.p_value)])),
    ),
  );
}
