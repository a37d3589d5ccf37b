"""Capacity planning: the arithmetic against hand-computed cases, profiles from tune and from runs."""

from __future__ import annotations

import json
import math

import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.plan import (
    Sizing,
    WorkerProfile,
    load_profiles,
    make_plan,
    parse_duration,
    profile_document,
    profiles_from_runs,
    size_option,
)

H100 = WorkerProfile("turbo fp16 on h100", "transcribe", "audio_s", "h100", 1.0, 850.0, 2.69)
CPU = WorkerProfile("tiny int8 on cpu", "transcribe", "audio_s", "cpu", 1.0, 15.0, 0.0425)
BACKLOG = 2000 * 3600.0  # 2000 audio hours
SIX_HOURS = 6 * 3600.0


def test_one_h100_finishes_two_thousand_audio_hours_in_six_hours():
    # By hand: window 21600 x 0.8 = 17280 s; 850 x 0.9 = 765 audio s/s per GPU;
    # 7,200,000 / (765 x 17280 = 13,219,200) = 0.545 -> 1 GPU;
    # finish 7,200,000 / 765 = 9411.76 s; cost 1 x 2.69 x 9411.76 / 3600 = $7.0327.
    o = size_option(H100, BACKLOG, Sizing(SIX_HOURS))
    assert o.utilization == 0.9 and o.utilization_assumed
    assert o.window_s == pytest.approx(17280)
    assert o.workers == 1
    assert o.finish_s == pytest.approx(9411.7647, abs=1e-3)
    assert o.cost_usd == pytest.approx(7.03268, abs=1e-5)
    assert o.headroom == pytest.approx(1 - 9411.7647 / 21600, abs=1e-6)
    assert o.cost_per_audio_minute_usd == pytest.approx(7.03268 / 120000, rel=1e-5)
    assert o.meets_deadline


def test_cpu_workers_are_counted_up_and_paid_until_the_backlog_is_done():
    # By hand: 15 x 0.9 = 13.5 audio s/s per core; 13.5 x 17280 = 233,280 per worker;
    # 7,200,000 / 233,280 = 30.86 -> 31 workers; finish 7,200,000 / (31 x 13.5) = 17,204.30 s;
    # cost 31 x 0.0425 x 17,204.30 / 3600 = $6.2963.
    o = size_option(CPU, BACKLOG, Sizing(SIX_HOURS))
    assert o.workers == 31
    assert o.finish_s == pytest.approx(17204.301, abs=1e-3)
    assert o.cost_usd == pytest.approx(6.29630, abs=1e-5)
    text = "\n".join(o.arithmetic)
    assert "ceil(30.8642) = 31" in text and "$6.2963" in text


def test_cheapest_option_meeting_the_deadline_wins_and_a_worker_limit_changes_it():
    plan = make_plan([H100, CPU], BACKLOG, "audio_s", Sizing(SIX_HOURS))
    assert plan.cheapest is not None and plan.cheapest.profile is CPU  # $6.30 < $7.03
    limited = make_plan([H100, CPU], BACKLOG, "audio_s", Sizing(SIX_HOURS, max_workers=16))
    cpu = next(o for o in limited.options if o.profile is CPU)
    assert not cpu.meets_deadline and "needs 31 workers, more than the 16 available" in cpu.reason
    assert limited.cheapest is not None and limited.cheapest.profile is H100


def test_start_up_time_shrinks_the_window_and_is_paid_for():
    # By hand: deadline 1 h, start-up 10 min, no headroom: window 3000 s; 5 x 1.0 x 3000 =
    # 15,000 per worker; 36,000 / 15,000 = 2.4 -> 3 workers; finish 600 + 36,000 / 15 = 3000 s;
    # cost 3 x 0.0425 x 3000 / 3600 = $0.10625.
    p = WorkerProfile("w", "transcribe", "audio_s", "cpu", 1.0, 5.0, 0.0425, utilization=1.0)
    o = size_option(p, 36000.0, Sizing(3600.0, headroom=0.0, startup_s=600.0))
    assert (o.workers, o.finish_s) == (3, pytest.approx(3000.0))
    assert o.cost_usd == pytest.approx(0.10625)
    assert not size_option(p, 36000.0, Sizing(3600.0, startup_s=3000.0)).meets_deadline


