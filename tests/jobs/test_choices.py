"""Every list the command line offers is its registry's: the parsers are read as a user sees
them (choices, and the names a help text lists) and compared with what the spec, the engines,
the task registry, redaction and the libraries accept, so the two cannot drift apart."""

from __future__ import annotations

import argparse
import json
from typing import get_args

import pytest

from overnight.jobs.cli import parser
from overnight.jobs.spec import ProcessOptions, TranscribeOptions


def _command(*names: str) -> argparse.ArgumentParser:
    current = parser()
    for name in names:
        sub = next(a for a in current._actions if isinstance(a, argparse._SubParsersAction))
        current = sub.choices[name]
    return current


def _flag(command: str, flag: str) -> argparse.Action:
    return next(a for a in _command(command)._actions if flag in a.option_strings)


def _literal(model, field: str) -> tuple[str, ...]:
    return get_args(model.model_fields[field].annotation)


def test_device_backend_and_whisper_task_choices_are_the_specs_values():
    assert tuple(_flag("transcribe", "--device").choices) == _literal(TranscribeOptions, "device")
    assert tuple(_flag("process", "--device").choices) == _literal(ProcessOptions, "device")
    assert tuple(_flag("transcribe", "--task").choices) == _literal(TranscribeOptions, "task")
    assert tuple(_flag("transcribe", "--engine").choices) == _literal(TranscribeOptions, "engine")
    # the spec also takes "auto", which the flag leaves to the default
    backends = [b for b in _literal(ProcessOptions, "backend") if b != "auto"]
    assert list(_flag("process", "--backend").choices) == backends


def test_the_engines_the_backend_flag_offers_are_the_ones_load_backend_loads():
    from overnight.workers.llm.adapter import EngineUnavailable, load_backend

    offered = _flag("process", "--backend").choices
    with pytest.raises(EngineUnavailable) as unknown:
        load_backend("no-such-engine", None)
    assert f"use one of {', '.join(offered)} " in str(unknown.value)


def test_the_process_task_help_lists_every_task_of_the_registry_in_order():
    from overnight.workers.llm.tasks.registry import TASKS

    assert (_flag("process", "--task").help or "").split(";")[0] == "|".join(TASKS)


def test_the_redact_help_lists_every_redaction_type_and_preset_redaction_takes():
    from overnight.workers.redact.types import PRESETS, TYPES, resolve_types

    help_text = _flag("transcribe", "--redact").help or ""
    listed = help_text.split(": ", 1)[1].split(" (")[0]
    types, presets = listed.split(", or a preset: ")
    assert tuple(types.split(", ")) == TYPES
    assert tuple(presets.split(", ")) == tuple(PRESETS)
    assert resolve_types(presets.split(", ")) == TYPES  # 'all' takes in every type


def test_every_export_format_offered_is_written_by_its_own_writer():
    from overnight.jobs.ops.export import FORMATS, render

    offered = tuple(_flag("export", "--format").choices)
    assert offered == FORMATS
    row = {
        "item_id": "a",
        "source_uri": "calls/a.wav",
        "text": "Hello there.",
        "segments": [{"start": 0.0, "end": 1.5, "text": "Hello there.", "speaker": "agent"}],
        "run_id": "r1",
    }
    written = {fmt: render(row, fmt) for fmt in offered}
    assert len(set(written.values())) == len(offered)  # none falls back to another's writer
    assert json.loads(written["json"])["run_id"] == "r1"


def test_report_and_tune_offer_what_their_libraries_take():
    from overnight.jobs.ops import report, tune

    assert tuple(_flag("report", "--by").choices) == report.GROUPS
    assert tuple(_flag("report", "--format").choices) == report.FORMATS
    assert tuple(_flag("tune", "--kind").choices) == tune.KINDS
