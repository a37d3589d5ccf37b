#!/usr/bin/env python
"""The two LLM engines side by side on the same documents: `overnight process` (the job, as a
user runs it) with ``backend = "vllm"`` and ``backend = "ctranslate2"``, each task in turn.

Documents: the shared PDFs (``../shared/data/docs``, read in place; an encrypted one must end
as an error row) plus ``--synth`` synthesized call transcripts and support emails
(scripts/bench_process.py's corpus). Tasks: summarize, extract against a pydantic-generated
schema with optional fields, classify into five labels. For each engine and task it prints
rows per document (must be exactly one), ok and error codes, the share of ok extract rows
valid against the schema (jsonschema), engine start (actor start to model ready) and time to
the first result, tokens/s, and per document the classify time over the summarize time.

    python scripts/compare_engines.py --json compare-engines.json       # CPU, ~15 minutes
    python scripts/compare_engines.py --engines vllm --synth 0          # the shared PDFs only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel, Field

DOCS = Path(__file__).resolve().parents[2] / "shared" / "data" / "docs"
LABELS = ["invoice", "letter", "report", "call_transcript", "other"]


class DocumentFields(BaseModel):
    """What a user asks of a mixed inbox: optional fields, bounds and formats."""

    title: str = Field(description="the document's title or subject")
    author: str | None = Field(None, description="who wrote or sent it")
    written_on: date | None = Field(None, description="the date it was written")
    pages: int | None = Field(None, ge=1)
    amount_due: float | None = Field(None, ge=0, description="a total to pay, if any")


def corpus(folder: Path, docs: Path, synth: int) -> list[str]:
    """Symlinks to the shared documents (never copied) plus synthesized ones."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = []
    if docs.is_dir():
        for f in sorted(docs.iterdir()):
            (folder / f.name).symlink_to(f)
            names.append(f.name)
    else:
        print(f"note: {docs} is absent: synthesized documents only", flush=True)
    if synth:
        from scripts.bench_process import make_corpus

        made = Path(tempfile.gettempdir()) / f"overnight-compare-synth-{synth}"
        refs = make_corpus(made, synth)
        for name in refs:
            (folder / name).symlink_to(made / "docs" / name)
            names.append(name)
    return names


def run(backend: str, task: str, folder: Path, out: Path, schema: dict) -> dict[str, Any]:
    import pyarrow.dataset as pads

    from overnight.jobs.process import run_process
    from overnight.jobs.spec import build_spec

    process: dict[str, Any] = {"task": task, "backend": backend, "max_new_tokens": 96}
    if task == "extract":
        process["schema"] = schema
    if task == "classify":
        process["labels"] = LABELS
    spec = build_spec(
        overrides={
            "job": {"kind": "process", "input": str(folder), "output": str(out)},
            "process": process,
        }
    )
    t0 = time.perf_counter()
    summary = run_process(spec)
    wall = time.perf_counter() - t0
    rows = pads.dataset(str(out / "results"), format="parquet").to_table().to_pylist()
    return {"summary": summary, "rows": rows, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--engines", default="ctranslate2,vllm")
    ap.add_argument("--tasks", default="summarize,extract,classify")
    ap.add_argument("--synth", type=int, default=16, help="synthesized documents added")
    ap.add_argument("--docs", default=str(DOCS), help="the real documents (read in place)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import jsonschema

    work = Path(tempfile.mkdtemp(prefix="overnight-compare-"))
    names = corpus(work / "in", Path(args.docs), args.synth)
    schema = DocumentFields.model_json_schema()
    engines = [e for e in args.engines.split(",") if e]
    tasks = [t for t in args.tasks.split(",") if t]
    print(
        f"{len(names)} documents ({', '.join(n for n in names if not n.startswith('doc_'))} and "
        f"{sum(n.startswith('doc_') for n in names)} synthesized); tasks {', '.join(tasks)}; "
        f"engines {', '.join(engines)}; {os.cpu_count()} CPUs",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    llm_s: dict[tuple[str, str], dict[str, float]] = {}
    # Tasks outer, engines inner: the two engines take turns, so a drift in the machine's
    # speed spreads over both.
    for task in tasks:
        for engine in engines:
            r = run(engine, task, work / "in", work / f"out-{engine}-{task}", schema)
            rows, s = r["rows"], r["summary"]
            per_doc: dict[str, int] = {}
            for row in rows:
                per_doc[Path(row["source_uri"]).name] = (
                    per_doc.get(Path(row["source_uri"]).name, 0) + 1
                )
            ok = [x for x in rows if x["status"] == "ok"]
            errors: dict[str, int] = {}
            for x in rows:
                if x["status"] != "ok":
                    errors[x["error_code"]] = errors.get(x["error_code"], 0) + 1
            valid = None
            if task == "extract":
                valid = sum(
                    jsonschema.Draft202012Validator(
                        schema, format_checker=jsonschema.FormatChecker()
                    ).is_valid(json.loads(x["output_json"]))
                    for x in ok
                )
            if task == "classify":
                valid = sum(x["label"] in LABELS for x in ok)
            if task == "summarize":
                valid = sum(bool((x["output_text"] or "").strip()) for x in ok)
            startup = s.get("startup") or {}
            tokens = (s.get("input_tokens") or 0) + (s.get("output_tokens") or 0)
            llm_s[(engine, task)] = {Path(x["source_uri"]).name: x["llm_s"] or 0.0 for x in ok}
            res = {
                "engine": engine,
                "task": task,
                "documents": len(names),
                "rows": len(rows),
                "one_row_each": sorted(per_doc) == sorted(names)
                and all(v == 1 for v in per_doc.values()),
                "ok": len(ok),
                "errors": errors,
                "well_formed_ok": valid,
                "wall_s": round(r["wall_s"], 1),
                "engine_start_s": startup.get("model_load_s"),
                "first_result_s": startup.get("first_result_s"),
                "tokens_per_s": round(tokens / max(s["pipeline_seconds"], 1e-9), 1),
                "generated_tokens": s.get("output_tokens"),
                "busy_s": s["accelerator_seconds"],
                "not_ok": {
                    Path(
                        x["source_uri"]
                    ).name: f"{x['error_code']}: {(x['error_message'] or '')[:160]}"
                    for x in rows
                    if x["status"] != "ok"
                },
            }
            results.append(res)
            print(
                f"  {engine:<11} {task:<9} rows {res['rows']}/{len(names)} "
                f"(one each: {res['one_row_each']}), ok {res['ok']}, errors {errors or '-'}, "
                f"well-formed {valid}/{len(ok)}; wall {res['wall_s']} s, engine start "
                f"{res['engine_start_s']} s, first result {res['first_result_s']} s, "
                f"{res['tokens_per_s']} tokens/s, load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    ratios: dict[str, dict[str, float]] = {}
    for engine in engines:
        summ, cls = llm_s.get((engine, "summarize"), {}), llm_s.get((engine, "classify"), {})
        both = sorted(set(summ) & set(cls))
        ratios[engine] = {n: round(cls[n] / summ[n], 2) for n in both if summ[n] > 0}
        long = {n: v for n, v in ratios[engine].items() if n.endswith(".pdf")}
        if long:
            print(
                f"  {engine}: classify / summarize model time per document: "
                + ", ".join(f"{n} {v:.2f}x" for n, v in long.items())
                + (
                    f"; all documents median {sorted(ratios[engine].values())[len(both) // 2]:.2f}x"
                    if both
                    else ""
                ),
                flush=True,
            )
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"results": results, "classify_over_summarize": ratios}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
