"""plan's flags and profiles, tune's SLA, grid and --max-items, config's stdout: a value out of
its range is exit 2 naming the flag (or the file and its field) before any work, never a
traceback, a NaN or a negative cost in a result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.plan import Sizing, check_number
from overnight.jobs.ops.tune import Measurement, parse_sla, read_grid, tune

PLAN = ["plan", "--audio-hours", "100", "--deadline", "6h", "--gpu", "h100", "--throughput", "50"]


def _plan(capsys, *extra: str) -> tuple[int, str, str]:
    code = main([*PLAN, *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (("--audio-hours", "nan"), "--audio-hours"),
        (("--audio-hours", "inf"), "--audio-hours"),
        (("--audio-hours", "1e308"), "--audio-hours"),
        (("--throughput", "nan"), "--throughput"),
        (("--throughput", "inf"), "--throughput"),
        (("--throughput", "-5"), "--throughput"),
        (("--max-workers", "0"), "--max-workers"),
        (("--max-workers", "-3"), "--max-workers"),
        (("--price", "-1"), "--price"),
        (("--price", "nan"), "--price"),
        (("--price", "inf"), "--price"),
        (("--price", "inf", "--json"), "--price"),
        (("--headroom", "nan"), "--headroom"),
        (("--headroom", "1"), "--headroom"),
        (("--utilization", "0"), "--utilization"),
        (("--utilization", "nan"), "--utilization"),
        (("--deadline", "9" * 400 + "h"), "--deadline"),
    ],
)
def test_plan_refuses_a_flag_that_is_not_a_finite_number_in_its_range_with_exit_2_naming_it(
    capsys, extra, flag
):
    code, out, err = _plan(capsys, *extra)
    assert code == 2, (out, err)
    assert out == ""  # no plan, no JSON holding NaN
    assert err.startswith(f"overnight: error: {flag} ") and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_plan_prices_of_zero_are_a_free_resource_not_an_error(capsys):
    code, out, err = _plan(capsys, "--price", "0", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["options"][0]["cost_usd"] == 0.0


def _profile(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    return str(path)


CONFIGURATION = {
    "name": "tiny int8",
    "resource": "cpu",
    "units_per_worker": 1.0,
    "throughput": 14.0,
    "price_per_unit_hour_usd": 0.0425,
}


def test_plan_refuses_a_negative_cpu_price_before_reading_a_profile(tmp_path, capsys):
    profile = _profile(
        tmp_path,
        {"profile_version": 1, "unit": "audio_s", "configurations": [CONFIGURATION]},
    )
    code = main(["plan", "--audio-hours", "100", "--deadline", "6h", "--profile", profile])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main(
        [
            *("plan", "--audio-hours", "100", "--deadline", "6h", "--profile", profile),
            *("--cpu-price", "-1"),
        ]
    )
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err.startswith("overnight: error: --cpu-price must be a finite number at least 0")


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([], "is not an overnight profile"),
        ("text", "is not an overnight profile"),
        ({"profile_version": 1, "configurations": ["x"]}, "configuration 0 is not a JSON object"),
        (
            {"profile_version": 1, "configurations": [{**CONFIGURATION, "throughput": "fast"}]},
            "configuration 0: throughput must be a finite number larger than 0 (got 'fast')",
        ),
        (
            {"profile_version": 1, "configurations": [{**CONFIGURATION, "throughput": None}]},
            "configuration 0: throughput must be a finite number larger than 0 (got None)",
        ),
        (
            {"profile_version": 1, "configurations": [{**CONFIGURATION, "throughput": 0}]},
            "configuration 0: throughput",
        ),
        (
            {
                "profile_version": 1,
                "configurations": [{**CONFIGURATION, "price_per_unit_hour_usd": -1}],
            },
            "configuration 0: price_per_unit_hour_usd must be a finite number at least 0",
        ),
        (
            {"profile_version": 1, "configurations": [{**CONFIGURATION, "utilization": 2}]},
            "configuration 0: utilization",
        ),
        (
            {"profile_version": 1, "configurations": [{**CONFIGURATION, "name": 3}]},
            "configuration 0: name must be text",
        ),
        (
            {"profile_version": 1, "unit": "hours", "configurations": [CONFIGURATION]},
            "configuration 0: unit must be one of audio_s, documents",
        ),
    ],
)
def test_plan_refuses_a_profile_of_the_wrong_shape_naming_the_file_and_the_field(
    tmp_path, capsys, doc, says
):
    profile = _profile(tmp_path, doc)
    code = main(["plan", "--audio-hours", "100", "--deadline", "6h", "--profile", profile])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert profile in err and says in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_profile_throughput_of_nan_is_refused_not_planned_as_nan(tmp_path, capsys):
    path = tmp_path / "profile.json"
    path.write_text(
        '{"profile_version": 1, "configurations": [{"name": "a", "resource": "cpu", '
        '"units_per_worker": 1, "throughput": NaN, "price_per_unit_hour_usd": 0.04}]}'
    )
    code = main(["plan", "--audio-hours", "1", "--deadline", "6h", "--profile", str(path)])
    assert code == 2
    assert "throughput must be a finite number larger than 0 (got nan)" in capsys.readouterr().err


def test_sizing_check_names_each_field_as_its_caller_spells_it():
    flag = lambda field: "--" + field.replace("_", "-")  # noqa: E731
    for sizing, named in (
        (Sizing(3600.0, max_workers=0), "--max-workers"),
        (Sizing(3600.0, headroom=float("nan")), "--headroom"),
        (Sizing(3600.0, utilization=1.5), "--utilization"),
        (Sizing(3600.0, startup_s=-1.0), "--startup"),
        (Sizing(float("inf")), "--deadline"),
    ):
        with pytest.raises(ConfigError, match=f"^{named} must be"):
            sizing.check(flag)
    assert Sizing(3600.0, max_workers=2).check(flag).max_workers == 2


def test_check_number_accepts_only_finite_numbers_in_range():
    assert check_number(0, "x") == 0.0
    for bad in (float("nan"), float("inf"), -1, True, "1", None):
        with pytest.raises(ConfigError, match=r"^x must be a finite number"):
            check_number(bad, "x")
    with pytest.raises(ConfigError, match=r"in \(0, 1\]"):
        check_number(0, "x", low_open=True, high=1.0)


# -- tune -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sla", "named"),
    [
        ("deadline=6h,backlog_hours=10,headroom=5", "--sla headroom"),
        ("deadline=6h,backlog_hours=10,headroom=-0.1", "--sla headroom"),
        ("deadline=6h,backlog_hours=nan", "--sla backlog_hours"),
        ("deadline=6h,backlog_hours=inf", "--sla backlog_hours"),
        ("deadline=6h,backlog_hours=10,utilization=0", "--sla utilization"),
        ("deadline=6h,backlog_hours=10,utilization=nan", "--sla utilization"),
        ("deadline=6h,backlog_hours=10,max_wer_increase=nan", "--sla max_wer_increase"),
        ("deadline=6h,backlog_hours=10,max_wer=-1", "--sla max_wer"),
        ("deadline=6h,backlog_hours=10,max_workers=0", "--sla max_workers"),
        ("deadline=6h,backlog_hours=10,workers=-2", "--sla workers"),
    ],
)
def test_parse_sla_refuses_every_value_out_of_its_range(sla, named):
    with pytest.raises(ConfigError, match=f"^{named} must be"):
        parse_sla(sla)


def test_parse_sla_names_the_document_keys_for_process():
    with pytest.raises(ConfigError, match=r"^--sla documents must be"):
        parse_sla("deadline=6h,documents=nan", "process")
    with pytest.raises(ConfigError, match=r"^--sla max_error must be"):
        parse_sla("deadline=6h,documents=5,max_error=inf", "process")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--sla", "deadline=6h,backlog_hours=10,headroom=5"], "--sla headroom"),
        (["--sla", "deadline=6h,backlog_hours=nan"], "--sla backlog_hours"),
        (["--sla", "deadline=6h,backlog_hours=10", "--max-items", "-1"], "--max-items"),
        (["--sla", "deadline=6h,backlog_hours=10", "--max-items", "0"], "--max-items"),
    ],
)
def test_tune_with_a_bad_sla_or_max_items_exits_2_before_measuring_anything(
    tmp_path, capsys, monkeypatch, extra, says
):
    import overnight.jobs.ops.tune as tune_package

    def measured(*args, **kwargs):
        raise AssertionError("tune measured before its flags were checked")

    monkeypatch.setattr(tune_package, "tune", measured)
    (tmp_path / "sample").mkdir()
    code = main(["tune", str(tmp_path / "sample"), "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"overnight: error: {says} must be"), err
    assert not (tmp_path / "o").exists()


def test_tune_refuses_max_items_below_one_before_running_a_configuration(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"x")
    (tmp_path / "b.wav").write_bytes(b"x")

    def runner(c, i, ctx):
        raise AssertionError("measured with a max_items below one")

    for bad in (-1, 0):
        with pytest.raises(ConfigError, match=f"--max-items must be .*got {bad}"):
            tune(
                str(tmp_path),
                parse_sla("deadline=6h,backlog_hours=1"),
                grid=read_grid(_grid(tmp_path, {"configs": [{"beam_size": 1}]})),
                out=str(tmp_path / "o"),
                max_items=bad,
                runner=runner,
            )


def _grid(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ([{"batch_size": 1}], "the top level must be a table"),
        ({"configs": "x"}, "configs must be a list of tables"),
        ({"configs": [1]}, "configs must be a list of tables"),
        ({"grid": [1, 2]}, "grid must be a table of options"),
        ({"base": "x", "configs": [{}]}, "base must be a table of options"),
    ],
)
def test_read_grid_refuses_a_file_of_the_wrong_shape_naming_the_file(tmp_path, doc, says):
    path = _grid(tmp_path, doc)
    with pytest.raises(ConfigError, match=f"^grid file {path!r}: {says}"):
        read_grid(path)


def test_tune_with_a_grid_of_the_wrong_shape_exits_2_naming_the_file(tmp_path, capsys):
    (tmp_path / "sample").mkdir()
    path = _grid(tmp_path, {"configs": "x"})
    code = main(
        ["tune", str(tmp_path / "sample"), "--sla", "deadline=6h,backlog_hours=1", "--grid", path]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"grid file {path!r}" in err and "Traceback" not in err


def test_tune_still_measures_a_valid_sla_with_a_stub_runner(tmp_path):
    (tmp_path / "a.wav").write_bytes(b"x")
    result = tune(
        str(tmp_path),
        parse_sla("deadline=6h,backlog_hours=1,headroom=0,utilization=1,max_workers=1"),
        grid=read_grid(_grid(tmp_path, {"configs": [{"beam_size": 1}]})),
        out=str(tmp_path / "o"),
        max_items=1,
        runner=lambda c, i, ctx: Measurement(c.name, c.options, status="failed", reason="stub"),
    )
    assert result.sample_items == 1


# -- config -----------------------------------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_config_into_a_full_stdout_is_one_line_and_a_non_zero_exit_not_a_traceback():
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from overnight.jobs.cli import main; sys.exit(main())",
                "config",
            ],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 11, done.stderr
    assert done.stderr.startswith("overnight: error: cannot write the configuration reference")
    assert "No space left on device" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
