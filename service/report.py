"""The printable report of an ended audit (``GET /audits/{id}/report``): one self-contained HTML
file (inline CSS and SVG, no script, nothing fetched when it is opened) with the verdict sentence,
the three tiles of the dashboard (claimed, measured, what the audit can detect), the f-DP picture,
the largest valid bound over rounds, the design, the gaps, the spec, every estimate, and the
evidence bundle's hash and signing key. A print stylesheet lays it out for PDF.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from ..auditor.claims.verdict import is_valid_bound
from ..auditor.results import number
from .vocabulary import (
    VOCABULARY,
    diagnostic_name,
    diagnostic_purpose,
    diagnostic_state,
    diagnostic_value,
    estimate_label,
    field_label,
    human_text,
    threat_label,
    value_lines,
    value_text,
    verdict_title,
)

__all__ = ["render_report"]

_CSS = """
:root{--fg:#111827;--muted:#5b6472;--line:#dde2ea;--ok:#1d6b3a;--ok-bg:#e6f4ea;--err:#9b1c1c;
--err-bg:#fde8e8;--warn:#7a5200;--warn-bg:#fff7db;--bg:#f4f6f9}
*{box-sizing:border-box}body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
color:var(--fg);max-width:60rem;margin:2rem auto;padding:0 1.2rem}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.6rem 0 .5rem;
border-bottom:1px solid var(--line);padding-bottom:.2rem}.muted{color:var(--muted)}
.small{font-size:.85rem}.verdict{font-size:1.1rem;padding:.8rem 1rem;border:2px solid
var(--muted);border-left-width:10px;border-radius:8px;background:var(--bg);margin:1rem 0}
.verdict p{margin:.3rem 0 0;color:var(--fg)}.verdict.consistent{border-color:var(--ok);
background:var(--ok-bg)}.verdict.claim_refuted{border-color:var(--err);background:var(--err-bg)}
.verdict.inconclusive{border-color:var(--warn);background:var(--warn-bg)}
.status{font-weight:800;font-size:1.3rem}.consistent .status{color:var(--ok)}
.claim_refuted .status{color:var(--err)}.inconclusive .status{color:var(--warn)}
.testing{font-size:.9rem}
.tiles{display:grid;grid-template-columns:repeat(3,1fr);gap:.8rem}.tile{border:1px solid
var(--line);border-radius:6px;padding:.7rem .8rem}.tile-label{font-size:.8rem;color:var(--muted)}
.tile-value{font-size:1.35rem;font-weight:600;margin:.2rem 0}table{border-collapse:collapse;
width:100%;font-size:.85rem}th,td{text-align:left;border-bottom:1px solid var(--line);
padding:.25rem .4rem;vertical-align:top}td.num{font-variant-numeric:tabular-nums;text-align:right}
table.fields th{width:45%;font-weight:500;color:var(--muted)}td .line{display:block}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:1rem}figure{margin:0}
figcaption{font-size:.85rem}figcaption strong{display:block;font-size:.95rem}
.adversary{display:block;color:var(--muted)}.rests{display:block;font-weight:600;
color:var(--err);margin:.2rem 0}svg{width:100%;height:auto;border:1px solid var(--line);
border-radius:4px}
code{font-size:.8rem;word-break:break-all}.legend{list-style:none;padding:0;margin:.3rem 0 0;
font-size:.8rem}.legend .key{display:flex;align-items:baseline;gap:.4rem;margin:.1rem 0}
.legend .swatch{flex:none;width:26px;height:10px;border:0;border-radius:0;align-self:center}
@media print{body{margin:0;max-width:none;font-size:11pt}.verdict{background:none}
section,figure,.tile,tr{break-inside:avoid;page-break-inside:avoid}h2{break-after:avoid;
page-break-after:avoid}.page-break{break-before:page;page-break-before:always}
a{color:inherit;text-decoration:none}}
@page{size:A4;margin:15mm}
"""

_W, _H, _PAD = 360, 260, 36

#: The dashboard's colours and dash patterns (static/charts.js): the palette, the claim in the
#: text colour, dashed.
_PALETTE = VOCABULARY["palette"]
_DASHES = ["", "7 4", "2 3", "9 3 2 3", "12 4", "4 2 1 2"]
_CLAIM = ("#111827", "8 5")
_EMPIRICAL, _BAND, _MU_LO = (_PALETTE[0], ""), (_PALETTE[5], "2 3"), (_PALETTE[1], "3 2 9 2")
_BAND_FILL = "rgba(86, 180, 233, 0.22)"

#: The adversary each picture is about (the bounds over rounds: its first line's).
_PICTURE_THREAT = {"fdp": "final_model", "bounds": "known_rounds"}


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return value_text(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "∞" if value > 0 else ("−∞" if value < 0 else "not a number")
        return f"{value:.{digits}g}"
    if value == "inf":
        return "∞"
    return str(value)


def _points(xs, ys, x_range, y_range) -> list[tuple[float, float]]:
    (x0, x1), (y0, y1) = x_range, y_range
    out = []
    for x, y in zip(xs, ys):
        if number(x, finite=True) is None or number(y, finite=True) is None:
            continue
        out.append(
            (
                _PAD + (x - x0) / ((x1 - x0) or 1) * (_W - 1.5 * _PAD),
                _H - _PAD - (min(y, y1) - y0) / ((y1 - y0) or 1) * (_H - 1.5 * _PAD),
            )
        )
    return out


def _polyline(
    xs, ys, x_range, y_range, color: str, *, dash: str = "", width: float = 2, dots: bool = False
) -> str:
    points = _points(xs, ys, x_range, y_range)
    if not points:
        return ""
    style = f' stroke-dasharray="{dash}"' if dash else ""
    line = (
        f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{style} '
        f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in points)}"/>'
    )
    if dots:
        line += "".join(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in points
        )
    return line


def _band(alpha, upper, lower, rng) -> str:
    top, bottom = _points(alpha, upper, *rng), _points(alpha, lower, *rng)
    if not top or not bottom:
        return ""
    ring = [*top, *reversed(bottom)]
    return (
        f'<polygon fill="{_BAND_FILL}" stroke="none" '
        f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in ring)}"/>'
    )


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
        f"{escape(x_label)}</text>"
        f'<text x="10" y="{(top + bottom) / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 10 {(top + bottom) / 2})">{escape(y_label)}</text>'
    )


def _svg(body: str, title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
        f'aria-label="{escape(title)}">{body}</svg>'
    )


def _legend(keys: list[tuple[str, str, str]]) -> str:
    """Legend entries (colour, dash, words): the line's sample and its words hold together."""
    items = "".join(
        f'<li class="key"><svg class="swatch" viewBox="0 0 26 10" aria-hidden="true">'
        f'<line x1="1" y1="5" x2="25" y2="5" stroke="{color}" stroke-width="3"'
        f"{f' stroke-dasharray={chr(34)}{dash}{chr(34)}' if dash else ''}/></svg>"
        f"<span>{escape(text)}</span></li>"
        for color, dash, text in keys
    )
    return f'<ul class="legend">{items}</ul>'


