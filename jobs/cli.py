"""The ``overnight`` command: parse flags, merge them over the job file, call a job.

No business logic here. Systemic failures arrive as ``OvernightError`` and are turned into
one clear message and an exit status; per-item failures are in the output, exit status 0.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from jobs.errors import ConfigError, OvernightError
from jobs.spec import JobSpec, build_spec, read_job_file, reference
from jobs.storage import redact


def _transcribe_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="faster-whisper model name or path (default: bundled tiny.en)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--compute-type")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--beam-size", type=int)
    p.add_argument("--language")
    p.add_argument("--actors", type=int, help="Whisper actors (one model each)")
    p.add_argument(
        "--split-channels",
        action="store_true",
        default=None,
        help="transcribe each channel separately (agent/customer stereo calls)",
    )
    p.add_argument("--no-vad", dest="vad", action="store_false", default=None)


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="job spec file (TOML or YAML); flags override it")
    p.add_argument("--address", help="Ray cluster address (default: start Ray locally)")
    p.add_argument("--run-id")
    p.add_argument("--max-items", type=int)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--verbose", action="store_true", help="also show Ray's own log lines (start-up, workers)"
    )
    p.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="folder/prefix input: take the files this glob matches (repeatable; '*': every "
        "file); default: the job's known extensions",
    )
    p.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        help="folder/prefix input: leave out the files this glob matches (repeatable)",
    )


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="overnight", description="Batch transcription and document processing on Ray."
    )
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "transcribe", help="transcribe recordings: INPUT → OUTPUT/transcripts, costs, runs"
    )
    t.add_argument("input", help="folder, file, URL prefix or manifest (.csv/.jsonl/.parquet)")
    t.add_argument("output", help="folder or URL prefix")
    _transcribe_flags(t)
    _common_flags(t)

    pr = sub.add_parser(
        "process", help="run an LLM task over documents or transcripts: INPUT → OUTPUT/results"
    )
    pr.add_argument(
        "input", help="documents (folder, file, URL prefix, manifest) or a transcripts dataset"
    )
    pr.add_argument("output")
    pr.add_argument(
        "--task",
        help="summarize|extract|classify|prompt|call_summary|disposition|promise_to_pay|compliance",
    )
    pr.add_argument("--schema", help="extract: the fields as a JSON schema file")
    pr.add_argument("--labels", help="classify: comma-separated labels")
    pr.add_argument("--prompt", help="prompt: a template file with {text}")
    pr.add_argument(
        "--model", help="model path or hub name (default: the backend's embedded default)"
    )
    pr.add_argument("--backend", choices=["ctranslate2", "vllm"])
    pr.add_argument("--device", choices=["auto", "cpu", "cuda"])
    pr.add_argument("--summary-words", type=int)
    _common_flags(pr)

    r = sub.add_parser("run", help="run a job spec file (scheduled runs)")
    r.add_argument("job_file")
    r.add_argument("--address")
    r.add_argument("--run-id")
    r.add_argument("--quiet", action="store_true")
    r.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")

    sub.add_parser("config", help="print the job spec reference")

    d = sub.add_parser("demo", help="synthesize a few calls and transcribe them (no input needed)")
    d.add_argument("--output", default="demo-output")
    d.add_argument("--address")
    d.add_argument("--verbose", action="store_true", help="also show Ray's own log lines")

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return ap


# Modules that add their own subcommands: each has add_parser(subparsers) and sets
# `handler=` on its parser; a handler takes the parsed args and returns an exit status.
COMMAND_MODULES: tuple[str, ...] = (
    "jobs.submit",
    "jobs.submissions",
    "jobs.report",
    "jobs.plan",
    "jobs.tune",
    "jobs.show",
)


def _overrides(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    job = {
        "kind": kind,
        "input": getattr(args, "input", None),
        "output": getattr(args, "output", None),
        "ray_address": getattr(args, "address", None),
        "run_id": getattr(args, "run_id", None),
        "max_items": getattr(args, "max_items", None),
        "progress": False if getattr(args, "quiet", False) else None,
        "verbose": True if getattr(args, "verbose", False) else None,
        "include": getattr(args, "include", None),
        "exclude": getattr(args, "exclude", None),
    }
    transcribe = {
        key: getattr(args, key, None)
        for key in (
            "model",
            "device",
            "compute_type",
            "batch_size",
            "beam_size",
            "language",
            "actors",
            "split_channels",
            "vad",
        )
    }
    if kind == "process":
        labels = getattr(args, "labels", None)
        process = {
            "task": args.task,
            "schema": args.schema,
            "prompt": args.prompt,
            "model": args.model,
            "backend": args.backend,
            "device": args.device,
            "summary_words": args.summary_words,
            "labels": [x.strip() for x in labels.split(",") if x.strip()] if labels else None,
        }
        return {"job": job, "process": process}
    return {"job": job, "transcribe": transcribe}


def run_spec(spec: JobSpec) -> dict[str, Any]:
    from jobs.console import quiet_native_stderr

    with contextlib.nullcontext() if spec.job.verbose else quiet_native_stderr():
        if spec.job.kind == "transcribe":
            from jobs.transcribe import run_transcribe

            return run_transcribe(spec)
        from jobs.process import run_chain, run_process

        return run_process(spec) if spec.job.kind == "process" else run_chain(spec)


def print_summary(summary: dict[str, Any], out=None) -> None:
    out = out or sys.stdout
    for stage in summary.get("stages", []):
        print_summary(stage, out)
    if "stages" in summary:
        return

    def money(value):
        return "n/a" if value is None else f"${value:.6f}"

    lines = [
        f"run {summary['run_id']} ({summary['kind']})",
        f"  items        {summary['items']} processed, {summary['succeeded']} ok, {summary['failed']} failed"
        f" ({summary['items_already_done']} already done of {summary['items_listed']} listed)",
    ]
    if summary.get("errors_by_code"):
        lines.append(
            "  errors       " + ", ".join(f"{k}: {v}" for k, v in summary["errors_by_code"].items())
        )
    if summary.get("skipped"):
        n = sum(summary["skipped"].values())
        reasons = ", ".join(f"{v} {k}" for k, v in summary["skipped"].items())
        shown = ", ".join(summary.get("skipped_examples") or [])
        lines.append(
            f"  skipped      {n} file{'s' if n != 1 else ''} of the listing ({reasons})"
            f"{': ' + shown + (', ...' if n > 5 else '') if shown else ''}; "
            "--include/--exclude GLOB choose the files"
        )
    if summary.get("duplicates_removed"):
        lines.append(
            f"  repaired     {summary['duplicates_removed']} late rows of an earlier, killed run "
            "(items this run also did; one row per item kept)"
        )
    if summary.get("audio_seconds"):
        lines.append(
            f"  audio        {summary['audio_seconds'] / 60:.2f} min, {summary.get('rtfx')}x real time"
        )
    lines += [
        f"  time         {summary['wall_seconds']:.1f} s wall, {summary['accelerator_seconds']:.1f} s busy on "
        f"{summary['accelerator']} of {summary['accelerator_reserved_seconds']:.1f} s reserved"
        f" (utilization {summary['utilization']})",
        f"  cost         {money(summary['cost_usd'])} busy, {money(summary['reserved_cost_usd'])} reserved",
    ]
    if summary.get("cost_per_document_usd") is not None:
        lines.append(
            f"  tokens       {summary['input_tokens']} in, {summary['output_tokens']} out; "
            f"{money(summary['cost_per_document_usd'])} per document, "
            f"{money(summary['cost_per_million_tokens_usd'])} per million tokens (busy)"
        )
    if summary.get("cost_per_audio_minute_usd") is not None:
        lines.append(
            f"  per minute   {money(summary['cost_per_audio_minute_usd'])} busy, "
            f"{money(summary['reserved_cost_per_audio_minute_usd'])} reserved"
        )
    startup = summary.get("startup") or {}
    if startup.get("first_result_s") is not None:
        steps = ", ".join(
            f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s"
            for k, v in startup.items()
            if k != "first_result_s" and v is not None
        )
        lines.append(
            f"  start-up     first result after {startup['first_result_s']:.1f} s ({steps})"
        )
    for key in ("transcripts", "results", "costs", "summary_path"):
        if key in summary:
            lines.append(f"  {key:<12} {summary[key]}")
    print("\n".join(lines), file=out)


def _demo(args: argparse.Namespace) -> dict[str, Any]:
    from jobs.demo import comparison_table, demo_scripts, make_demo_calls
    from jobs.show import COLUMNS, width

    # The calls live with the results they explain (OUTPUT/calls/), not in a temporary
    # folder that outlives the run and that every row's source_uri would point into.
    output = Path(args.output).resolve()
    calls = output / "calls"
    refs = make_demo_calls(calls)
    manifest = calls / "manifest.jsonl"
    with open(manifest, "w") as f:
        for name in refs:
            row = {"uri": name, "tenant": "demo", "external_id": name.removesuffix(".wav")}
            if name == "call_stereo.wav":
                row["channel_labels"] = "agent,customer"
            f.write(json.dumps(row) + "\n")
    print(f"[overnight] synthesized {len(refs)} calls in {calls}", file=sys.stderr)
    spec = build_spec(
        overrides={
            "job": {
                "input": str(manifest),
                "output": str(output),
                "ray_address": args.address,
                "verbose": True if args.verbose else None,
            }
        }
    )
    summary = run_spec(spec)
    from jobs import ledger, storage

    table = ledger.read_results(storage.resolve(summary["transcripts"]), COLUMNS["transcripts"])
    rows = [
        r
        for r in (table.to_pylist() if table is not None else [])
        if Path(r["source_uri"]).parent == calls and Path(r["source_uri"]).name in refs
    ]
    print("\nthe calls' scripts and their transcripts:\n")
    print(comparison_table(rows, demo_scripts(), width()))
    print()
    return summary


def _innermost_parser(
    ap: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    """The (sub)command parser the arguments reached: ``overnight submissions add`` → add's."""
    current = ap
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        name = getattr(args, subs[0].dest, None) if subs else None
        if name is None or name not in subs[0].choices:
            return current
        current = subs[0].choices[name]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse like ``parse_args``, but an unknown option is the subcommand's own error: its
    usage, not the top-level one, and the option it most likely meant."""
    ap = parser()
    args, extra = ap.parse_known_args(argv)
    if extra:
        command = _innermost_parser(ap, args)
        options = [o for a in command._actions for o in a.option_strings]
        message = f"unrecognized arguments: {' '.join(extra)}"
        for token in extra:
            if token.startswith("-"):
                close = difflib.get_close_matches(token.split("=", 1)[0], options, n=1)
                message += "".join(f"; did you mean {c}?" for c in close)
        command.error(message)
    return args


# After Ctrl-C, the longest the command waits for Ray to wind down before it exits anyway.
INTERRUPT_GRACE_S = 30.0


def _interrupt_within_grace() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual, and also arms an exit INTERRUPT_GRACE_S
    later: under CI load an interrupted run stayed alive for minutes. Python runs its own
    signal handler only when the main thread is back in the interpreter, and a driver waiting
    inside Ray's C++ core may not come back; the wakeup fd is written by the C-level handler
    at once, so a watcher thread sees the interrupt whatever the main thread does. Every
    finished batch is committed atomically: exiting loses nothing a rerun does not resume."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return  # someone else (an embedding program) owns Ctrl-C
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:
        os.close(read_fd)
        os.close(write_fd)
        return

    def watch() -> None:
        while data := os.read(read_fd, 64):
            if signal.SIGINT in data:
                time.sleep(INTERRUPT_GRACE_S)
                print(
                    f"overnight: still winding down {INTERRUPT_GRACE_S:.0f} s after the "
                    "interrupt; exiting now (finished items are committed, rerun to resume)",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(130)

    threading.Thread(target=watch, name="overnight-interrupt", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    """The ``overnight`` command. A reader that stops early (``overnight config | head``)
    ends it quietly, with the shell's status for a closed pipe (141), and no traceback."""
    if argv is None:  # the command line itself, not a caller (tests, an embedding program)
        _interrupt_within_grace()
    try:
        try:
            return _main(argv)
        finally:  # also after argparse's exit (--help): the buffered lines may meet a closed pipe
            sys.stdout.flush()
    except BrokenPipeError:
        # Python would flush stdout again at exit and print the same error: point it at
        # /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "config":
            print(reference())
            return 0
        if args.command == "demo":
            summary = _demo(args)
        elif args.command in ("transcribe", "process"):
            file_data = read_job_file(args.config) if args.config else {}
            summary = run_spec(build_spec(file_data, _overrides(args, args.command)))
        elif getattr(args, "handler", None) is not None:
            return int(args.handler(args))
        elif args.command == "run":
            file_data = read_job_file(args.job_file)
            over = {
                "job": {
                    "ray_address": args.address,
                    "run_id": args.run_id,
                    "progress": False if args.quiet else None,
                    "verbose": True if args.verbose else None,
                }
            }
            summary = run_spec(build_spec(file_data, over))
        else:  # pragma: no cover - argparse enforces the choices
            raise ConfigError(f"unknown command {args.command}")
    except OvernightError as exc:
        print(f"overnight: error: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(
            "overnight: interrupted; finished items are committed, rerun to resume", file=sys.stderr
        )
        return 130
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
