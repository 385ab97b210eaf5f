// Formatting of the service's JSON and the human names the page shows for the API's identifiers
// (the API keeps its identifiers; the page never shows them). The names come from
// vocabulary.json, the one vocabulary the page and the printable report share
// (service/vocabulary.py reads the same file).

import VOCABULARY from "./vocabulary.json" with { type: "json" };

export { VOCABULARY };

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

/** JSON epsilon ("inf", number, null) -> number (Infinity allowed) or null. */
export function epsValue(value) {
  if (value === "inf" || value === "Infinity") return Infinity;
  if (value === "-inf") return -Infinity;
  if (typeof value === "number" && !Number.isNaN(value)) return value;
  return null;
}

export function fmtEps(value) {
  const v = epsValue(value);
  if (v === null) return "–";
  if (v === Infinity) return "∞";
  if (v === 0) return "0";
  if (Math.abs(v) >= 100) return v.toFixed(0);
  return v.toPrecision(3);
}

export function fmtNum(value, digits = 3) {
  if (value === null || value === undefined || value === "") return "–";
  if (value === "inf") return "∞";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  if (Math.abs(value) > 0 && (Math.abs(value) < 1e-3 || Math.abs(value) >= 1e5)) return value.toExponential(2);
  return value.toPrecision(digits);
}

/** δ as people write it: 1e-6, 1e-5, 0.01. */
export function fmtDelta(value) {
  if (typeof value !== "number") return "–";
  if (value < 1e-3) return value.toExponential();
  return String(value);
}

export function fmtPercent(value) {
  return typeof value === "number" ? `${+(value * 100).toFixed(1)}%` : "–";
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString(undefined, { dateStyle: "medium", timeStyle: "medium" });
}

/** A status in words: a succeeded audit's run finished; whether its claim held is the verdict's
 * to say (a green "succeeded" beside "Claim refuted" reads as a contradiction). */
export const STATUS_WORD = VOCABULARY.statuses;

/** A record-level look's `status` (`ok`, `error`, `no_dp_claim`) as the page says it: "no alarm",
 * "alarm", "no DP claim" (the user-level page's "Alarm" and "No alarm has fired"). */
export function lookAlarm(status) {
  return VOCABULARY.look_alarms[status] ?? String(status ?? "–").replace(/_/g, " ");
}

export const STATUS_ICON = {
  queued: "◷",
  running: "▶",
  succeeded: "•",
  failed: "✕",
  cancelled: "■",
};

// --- verdicts ---------------------------------------------------------------------------------

/** The verdict's status as a heading word and a banner style (the sentence is the API's). */
export const VERDICT_STYLE = VOCABULARY.verdicts;

// --- estimators -------------------------------------------------------------------------------

/** What each estimator is called on screen, what it assumes, and one line on what it is. */
export const ESTIMATORS = VOCABULARY.estimators;


export function estimatorName(id) {
  return ESTIMATORS[id]?.name || VOCABULARY.other_estimator;
}

/** Which adversary (threat model) an estimate is about, in words. */
export function threatLabel(tm) {
  return VOCABULARY.threat_models[tm] || VOCABULARY.other_threat_model;
}

const CORRECTION_LABEL = VOCABULARY.corrections;

/** Short human label of one estimate (name, adversary and the variant that matters). */
export function estimateLabel(e) {
  const parts = [estimatorName(e.estimator)];
  if (VOCABULARY.variances[e.variance]) parts.push(VOCABULARY.variances[e.variance]);
  if (e.correction === "none") parts.push("uncorrected");
  const accountant = e.details?.accountant;
  if (e.estimator === "analytic" && typeof accountant === "string") parts.push(accountant.toUpperCase());
  return `${parts[0]}${parts.length > 1 ? ` (${parts.slice(1).join(", ")})` : ""}`;
}

/** What kind of number an estimate is: a valid bound, an estimate, or the promise. */
export function estimateKind(e) {
  if (e.estimator === "analytic") return "promise";
  if (e.estimator === "two_gaussian") return "estimate, not a bound";
  if (e.correction === "none") return "not valid (uncorrected)";
  if (e.confidence != null) return `valid lower bound, ${fmtPercent(e.confidence)} confidence`;
  return "test";
}

export function correctionLabel(c) {
  return CORRECTION_LABEL[c] || "";
}

// --- diagnostics ------------------------------------------------------------------------------

/** A diagnostic's name and purpose in words, by its identifier. */
export function diagnosticName(d) {
  const name = String(d.name || "");
  return VOCABULARY.diagnostics[name]?.name ?? `Check: ${name.replace(/_/g, " ")}`;
}

export function diagnosticPurpose(d) {
  return VOCABULARY.diagnostics[String(d.name || "")]?.purpose ?? "";
}

/** "passes", "needs attention", or "not run" (too few canaries for the tests it names). */
export function diagnosticState(d) {
  if (String(d.name || "").endsWith("_skipped")) return "not run";
  return d.ok ? "passes" : "needs attention";
}

/** What a diagnostic's number is: the bootstrap's interval, a test statistic or a p-value. */
export function diagnosticValue(d) {
  if (String(d.name || "").endsWith("_skipped")) return humanText(d.hint || "");
  const det = d.details || {};
  const lo = epsValue(det.lower);
  const hi = epsValue(det.upper);
  if (lo !== null && hi !== null) {
    const conf = typeof det.confidence === "number" ? `${Math.round(det.confidence * 100)}% ` : "";
    return `${conf}interval of ε: [${fmtEps(lo)}, ${fmtEps(hi)}]`;
  }
  if (typeof det.critical_value === "number") return `A² = ${fmtNum(d.value)} (limit ${fmtNum(det.critical_value)})`;
  if (typeof det.p_value === "number") return `p = ${fmtNum(det.p_value)}`;
  return `value ${fmtNum(epsValue(d.value) ?? d.value)}`;
}

// --- text from the service --------------------------------------------------------------------

const TOKENS = VOCABULARY.text.map(([pattern, repl]) => [new RegExp(pattern, "g"), repl]);

/** Free text from the service (alerts, notes) with its identifiers put into words. */
export function humanText(text) {
  let out = String(text || "");
  for (const [pattern, repl] of TOKENS) out = out.replace(pattern, repl);
  return out;
}
