// Formatting and labelling of the service's JSON (EpsilonResult / Diagnostic dicts).

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

export const STATUS_ICON = {
  queued: "◷",
  running: "▶",
  succeeded: "✓",
  failed: "✕",
  cancelled: "■",
};

const ESTIMATOR_NAME = {
  two_gaussian: "ε_est",
  lower_bound: "ε_lo",
  one_run: "one-run bound",
  analytic: "analytic ε",
  sequential: "sequential test",
};

const ESTIMATOR_LONG = {
  two_gaussian: "two-Gaussian (Andrew §3.2)",
  lower_bound: "ε_lo, Jeffreys (Andrew §5.1)",
  one_run: "one-run (Steinke Thm 3.1)",
  analytic: "accountant (dp-accounting)",
  sequential: "test by betting (González)",
};

export function estimatorLong(estimator) {
  return ESTIMATOR_LONG[estimator] || estimator;
}

export function threatLabel(tm) {
  if (tm === "final_model") return "final model";
  if (tm === "all_iterates") return "all iterates";
  return String(tm || "").replace(/_/g, " ");
}

/** Short human label of one estimate, e.g. "ε_est final model (σ²=1/d)". */
export function estimateLabel(e) {
  const name = ESTIMATOR_NAME[e.estimator] || e.estimator;
  const parts = [name, threatLabel(e.threat_model)];
  if (e.variance === "null") parts.push("(σ² = 1/d)");
  else if (e.variance === "fitted") parts.push("(fitted σ)");
  if (e.correction && e.correction !== "n/a") parts.push(`[${e.correction}]`);
  const accountant = e.details?.accountant;
  if (accountant && typeof accountant === "string") parts.push(`(${accountant.toUpperCase()})`);
  return parts.join(" ");
}

/** Identity of a series across rounds: estimator, threat model, variance, correction (and the
 * accountant for analytic entries, which may share a threat model). */
export function seriesKey(e) {
  const parts = [e.estimator, e.threat_model, e.variance || "n/a", e.correction || "n/a"];
  if (e.details?.accountant) parts.push(String(e.details.accountant));
  return parts.join("|");
}

export function isLowerBound(e) {
  return e.estimator === "lower_bound" || e.estimator === "one_run";
}

const VARIANCE_PREF = { null: 0, fitted: 1, "n/a": 2 };
const CORRECTION_PREF = { bonferroni: 0, split: 1, "n/a": 2, none: 3 };

/** Which series are shown by default: for each (estimator, threat model) the preferred
 * variance treatment (σ² = 1/d, as the paper's Table 2) and a corrected bound when offered. */
export function defaultSeries(estimates) {
  const best = new Map();
  for (const e of estimates) {
    if (e.estimator === "analytic" || e.estimator === "sequential") continue;
    const group = `${e.estimator}|${e.threat_model}`;
    const rank = (VARIANCE_PREF[e.variance] ?? 5) * 10 + (CORRECTION_PREF[e.correction] ?? 5);
    const prev = best.get(group);
    if (!prev || rank < prev.rank) best.set(group, { rank, key: seriesKey(e) });
  }
  return new Set([...best.values()].map((v) => v.key));
}

/** The list item's headline epsilon may be a number, "inf", an EpsilonResult dict or null. */
export function headline(value) {
  if (value && typeof value === "object") return { eps: value.epsilon, label: estimateLabel(value) };
  return { eps: value, label: "" };
}

/** Valid lower bounds above the analytic epsilon, highlighted in the estimates table (the
 * paper's uncorrected ε_lo, correction "none", is not a 95% bound; the claim compared against is
 * the "adversary knows the rounds" PLD bound). Not an alarm: each bound keeps only its own
 * per-look confidence; the service's alerts (claim tests over all looks) are the alarm. */
export function boundViolations(estimates) {
  const analytic = estimates.filter(
    (e) => e.estimator === "analytic" && e.threat_model === "known_rounds" && (e.details?.accountant ?? "pld") === "pld" && epsValue(e.epsilon) !== null,
  );
  const bounds = estimates.filter((e) => isLowerBound(e) && e.correction !== "none" && epsValue(e.epsilon) !== null);
  const out = [];
  for (const b of bounds) {
    const lo = epsValue(b.epsilon);
    for (const a of analytic) {
      const hi = epsValue(a.epsilon);
      if (Number.isFinite(hi) && lo > hi) out.push({ bound: b, analytic: a });
    }
  }
  return out;
}

/** The tightest analytic epsilon when ``e`` is a point estimate (two-Gaussian ε_est) above it,
 * else null. Such an estimate is not a bound and raises no alarm; the page says why. */
export function estimateAboveClaim(e, estimates) {
  if (!e || e.estimator !== "two_gaussian") return null;
  const v = epsValue(e.epsilon);
  const claims = estimates.filter((a) => a.estimator === "analytic" && Number.isFinite(epsValue(a.epsilon)));
  const tightest = claims.sort((x, y) => epsValue(x.epsilon) - epsValue(y.epsilon))[0];
  return tightest && v !== null && v > epsValue(tightest.epsilon) ? tightest : null;
}

export const ABOVE_CLAIM_NOTE =
  "above the analytic ε: a point estimate from Gaussians fitted to the canaries, not a bound and not a sign of a DP bug " +
  "(few canaries or unequal fitted variances inflate it; see the bootstrap interval). Only the DP alarm's tests and valid lower bounds can indicate a bug.";

/** What a diagnostic's number is: the bootstrap's interval, else its value. */
export function diagnosticValue(d) {
  const lo = epsValue(d.details?.lower);
  const hi = epsValue(d.details?.upper);
  if (lo !== null && hi !== null) {
    const conf = typeof d.details.confidence === "number" ? `${Math.round(d.details.confidence * 100)}% ` : "";
    return `${conf}interval [${fmtEps(lo)}, ${fmtEps(hi)}]`;
  }
  return `value ${fmtNum(epsValue(d.value) ?? d.value)}`;
}

const DIAGNOSTIC_HINTS = [
  [/anderson|normal|gauss/i, "The cosines do not look Gaussian, so the two-Gaussian ε_est is shaky: trust ε_lo and the one-run bound."],
  [/null|unseen/i, "Unseen canaries should look like the null N(0, 1/d); if not, the canaries are not independent of the model (a bug in insertion or in the seed)."],
  [/bootstrap|interval/i, "A wide interval means too few canaries for a stable ε_est: add canaries."],
];

const DIAGNOSTIC_PURPOSE = [
  [/anderson/i, "Checks the Gaussian fit that ε_est relies on (Anderson–Darling, Andrew et al. App. B)."],
  [/unseen_vs_null|null/i, "Checks that held-out canaries behave like random directions."],
  [/bootstrap/i, "How much ε_est moves when the canaries are resampled."],
];

/** Plain-language hint for a diagnostic: the service's own hint, else a generic one by name. */
export function diagnosticHint(d) {
  if (d.hint) return d.hint;
  for (const [pattern, hint] of DIAGNOSTIC_HINTS) if (pattern.test(d.name)) return hint;
  return d.ok ? "Looks fine." : "Outside the expected range.";
}

/** One line on what a diagnostic checks, by its name (empty when unknown). */
export function diagnosticPurpose(d) {
  for (const [pattern, text] of DIAGNOSTIC_PURPOSE) if (pattern.test(d.name)) return text;
  return "";
}

export function humanize(name) {
  return String(name || "").replace(/_/g, " ");
}