def _figure(key: str, title: str, svg: str, legend: str, adversary: str, lead: str) -> str:
    return (
        f'<figure id="{key}" data-threat-model="{_PICTURE_THREAT[key]}"><figcaption>'
        f'<strong>{escape(title)}</strong><span class="adversary">{escape(adversary)}</span>'
        f"{lead}</figcaption>{svg}{legend}</figure>"
    )


def _tradeoff_svg(picture: dict, lead: str) -> str:
    alpha = picture.get("alpha") or []
    rng = ((0.0, 1.0), (0.0, 1.0))
    body = _axes("false-positive rate α", "false-negative rate β", *rng)
    body += _polyline(alpha, [1 - a for a in alpha], *rng, "#bbb", dash="3 3", width=1)
    if picture.get("band") and picture.get("empirical"):
        body += _band(alpha, picture["empirical"], picture["band"], rng)
    mu_lo = (
        picture.get("mu_lo") if (number(picture.get("mu_lo_value"), finite=True) or 0) > 0 else None
    )
    conf = picture.get("confidence") or 0.95
    keys = []
    for values, (color, dash), width, text in (
        (
            picture.get("band"),
            _BAND,
            1.5,
            (
                f"{_fmt(100 * conf)}% confidence band if scores were independent (a picture, "
                "not the test)"
            ),
        ),
        (
            picture.get("empirical"),
            _EMPIRICAL,
            2.5,
            f"measured from {picture.get('num_seen') or 0} inserted canaries",
        ),
        (picture.get("claim"), _CLAIM, 2.5, f"claimed (μ = {_fmt(picture.get('claim_mu'))})"),
        (
            mu_lo,
            _MU_LO,
            2,
            f"proven at least this leaky (valid bound μ ≥ {_fmt(picture.get('mu_lo_value'))})",
        ),
    ):
        if values:
            body += _polyline(alpha, values, *rng, color, dash=dash, width=width)
            keys.append((color, dash, text))
    return _figure(
        "fdp",
        "Can an attacker tell inserted canaries from the others?",
        _svg(body, "f-DP trade-off picture"),
        _legend(keys) if keys else '<p class="small muted">No curve: no claim and no scores.</p>',
        "Adversary: " + threat_label("final_model") + " (the inserted canaries' final-model "
        "scores). A measured curve below the claimed one is leakage beyond the claim.",
        lead,
    )


