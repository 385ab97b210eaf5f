// Small SVG charts drawn by hand: a line chart (epsilon over rounds) and a density chart
// (cosine histograms vs the null). Readable without colour: every series has its own dash
// pattern and marker shape, and a text legend.

const SVG_NS = "http://www.w3.org/2000/svg";

/** Okabe–Ito palette (distinguishable with the common colour-vision deficiencies). */
export const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C6D1F", "#000000"];
export const DASHES = ["", "7 4", "2 3", "9 3 2 3", "12 4", "4 2 1 2", "1 2", "14 3 3 3"];
export const MARKERS = ["circle", "square", "triangle", "diamond", "cross", "triangle-down", "x", "plus"];

export function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

/** "Nice" tick values covering [lo, hi] (about `count` of them). */
export function niceTicks(lo, hi, count = 5) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return [];
  if (hi === lo) {
    hi = lo + 1;
  }
  const span = hi - lo;
  const raw = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = (norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1) * mag;
  const start = Math.ceil(lo / step - 1e-9) * step;
  const ticks = [];
  for (let v = start; v <= hi + step * 1e-9; v += step) ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  return ticks;
}

function tickLabel(v, ticks) {
  const step = ticks.length > 1 ? Math.abs(ticks[1] - ticks[0]) : Math.abs(v) || 1;
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  return v.toFixed(decimals);
}

function linear(d0, d1, r0, r1) {
  const k = d1 === d0 ? 0 : (r1 - r0) / (d1 - d0);
  return (v) => r0 + (v - d0) * k;
}

/** Draw a marker shape centred at (x, y). */
export function marker(parent, shape, x, y, size, color) {
  const s = size;
  const common = { stroke: color, "stroke-width": 1.6, fill: "var(--chart-bg)", class: "marker" };
  switch (shape) {
    case "square":
      return el("rect", { x: x - s, y: y - s, width: 2 * s, height: 2 * s, ...common }, parent);
    case "triangle":
      return el("path", { d: `M${x},${y - s * 1.2}L${x + s * 1.1},${y + s * 0.8}L${x - s * 1.1},${y + s * 0.8}Z`, ...common }, parent);
    case "triangle-down":
      return el("path", { d: `M${x},${y + s * 1.2}L${x + s * 1.1},${y - s * 0.8}L${x - s * 1.1},${y - s * 0.8}Z`, ...common }, parent);
    case "diamond":
      return el("path", { d: `M${x},${y - s * 1.3}L${x + s * 1.3},${y}L${x},${y + s * 1.3}L${x - s * 1.3},${y}Z`, ...common }, parent);
    case "cross":
    case "plus":
      return el("path", { d: `M${x - s},${y}H${x + s}M${x},${y - s}V${y + s}`, ...common, "stroke-width": 2 }, parent);
    case "x":
      return el("path", { d: `M${x - s},${y - s}L${x + s},${y + s}M${x + s},${y - s}L${x - s},${y + s}`, ...common, "stroke-width": 2 }, parent);
    default:
      return el("circle", { cx: x, cy: y, r: s, ...common }, parent);
  }
}

/** A filled up-arrow at the top edge: "this value is off the chart". */
function arrowUp(parent, x, top, color) {
  return el("path", { d: `M${x},${top}L${x + 5},${top + 8}H${x + 1.5}V${top + 13}H${x - 1.5}V${top + 8}H${x - 5}Z`, fill: color, stroke: "var(--chart-bg)", "stroke-width": 0.8, class: "marker off-chart" }, parent);
}

