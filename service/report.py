"""The printable report of an ended audit (``GET /audits/{id}/report``): one self-contained HTML
file (inline CSS and SVG, no script, nothing fetched when it is opened) with the verdict sentence,
the three tiles of the dashboard (claimed, measured, what the audit can detect), the f-DP picture,
the largest valid bound over rounds, the design, the gaps, the spec, every estimate, and the
evidence bundle's hash and signing key. A print stylesheet lays it out for PDF.
"""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any

from ..auditor.claims.verdict import is_valid_bound, largest_valid_bound
from ..auditor.results import number

__all__ = ["render_report"]

_CSS = """
:root{--ink:#1d2430;--muted:#5b6472;--line:#d5dae1;--ok:#1d7a46;--bad:#b3261e;--warn:#8a5a00;
--claim:#3056b8;--emp:#b3261e;--band:#f3c7c4;--lo:#8a5a00}
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
color:var(--ink);max-width:60rem;margin:2rem auto;padding:0 1.2rem}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.6rem 0 .5rem;
border-bottom:1px solid var(--line);padding-bottom:.2rem}.muted{color:var(--muted)}
.small{font-size:.85rem}.verdict{font-size:1.15rem;padding:.8rem 1rem;border-left:6px solid
var(--muted);background:#f6f7f9;margin:1rem 0}.verdict.consistent{border-color:var(--ok)}
.verdict.claim_refuted{border-color:var(--bad)}.verdict.inconclusive{border-color:var(--warn)}
.status{font-weight:600;text-transform:uppercase;font-size:.8rem;letter-spacing:.05em}
.tiles{display:grid;grid-template-columns:repeat(3,1fr);gap:.8rem}.tile{border:1px solid
var(--line);border-radius:6px;padding:.7rem .8rem}.tile-label{font-size:.8rem;color:var(--muted)}
.tile-value{font-size:1.35rem;font-weight:600;margin:.2rem 0}table{border-collapse:collapse;
width:100%;font-size:.85rem}th,td{text-align:left;border-bottom:1px solid var(--line);
padding:.25rem .4rem;vertical-align:top}td.num{font-variant-numeric:tabular-nums;text-align:right}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:1rem}figure{margin:0}figcaption{font-size:
.8rem;color:var(--muted)}svg{width:100%;height:auto;border:1px solid var(--line);border-radius:4px}
code{font-size:.8rem;word-break:break-all}.legend span{margin-right:1rem;white-space:nowrap}
@media print{body{margin:0;max-width:none;font-size:11pt}.verdict{background:none}
section,figure,.tile,tr{break-inside:avoid;page-break-inside:avoid}h2{break-after:avoid;
page-break-after:avoid}.page-break{break-before:page;page-break-before:always}
a{color:inherit;text-decoration:none}}
@page{size:A4;margin:15mm}
"""

_W, _H, _PAD = 360, 260, 36

#: The dashboard's human names (static/format.js ``ESTIMATORS`` and ``threatLabel``).
_ESTIMATOR_NAMES = {
    "two_gaussian": "Gaussian-fit estimate of ε", "lower_bound": "Threshold-test bound on ε",
    "normal_scores": "Normal-score bound on μ", "gdp_lower_bound": "Threshold-test bound on μ",
    "one_run": "Guessing-game bound on ε", "fdp_one_run": "Guessing-game bound on μ",
    "analytic": "Promised ε (privacy accountant)", "sequential": "Sequential test by betting",
}
_THREAT_NAMES = {
    "final_model": "sees the final model", "all_iterates": "sees every round's update",
    "known_rounds": "sees the rounds a canary joined",
    "poisson_subsampled": "sees every update, rounds random",
    "gaussian_mechanism": "one Gaussian mechanism",
}


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "–" if value is None else str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "∞" if value > 0 else ("−∞" if value < 0 else "nan")
        return f"{value:.{digits}g}"
    if value == "inf":
        return "∞"
    return str(value)


def _polyline(xs, ys, x_range, y_range, color: str, *, dash: str = "", width: float = 2) -> str:
    (x0, x1), (y0, y1) = x_range, y_range
    points = []
    for x, y in zip(xs, ys):
        if number(x, finite=True) is None or number(y, finite=True) is None:
            continue
        px = _PAD + (x - x0) / ((x1 - x0) or 1) * (_W - 1.5 * _PAD)
        py = _H - _PAD - (y - y0) / ((y1 - y0) or 1) * (_H - 1.5 * _PAD)
        points.append(f"{px:.1f},{py:.1f}")
    if not points:
        return ""
    style = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{style} '
            f'points="{" ".join(points)}"/>')