def _round_lines(round_estimates: list[list[dict]], final: list[dict]) -> list[tuple[dict, list]]:
    """The dashboard's bounds over rounds: per series of ``round_bounds``, (round, μ) points."""

    def pick(estimates, spec):
        for e in estimates or []:
            mu = (e.get("details") or {}).get("mu")
            if (
                e.get("estimator") == spec["estimator"]
                and e.get("correction") != "none"
                and e.get("threat_model") == spec["threat_model"]
                and number(mu, finite=True) is not None
            ):
                return float(mu)
        return None

    lines = []
    for spec in VOCABULARY["round_bounds"]:
        points = [
            (t, mu)
            for t, estimates in enumerate(round_estimates, start=1)
            if (mu := pick(estimates, spec)) is not None
        ]
        last = pick(final, spec)
        if (
            last is not None
            and round_estimates
            and not any(t == len(round_estimates) for t, _ in points)
        ):
            points.append((len(round_estimates), last))
        if points:
            lines.append((spec, points))
    return lines


def _bounds_svg(
    round_estimates: list[list[dict]], final: list[dict], claim_mu: float | None, lead: str
) -> str:
    lines = _round_lines(round_estimates, final)
    values = [mu for _, points in lines for _, mu in points]
    top = max([*values, claim_mu or 0.0, 1e-3]) * 1.15
    x_range = (1.0, float(max(len(round_estimates), 2)))
    body = _axes("round", "μ (Gaussian DP)", x_range, (0.0, top))
    keys = []
    for i, (spec, points) in enumerate(lines):
        color, dash = _PALETTE[i % len(_PALETTE)], _DASHES[i % len(_DASHES)]
        body += _polyline(
            [t for t, _ in points],
            [mu for _, mu in points],
            x_range,
            (0.0, top),
            color,
            dash=dash,
            dots=True,
        )
        keys.append((color, dash, spec["label"]))
    if claim_mu is not None:
        body += _polyline(
            [1, x_range[1]],
            [claim_mu, claim_mu],
            x_range,
            (0.0, top),
            _CLAIM[0],
            dash=_CLAIM[1],
            width=2.5,
        )
        keys.append((*_CLAIM, f"claimed μ = {_fmt(claim_mu)}"))
    adversaries = ", ".join(dict.fromkeys(threat_label(s["threat_model"]) for s, _ in lines))
    return _figure(
        "bounds",
        "Lower bounds on μ after each round, against the claim",
        _svg(body, "valid lower bounds on μ over rounds"),
        _legend(keys) if keys else '<p class="small muted">No bound yet.</p>',
        f"Adversary: one line each ({adversaries or threat_label('known_rounds')}). "
        "A valid lower bound above the claim line refutes the claim.",
        lead,
    )


