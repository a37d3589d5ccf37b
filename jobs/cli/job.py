"""The job commands: ``transcribe``, ``process``, ``probe``, ``run``, ``config``, ``demo``.

Flags are merged over the job file into one validated spec (``jobs.spec``); the job runs and
its summary is printed. The libraries are imported when a command runs, not to print help.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from overnight.jobs.accounting.money import money
from overnight.jobs.choices import (
    BACKENDS,
    DEVICES,
    LLM_TASKS,
    REDACTION_PRESETS,
    REDACTION_TYPES,
    WHISPER_ENGINES,
    WHISPER_TASKS,
)
from overnight.jobs.cli.output import add_json_flag, print_json

if TYPE_CHECKING:
    from overnight.jobs.spec import JobSpec


class _TaskList(argparse.Action):
    """``--task`` given more than once: a job of several tasks (the spec's list), as the docs
    show (``--task summarize --task classify``); the last one alone ran, silently."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        before = getattr(namespace, self.dest, None)
        tasks = ([before] if isinstance(before, str) else list(before or [])) + [values]
        setattr(namespace, self.dest, tasks[0] if len(tasks) == 1 else tasks)


def _names(text: str) -> list[str]:
    """A comma-separated flag value as its names, blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _listed(text: str) -> list[str]:
    """Names that each mean a place in a list (``--labels``, ``--channel-labels``,
    ``--speaker-roles``) as given, an empty one kept for the spec to refuse by its position
    (``a,,b``): dropped, the job classified into a set nobody wrote, or named the second
    channel or speaker with the third name."""
    return [name.strip() for name in text.split(",")]


def _redact_types(text: str) -> list[str]:
    """``--redact``'s names; none at all (``--redact ""``, an unset ``$TYPES``) is an error:
    with blanks dropped it was no redaction, without a word."""
    names = _names(text)
    if not names:
        raise argparse.ArgumentTypeError(
            "names no entity type (an unset variable?): give types such as pci,ssn or all, "
            "or leave --redact out for none"
        )
    return names


def _transcribe_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="faster-whisper model name or path (default: bundled tiny.en)")
    p.add_argument(
        "--device", choices=DEVICES, help="where the model runs (default auto: cuda if any)"
    )
    p.add_argument(
        "--compute-type",
        metavar="TYPE",
        help="CTranslate2 precision: int8, int8_float16, float16, float32 (default: int8 on "
        "cpu, float16 on cuda)",
    )
    p.add_argument(
        "--batch-size", type=int, metavar="N", help="chunks per model batch (default 16)"
    )
    p.add_argument("--beam-size", type=int, metavar="N", help="beam width; 1 is greedy (default 5)")
    p.add_argument(
        "--language",
        metavar="CODE",
        help="spoken language, e.g. en, de (default: detected per recording)",
    )
    p.add_argument(
        "--engine",
        choices=WHISPER_ENGINES,
        help="Whisper implementation: ctranslate2 (faster-whisper), torch (PyTorch, for large "
        "GPU batches); auto: ctranslate2",
    )
    p.add_argument("--actors", type=int, help="Whisper actors (one model each)")
    p.add_argument(
        "--split-channels",
        action="store_true",
        default=None,
        help="transcribe each channel separately (agent/customer stereo calls)",
    )
    p.add_argument(
        "--channel-labels",
        metavar="NAMES",
        type=_listed,
        help="speaker names of the channels in order, e.g. agent,customer (implies "
        "--split-channels; a manifest's channel_labels column wins per item)",
    )
    p.add_argument(
        "--diarize",
        action="store_true",
        default=None,
        help="mono recordings: find who spoke when; words get their speaker, the text is "
        "dialogue, analytics are filled (turns word timestamps on)",
    )
    p.add_argument(
        "--speakers",
        type=int,
        metavar="N",
        help="with --diarize: exactly N speakers (--min/--max-speakers then do not apply)",
    )
    p.add_argument(
        "--min-speakers", type=int, metavar="N", help="with --diarize: at least N (default 1)"
    )
    p.add_argument(
        "--max-speakers", type=int, metavar="N", help="with --diarize: at most N (default 8)"
    )
    p.add_argument(
        "--speaker-roles",
        metavar="NAMES",
        type=_listed,
        help="with --diarize: names in the order the speakers first speak, e.g. "
        "agent,customer (default SPEAKER_00, SPEAKER_01, ...)",
    )
    p.add_argument(
        "--initial-prompt",
        metavar="TEXT",
        help="text the decoder sees first: names, spelling, style (a manifest's "
        "initial_prompt column wins per item)",
    )
    p.add_argument(
        "--hotwords",
        metavar="TEXT",
        help="words to favour, e.g. product names (a manifest's hotwords column wins per item)",
    )
    p.add_argument(
        "--task",
        choices=WHISPER_TASKS,
        help="translate: English text from any language (multilingual models only)",
    )
    p.add_argument(
        "--redact",
        metavar="TYPES",
        type=_redact_types,
        help="entity types to replace by [TYPE] tags, comma-separated: "
        f"{', '.join(REDACTION_TYPES)}, or a preset: {', '.join(REDACTION_PRESETS)} (turns word "
        "timestamps on)",
    )
    p.add_argument(
        "--keep-unredacted",
        action="store_true",
        default=None,
        help="with --redact: also write the original text to OUTPUT/transcripts_unredacted/",
    )
    p.add_argument(
        "--redact-audio",
        action="store_true",
        default=None,
        help="with --redact: write each recording again, redacted words silenced, under "
        "OUTPUT/redacted_audio/",
    )
    p.add_argument(
        "--no-vad",
        dest="vad",
        action="store_false",
        default=None,
        help="transcribe silence too (default: Silero VAD skips it, and the model never "
        "writes text for noise)",
    )


def _scheduler_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-error-rate",
        type=float,
        metavar="R",
        help="exit 12 when more than this share (0-1) of the run's items failed",
    )
    p.add_argument(
        "--retry-errors",
        nargs="?",
        const=["all"],
        type=_names,
        metavar="CODES",
        help="redo the items whose row is an error with one of these codes (comma-separated; "
        "without CODES: any code), e.g. encrypted once the PDF password is set; default: "
        "error rows count as done",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="list and check the input, count what is pending against what is done, estimate "
        "the cost from this output's past runs; start and write nothing",
    )


def _address_flag(p: argparse.ArgumentParser, **kwargs: Any) -> None:
    p.add_argument("--address", dest="ray_address", metavar="ADDRESS", **kwargs)


def _quiet_flag(p: argparse.ArgumentParser, **kwargs: Any) -> None:
    p.add_argument("--quiet", dest="progress", action="store_false", default=None, **kwargs)


def _verbose_flag(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--verbose", action="store_true", default=None, help=help)


def _run_id_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-id",
        metavar="ID",
        help="this run's id in rows, ledger and summary (default: time-based)",
    )


def _log_format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="stderr lines: text (default) or json, one event per line for log collectors "
        "(also OVERNIGHT_LOG_FORMAT)",
    )


def _notify_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notify",
        metavar="URL",
        help="POST a JSON note of the run's end (summary, or error and exit status) to URL "
        "(default: $OVERNIGHT_NOTIFY_URL, which keeps a webhook's token out of job files)",
    )


def _common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="job spec file (TOML or YAML); flags override it")
    _address_flag(p, help="Ray cluster address (default: start Ray locally)")
    _run_id_flag(p)
    p.add_argument(
        "--max-items",
        type=int,
        metavar="N",
        help="do at most N of the pending items this run (the rest stay pending)",
    )
    add_json_flag(p, "the run summary (or the dry run's report)")
    _log_format_flag(p)
    _notify_flag(p)
    _scheduler_flags(p)
    _quiet_flag(p, help="no progress lines")
    _verbose_flag(p, "also show Ray's own log lines (start-up, workers)")
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


def add_parser(sub) -> None:
    t = sub.add_parser(
        "transcribe", help="transcribe recordings: INPUT → OUTPUT/transcripts, costs, runs"
    )
    t.add_argument("input", help="folder, file, URL prefix or manifest (.csv/.jsonl/.parquet)")
    t.add_argument("output", help="folder or URL prefix")
    _transcribe_flags(t)
    _common_flags(t)
    t.set_defaults(handler=_cmd_job)

    pr = sub.add_parser(
        "process", help="run an LLM task over documents or transcripts: INPUT → OUTPUT/results"
    )
    pr.add_argument(
        "input", help="documents (folder, file, URL prefix, manifest) or a transcripts dataset"
    )
    pr.add_argument("output", help="folder or URL prefix")
    pr.add_argument(
        "--task",
        action=_TaskList,
        help="|".join(LLM_TASKS) + "; repeat it for a job of several tasks over the same documents",
    )
    pr.add_argument("--schema", help="extract: the fields as a JSON schema file")
    pr.add_argument(
        "--labels", type=_listed, help="classify (only): comma-separated labels, none empty"
    )
    pr.add_argument("--prompt", help="prompt: a template file with {text}")
    pr.add_argument(
        "--model", help="model path or hub name (default: the backend's embedded default)"
    )
    pr.add_argument("--backend", choices=BACKENDS, help="LLM engine (default auto)")
    pr.add_argument(
        "--device", choices=DEVICES, help="where the model runs (default auto: cuda if any)"
    )
    pr.add_argument(
        "--summary-words", type=int, metavar="N", help="summarize: about how many words"
    )
    _common_flags(pr)
    pr.set_defaults(handler=_cmd_job)

    pb = sub.add_parser(
        "probe",
        help="read recordings' headers only: INPUT → OUTPUT/probes, and the audio hours for plan",
    )
    pb.add_argument("input", help="folder, file, URL prefix or manifest (.csv/.jsonl/.parquet)")
    pb.add_argument("output", help="folder or URL prefix")
    _common_flags(pb)
    pb.set_defaults(handler=_cmd_job)

    r = sub.add_parser("run", help="run a job spec file (scheduled runs)")
    r.add_argument("job_file", help="job spec file (TOML or YAML) that names its kind")
    _address_flag(r, help="Ray cluster address (default: the job file's, else local)")
    _run_id_flag(r)
    add_json_flag(r, "the run summary (or the dry run's report)")
    _log_format_flag(r)
    _notify_flag(r)
    _quiet_flag(r, help="no progress lines")
    _verbose_flag(r, "also show Ray's own log lines")
    _scheduler_flags(r)
    r.set_defaults(handler=_cmd_run)

    c = sub.add_parser("config", help="print the job spec reference")
    c.set_defaults(handler=_cmd_config)

    d = sub.add_parser("demo", help="synthesize a few calls and transcribe them (no input needed)")
    d.add_argument(
        "--output", default="demo-output", help="where the calls and results go (demo-output)"
    )
    _address_flag(d, help="Ray cluster address (default: start Ray locally)")
    _verbose_flag(d, "also show Ray's own log lines")
    d.set_defaults(handler=_cmd_demo)


def _use_log_format(args: argparse.Namespace) -> None:
    if getattr(args, "log_format", None):
        from overnight.jobs.run.console import set_log_format

        set_log_format(args.log_format)


def _cmd_job(args: argparse.Namespace) -> int:
    from overnight.jobs.spec import build_spec, read_job_file

    _use_log_format(args)
    file_data = read_job_file(args.config) if args.config else {}
    spec = build_spec(file_data, _overrides(args, args.command))
    return _run_or_dry(spec, args.dry_run, args.json)


def _cmd_run(args: argparse.Namespace) -> int:
    from overnight.jobs.spec import build_spec, read_job_file

    _use_log_format(args)
    file_data = read_job_file(args.job_file)  # it names the kind
    return _run_or_dry(build_spec(file_data, _overrides(args, None)), args.dry_run, args.json)


def _run_or_dry(spec: JobSpec, dry: bool, as_json: bool = False) -> int:
    if dry:
        from overnight.jobs.ops.dryrun import dry_run, render

        report = dry_run(spec)
        if as_json:
            print_json(report)
        else:
            print(render(report))
        return 0
    from overnight.jobs.api import finish
    from overnight.jobs.run.console import quiet_native_stderr

    def show(summary: dict[str, Any]) -> None:
        if as_json:  # one object, nothing else on stdout: a scheduler parses it as it is
            print_json(summary)
        else:
            print_summary(summary)

    with contextlib.nullcontext() if spec.job.verbose else quiet_native_stderr():
        finish(spec, show)  # exit 12 over max_error_rate, after the summary is shown
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import os

    from overnight.jobs.errors import OutputNotWritable
    from overnight.jobs.spec import reference

    try:
        print(reference())
        sys.stdout.flush()
    except BrokenPipeError:
        raise  # `overnight config | head`: the command's quiet exit 141 (jobs.cli.main)
    except OSError as exc:  # a full disk (> /dev/full), a stdout closed or gone
        # What could not be written is dropped, not written again by the next flush (the
        # command's own, then Python's at exit) into the same error and a traceback.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        reason = exc.strerror or type(exc).__name__
        raise OutputNotWritable(
            f"cannot write the configuration reference to standard output ({reason}); "
            "free space where it goes or send it elsewhere"
        ) from None
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    print_summary(_demo(args))
    return 0


# Parsed arguments of the command line's own; every other one is named as its spec field.
_NOT_OPTIONS = frozenset(
    {
        "command",
        "handler",
        "config",
        "dry_run",
        "job_file",
        "input",
        "output",
        "json",
        "log_format",
    }
)


def _overrides(
    args: argparse.Namespace,
    kind: str | None,
    *,
    input: str | None = None,
    output: str | None = None,
) -> dict[str, Any]:
    """The spec sections the flags set, built as the Python API builds them from its keyword
    arguments (``jobs.spec.overrides``); ``input``/``output`` default to the arguments'."""
    from overnight.jobs.spec import overrides

    options = {k: v for k, v in vars(args).items() if k not in _NOT_OPTIONS}
    return overrides(
        kind,
        options,
        input=input or getattr(args, "input", None),
        output=output or getattr(args, "output", None),
        who=f"overnight {args.command}",
    )


def run_spec(spec: JobSpec) -> dict[str, Any]:
    from overnight.jobs.api import execute
    from overnight.jobs.run.console import quiet_native_stderr

    with contextlib.nullcontext() if spec.job.verbose else quiet_native_stderr():
        return execute(spec)


def print_probe_summary(summary: dict[str, Any], out=None) -> None:
    """A probe's run: how many items, and the audio hours that ``overnight plan`` sizes."""
    from overnight.jobs.run.console import printable

    out = out or sys.stdout
    hours = summary.get("audio_hours")
    if hours is None and summary.get("audio_seconds") is not None:
        hours = summary["audio_seconds"] / 3600.0
    lines = [f"run {summary.get('run_id')} (probe)"]
    if "items" in summary:
        lines.append(
            f"  items        {summary['items']} probed, {summary.get('succeeded', 0)} ok, "
            f"{summary.get('failed', 0)} failed"
        )
    if hours is not None:
        lines.append(
            f"  audio        {hours:.4f} h; size the backlog with "
            f"`overnight plan --audio-hours {hours:.4f} --deadline ...`"
        )
    for key in ("probes", "summary_path"):
        if key in summary:
            lines.append(f"  {key:<12} {summary[key]}")
    print("\n".join(printable(line) for line in lines), file=out)


def _short(value: Any, width: int = 40) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def print_summary(summary: dict[str, Any], out=None) -> None:
    from overnight.jobs.run.console import printable

    out = out or sys.stdout
    for stage in summary.get("stages", []):
        print_summary(stage, out)
    if "stages" in summary:
        return
    if summary.get("kind") == "probe":
        print_probe_summary(summary, out)
        return
    lines = [
        f"run {summary['run_id']} ({summary['kind']})",
        f"  items        {summary['items']} processed, {summary['succeeded']} ok, {summary['failed']} failed"
        f" ({summary['items_already_done']} already done of {summary['items_listed']} listed"
        + (
            f"; {summary['errors_retried']} error row"
            f"{'s' if summary['errors_retried'] != 1 else ''} redone"
            if summary.get("errors_retried")
            else ""
        )
        + ")",
    ]
    if summary.get("done_with_other_options"):
        changed = "; ".join(
            f"{name} {_short(then)} -> {_short(now)}"
            for name, (then, now) in summary["done_with_other_options"].items()
        )
        lines.append(
            f"  options      the {summary['items_already_done']} done item(s) keep the rows the "
            f"last run wrote with other options ({changed}); a new output redoes them with these"
        )
    if summary.get("errors_by_code"):
        lines.append(
            "  errors       " + ", ".join(f"{k}: {v}" for k, v in summary["errors_by_code"].items())
        )
    if summary.get("skipped"):
        from overnight.jobs.dataset.manifest import skipped_lines

        lines += [
            "  " + line
            for line in skipped_lines(summary["skipped"], summary.get("skipped_examples") or [])
        ]
    if summary.get("degenerate"):
        n = summary["degenerate"]
        lines.append(
            f"  degenerate   {n} transcript{'s' if n != 1 else ''} where the model looped on "
            "every attempt: stored with the repetition cut and marked (column degenerate)"
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
        f"  cost         {money(summary['cost_usd'], 'n/a')} busy, {money(summary['reserved_cost_usd'], 'n/a')} reserved",
    ]
    if summary.get("cost_per_document_usd") is not None:
        lines.append(
            f"  tokens       {summary['input_tokens']} in, {summary['output_tokens']} out; "
            f"{money(summary['cost_per_document_usd'], 'n/a')} per document, "
            f"{money(summary['cost_per_million_tokens_usd'], 'n/a')} per million tokens (busy)"
        )
    if summary.get("cost_per_audio_minute_usd") is not None:
        lines.append(
            f"  per minute   {money(summary['cost_per_audio_minute_usd'], 'n/a')} busy, "
            f"{money(summary['reserved_cost_per_audio_minute_usd'], 'n/a')} reserved"
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
    print("\n".join(printable(line) for line in lines), file=out)


def _demo(args: argparse.Namespace) -> dict[str, Any]:
    from overnight.jobs.ops.demo import comparison_table, demo_scripts, make_demo_calls
    from overnight.jobs.ops.show import COLUMNS, width
    from overnight.jobs.preflight import require_extra
    from overnight.jobs.spec import build_spec

    # Its comparison of scripts and transcripts scores the word error rate (jobs.ops.wer).
    require_extra("eval", "overnight demo (it scores its transcripts' word error rate)")
    # The calls live with the results they explain (OUTPUT/calls/), not in a temporary
    # folder that outlives the run and that every row's source_uri would point into.
    output = Path(args.output).resolve()
    calls = output / "calls"
    # Before anything is synthesized or run, as transcribe checks them: the output takes
    # files (not read-only, not a file in the way: exit 11), and the transcripts it already
    # holds (a previous demo's) can be read (a damaged file there: exit 4, and then truly
    # nothing was read or changed; after the run, its rows were committed first).
    from overnight.jobs.dataset import storage
    from overnight.jobs.dataset.commits import CommittedDataset
    from overnight.jobs.errors import OutputNotWritable
    from overnight.jobs.preflight import check_output

    check_output(str(output))
    CommittedDataset(storage.resolve(str(output)).join("transcripts")).read_results(["item_id"])
    try:
        refs = make_demo_calls(calls)
        manifest = calls / "manifest.jsonl"
        with open(manifest, "w") as f:
            for name in refs:
                row = {"uri": name, "tenant": "demo", "external_id": name.removesuffix(".wav")}
                if name == "call_stereo.wav":
                    row["channel_labels"] = "agent,customer"
                f.write(json.dumps(row) + "\n")  # JSON Lines, a manifest: not print_json
    except OSError as exc:  # OUTPUT/calls is a file, or a folder that takes no files
        raise OutputNotWritable(
            f"cannot write the demo's calls in {calls}: {exc.strerror or type(exc).__name__}; "
            "choose another --output, or move what is in the way"
        ) from None
    print(f"[overnight] synthesized {len(refs)} calls in {calls}", file=sys.stderr)
    spec = build_spec(overrides=_overrides(args, None, input=str(manifest), output=str(output)))
    summary = run_spec(spec)
    table = CommittedDataset(storage.resolve(summary["transcripts"])).read_results(
        COLUMNS["transcripts"]
    )
    rows = [
        r
        for r in (table.to_pylist() if table is not None else [])
        if Path(r["source_uri"]).parent == calls and Path(r["source_uri"]).name in refs
    ]
    print("\nthe calls' scripts and their transcripts:\n")
    print(comparison_table(rows, demo_scripts(), width()))
    print()
    return summary