def _axes(x_label: str, y_label: str, x_range, y_range) -> str:
    (x0, x1), (y0, y1) = x_range, y_range
    left, bottom, right, top = _PAD, _H - _PAD, _W - _PAD / 2, _PAD / 2
    return (
        f'<line x1="{left}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{bottom}" x2="{left}" y2="{top}" stroke="#888"/>'
        f'<text x="{left}" y="{bottom + 14}" font-size="10">{_fmt(x0)}</text>'
        f'<text x="{right}" y="{bottom + 14}" font-size="10" text-anchor="end">{_fmt(x1)}</text>'
        f'<text x="{left - 4}" y="{bottom}" font-size="10" text-anchor="end">{_fmt(y0)}</text>'
        f'<text x="{left - 4}" y="{top + 8}" font-size="10" text-anchor="end">{_fmt(y1)}</text>'
        f'<text x="{(left + right) / 2}" y="{_H - 6}" font-size="11" text-anchor="middle">'
        f'{escape(x_label)}</text>'
        f'<text x="10" y="{(top + bottom) / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 10 {(top + bottom) / 2})">{escape(y_label)}</text>'
    )


def _svg(body: str, title: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
            f'aria-label="{escape(title)}">{body}</svg>')


def _tradeoff_svg(picture: dict) -> str:
    alpha = picture.get("alpha") or []
    rng = ((0.0, 1.0), (0.0, 1.0))
    body = _axes("false-positive rate α", "false-negative rate β", *rng)
    body += _polyline(alpha, [1 - a for a in alpha], *rng, "#bbb", dash="3 3", width=1)
    for key, color, dash in (("band", "var(--band)", ""), ("claim", "var(--claim)", ""),
                             ("mu_lo", "var(--lo)", "6 3"), ("empirical", "var(--emp)", "")):
        if picture.get(key):
            body += _polyline(alpha, picture[key], *rng, color, dash=dash,
                              width=4 if key == "band" else 2)
    legend = []
    for key, color, text in (("claim", "#3056b8", f"claimed (μ = {_fmt(picture.get('claim_mu'))})"),
                             ("empirical", "#b3261e", "seen canaries' empirical curve"),
                             ("band", "#f3c7c4", "lower confidence band"),
                             ("mu_lo", "#8a5a00", f"μ_lo = {_fmt(picture.get('mu_lo_value'))}")):
        if picture.get(key):
            legend.append(f'<span style="color:{color}">■</span> {escape(text)}')
    return (f'<figure id="fdp">{_svg(body, "f-DP trade-off picture")}<figcaption '
            f'class="legend">{" ".join(legend) or "no curve: no claim and no scores"}'
            f'</figcaption></figure>')


def _bounds_svg(round_estimates: list[list[dict]], claim_eps: float | None) -> str:
    rounds, values = [], []
    for t, estimates in enumerate(round_estimates, start=1):
        bound = largest_valid_bound(estimates)
        value = None if bound is None else number(bound.get("epsilon"), finite=True)
        rounds.append(t)
        values.append(value if value is not None else 0.0)
    top = max([*values, claim_eps or 0.0, 1e-3]) * 1.1
    x_range = (1.0, float(max(len(rounds), 2)))
    body = _axes("round", "largest valid ε lower bound", x_range, (0.0, top))
    if claim_eps is not None:
        body += _polyline([1, x_range[1]], [claim_eps, claim_eps], x_range, (0.0, top),
                          "var(--claim)", dash="5 4")
    body += _polyline(rounds, values, x_range, (0.0, top), "var(--emp)")
    note = ("claimed ε dashed" if claim_eps is not None else "no claim")
    return (f'<figure id="bounds">{_svg(body, "valid lower bound over rounds")}'
            f'<figcaption>largest valid ε lower bound after each round ({note})</figcaption>'
            f'</figure>')


def _tiles(verdict: dict) -> str:
    claim = verdict.get("claim")
    if verdict.get("status") == "no_dp_claim":
        claimed, note = "No DP claim", "noise multiplier 0: no privacy promise to test"
    elif claim:
        claimed = f"ε = {_fmt(claim.get('epsilon'))}"
        note = f"at δ = {_fmt(claim.get('delta'))}; Gaussian DP with μ = {_fmt(claim.get('mu'))}"
    else:
        claimed, note = "–", "the run declared no settings"
    bound = verdict.get("largest_valid_bound")
    if bound and number(bound.get("epsilon"), finite=True) is not None:
        measured = f"ε ≥ {_fmt(bound.get('epsilon'))}"
        mu = f"μ ≥ {_fmt(bound.get('mu'))}, " if bound.get("mu") is not None else ""
        conf = (f"{_fmt(100 * bound['confidence'])}% confidence; "
                if isinstance(bound.get("confidence"), (int, float)) else "")
        m_note = f"{mu}{conf}{bound.get('name') or bound.get('estimator') or ''}"
        if bound.get("validity"):
            m_note += f" ({bound['validity']})"
    else:
        measured, m_note = "none", "no lower bound above zero"
    design = verdict.get("design") or {}
    return (
        '<div class="tiles" id="tiles">'
        f'<div class="tile" id="tile-claim"><div class="tile-label">Claimed</div>'
        f'<div class="tile-value">{escape(claimed)}</div><div class="small muted">'
        f'{escape(note)}</div></div>'
        f'<div class="tile" id="tile-measured"><div class="tile-label">Measured: valid lower '
        f'bound</div><div class="tile-value">{escape(measured)}</div><div class="small muted">'
        f'{escape(m_note)}</div></div>'
        f'<div class="tile" id="tile-design"><div class="tile-label">This audit can detect</div>'
        f'<div>{escape(str(design.get("summary") or "–"))}</div><div class="small muted">'
        f'{escape(str(design.get("advice") or ""))}</div></div></div>'
    )


