// The dashboard's charts, drawn with uPlot (vendor/uPlot.esm.js, MIT): the f-DP trade-off
// picture, lower bounds over rounds against the claim, and the canary-score histograms.
// Readable without colour: every series has its own dash pattern and a text legend.

import uPlot from "./vendor/uPlot.esm.js";
import { VOCABULARY } from "./format.js";

/** Okabe–Ito palette (distinguishable with the common colour-vision deficiencies), shared with
 * the printable report through vocabulary.json. */
export const PALETTE = VOCABULARY.palette;
export const DASHES = [[], [7, 4], [2, 3], [9, 3, 2, 3], [12, 4], [4, 2, 1, 2]];

function cssVar(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

function axis(label, { values } = {}) {
  const fg = cssVar("--muted", "#5b6472");
  const grid = cssVar("--grid", "#e8ecf2");
  return { label, stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 }, values, labelFont: "600 12px system-ui, sans-serif", font: "11px system-ui, sans-serif" };
}

/** (Re)draw a uPlot chart in ``container``; the previous one there is destroyed. */
function draw(container, opts, data, { emptyText, summary } = {}) {
  container._plot?.destroy();
  container._plot = null;
  container.replaceChildren();
  if (summary) container.setAttribute("aria-label", summary);
  if (!data || !data[0]?.length) {
    container.appendChild(Object.assign(document.createElement("p"), { className: "chart-empty muted", textContent: emptyText || "No data yet" }));
    container.dataset.drawn = "";
    return null;
  }
  const width = Math.max(260, Math.floor(container.clientWidth || 600));
  const plot = new uPlot({ width, height: opts.height || 300, legend: { show: true, live: false }, cursor: { drag: { x: false, y: false } }, ...opts }, data, container);
  container._plot = plot;
  container.dataset.drawn = opts.series.slice(1).map((s) => s.id).join(",");
  return plot;
}

const fmt2 = (u, ticks) => ticks.map((t) => (Math.abs(t) < 1e-12 ? "0" : +t.toFixed(2)).toString());

/**
 * The f-DP picture: false-negative rate against false-positive rate of tests that tell seen
 * canaries from the null. ``picture`` is the API's ``tradeoff`` object; ``names`` the legend text.
 */
export function tradeoffChart(container, picture, names, { emptyText, summary } = {}) {
  const alpha = picture?.alpha || [];
  const series = [{ label: "false-positive rate α" }];
  const data = [alpha];
  const add = (id, values, style) => {
    if (!Array.isArray(values)) return -1;
    series.push({ id, label: names[id], points: { show: false }, spanGaps: true, width: 2, ...style });
    data.push(values);
    return series.length - 1;
  };
  const bands = [];
  const empirical = add("empirical", picture?.empirical, { stroke: PALETTE[0], width: 2.5 });
  const band = add("band", picture?.band, { stroke: PALETTE[5], dash: [2, 3], width: 1.5 });
  if (empirical > 0 && band > 0) bands.push({ series: [empirical, band], fill: "rgba(86, 180, 233, 0.22)" });
  add("claim", picture?.claim, { stroke: cssVar("--fg", "#111827"), dash: [8, 5], width: 2.5 });
  add("mu_lo", picture?.mu_lo, { stroke: PALETTE[1], dash: [3, 2, 9, 2], width: 2 });
  if (series.length === 1) return draw(container, { series }, [[]], { emptyText, summary });
  return draw(
    container,
    {
      height: 340,
      series,
      bands,
      scales: { x: { time: false, range: [0, 1] }, y: { range: [0, 1] } },
      axes: [axis("false-positive rate α (unseen called seen)", { values: fmt2 }), axis("false-negative rate β (seen missed)", { values: fmt2 })],
    },
    data,
    { summary },
  );
}

/**
 * Lower bounds over rounds against the claim line. ``lines``: [{id, label, points: [[round, y]]}],
 * ``claim``: {label, y} or null; the y axis covers the claim and the bounds (not more).
 */