def test_an_exact_fit_does_not_round_up_to_an_extra_worker():
    # 0.9 x 0.8 leaves float dust: 777,600 / (10 x 0.9 x 2880) must be 30 workers, not 31.
    p = WorkerProfile("w", "transcribe", "audio_s", "cpu", 1.0, 10.0, 0.0425, utilization=0.9)
    o = size_option(p, 30 * 10 * 0.9 * 3600 * 0.8, Sizing(3600.0))
    assert o.workers == 30
    assert o.headroom == pytest.approx(0.2)


def test_measured_cpu_cost_per_unit_and_units_per_worker_are_priced():
    # 2 GPUs per worker at $3.50, 1000 documents at 0.5 docs/s, utilization 0.8, 4 h:
    # window 11,520 s; 0.4 x 11,520 = 4,608 per worker -> 1 worker; finish 2,500 s;
    # compute 1 x 7.00 x 2500 / 3600 = $4.8611; other 1000 x $0.001 = $1; total $5.8611.
    p = WorkerProfile(
        "llm",
        "process",
        "documents",
        "h200",
        2.0,
        0.5,
        3.5,
        utilization=0.8,
        other_cost_per_unit_usd=0.001,
    )
    o = size_option(p, 1000.0, Sizing(4 * 3600.0))
    assert o.workers == 1 and not o.utilization_assumed
    assert o.compute_cost_usd == pytest.approx(4.86111, abs=1e-5)
    assert o.cost_usd == pytest.approx(5.86111, abs=1e-5)
    assert o.cost_per_unit_usd == pytest.approx(0.00586111, abs=1e-8)


def test_profiles_from_past_runs_pool_throughput_and_measure_utilization():
    runs = [
        _past_run("n1"),
        _past_run(
            "n2",
            audio_seconds=720000.0,
            accelerator_seconds=800.0,
            accelerator_reserved_seconds=1100.0,
            cost_usd=800 * 2.69 / 3600 + 0.60,
        ),
        _past_run("empty", audio_seconds=0.0, accelerator_seconds=0.0),
    ]
    [p] = profiles_from_runs(runs)
    assert p.throughput == pytest.approx(900.0)  # 1,080,000 / 1,200
    assert p.utilization == pytest.approx(0.75)  # 1,200 / 1,600
    assert p.price_per_unit_hour_usd == 2.69 and p.resource == "h100"
    assert p.other_cost_per_unit_usd == pytest.approx(0.90 / 1080000)
    assert "n1" in p.source and "n2" in p.source and "empty" not in p.source
    assert p.measured_reserved_s == pytest.approx(1600.0)
    # 1,600 s of reserved time is long enough to plan on as measured.
    assert not any(
        "short run" in line for line in size_option(p, 3.6e6, Sizing(6 * 3600)).arithmetic
    )