/** A small SVG swatch (line with dash + marker) for legends. */
export function swatch(style, { width = 34, height = 14 } = {}) {
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, "aria-hidden": "true", focusable: "false", class: "swatch" });
  if (style.fill) {
    el("rect", { x: 2, y: 2, width: width - 4, height: height - 4, fill: style.fill, stroke: style.color, "stroke-width": 1.5, "stroke-dasharray": style.dash || null }, svg);
    return svg;
  }
  el("line", { x1: 1, y1: height / 2, x2: width - 1, y2: height / 2, stroke: style.color, "stroke-width": style.width || 2, "stroke-dasharray": style.dash || null }, svg);
  if (style.marker) marker(svg, style.marker, width / 2, height / 2, 3.5, style.color);
  return svg;
}

function frame(container, { height, margin }) {
  container.replaceChildren();
  const width = Math.max(260, Math.floor(container.clientWidth || 600));
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "chart-svg", role: "presentation", focusable: "false" }, container);
  const inner = { left: margin.left, right: width - margin.right, top: margin.top, bottom: height - margin.bottom };
  el("rect", { x: inner.left, y: inner.top, width: inner.right - inner.left, height: inner.bottom - inner.top, class: "plot-bg" }, svg);
  return { svg, width, inner };
}

function axes(svg, inner, xs, ys, xTicks, yTicks, { xLabel, yLabel, xFormat, yFormat }) {
  const grid = el("g", { class: "grid" }, svg);
  for (const t of yTicks) {
    const y = ys(t);
    el("line", { x1: inner.left, x2: inner.right, y1: y, y2: y }, grid);
    const label = el("text", { x: inner.left - 6, y: y + 4, "text-anchor": "end", class: "tick" }, svg);
    label.textContent = yFormat ? yFormat(t) : tickLabel(t, yTicks);
  }
  for (const t of xTicks) {
    const x = xs(t);
    el("line", { x1: x, x2: x, y1: inner.top, y2: inner.bottom, class: "vgrid" }, grid);
    const label = el("text", { x, y: inner.bottom + 16, "text-anchor": "middle", class: "tick" }, svg);
    label.textContent = xFormat ? xFormat(t) : tickLabel(t, xTicks);
  }
  el("line", { x1: inner.left, x2: inner.right, y1: inner.bottom, y2: inner.bottom, class: "axis" }, svg);
  el("line", { x1: inner.left, x2: inner.left, y1: inner.top, y2: inner.bottom, class: "axis" }, svg);
  if (xLabel) {
    const t = el("text", { x: (inner.left + inner.right) / 2, y: inner.bottom + 34, "text-anchor": "middle", class: "axis-label" }, svg);
    t.textContent = xLabel;
  }
  if (yLabel) {
    const cy = (inner.top + inner.bottom) / 2;
    const t = el("text", { x: 14, y: cy, "text-anchor": "middle", transform: `rotate(-90 14 ${cy})`, class: "axis-label" }, svg);
    t.textContent = yLabel;
  }
}

/**
 * Line chart.
 * @param {HTMLElement} container
 * @param {{series: {key, label, points: [number, number][], style: {color, dash, marker}}[],
 *          refs: {label, y, style}[], xDomain: [number, number], xLabel, yLabel, emptyText,
 *          yCap: number|null}} spec
 * Infinite y values, and values above ``yCap`` when the data exceed it, are drawn at the top
 * edge with an upward triangle (their value in the tooltip); lines are clipped to the plot.
 */