export function roundsChart(container, { lines, claim, numRounds, yLabel, emptyText, summary }) {
  const rounds = [...new Set(lines.flatMap((l) => l.points.map((p) => p[0])))].sort((a, b) => a - b);
  if (!rounds.length) return draw(container, { series: [{}] }, [[]], { emptyText, summary });
  const xs = rounds.length === 1 ? [rounds[0], rounds[0] + 1e-9] : rounds;
  const series = [{ label: "round" }];
  const data = [xs];
  let yMax = claim && Number.isFinite(claim.y) ? claim.y : 0;
  lines.forEach((l, i) => {
    const byRound = new Map(l.points);
    const ys = xs.map((r) => (byRound.has(r) ? byRound.get(r) : null));
    for (const y of ys) if (Number.isFinite(y)) yMax = Math.max(yMax, y);
    series.push({ id: l.id, label: l.label, stroke: PALETTE[i % PALETTE.length], dash: DASHES[i % DASHES.length], width: 2, spanGaps: true, points: { show: true, size: 6 } });
    data.push(ys);
  });
  if (claim && Number.isFinite(claim.y)) {
    series.push({ id: "claim", label: claim.label, stroke: cssVar("--fg", "#111827"), dash: [8, 5], width: 2.5, points: { show: false } });
    data.push(xs.map(() => claim.y));
  }
  const top = yMax > 0 ? yMax * 1.15 : 1;
  return draw(
    container,
    {
      height: 260,
      series,
      scales: { x: { time: false, range: [1, Math.max(2, numRounds || xs[xs.length - 1])] }, y: { range: [0, top] } },
      axes: [axis("round", { values: (u, ticks) => ticks.map((t) => (Number.isInteger(t) ? String(t) : "")) }), axis(yLabel)],
    },
    data,
    { summary },
  );
}

/** Counts -> densities (count / (n * bin width)). */
export function toDensity(counts, edges) {
  const n = counts.reduce((a, b) => a + (Number(b) || 0), 0);
  if (!n) return counts.map(() => 0);
  return counts.map((c, i) => (Number(c) || 0) / (n * (edges[i + 1] - edges[i] || 1)));
}

/** Density of N(0, 1/d) (the null for one cosine with a random direction in d dimensions). */
export function nullDensity(x, d) {
  return Math.sqrt(d / (2 * Math.PI)) * Math.exp((-d * x * x) / 2);
}

/**
 * Histograms of canary scores (densities per bin, drawn as steps) with the null density.
 * ``layers``: [{id, label, values}] per bin of ``edges``; ``nullCurve``: {label, f(x)} or null.
 */
export function densityChart(container, { edges, layers, nullCurve, emptyText, summary }) {
  if (!Array.isArray(edges) || edges.length < 2) return draw(container, { series: [{}] }, [[]], { emptyText, summary });
  const xs = [...edges];
  const series = [{ label: "score" }];
  const data = [xs];
  const stepped = uPlot.paths.stepped({ align: 1 });
  layers.forEach((l, i) => {
    series.push({ id: l.id, label: l.label, stroke: PALETTE[i === 0 ? 1 : 0], dash: DASHES[i], width: 2, paths: stepped, points: { show: false }, fill: i === 0 ? "rgba(213, 94, 0, 0.10)" : "rgba(0, 114, 178, 0.08)" });
    data.push([...l.values, l.values[l.values.length - 1] ?? 0]);
  });
  if (nullCurve) {
    series.push({ id: "null", label: nullCurve.label, stroke: cssVar("--fg", "#111827"), dash: [2, 3], width: 2, points: { show: false } });
    data.push(xs.map((x) => nullCurve.f(x)));
  }
  return draw(
    container,
    { height: 220, series, scales: { x: { time: false, range: [xs[0], xs[xs.length - 1]] } }, axes: [axis("cosine of canary and model update"), axis("density")] },
    data,
    { summary },
  );
}

/** How many pixels of a chart's canvas are not background: a drawn chart has many. */
export function inkedPixels(container) {
  const canvas = container.querySelector("canvas");
  if (!canvas) return 0;
  const ctx = canvas.getContext("2d");
  const { data } = ctx.getImageData(0, 0, canvas.width, canvas.height);
  let n = 0;
  for (let i = 3; i < data.length; i += 4) if (data[i] > 0) n++;
  return n;
}