def test_runs_with_diarization_or_word_timestamps_are_profiles_of_their_own():
    # Word timestamps add an alignment pass and diarization CPU tasks: pooled with plain
    # runs, a plan for a diarizing backlog learned a throughput it would not run at.
    def run(run_id, audio_s, busy_s, **options):
        return {
            "kind": "transcribe",
            "run_id": run_id,
            "model": "bundled:tiny.en",
            "accelerator": "cpu",
            "device": "cpu",
            "options": {"cpus_per_actor": 1.5, "word_timestamps": False, **options},
            "audio_seconds": audio_s,
            "accelerator_seconds": busy_s,
            "accelerator_reserved_seconds": busy_s * 1.2,
        }

    runs = [
        run("plain", 1000.0, 50.0),
        run("plain-old", 1000.0, 50.0, word_timestamps=None),  # before the option existed
        run("diarized", 1000.0, 64.0, word_timestamps=True, diarize=True),
        run("redacted", 1000.0, 58.0, word_timestamps=True, redact=["pci"]),
    ]
    profiles = {p.name.split(" on cpu")[-1]: p for p in profiles_from_runs(runs)}
    assert set(profiles) == {"", " +word_timestamps +diarize", " +word_timestamps +redact"}
    assert profiles[""].throughput == pytest.approx(20.0)  # the two plain runs pooled
    assert profiles[" +word_timestamps +diarize"].throughput == pytest.approx(1000 / 64)


def test_a_plan_from_a_short_run_says_its_measured_utilization_is_a_short_runs():
    run = {
        "kind": "transcribe",
        "run_id": "toy",
        "model": "bundled:tiny.en",
        "accelerator": "cpu",
        "device": "cpu",
        "options": {"cpus_per_actor": 1.5},
        "audio_seconds": 17.6,
        "accelerator_seconds": 0.33,
        "accelerator_reserved_seconds": 2.49,
    }
    [p] = profiles_from_runs([run])
    measured = size_option(p, 7.2e6, Sizing(6 * 3600))
    [note] = [line for line in measured.arithmetic if "short run" in line]
    assert "measured over 2 s of reserved time" in note and "--utilization" in note
    # A stated utilization replaces the measured one, and the note with it.
    stated = size_option(p, 7.2e6, Sizing(6 * 3600, utilization=0.9))
    assert not any("short run" in line for line in stated.arithmetic)
    assert stated.workers < measured.workers


