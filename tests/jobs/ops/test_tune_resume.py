"""Rerunning ``overnight tune`` into the same ``--out``: it resumes (after Ctrl-C, a failure or
a finished tuning) and decides as an uninterrupted tuning would, or refuses to mix tunings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.tune import Candidate, Measurement, parse_sla, tune

# Beam 5 is twice as fast (so cheaper) but less accurate: with references, greedy's WER is 0
# and beam 5's 2/7 (a deletion and a substitution in 7 words), above the allowed 0.05. Were
# greedy lost (failed, skewed), the best WER would move to beam 5's and beam 5 be chosen.
TEXTS = {
    "greedy": {"0.wav": "the cat sat down", "1.wav": "on the mat"},
    "beam 5": {"0.wav": "the cat sat", "1.wav": "on a mat"},
}
SPEED = {"greedy": 2.0, "beam 5": 4.0}
GRID = [Candidate("greedy", {"beam_size": 1}), Candidate("beam 5", {"beam_size": 5})]
SLA = "deadline=6h,backlog_hours=100,max_wer_increase=0.05"


@pytest.fixture
def sample(tmp_path) -> Path:
    folder = tmp_path / "sample"
    folder.mkdir()
    for i in range(2):
        (folder / f"{i}.wav").write_bytes(b"RIFF")
    (folder / "references.tsv").write_text("0.wav\tthe cat sat down\n1.wav\ton the mat\n")
    return folder


class FakeJobs:
    """A runner standing in for the real job: it writes into the configuration's own output
    folder like one (a file per item done), records what it ran and what it found there, and
    can be interrupted (Ctrl-C) in the middle of a configuration."""

    def __init__(self, interrupt: str | None = None):
        self.ran: list[str] = []
        self.leftovers: dict[str, list[str]] = {}
        self.interrupt = interrupt

    def __call__(self, c: Candidate, index: int, ctx) -> Measurement:
        folder = Path(ctx.workdir.join("configs", f"{index:02d}").path)
        self.leftovers[c.name] = sorted(p.name for p in folder.glob("*")) if folder.is_dir() else []
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "0.done").write_text("")  # the first item is committed ...
        if c.name == self.interrupt:
            raise KeyboardInterrupt  # ... and the user presses Ctrl-C
        (folder / "1.done").write_text("")
        self.ran.append(c.name)
        m = Measurement(c.name, c.options, run_id=f"tune-{ctx.stamp}-{index:02d}", items=2)
        m.work, m.busy_s, m.elapsed_s = 10.0, 10.0 / SPEED[c.name], 5.0
        m.price_per_unit_hour_usd = 0.0425
        m.texts = dict(TEXTS[c.name])
        return m


def _tune(sample: Path, out: Path, runner: FakeJobs, sla: str = SLA, lines=None, **kw):
    return tune(
        str(sample),
        parse_sla(sla),
        grid=GRID,
        out=str(out),
        runner=runner,
        echo=(lines.append if lines is not None else None),
        **kw,
    )


def _outputs(out: Path) -> tuple[str | None, str | None, str | None]:
    """What each output file says was chosen (None: no choice, or no chosen.toml)."""
    profile = json.loads((out / "profile.json").read_text())
    measured = json.loads((out / "measurements.json").read_text())
    toml = out / "chosen.toml"
    beam = None
    if toml.is_file():
        beam = next(
            line.split("=")[1].strip()
            for line in toml.read_text().splitlines()
            if line.startswith("beam_size")
        )
    chosen_toml = {None: None, "1": "greedy", "5": "beam 5"}[beam]
    return profile.get("chosen"), measured["chosen"], chosen_toml


def test_a_rerun_of_a_finished_tuning_reuses_every_measurement_and_decides_the_same(
    sample, tmp_path
):
    first = _tune(sample, tmp_path / "out", FakeJobs())
    assert first.decision.chosen is not None
    assert first.decision.chosen.measurement.name == "greedy"
    again, lines = FakeJobs(), []
    second = _tune(sample, tmp_path / "out", again, lines=lines)
    # Nothing is measured again: the runs were not redone (and not skipped as already done).
    assert again.ran == []
    assert lines == [
        "[tune] greedy: measured before, reused (2.0x real time per busy worker)",
        "[tune] beam 5: measured before, reused (4.0x real time per busy worker)",
    ]
    assert [m.status for m in second.measurements] == ["ok", "ok"]
    assert [m.reused for m in second.measurements] == [True, True]
    assert [m.run_id for m in second.measurements] == [m.run_id for m in first.measurements]
    assert [m.wer for m in second.measurements] == [0.0, pytest.approx(2 / 7)]
    assert second.decision.chosen is not None
    assert second.decision.chosen.measurement.name == "greedy"
    assert _outputs(tmp_path / "out") == ("greedy", "greedy", "greedy")
    stored = json.loads((tmp_path / "out" / "measurements.json").read_text())
    assert [c["reused"] for c in stored["configurations"]] == [True, True]


def test_a_rerun_after_ctrl_c_measures_the_interrupted_configuration_again_from_a_clean_folder(
    sample, tmp_path
):
    interrupted = FakeJobs(interrupt="beam 5")
    with pytest.raises(KeyboardInterrupt):
        _tune(sample, tmp_path / "out", interrupted)
    assert interrupted.ran == ["greedy"]
    resumed, lines = FakeJobs(), []
    result = _tune(sample, tmp_path / "out", resumed, lines=lines)
    # greedy finished before the interrupt: reused. beam 5 did not: measured again, and its
    # folder no longer holds the item the interrupted run committed.
    assert resumed.ran == ["beam 5"]
    assert resumed.leftovers == {"beam 5": []}
    assert lines[0] == "[tune] greedy: measured before, reused (2.0x real time per busy worker)"
    assert lines[1] == "[tune] beam 5: running on 2 items ..."
    # The same decision as an uninterrupted tuning: greedy, beam 5 rejected for accuracy.
    whole = _tune(sample, tmp_path / "whole", FakeJobs())
    assert result.decision.chosen is not None and whole.decision.chosen is not None
    assert result.decision.chosen.measurement.name == whole.decision.chosen.measurement.name
    assert result.decision.best_wer == whole.decision.best_wer == 0.0
    assert [r.why for r in result.decision.rows] == [r.why for r in whole.decision.rows]
    assert _outputs(tmp_path / "out") == ("greedy", "greedy", "greedy")


def test_a_configuration_that_failed_is_measured_again_on_a_rerun(sample, tmp_path):
    class FailsOnce(FakeJobs):
        def __call__(self, c, index, ctx):
            if c.name == "greedy" and not self.ran:
                self.ran.append("greedy (failed)")
                return Measurement(c.name, c.options, status="failed", reason="out of memory")
            return super().__call__(c, index, ctx)

    first = _tune(sample, tmp_path / "out", FailsOnce())
    assert first.decision.chosen is not None
    assert first.decision.chosen.measurement.name == "beam 5"  # the only one measured
    again = FakeJobs()
    second = _tune(sample, tmp_path / "out", again)
    assert again.ran == ["greedy"]
    assert second.decision.chosen is not None
    assert second.decision.chosen.measurement.name == "greedy"
    assert _outputs(tmp_path / "out") == ("greedy", "greedy", "greedy")


@pytest.mark.parametrize("change", ["references", "sample", "grid", "max_items"])
def test_a_rerun_with_another_sample_grid_or_references_refuses_and_names_a_new_out(
    sample, tmp_path, change
):
    _tune(sample, tmp_path / "out", FakeJobs())
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    kw: dict = {}
    grid = GRID
    if change == "references":
        (sample / "references.tsv").write_text("0.wav\tthe cat sat\n1.wav\ton a mat\n")
    elif change == "sample":
        (sample / "1.wav").write_bytes(b"RIFF and more")
    elif change == "grid":
        grid = [GRID[0], Candidate("beam 5", {"beam_size": 4})]
    else:
        kw["max_items"] = 1
    rerun = FakeJobs()
    with pytest.raises(ConfigError) as err:
        tune(
            str(sample),
            parse_sla(SLA),
            grid=grid,
            out=str(tmp_path / "out"),
            runner=rerun,
            **kw,
        )
    message = str(err.value)
    assert "\n" not in message and message.endswith("use a new --out")
    assert "holds a tuning of another sample, grid, references" in message
    # Nothing measured, nothing of the earlier tuning touched or mixed in.
    assert rerun.ran == []
    after = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}
    assert after == before


def test_a_rerun_that_chooses_nothing_removes_the_earlier_chosen_toml(sample, tmp_path):
    _tune(sample, tmp_path / "out", FakeJobs())
    assert (tmp_path / "out" / "chosen.toml").is_file()
    # The same measurements under an SLA none meets: 1 worker for 100 h in 1 h.
    strict = "deadline=1h,backlog_hours=100,max_workers=1"
    result = _tune(sample, tmp_path / "out", FakeJobs(), sla=strict)
    assert result.decision.chosen is None
    assert "chosen" not in result.files
    assert _outputs(tmp_path / "out") == (None, None, None)
    assert not (tmp_path / "out" / "chosen.toml").exists()


def test_an_out_holding_configuration_runs_but_no_tuning_state_is_refused(sample, tmp_path):
    (tmp_path / "out" / "configs" / "00").mkdir(parents=True)  # e.g. a tuning by an older version
    with pytest.raises(
        ConfigError, match=r"cannot resume \(no tune-state.json\); use a new --out$"
    ):
        _tune(sample, tmp_path / "out", FakeJobs())


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_on_the_real_model_a_rerun_reuses_a_finished_run_and_redoes_an_unfinished_one_in_full(
    tmp_path, request
):
    """The real job into ``configs/NN``: a rerun used to run it again under a new run id into
    the same folder, where every item was skipped as already done ("every item failed ()")."""
    shared = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "audio"
    if shared.is_dir():
        names = ("1089-134686-0001", "1221-135766-0002")  # the two shortest: 6.6 s and 4.8 s
        refs = dict(
            line.split("\t", 1)
            for line in (shared / "librispeech_trans.txt").read_text().splitlines()
            if line
        )
        rows = [{"uri": str(shared / f"{n}.wav"), "reference": refs[n].strip()} for n in names]
    else:
        folder, texts = request.getfixturevalue("synth_calls")
        rows = [
            {"uri": str(folder / n), "reference": texts[n]}
            for n in ("call_billing.wav", "call_refund.wav")
        ]
    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    grid = [Candidate("greedy", {"beam_size": 1, "batch_size": 4, "compute_type": "int8"})]

    def run(lines=None):
        return tune(
            str(sample),
            parse_sla(SLA),
            grid=grid,
            out=str(out),
            echo=(lines.append if lines is not None else None),
        )

    first = run()
    assert first.measurements[0].status == "ok" and first.measurements[0].items == 2
    lines: list[str] = []
    second = run(lines)
    (m,) = second.measurements
    assert (m.status, m.reason) == ("ok", "")
    assert lines[0].startswith("[tune] greedy: measured before, reused (")
    assert (m.status, m.items, m.run_id, m.wer) == (
        "ok",
        2,
        first.measurements[0].run_id,
        first.measurements[0].wer,
    )
    assert second.decision.chosen is not None
    # As if Ctrl-C had come after the job committed its items but before the tuner recorded
    # the measurement: the rerun measures it again, every item, from a clean folder.
    state = json.loads((out / "tune-state.json").read_text())
    state["measurements"] = {}
    (out / "tune-state.json").write_text(json.dumps(state))
    third = run()
    (m,) = third.measurements
    assert (m.status, m.reason, m.items, m.failed_items) == ("ok", "", 2, 0)
    assert m.run_id != first.measurements[0].run_id and not m.reused
    assert m.wer == pytest.approx(first.measurements[0].wer)
    assert third.decision.chosen is not None
    assert json.loads((out / "profile.json").read_text())["chosen"] == "greedy"
