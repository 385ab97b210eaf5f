// Formatting of the service's JSON and the human names the page shows for the API's identifiers
// (the API keeps its identifiers; the page never shows them).

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

export const STATUS_ICON = {
  queued: "◷",
  running: "▶",
  succeeded: "✓",
  failed: "✕",
  cancelled: "■",
};

// --- verdicts ---------------------------------------------------------------------------------

/** The verdict's status as a heading word and a banner style (the sentence is the API's). */
export const VERDICT_STYLE = {
  claim_refuted: { title: "Claim refuted", tone: "bad", icon: "✕" },
  consistent: { title: "Consistent with the claim", tone: "good", icon: "✓" },
  inconclusive: { title: "Inconclusive", tone: "unsure", icon: "?" },
  no_dp_claim: { title: "No DP claim", tone: "neutral", icon: "–" },
  running: { title: "Running: provisional verdict", tone: "running", icon: "▶" },
};

// --- estimators -------------------------------------------------------------------------------

/** What each estimator is called on screen, what it assumes, and one line on what it is. */
export const ESTIMATORS = {
  two_gaussian: {
    name: "Gaussian-fit estimate of ε",
    assumes: "The canaries' scores are Gaussian (see the normality checks).",
    explains: "ε between two Gaussians fitted to the canaries' scores (Andrew et al. §3.2). An estimate, not a bound: it can sit above the claim on a correct run.",
  },
  lower_bound: {
    name: "Threshold-test bound on ε",
    assumes: "Independent canary scores; those of one round share its noise scale, so it is shown, not counted as the measured bound.",
    explains: "The best threshold on the scores; confidence bounds on its two error rates give a lower bound on ε (Andrew et al. §5.1).",
  },
  normal_scores: {
    name: "Normal-score bound on μ",
    assumes: "DP-FedAvg with Gaussian noise (exact: the noise scale a round's canaries share is part of the test).",
    explains: "The inserted canaries' scores, studentized by the round's noise scale and summed, tested against the claimed Gaussian: μ_lo near the Neyman–Pearson limit (the test behind the alarm)."
  },
  gdp_lower_bound: {
    name: "Threshold-test bound on μ",
    assumes: "Independent canary scores; those of one round share its noise scale, which can make it overstate on small models with many canaries: shown, not counted as the measured bound.",
    explains: "μ ≥ Φ⁻¹(1 − FPR) − Φ⁻¹(FNR) with upper confidence bounds on both rates; reads the whole trade-off curve, so it is tighter than an (ε, δ) point.",
  },
  one_run: {
    name: "Guessing-game bound on ε",
    assumes: "Nothing but the random choice of which canaries are inserted.",
    explains: "Counts how many seen/unseen guesses from the scores are right (Steinke et al. 2023, one training run).",
  },
  fdp_one_run: {
    name: "Guessing-game bound on μ",
    assumes: "Nothing but the random choice of which canaries are inserted.",
    explains: "The same guessing game judged against Gaussian trade-off curves (Mahloujifar et al. 2025).",
  },
  analytic: {
    name: "Promised ε (privacy accountant)",
    assumes: "The DP implementation does what its settings say.",
    explains: "What the noise and the schedule promise, from dp-accounting: the claim the bounds are tested against.",
  },
  sequential: {
    name: "Sequential test by betting",
    assumes: "Independent rounds.",
    explains: "An anytime-valid test of the claim, updated after every round (González et al. 2025).",
  },
};

export function estimatorName(id) {
  return ESTIMATORS[id]?.name || "Other estimate";
}

/** Which adversary (threat model) an estimate is about, in words. */
export function threatLabel(tm) {
  return (
    {
      final_model: "sees the final model",
      all_iterates: "sees every round's update",
      known_rounds: "sees the rounds a canary joined",
      poisson_subsampled: "sees every update, rounds random",
      gaussian_mechanism: "one Gaussian mechanism",
    }[tm] || "another adversary"
  );
}

const CORRECTION_LABEL = {
  bonferroni: "corrected over thresholds (Bonferroni)",
  split: "threshold chosen on half the canaries",
  none: "uncorrected: not a valid bound",
};

/** Short human label of one estimate (name, adversary and the variant that matters). */
export function estimateLabel(e) {
  const parts = [estimatorName(e.estimator)];
  if (e.variance === "null") parts.push("variance fixed at 1/d");
  else if (e.variance === "fitted") parts.push("variance fitted");
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

/** The list item's headline epsilon may be a number, "inf", an EpsilonResult dict or null. */
export function headline(value) {
  if (value && typeof value === "object") return { eps: value.epsilon, label: estimateLabel(value) };
  return { eps: value, label: "" };
}

// --- diagnostics ------------------------------------------------------------------------------

const SCORE_SET = { final: "final-model", max: "per-round maximum" };

/** A diagnostic's name and purpose in words, by its identifier. */
export function diagnosticName(d) {
  const name = String(d.name || "");
  let m = name.match(/^anderson_darling_(seen|unseen)_(final|max)$/);
  if (m) return `The ${m[1]} canaries' ${SCORE_SET[m[2]]} scores look Gaussian`;
  m = name.match(/^bootstrap_(final_model|all_iterates)_epsilon$/);
  if (m) return `Stability of the Gaussian-fit estimate (adversary ${threatLabel(m[1])})`;
  if (name === "unseen_vs_null") return "Unseen canaries look like random directions";
  return "Another check";
}

export function diagnosticPurpose(d) {
  const name = String(d.name || "");
  if (name.startsWith("anderson_darling")) return "The Gaussian-fit estimate relies on it (Anderson–Darling test, Andrew et al. App. B). If it fails, trust the lower bounds, not the estimate.";
  if (name.startsWith("bootstrap")) return "How much the Gaussian-fit estimate moves when the canaries are resampled; a wide interval means too few canaries.";
  if (name === "unseen_vs_null") return "Held-out canaries must behave like random directions; if not, canaries and model are not independent (a bug in insertion or in the seed).";
  return "";
}

/** What a diagnostic's number is: the bootstrap's interval, a test statistic or a p-value. */
export function diagnosticValue(d) {
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

const TOKENS = [
  [/\bfinal_model_epsilon\b/g, "final-model estimate"],
  [/\ball_iterates_epsilon\b/g, "all-rounds estimate"],
  [/\bfinal_model\b/g, "final-model"],
  [/\ball_iterates\b/g, "all-rounds"],
  [/\bknown_rounds\b/g, "known-rounds"],
  [/\bpoisson_subsampled\b/g, "Poisson-subsampled"],
  [/\b(seen|unseen)_final\b/g, "$1 final-model"],
  [/\b(seen|unseen)_max\b/g, "$1 per-round maximum"],
  [/\bnoise_scale=([\d.]+)/g, "noise × $1"],
  [/\bnoise_scale\b/g, "noise scale"],
  [/\bno_noise\b/g, "no noise"],
  [/\bno_clipping\b/g, "no clipping"],
  [/\bnoise_divided_twice\b/g, "noise divided twice"],
  [/\bextra_participation\b/g, "extra participation"],
  [/\b(\d+(?:\.\d+)?)-Gaussian DP\b/g, "Gaussian DP with μ = $1"],
  [/\bmu\b/g, "μ"],
];

/** Free text from the service (alerts, notes) with its identifiers put into words. */
export function humanText(text) {
  let out = String(text || "");
  for (const [pattern, repl] of TOKENS) out = out.replace(pattern, repl);
  return out;
}