def test_plan_command_shows_its_arithmetic_and_the_cheapest_option(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_document([H100, CPU], "transcribe", "audio_s")))
    assert [p.name for p in load_profiles([str(path)])] == [H100.name, CPU.name]
    night = ["plan", "--audio-hours", "2000", "--deadline", "6h", "--profile", str(path)]
    code = main(night)
    out = capsys.readouterr().out
    assert code == 0
    assert "ceil(30.8642) = 31" in out and "$7.0327" in out
    assert "cheapest meeting the deadline: tiny int8 on cpu: 31 x 1 cpu" in out
    # A GPU kind no profile measured can be stated, and is then priced as asked.
    code = main(
        [
            *night,
            "--gpu",
            "l4",
            "--throughput",
            "300",
            "--price",
            "0.8",
            "--max-workers",
            "4",
            "--json",
        ]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    l4 = next(o for o in plan["options"] if o["resource"] == "l4")
    workers = math.ceil(BACKLOG / (300 * 0.9 * 17280))
    assert l4["workers"] == workers == 2
    assert l4["cost_usd"] == pytest.approx(workers * 0.8 * BACKLOG / (workers * 270) / 3600)
    assert plan["cheapest"] == l4["name"]  # h100 was filtered out by --gpu l4; cpu needs 31 > 4
    # No option within --max-workers meets the deadline: its own exit status, not 1 (a bug).
    code = main([*night, "--gpu", "cpu", "--max-workers", "4"])
    assert code == 13, capsys.readouterr().out


def test_durations_and_bad_inputs_are_named():
    assert (
        parse_duration("6h") == 21600
        and parse_duration("1h30m") == 5400
        and parse_duration("2d") == 172800
    )
    for bad in ("6", "six hours", "0h", "6h extra"):
        with pytest.raises(ConfigError, match=r"duration|longer than zero"):
            parse_duration(bad)
    with pytest.raises(ConfigError, match="no profile measures documents"):
        make_plan([H100], 100.0, "documents", Sizing(SIX_HOURS))
    assert main(["plan", "--audio-hours", "1", "--deadline", "6h"]) == 2


def _past_run(run_id: str, **figures) -> dict:
    """A GPU transcription run's summary, as ``runs/<run_id>.json`` holds it."""
    return {
        "run_id": run_id,
        "kind": "transcribe",
        "model": "large-v3-turbo",
        "accelerator": "h100",
        "device": "cuda",
        "options": {
            "compute_type": "float16",
            "batch_size": 32,
            "beam_size": 1,
            "gpus_per_actor": 1,
        },
        "prices": {"h100": 2.69, "cpu": 0.0425},
        "audio_seconds": 360000.0,
        "accelerator_seconds": 400.0,
        "accelerator_reserved_seconds": 500.0,
        "cost_usd": 400 * 2.69 / 3600 + 0.30,
        **figures,
    }


# Runs of the good run's configuration whose figures a plan cannot be made from: pooled, each
# changed the profile (a smaller throughput, NaN) or sized a plan of nonsense.
BAD_RUNS = [
    _past_run("nan-busy", accelerator_seconds=math.nan),
    _past_run("negative-busy", accelerator_seconds=-400.0),
    _past_run("negative-audio", audio_seconds=-360000.0),
    _past_run("zero-throughput", audio_seconds=0.0),
    _past_run("infinite-audio", audio_seconds=math.inf),
    _past_run("nan-reserved", accelerator_reserved_seconds=math.nan),
    _past_run("negative-cost", cost_usd=-1.0),
    _past_run("text-busy", accelerator_seconds="400"),
    _past_run("negative-units", options={**_past_run("x")["options"], "gpus_per_actor": -1}),
    _past_run("nan-price", prices={"h100": math.nan}),
]


def _write_runs(folder, runs: list[dict]) -> str:
    (folder / "runs").mkdir(parents=True)
    for run in runs:
        (folder / "runs" / f"{run['run_id']}.json").write_text(
            json.dumps(run)
        )  # NaN as JSON has it
    return str(folder)


def test_past_runs_with_figures_out_of_range_are_skipped_with_a_warning_naming_each(
    tmp_path, capsys
):
    out = _write_runs(tmp_path / "out", [_past_run("good"), *BAD_RUNS])
    [p] = load_profiles([out])
    assert p.throughput == 900.0 and p.utilization == 0.8  # the good run's alone
    assert p.price_per_unit_hour_usd == 2.69 and p.units_per_worker == 1.0
    assert p.source == f"{out}: 1 run(s), good"
    err = capsys.readouterr().err
    for run in BAD_RUNS:
        [line] = [line for line in err.splitlines() if f"skipped run {run['run_id']} " in line]
        assert "warning: skipped run" in line and "must be a finite number" in line, line
    assert main(["plan", "--audio-hours", "100", "--deadline", "6h", "--profile", out]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_a_plan_from_past_runs_of_which_none_is_usable_exits_4_with_one_line(tmp_path, capsys):
    out = _write_runs(tmp_path / "out", BAD_RUNS)
    code = main(["plan", "--audio-hours", "100", "--deadline", "6h", "--profile", out, "--json"])
    captured = capsys.readouterr()
    assert code == 4 and captured.out == ""
    errors = [line for line in captured.err.splitlines() if "warning: skipped" not in line]
    assert len(errors) == 1 and errors[0].startswith("overnight: error: no past run in "), errors
    assert "Traceback" not in captured.err


def _cpu_run(run_id: str, finished: str, cpu_price: float) -> dict:
    """A CPU transcription run: 100 busy s on 2 cores plus 50 CPU core-seconds of decoding,
    both ledgered at its own CPU price."""
    return _past_run(
        run_id,
        accelerator="cpu",
        device="cpu",
        options={"compute_type": "int8", "batch_size": 8, "beam_size": 1, "cpus_per_actor": 2},
        prices={"cpu": cpu_price, "h100": 2.69},
        audio_seconds=1000.0,
        accelerator_seconds=100.0,
        accelerator_reserved_seconds=200.0,
        cost_usd=(100 * 2 + 50) * cpu_price / 3600,
        finished_at=finished,
    )


def test_a_profile_of_runs_at_different_prices_takes_the_newest_runs_prices_for_all_its_costs(
    tmp_path,
):
    # "r1" sorts after "a-new" but ran first: the file order gave r1's price two runs old,
    # and the CPU stages' cost came out larger than the compute.
    runs = [
        _cpu_run("r1", "2026-12-07T16:01:00+00:00", 0.0425),
        _cpu_run("a-new", "2026-12-07T16:04:00+00:00", 1.0),
    ]
    [p] = load_profiles([_write_runs(tmp_path / "out", runs)])
    assert p.price_per_unit_hour_usd == 1.0
    # 100 CPU core-seconds of decoding over 2000 audio s, at $1 a core-hour
    assert p.other_cost_per_unit_usd == pytest.approx(100 / 3600 / 2000)
    assert p.other_cpu_price_per_hour_usd == 1.0
    assert p.source.endswith("at the prices of the newest, a-new")


def test_cpu_price_prices_the_cpu_stages_as_well_as_the_workers(tmp_path, capsys):
    out = _write_runs(tmp_path / "out", [_cpu_run("r1", "2026-12-07T16:01:00+00:00", 0.0425)])
    night = ["plan", "--audio-hours", "100", "--deadline", "6h", "--profile", out, "--json"]
    assert main([*night, "--cpu-price", "4.25"]) == 0
    [option] = json.loads(capsys.readouterr().out)["options"]
    # 50 core-seconds of decoding per 1000 audio s, at $4.25 a core-hour
    assert option["other_cost_usd"] == pytest.approx(100 * 3600 * 50 / 1000 / 3600 * 4.25)


def test_gpu_is_read_in_any_case_and_an_unknown_kind_needs_its_price(capsys):
    night = ["plan", "--audio-hours", "100", "--deadline", "6h", "--throughput", "50", "--json"]
    assert main([*night, "--gpu", "L4"]) == 0
    [option] = json.loads(capsys.readouterr().out)["options"]
    assert option["price_per_unit_hour_usd"] == 0.80  # l4's, not the generic 2.69
    assert main([*night, "--gpu", "h1000"]) == 2
    err = capsys.readouterr().err
    assert "'h1000' is no GPU kind" in err and "'h100'" in err and "--price" in err
    assert main([*night, "--gpu", "h1000", "--price", "3"]) == 0
    capsys.readouterr()
    assert main([*night, "--gpu", "l40s"]) == 0  # a kind we know, without a list price
    assert "l40s has no price in the default table" in capsys.readouterr().out


def test_no_option_meeting_the_deadline_advises_only_what_applies(capsys):
    night = ["plan", "--audio-hours", "100", "--deadline", "6h", "--gpu", "h100"]
    assert main([*night, "--throughput", "50", "--startup", "7h"]) == 13
    advice = capsys.readouterr().out.splitlines()[-1]
    assert "worker limit" not in advice and "start-up" in advice, advice


def test_a_plan_says_when_it_counts_no_start_up_or_needs_more_workers_than_a_cluster_gets(capsys):
    backlog = ["plan", "--audio-hours", "1000", "--gpu", "h100", "--throughput", "300"]
    assert main([*backlog, "--deadline", "0.0001s", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("166,666,667 workers" in n and "--max-workers" in n for n in notes), notes
    assert any("no worker start-up counted" in n and "--startup" in n for n in notes), notes
    assert main([*backlog, "--deadline", "6h", "--startup", "5m"]) == 0
    out = capsys.readouterr().out
    assert "start-up counted" not in out and "usually granted" not in out
    assert main([*backlog, "--deadline", "0.0001s", "--max-workers", "10"]) == 13
    assert "usually granted" not in capsys.readouterr().out