export function lineChart(container, spec) {
  const height = spec.height || 300;
  const { svg, inner } = frame(container, { height, margin: { left: 50, right: 16, top: 14, bottom: 44 } });
  const finite = [];
  for (const s of spec.series) for (const [, y] of s.points) if (Number.isFinite(y)) finite.push(y);
  for (const r of spec.refs || []) if (Number.isFinite(r.y)) finite.push(r.y);
  const hasInf = spec.series.some((s) => s.points.some(([, y]) => y === Infinity));
  let yMax = finite.length ? Math.max(...finite) : 1;
  const capped = Number.isFinite(spec.yCap) && spec.yCap > 0 && yMax > spec.yCap;
  if (capped) yMax = spec.yCap;
  yMax = yMax <= 0 ? 1 : yMax * (capped ? 1.04 : hasInf ? 1.2 : 1.08);
  const yTicks = niceTicks(0, yMax, 5);
  yMax = Math.max(yMax, yTicks[yTicks.length - 1] ?? yMax);
  const [x0, x1] = spec.xDomain[1] > spec.xDomain[0] ? spec.xDomain : [spec.xDomain[0], spec.xDomain[0] + 1];
  const xs = linear(x0, x1, inner.left + 6, inner.right - 6);
  const ys = linear(0, yMax, inner.bottom, inner.top);
  let xTicks = niceTicks(x0, x1, Math.min(8, Math.max(2, Math.floor((inner.right - inner.left) / 70)))).filter((t) => Number.isInteger(t));
  if (!xTicks.length) xTicks = [x0, x1];
  axes(svg, inner, xs, ys, xTicks, yTicks, { xLabel: spec.xLabel, yLabel: spec.yLabel, xFormat: (t) => String(t) });

  // Reference lines, labelled on the line; labels that would overlap alternate sides or are
  // left to the legend.
  const placed = { start: [], end: [] };
  const refs = (spec.refs || []).filter((r) => Number.isFinite(r.y)).sort((a, b) => b.y - a.y);
  for (const r of refs) {
    const y = ys(r.y);
    el("line", { x1: inner.left, x2: inner.right, y1: y, y2: y, stroke: r.style.color, "stroke-width": r.style.width || 1.5, "stroke-dasharray": r.style.dash || null, class: "ref-line" }, svg);
    const side = ["start", "end"].find((s) => placed[s].every((py) => Math.abs(py - y) >= 15));
    if (!side) continue;
    placed[side].push(y);
    const x = side === "start" ? inner.left + 8 : inner.right - 8;
    const t = el("text", { x, y: y - 4, "text-anchor": side, class: "ref-label" }, svg);
    const narrow = inner.right - inner.left < 480;
    t.textContent = (narrow && r.tinyLabel) || r.shortLabel || r.label;
  }

  const clipId = `clip-${Math.random().toString(36).slice(2, 10)}`;
  const clip = el("clipPath", { id: clipId }, el("defs", {}, svg));
  el("rect", { x: inner.left, y: inner.top - 4, width: inner.right - inner.left, height: inner.bottom - inner.top + 8 }, clip);
  const markEvery = (n) => Math.max(1, Math.ceil(n / 24));
  for (const s of spec.series) {
    const g = el("g", { class: "series", "data-series": s.key }, svg);
    const pts = s.points.filter(([x, y]) => Number.isFinite(x) && y !== null && !Number.isNaN(y));
    const mapped = pts.map(([x, y]) => [xs(x), Number.isFinite(y) ? ys(y) : inner.top + 2, y]);
    if (mapped.length > 1) {
      const d = mapped.map(([x, y], i) => `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`).join("");
      el("path", { d, fill: "none", stroke: s.style.color, "stroke-width": 2, "stroke-dasharray": s.style.dash || null, "stroke-linejoin": "round", "clip-path": `url(#${clipId})` }, g);
    }
    const every = markEvery(mapped.length);
    mapped.forEach(([x, y, raw], i) => {
      const above = raw === Infinity || raw > yMax;
      if (i % every !== 0 && i !== mapped.length - 1 && !above) return;
      const m = above ? arrowUp(g, x, inner.top, s.style.color) : marker(g, s.style.marker, x, y, 3.5, s.style.color);
      const title = el("title", {}, m);
      title.textContent = `${s.label}: round ${pts[i][0]}, ε = ${raw === Infinity ? "∞" : raw.toPrecision(3)}`;
    });
  }
  if (!spec.series.some((s) => s.points.length)) {
    const t = el("text", { x: (inner.left + inner.right) / 2, y: (inner.top + inner.bottom) / 2, "text-anchor": "middle", class: "empty-text" }, svg);
    t.textContent = spec.emptyText || "No data yet";
  }
  return svg;
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
 * Density chart of cosine histograms.
 * @param {{bins: number[], layers: {label, values: number[] (densities per bin), style: {color, dash, fill, pattern}}[],
 *          curves: {label, points: [number, number][], style}[], xLabel, emptyText}} spec
 */
export function densityChart(container, spec) {
  const height = spec.height || 240;
  const { svg, inner } = frame(container, { height, margin: { left: 50, right: 14, top: 12, bottom: 44 } });
  const defs = el("defs", {}, svg);
  const edges = spec.bins || [];
  if (edges.length < 2) {
    const t = el("text", { x: (inner.left + inner.right) / 2, y: (inner.top + inner.bottom) / 2, "text-anchor": "middle", class: "empty-text" }, svg);
    t.textContent = spec.emptyText || "No cosines yet";
    return svg;
  }
  const x0 = edges[0];
  const x1 = edges[edges.length - 1];
  let yMax = 0;
  for (const l of spec.layers) for (const v of l.values) if (Number.isFinite(v)) yMax = Math.max(yMax, v);
  for (const c of spec.curves || []) for (const [, y] of c.points) if (Number.isFinite(y)) yMax = Math.max(yMax, y);
  yMax = yMax > 0 ? yMax * 1.08 : 1;
  const xs = linear(x0, x1, inner.left, inner.right);
  const ys = linear(0, yMax, inner.bottom, inner.top);
  let xTicks = niceTicks(x0, x1, Math.min(7, Math.max(4, Math.floor((inner.right - inner.left) / 80))));
  if (xTicks.length < 3) xTicks = niceTicks(x0, x1, 8);
  const yTicks = niceTicks(0, yMax, 4);
  axes(svg, inner, xs, ys, xTicks, yTicks, { xLabel: spec.xLabel, yLabel: "density", yFormat: (t) => (t >= 1000 ? `${(t / 1000).toFixed(t % 1000 ? 1 : 0)}k` : tickLabel(t, yTicks)) });

  spec.layers.forEach((layer, li) => {
    let fill = "none";
    if (layer.style.pattern) {
      const id = `pat-${Math.random().toString(36).slice(2, 9)}-${li}`;
      const p = el("pattern", { id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: layer.style.pattern === "hatch" ? "rotate(45)" : null }, defs);
      if (layer.style.pattern === "hatch") el("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: layer.style.color, "stroke-width": 1.6, opacity: 0.55 }, p);
      else el("circle", { cx: 3, cy: 3, r: 1.1, fill: layer.style.color, opacity: 0.6 }, p);
      fill = `url(#${id})`;
    }
    let d = `M${xs(edges[0]).toFixed(1)},${ys(0).toFixed(1)}`;
    layer.values.forEach((v, i) => {
      const y = ys(Number.isFinite(v) ? v : 0).toFixed(1);
      d += `L${xs(edges[i]).toFixed(1)},${y}L${xs(edges[i + 1]).toFixed(1)},${y}`;
    });
    d += `L${xs(edges[edges.length - 1]).toFixed(1)},${ys(0).toFixed(1)}`;
    const g = el("g", { class: "layer" }, svg);
    el("path", { d: `${d}Z`, fill, stroke: "none" }, g);
    el("path", { d, fill: "none", stroke: layer.style.color, "stroke-width": 1.8, "stroke-dasharray": layer.style.dash || null }, g);
  });
  for (const c of spec.curves || []) {
    const pts = c.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    if (pts.length < 2) continue;
    const d = pts.map(([x, y], i) => `${i ? "L" : "M"}${xs(x).toFixed(1)},${ys(y).toFixed(1)}`).join("");
    el("path", { d, fill: "none", stroke: c.style.color, "stroke-width": c.style.width || 2, "stroke-dasharray": c.style.dash || null }, svg);
  }
  return svg;
}