def _rows(items: list[tuple[str, Any]]) -> str:
    return "".join(f"<tr><th>{escape(str(k))}</th><td>{escape(_value(v))}</td></tr>"
                   for k, v in items)


def _value(v: Any) -> str:
    if isinstance(v, (dict, list)):
        return json.dumps(v, ensure_ascii=False, sort_keys=True)
    return _fmt(v, 6) if isinstance(v, float) else ("–" if v is None else str(v))


def _estimates_table(estimates: list[dict]) -> str:
    head = ("<tr><th>estimate</th><th>adversary</th><th>ε</th><th>counted as a valid bound</th>"
            "<th>confidence</th></tr>")
    rows = []
    for e in estimates:
        name = _ESTIMATOR_NAMES.get(str(e.get("estimator")), "Other estimate")
        variant = ", ".join(f"{k} {e[k]}" for k in ("variance", "correction")
                            if e.get(k) and e.get(k) not in ("not_applicable", "n/a"))
        rows.append(
            f"<tr><td>{escape(str(name))}{escape(f' ({variant})' if variant else '')}</td>"
            f"<td>{escape(_THREAT_NAMES.get(str(e.get('threat_model')), str(e.get('threat_model'))))}"
            "</td>"
            f"<td class=num>{escape(_fmt(e.get('epsilon')))}</td>"
            f"<td>{'yes' if is_valid_bound(e) else 'no'}</td>"
            f"<td class=num>{escape(_fmt(e.get('confidence')))}</td></tr>")
    return f"<table id=estimates>{head}{''.join(rows)}</table>"


def render_report(view: dict, bundle: dict, round_estimates: list[list[dict]]) -> str:
    """The report of one ended audit.

    Parameters
    ----------
    view : dict
        ``GET /audits/{id}``'s body (with ``tradeoff``).
    bundle : dict
        Its signed evidence bundle (for the hash and the key id).
    round_estimates : list of list of dict
        Each stored round's estimates, in round order (the bounds over rounds).
    """
    verdict = view.get("verdict") or {}
    status = str(verdict.get("status") or "")
    claim_eps = number((verdict.get("claim") or {}).get("epsilon"), finite=True)
    gaps = view.get("gaps") or []
    gap_rows = "".join(
        f"<tr><td class=num>{escape(str(g.get('round')))}</td><td>{escape(str(g.get('kind')))}"
        f"</td><td>{escape(str(g.get('reason') or ''))}</td><td>{escape(str(g.get('cost')))}"
        f"</td></tr>" for g in gaps)
    gaps_html = (f"<table id=gaps><tr><th>round</th><th>kind</th><th>reason</th><th>cost</th>"
                 f"</tr>{gap_rows}</table>" if gaps else
                 "<p id=gaps class=muted>No gaps: every round was reported with its canaries.</p>")
    design = verdict.get("design") or {}
    signature = bundle.get("signature") or {}
    seed = bundle.get("canary_seed") or {}
    progress = view.get("progress") or {}
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>flaudit report: {escape(str(view.get('name')))} ({escape(str(view.get('id')))})</title>
<style>{_CSS}</style></head><body>
<header><div class="muted small">flaudit audit report · audit <code>{escape(str(view.get('id')))}</code>
· {escape(str(view.get('status')))} · round {escape(str(progress.get('round')))} of
{escape(str(progress.get('num_rounds')))}</div>
<h1>{escape(str(view.get('name')))}</h1></header>
<section><p id="verdict" class="verdict {escape(status)}"><span class="status">{escape(status.replace('_', ' '))}</span><br>
{escape(str(verdict.get('summary') or ''))}</p>
{_tiles(verdict)}</section>
<section><h2>Pictures</h2><div class="charts">{_tradeoff_svg(view.get('tradeoff') or {})}
{_bounds_svg(round_estimates, claim_eps)}</div></section>
<section><h2>Design</h2><table id=design>{_rows(sorted(design.items()))}</table></section>
<section><h2>Gaps</h2>{gaps_html}</section>
<section class="page-break"><h2>Estimates</h2>{_estimates_table(view.get('estimates') or [])}</section>
<section><h2>Spec</h2><table id=spec>{_rows(sorted((view.get('spec') or {}).items()))}</table></section>
<section id="evidence"><h2>Evidence</h2><table>{_rows([
        ("evidence hash", signature.get("digest")), ("signing key id", signature.get("key_id")),
        ("signature", signature.get("algorithm")), ("canary seed commitment", seed.get("commitment")),
        ("created", view.get("created_at")), ("finished", view.get("finished_at")),
        ("versions", bundle.get("versions")),
    ])}</table>
<p class="small muted">Check the numbers with <code>flaudit verify {escape(str(view.get('id')))}-evidence.json --url &lt;service&gt;</code>
on the bundle from GET /audits/{escape(str(view.get('id')))}/evidence: it recomputes the verdict and
every estimate from the published statistics and checks the signature (docs/evidence.md).</p></section>
</body></html>
"""