def _pictures(view: dict, round_estimates: list[list[dict]]) -> str:
    """The pictures, the one the verdict rests on first, each saying whose adversary it shows."""
    verdict = view.get("verdict") or {}
    by = verdict.get("refuted_by") if verdict.get("status") == "claim_refuted" else None
    if by and by.get("threat_model") not in VOCABULARY["threat_models"]:
        by = None  # refuted by something no picture shows (e.g. the weighting): no order
    rests = None
    if by:
        rests = "fdp" if by.get("threat_model") == "final_model" else "bounds"
    leads = {}
    for key in ("fdp", "bounds"):
        if rests == key:
            leads[key] = (
                '<span class="rests">The verdict rests on this: '
                f"{escape(human_text(by.get('name') or 'the claim test'))} refuted the "
                f"claim (adversary {escape(threat_label(by.get('threat_model')))})."
                "</span>"
            )
        elif rests:
            leads[key] = (
                '<span class="adversary">Not the evidence of the verdict: the claim was '
                "refuted for the adversary who "
                f"{escape(threat_label(by.get('threat_model')))}"
                " (the first picture); this one shows another adversary.</span>"
            )
        else:
            leads[key] = ""
    claim_mu = number((verdict.get("claim") or {}).get("mu"), finite=True)
    if claim_mu is None:
        claim_mu = number((view.get("tradeoff") or {}).get("claim_mu"), finite=True)
    figures = {
        "fdp": _tradeoff_svg(view.get("tradeoff") or {}, leads["fdp"]),
        "bounds": _bounds_svg(
            round_estimates, view.get("estimates") or [], claim_mu, leads["bounds"]
        ),
    }
    order = ["bounds", "fdp"] if rests == "bounds" else ["fdp", "bounds"]
    return "".join(figures[k] for k in order)


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
        conf = (
            f"{_fmt(100 * bound['confidence'])}% confidence; "
            if isinstance(bound.get("confidence"), (int, float))
            else ""
        )
        name = human_text(bound.get("name")) if bound.get("name") else estimate_label(bound)
        who = (
            f"; adversary {threat_label(bound['threat_model'])}"
            if bound.get("threat_model")
            else ""
        )
        m_note = f"{mu}{conf}{name}{who}"
        if bound.get("validity"):
            m_note += f" ({bound['validity']})"
    else:
        measured, m_note = "none", "no lower bound above zero"
    design = verdict.get("design") or {}
    return (
        '<div class="tiles" id="tiles">'
        f'<div class="tile" id="tile-claim"><div class="tile-label">Claimed</div>'
        f'<div class="tile-value">{escape(claimed)}</div><div class="small muted">'
        f"{escape(note)}</div></div>"
        f'<div class="tile" id="tile-measured"><div class="tile-label">Measured: valid lower '
        f'bound</div><div class="tile-value">{escape(measured)}</div><div class="small muted">'
        f"{escape(m_note)}</div></div>"
        f'<div class="tile" id="tile-design"><div class="tile-label">This audit can detect</div>'
        f'<div>{escape(human_text(design.get("summary") or "–"))}</div><div class="small muted">'
        f"{escape(human_text(design.get('advice') or ''))}</div></div></div>"
    )


def _rows(items: list[tuple[str, Any]], *, label=field_label) -> str:
    return "".join(f"<tr><th>{escape(label(k))}</th><td>{_value(v, k)}</td></tr>" for k, v in items)


def _value(v: Any, key: Any = None) -> str:
    """A value in words; a nested setting one line per field."""
    if isinstance(v, dict) and v:
        return "".join(f'<span class="line">{escape(line)}</span>' for line in value_lines(v))
    return escape(value_text(v, key))


def _estimates_table(estimates: list[dict]) -> str:
    head = (
        "<tr><th>estimate</th><th>adversary</th><th>ε</th><th>counted as a valid bound</th>"
        "<th>confidence</th></tr>"
    )
    rows = []
    for e in estimates:
        rows.append(
            f"<tr><td>{escape(estimate_label(e))}</td>"
            f"<td>{escape(threat_label(e.get('threat_model')))}</td>"
            f"<td class=num>{escape(_fmt(e.get('epsilon')))}</td>"
            f"<td>{'yes' if is_valid_bound(e) else 'no'}</td>"
            f"<td class=num>{escape(_fmt(e.get('confidence')))}</td></tr>"
        )
    return f"<table id=estimates>{head}{''.join(rows)}</table>"


