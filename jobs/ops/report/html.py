"""The report as one self-contained HTML page (inline CSS and SVG, no script, no network)."""

from __future__ import annotations

import html

from overnight.jobs.accounting.money import money
from overnight.jobs.ops.report.aggregate import Report
from overnight.jobs.ops.report.svg import bar_chart, hbar_chart, line_chart
from overnight.jobs.ops.report.text import _SHOWN, _num, _pct, _scope_line

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#0f172a;margin:24px;max-width:1180px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}
.scope{color:#475569;margin:0 0 16px}
.kpis{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.kpi{border:1px solid #e2e8f0;border-radius:8px;padding:10px 14px;min-width:150px}
.kpi b{display:block;font-size:20px}.kpi span{color:#64748b;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:16px}
figure.chart{margin:0;border:1px solid #e2e8f0;border-radius:8px;padding:8px}
figcaption{font-weight:600;margin:0 0 4px}
svg .grid{stroke:#e2e8f0;stroke-width:1}svg .tick{font-size:11px;fill:#475569}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:4px 8px;border-bottom:1px solid #e2e8f0;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}th{background:#f8fafc}
tr.total td{font-weight:700;border-top:2px solid #94a3b8}
.notes{color:#475569;font-size:12px}
"""


def _html_table(headers: list[str], rows: list[list[str]], total: list[str] | None = None) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    if total:
        body += (
            '<tr class="total">' + "".join(f"<td>{html.escape(c)}</td>" for c in total) + "</tr>"
        )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(report: Report) -> str:
    """One self-contained page: inline CSS and SVG, no script, no external reference."""
    t = report.totals
    day = report.tables["by_day"].to_pylist()
    tenant = report.tables["by_tenant"].to_pylist()
    days = [r["day"] for r in day]
    charts = [
        line_chart(
            "chart-cost-per-minute",
            "Cost per audio minute by day (USD)",
            days,
            [
                ("busy", [r["cost_per_audio_minute_usd"] for r in day]),
                ("reserved", [r["reserved_cost_per_audio_minute_usd"] for r in day]),
            ],
            money,
        ),
        hbar_chart(
            "chart-cost-by-tenant",
            "Cost by tenant (USD)",
            [r["tenant"] for r in tenant],
            [r["cost_usd"] for r in tenant],
            money,
        ),
        bar_chart(
            "chart-utilization",
            "Accelerator hours by day: busy vs reserved",
            days,
            [
                ("busy h", [r["accelerator_busy_hours"] for r in day]),
                ("reserved h", [r["accelerator_reserved_hours"] for r in day]),
            ],
            lambda v: f"{v:,.3g}",
        ),
        bar_chart(
            "chart-throughput",
            "Throughput by day: audio hours processed",
            days,
            [("audio h", [r["audio_hours"] for r in day])],
            lambda v: f"{v:,.3g}",
        ),
    ]
    kpis = [
        (money(t["cost_usd"]), "total cost (busy)"),
        (money(t["reserved_cost_usd"]), "reserved cost"),
        (money(t["cost_per_audio_minute_usd"]), "per audio minute"),
        (_num(t["audio_hours"], ",.2f"), "audio hours"),
        (_num(t["documents"], ",d"), "documents"),
        (money(t["cost_per_document_usd"]), "per document"),
        (_pct(t["utilization"]), "accelerator utilization"),
        (_num(t["failed"], ",d"), "failed items"),
    ]
    key = report.by
    headers = [key] + [h for _, h, _ in _SHOWN]
    rows = [[str(r[key])] + [f(r[c]) for c, _, f in _SHOWN] for r in report.main.to_pylist()]
    total = ["TOTAL"] + [f(t[c]) for c, _, f in _SHOWN]
    failures = report.tables["failures"].to_pylist()
    failure_html = (
        _html_table(
            [key, "error code", "items"],
            [[str(f[key]), f["error_code"], f"{f['items']:,d}"] for f in failures],
        )
        if failures
        else "<p>No failed items.</p>"
    )
    notes = "".join(f"<p>{html.escape(n)}</p>" for n in report.notes)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>overnight cost report by {html.escape(key)}</title><style>{_CSS}</style></head><body>"
        "<h1>overnight cost report</h1>"
        f'<p class="scope">{html.escape(_scope_line(report))}. Generated {report.generated_at:%Y-%m-%d %H:%M} UTC.</p>'
        '<div class="kpis">'
        + "".join(
            f'<div class="kpi"><b>{html.escape(v)}</b><span>{html.escape(k)}</span></div>'
            for v, k in kpis
        )
        + "</div>"
        '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>"
        f"<h2>By {html.escape(key)}</h2>"
        + _html_table(headers, rows, total)
        + "<h2>Failures by error code</h2>"
        + failure_html
        + '<h2>Definitions</h2><div class="notes"><p>Busy cost: the ledger (each item\'s measured seconds x units x '
        "price per hour). Reserved cost: the run summaries (actors hold their device for the whole pipeline, "
        "busy or not), split between groups by busy time. Utilization = busy / reserved accelerator hours. "
        "rtfx = audio seconds / pipeline wall seconds. Items: what each run did, an item redone or "
        "replaced by a later run counted in each; sources: the distinct recordings and documents "
        "behind them (by URI).</p>" + notes + "</div></body></html>"
    )