def _checks_table(diagnostics: list[dict]) -> str:
    """The audit's checks (its diagnostics), each named in words with its result, its number and
    what it is for (the dashboard's "Checks")."""
    if not diagnostics:
        return "<p id=checks class=muted>No checks were run.</p>"
    rows = "".join(
        f"<tr><td>{escape(diagnostic_name(d))}</td><td>{escape(diagnostic_state(d))}</td>"
        f"<td>{escape(diagnostic_value(d))}</td><td class=small>{escape(diagnostic_purpose(d))}"
        "</td></tr>"
        for d in diagnostics
    )
    return (
        "<table id=checks><tr><th>check</th><th>result</th><th>number</th><th>what it is for"
        f"</th></tr>{rows}</table>"
    )


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
    gaps = view.get("gaps") or []
    gap_rows = "".join(
        f"<tr><td class=num>{escape(str(g.get('round')))}</td><td>{_value(g.get('kind'))}"
        f"</td><td>{escape(human_text(g.get('reason') or ''))}</td><td>{_value(g.get('cost'))}"
        f"</td></tr>"
        for g in gaps
    )
    gaps_html = (
        f"<table id=gaps><tr><th>round</th><th>what</th><th>reason</th><th>cost</th>"
        f"</tr>{gap_rows}</table>"
        if gaps
        else "<p id=gaps class=muted>No gaps: every round was reported with its canaries.</p>"
    )
    design = verdict.get("design") or {}
    signature = bundle.get("signature") or {}
    seed = bundle.get("canary_seed") or {}
    progress = view.get("progress") or {}
    spec = dict(view.get("spec") or {})
    if spec.get("inject_bug") and view.get("bug_injected"):
        spec["inject_bug"] = view["bug_injected"]
    bug = view.get("bug_injected")
    status_word = VOCABULARY["statuses"].get(view.get("status"), str(view.get("status")))
    testing = (
        f'<p class="testing" id="bug-injected"><strong>Testing: </strong>'
        f"{escape(human_text(bug))}</p>"
        if bug
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>flaudit report: {escape(str(view.get("name")))} ({escape(str(view.get("id")))})</title>
<style>{_CSS}</style></head><body>
<header><div class="muted small">flaudit audit report · audit <code>{
        escape(str(view.get("id")))
    }</code>
· {escape(status_word)} · round {escape(str(progress.get("round")))} of
{escape(str(progress.get("num_rounds")))}</div>
<h1>{escape(str(view.get("name")))}</h1></header>
<section><div id="verdict" class="verdict {escape(status)}"><span class="status">{
        escape(verdict_title(status))
    }</span>
<p>{escape(str(verdict.get("summary") or ""))}</p>{testing}</div>
{_tiles(verdict)}</section>
<section><h2>Pictures</h2><div class="charts">{_pictures(view, round_estimates)}</div></section>
<section><h2>Design: what this audit can detect</h2>
<table id=design class=fields>{_rows(list(design.items()))}</table></section>
<section><h2>Gaps</h2>{gaps_html}</section>
<section class="page-break"><h2>Estimates</h2>{
        _estimates_table(view.get("estimates") or [])
    }</section>
<section><h2>Checks</h2>{_checks_table(view.get("diagnostics") or [])}</section>
<section><h2>Settings of the audit</h2><table id=spec class=fields>{
        _rows(list(spec.items()))
    }</table></section>
<section id="evidence"><h2>Evidence</h2><table class=fields>{
        _rows(
            [
                ("evidence hash", signature.get("digest")),
                ("signing key id", signature.get("key_id")),
                ("signature", signature.get("algorithm")),
                ("canary seed commitment", seed.get("commitment")),
                ("created", view.get("created_at")),
                ("finished", view.get("finished_at")),
                ("versions", bundle.get("versions")),
            ],
            label=lambda k: str(k).capitalize(),
        )
    }</table>
<p class="small muted">Check the numbers with <code>flaudit verify {
        escape(str(view.get("id")))
    }-evidence.json --url &lt;service&gt;</code>
on the bundle from GET /audits/{escape(str(view.get("id")))}/evidence: it recomputes the verdict and
every estimate from the published statistics and checks the signature (docs/evidence.md).</p></section>
</body></html>
"""


def _look_alarm(status: Any) -> str:
    """A look's status in words (the dashboard's ``lookAlarm``): "no alarm", "alarm"."""
    return VOCABULARY["look_alarms"].get(status, str(status or "-").replace("_", " "))


def _record_looks_table(looks: list[dict]) -> str:
    rows = "".join(
        f"<tr><td class=num>{escape('end' if look.get('round') is None else str(look['round']))}"
        f"</td><td>{escape(_look_alarm(look.get('status')))}</td><td class=num>{_fmt(look.get('steps'))}"
        f"</td><td class=num>{_fmt(look.get('claim_epsilon'))}</td>"
        f"<td class=num>{_fmt(look.get('p_value'))}</td></tr>"
        for look in looks
    )
    return (
        "<table id=looks><tr><th>round</th><th>alarm</th><th>steps</th><th>claim epsilon</th>"
        f"<th>p-value</th></tr>{rows}</table>"
    )


def _record_claim_table(claim: dict) -> str:
    rows = "".join(
        f"<tr><td>{escape(', '.join(str(c) for c in g.get('client_keys', g.get('clients', []))))}"
        "</td>"
        f"<td class=num>{_fmt(g.get('noise_multiplier'))}</td>"
        f"<td class=num>{_fmt(g.get('sample_rate'))}</td><td class=num>{_fmt(g.get('steps'))}"
        f"</td><td class=num>{_fmt(g.get('epsilon'))}</td>"
        f"<td class=num>{_fmt(g.get('epsilon_per_round'))}</td></tr>"
        for g in claim.get("groups", [])
    )
    return (
        "<table id=claim><tr><th>clients (Flower node id)</th><th>noise multiplier</th><th>sample rate</th>"
        "<th>steps</th><th>epsilon over the run</th><th>epsilon per round</th></tr>"
        f"{rows}</table>"
    )


def render_record_report(view: dict, bundle: dict) -> str:
    """The report of one ended record-level audit (issue #37): the verdict and its cause, the
    claim over the run and per round client by client, the design line, every look."""
    verdict = view.get("verdict") or {}
    status = str(verdict.get("status") or "")
    claim = view.get("claim") or {}
    design = view.get("design") or {}
    cause = view.get("cause") or {}
    signature = bundle.get("signature") or {}
    seed = bundle.get("canary_seed") or {}
    audit_id = escape(str(view.get("id")))
    run_sentence = (
        f"The run's record-level epsilon is {_fmt(claim.get('epsilon'))} at delta = "
        f"{_fmt(claim.get('delta'))} over every round each client trained; a client that "
        f"rebuilds its PrivacyEngine every round (as Flower's examples/opacus does) prints the "
        f"per-round figure, {_fmt(claim.get('epsilon_per_round'))}."
    )
    cause_html = (
        f"<p id=cause><strong>Cause: </strong>{escape(str(cause.get('sentence')))}</p>"
        if cause
        else ""
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>flaudit record-level report: {escape(str(view.get("name")))} ({audit_id})</title>
<style>{_CSS}</style></head><body>
<header><div class="muted small">flaudit audit report · record-level · audit <code>{audit_id}</code>
· {escape(str(view.get("status")))}</div><h1>{escape(str(view.get("name")))}</h1></header>
<section><div id="verdict" class="verdict {escape(status)}"><span class="status">{
        escape(verdict_title(status))
    }</span><p>{escape(str(verdict.get("summary") or ""))}</p>{cause_html}</div></section>
<section><h2>The claim</h2><p>{escape(run_sentence)}</p>{_record_claim_table(claim)}</section>
<section><h2>Design: what this audit can detect</h2><p id=design>{
        escape(str(design.get("summary") or "not designed: no round was reported"))
    }</p></section>
<section><h2>Looks (the alarm after every round and at the end)</h2>{
        _record_looks_table(view.get("looks") or [])
    }</section>
<section id="evidence"><h2>Evidence</h2><table class=fields>{
        _rows(
            [
                ("evidence hash", signature.get("digest")),
                ("signing key id", signature.get("key_id")),
                ("canary seed commitment", seed.get("commitment")),
                ("created", view.get("created_at")),
                ("finished", view.get("finished_at")),
            ],
            label=lambda k: str(k).capitalize(),
        )
    }</table><p class="small muted">Check the numbers with <code>flaudit verify {
        audit_id
    }-evidence.json
--url &lt;service&gt;</code> on the bundle from GET /audits/{audit_id}/evidence.</p></section>
</body></html>
"""
