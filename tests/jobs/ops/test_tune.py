"""SLA-driven tuning: real configurations on the real tiny.en model, and the choice it makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overnight.jobs.cli import main
from overnight.jobs.errors import ConfigError
from overnight.jobs.ops.plan import Sizing, load_profiles, make_plan
from overnight.jobs.ops.report import build_report, load
from overnight.jobs.ops.tune import (
    Candidate,
    Measurement,
    corpus_wer,
    decide,
    parse_sla,
    read_grid,
    score,
    tune,
)
from overnight.jobs.spec import build_spec, read_job_file

LIBRISPEECH = ("1089-134686-0001", "1221-135766-0002")  # the two shortest: 6.6 s and 4.8 s


@pytest.fixture
def sample(tmp_path, request) -> Path:
    """A manifest of real recordings with a `reference` column: LibriSpeech clips from
    ../shared/data when present, else calls synthesized by espeak-ng."""
    rows = []
    shared = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "audio"
    if shared.is_dir():
        refs = dict(
            line.split("\t", 1)
            for line in (shared / "librispeech_trans.txt").read_text().splitlines()
            if line
        )
        rows = [
            {"uri": str(shared / f"{n}.wav"), "reference": refs[n].strip(), "tenant": "acme"}
            for n in LIBRISPEECH
        ]
    else:
        folder, refs = request.getfixturevalue("synth_calls")
        rows = [
            {"uri": str(folder / n), "reference": refs[n], "tenant": "acme"}
            for n in ("call_billing.wav", "call_refund.wav")
        ]
    manifest = tmp_path / "sample.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return manifest


GRID = """
[base]
batch_size = 8

[[configs]]
name = "greedy"
beam_size = 1

[[configs]]
name = "beam 5"
beam_size = 5

[[configs]]
name = "float16 on cpu"
compute_type = "float16"

[[configs]]
name = "missing model"
model = "./no-such-model"
"""


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_tune_on_real_tiny_en_and_real_recordings_picks_a_configuration_that_meets_the_sla(
    sample, tmp_path, capsys
):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID)
    out = tmp_path / "tune"
    sla = "deadline=6h,backlog_hours=1000,max_wer_increase=0.05"
    code = main(
        [
            "tune",
            str(sample),
            "--sla",
            sla,
            "--grid",
            str(grid),
            "--budget",
            "8m",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    result = json.loads((out / "measurements.json").read_text())
    configs = {c["name"]: c for c in result["configurations"]}
    # Failing configurations are skipped with their reason; the tuning goes on.
    assert configs["float16 on cpu"]["status"] == "failed"
    assert "float16 is not supported on cpu" in configs["float16 on cpu"]["reason"]
    assert configs["missing model"]["status"] == "failed"
    assert "not found" in configs["missing model"]["reason"]
    assert "skipped: compute type float16" in text
    measured = [configs["greedy"], configs["beam 5"]]
    for c in measured:
        assert c["status"] == "ok" and c["throughput"] > 0 and c["items"] == 2
        assert c["wer"] is not None and c["wer"] <= 0.3  # tiny.en's accuracy on these clips
        assert c["scored_items"] == 2 and c["plan"]["workers"] >= 1
    assert result["accuracy_basis"].startswith(
        "references (the manifest's reference column; 2 items)"
    )
    assert result["elapsed_s"] <= result["budget_s"] == 480
    # The cheapest configuration meeting accuracy and the deadline is chosen, and says why.
    chosen = configs[result["chosen"]]
    assert chosen["meets_accuracy"] and chosen["meets_deadline"]
    meeting = [c for c in measured if c["meets_accuracy"] and c["meets_deadline"]]
    assert chosen["plan"]["cost_usd"] == min(c["plan"]["cost_usd"] for c in meeting)
    other = next(c for c in measured if c["name"] != result["chosen"])
    assert other["why"] and other["why"] in text
    # chosen.toml is a ready job spec with the chosen options, pinned to what was measured.
    spec = build_spec(
        read_job_file(out / "chosen.toml"),
        {"job": {"input": str(sample), "output": str(tmp_path / "o")}},
    )
    assert spec.transcribe.beam_size == chosen["options"]["beam_size"]
    assert (spec.transcribe.batch_size, spec.transcribe.device, spec.transcribe.compute_type) == (
        8,
        "cpu",
        "int8",
    )
    # profile.json gives plan the same answer the tuner computed.
    profiles = {p.name: p for p in load_profiles([str(out / "profile.json")])}
    assert set(profiles) == {"greedy", "beam 5"}
    plan = make_plan([profiles[result["chosen"]]], 1000 * 3600.0, "audio_s", Sizing(6 * 3600.0))
    assert plan.options[0].workers == chosen["plan"]["workers"]
    assert plan.options[0].cost_usd == pytest.approx(chosen["plan"]["cost_usd"])
    # Each configuration's run is a normal output: the report's cost per minute agrees.
    report = build_report(
        load([str(out / "configs" / "00"), str(out / "configs" / "01")]), by="run"
    )
    for row in report.main.to_pylist():
        c = next(c for c in measured if c["run_id"] == row["run"])
        assert row["cost_per_audio_minute_usd"] == pytest.approx(
            c["sample_cost_per_unit"], rel=1e-9
        )


def _m(name: str, resource: str, price: float, throughput: float, wer: float, **kw) -> Measurement:
    """A measurement as the runner would record it: 1 h of sample audio."""
    return Measurement(
        name,
        {},
        resource=resource,
        price_per_unit_hour_usd=price,
        work=3600.0,
        busy_s=3600.0 / throughput,
        wer=wer,
        scored_items=10,
        **kw,
    )


MEASURED = [
    _m("cpu beam 1", "cpu", 0.0425, 5.0, 0.10),
    _m("t4 beam 1", "t4", 0.53, 60.0, 0.10),
    _m("cpu tiny fast", "cpu", 0.0425, 8.0, 0.16),
    Measurement(
        "float16 on cpu", {}, status="failed", reason="compute type float16 is not supported on cpu"
    ),
]


def test_loose_sla_picks_the_cheapest_and_a_tight_deadline_picks_a_faster_more_expensive_one():
    # Loose, by hand: 100 h = 360,000 s; window 43,200 x 0.8 = 34,560 s.
    #   cpu: 5 x 0.9 x 34,560 = 155,520 per worker -> 3 workers; 3 x 0.0425 x (360,000 / 13.5) / 3600 = $0.9444
    #   t4: 60 x 0.9 x 34,560 -> 1 worker; 0.53 x (360,000 / 54) / 3600 = $0.9815
    loose = decide(
        MEASURED, parse_sla("deadline=12h,backlog_hours=100,max_wer_increase=0.01,max_workers=4")
    )
    assert loose.chosen is not None and loose.chosen.measurement.name == "cpu beam 1"
    assert loose.chosen.option.workers == 3 and loose.chosen.option.cost_usd == pytest.approx(
        0.944444, abs=1e-6
    )
    why = {r.measurement.name: r.why for r in loose.rows}
    assert why["t4 beam 1"].startswith("faster (60.0 vs 5.0") and "(+4%)" in why["t4 beam 1"]
    assert "WER 0.160 is above the allowed 0.110" in why["cpu tiny fast"]
    assert why["float16 on cpu"] == "skipped: compute type float16 is not supported on cpu"
    # Tight, by hand: window 7,200 x 0.8 = 5,760 s; cpu needs ceil(360,000 / 25,920) = 14 > 4 workers;
    #   t4: ceil(360,000 / 311,040) = 2 workers, 2 x 0.53 x (360,000 / 108) / 3600 = $0.9815.
    tight = decide(
        MEASURED, parse_sla("deadline=2h,backlog_hours=100,max_wer_increase=0.01,max_workers=4")
    )
    assert tight.chosen is not None and tight.chosen.measurement.name == "t4 beam 1"
    assert tight.chosen.option.workers == 2 and tight.chosen.option.cost_usd == pytest.approx(
        0.981481, abs=1e-6
    )
    why = {r.measurement.name: r.why for r in tight.rows}
    assert "misses the deadline: needs 14 workers, more than the 4 available" in why["cpu beam 1"]
    # The frontier: cpu beam 1 (cheapest), t4 (fastest); cpu tiny fast is worse in accuracy but
    # cheaper per minute than t4 and faster than cpu beam 1, so it is not dominated either.
    assert {r.measurement.name for r in loose.rows if r.frontier} == {
        "cpu beam 1",
        "t4 beam 1",
        "cpu tiny fast",
    }


def test_no_configuration_meeting_the_sla_means_no_choice():
    d = decide(MEASURED, parse_sla("deadline=1h,backlog_hours=100000,max_workers=2,max_wer=0.12"))
    assert d.chosen is None
    assert all(
        "misses the deadline" in r.why
        or "above the allowed" in r.why
        or r.why.startswith("skipped")
        for r in d.rows
    )


def test_time_budget_stops_starting_configurations_once_one_would_not_fit(tmp_path):
    now = [0.0]
    ran = []

    def runner(candidate: Candidate, index: int, ctx) -> Measurement:
        ran.append(candidate.name)
        now[0] += 100.0  # every configuration takes 100 s
        m = _m(candidate.name, "cpu", 0.0425, 5.0 + index, 0.1)
        m.elapsed_s, m.texts = 100.0, {"0.wav": "hello world"}
        return m

    sample = tmp_path / "sample"
    sample.mkdir()
    for i in range(3):
        (sample / f"{i}.wav").write_bytes(b"RIFF")
    grid = [Candidate(f"c{i}", {"beam_size": 1 + i}) for i in range(5)]
    result = tune(
        str(sample),
        parse_sla("deadline=6h,backlog_hours=10"),
        grid=grid,
        budget_s=250.0,
        out=str(tmp_path / "out"),
        runner=runner,
        clock=lambda: now[0],
    )
    # No references: the most accurate configuration (widest beam) runs first, as the reference.
    # After two, 50 s are left: less than one configuration takes, so no third one starts.
    assert ran == ["c4", "c3"]
    status = {m.name: m.status for m in result.measurements}
    assert status == {"c0": "not_run", "c1": "not_run", "c2": "not_run", "c3": "ok", "c4": "ok"}
    assert "time budget: 50 s left" in result.measurements[0].reason
    assert result.elapsed_s <= 250.0
    assert (tmp_path / "out" / "chosen.toml").is_file()


def test_without_references_the_most_accurate_configuration_is_the_reference():
    ref_text = {"a.wav": "the quick brown fox jumps", "b.wav": "over the lazy dog"}
    best = Measurement(
        "beam 5 float32", {"beam_size": 5, "compute_type": "float32"}, texts=dict(ref_text)
    )
    fast = Measurement(
        "beam 1 int8",
        {"beam_size": 1, "compute_type": "int8"},
        texts={"a.wav": "the quick brown fox jumped", "b.wav": "over the lazy dog"},
    )
    basis = score([fast, best], {}, "")
    assert "most accurate configuration of the grid (beam 5 float32)" in basis
    assert best.wer == 0.0
    assert fast.wer == pytest.approx(1 / 9)  # one substitution in nine reference words


def test_word_error_rate_is_corpus_level_and_a_missing_transcript_counts_as_deletions():
    # Not number words: Whisper's normaliser (jobs.ops.wer) writes "one two three four" as "1234".
    refs = {"a": "Hello, World!", "b": "the cat sat down"}
    assert corpus_wer(refs, {"a": "hello world", "b": "the cat sat down"}) == (0.0, 2)
    assert corpus_wer(refs, {"a": "hello world"}) == (4 / 6, 2)


def test_sla_and_grid_files_are_validated_with_messages_that_name_the_problem(tmp_path):
    sla = parse_sla("deadline=6h, backlog_hours=2000, max_wer_increase=0.01, max_workers=8")
    assert (sla.deadline_s, sla.backlog, sla.max_wer_increase, sla.max_workers) == (
        21600,
        7.2e6,
        0.01,
        8,
    )
    for bad, match in (
        ("backlog_hours=5", "deadline"),
        ("deadline=6h", "backlog_hours"),
        ("deadline=6h,backlog_hours=x", "not a number"),
        ("deadline=6h,speed=2", "known key"),
    ):
        with pytest.raises(ConfigError, match=match):
            parse_sla(bad)
    grid = tmp_path / "grid.toml"
    grid.write_text(
        '[base]\nbatch_size = 8\n[grid]\nbeam_size = [1, 5]\ncompute_type = ["int8", "float32"]\n'
    )
    names = [c.name for c in read_grid(str(grid))]
    assert names == [
        "beam_size=1 compute_type=int8",
        "beam_size=1 compute_type=float32",
        "beam_size=5 compute_type=int8",
        "beam_size=5 compute_type=float32",
    ]
    assert all(c.options["batch_size"] == 8 for c in read_grid(str(grid)))
    grid.write_text("[grid]\nbeam_size = [0]\n")
    with pytest.raises(ConfigError, match=r"(?s)beam_size=0.*transcribe.beam_size"):
        tune(
            str(tmp_path),
            parse_sla("deadline=6h,backlog_hours=1"),
            grid=read_grid(str(grid)),
            out=str(tmp_path / "o"),
            runner=lambda c, i, ctx: Measurement(c.name, c.options),
        )


CALLS = {
    "billing.txt": "customer: I was charged twice for my internet bill and I want the extra payment refunded.",
    "router.txt": "customer: My router keeps dropping the wifi connection every few minutes since the update.",
}


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_tune_process_measures_the_document_job_on_the_real_smollm2_model(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in CALLS.items():
        (docs / name).write_text(text)
    (docs / "references.tsv").write_text("billing.txt\tbilling\nrouter.txt\ttechnical_support\n")
    # The CTranslate2 grid (two compute types): the default install's engine; vLLM has one.
    base = {
        "process": {
            "task": "classify",
            "labels": ["billing", "technical_support", "sales"],
            "backend": "ctranslate2",
        }
    }
    grid = [
        Candidate("int8 batch 4", {"compute_type": "int8", "max_batch_size": 4}),
        Candidate("float16", {"compute_type": "float16"}),
    ]
    result = tune(
        str(docs),
        parse_sla("deadline=6h,backlog_documents=100000,max_error_increase=0.5", "process"),
        kind="process",
        grid=grid,
        base=base,
        budget_s=300,
        out=str(tmp_path / "out"),
    )
    ok, skipped = result.measurements
    assert skipped.status == "failed" and "float16 is not supported on cpu" in skipped.reason
    # Two documents (references.tsv is not one), classified, labels compared with the references.
    assert ok.status == "ok" and ok.unit == "documents" and ok.work == 2 and ok.labels
    assert ok.scored_items == 2 and ok.wer in (0.0, 0.5, 1.0)
    assert ok.throughput > 0 and ok.resource == "cpu"
    assert result.decision.chosen is not None and result.decision.chosen.measurement is ok
    spec = build_spec(read_job_file(tmp_path / "out" / "chosen.toml"))
    assert spec.job.kind == "process" and spec.process.task == "classify"
    assert (spec.process.compute_type, spec.process.max_batch_size) == ("int8", 4)
    [profile] = load_profiles([str(tmp_path / "out" / "profile.json")])
    assert profile.unit == "documents" and profile.kind == "process"
    plan = make_plan([profile], 100000.0, "documents", Sizing(6 * 3600.0))
    assert plan.cheapest is not None
    assert plan.cheapest.workers == result.decision.chosen.option.workers


def test_the_gpu_grid_measures_both_engines_and_plan_keeps_them_apart(monkeypatch):
    """tune chooses the Whisper engine as it chooses beam and batch: on a GPU its grid holds
    CTranslate2's compute types and the torch engine (where torch is installed), and runs of
    the two engines are separate profiles in plan, priced each on its own."""
    import importlib.util

    from overnight.jobs.ops.plan import _option_key
    from overnight.jobs.ops.tune import default_grid

    grid = default_grid("cuda")
    engines = {c.options.get("engine") for c in grid}
    torch = importlib.util.find_spec("torch") is not None
    assert engines == ({"ctranslate2", "torch"} if torch else {"ctranslate2"})
    assert all(c.options["compute_type"] == "auto" for c in grid if c.options["engine"] == "torch")
    assert {c.options.get("engine") for c in default_grid("cpu")} == {None}  # CTranslate2 only
    run = {"kind": "transcribe", "device": "cuda", "accelerator": "h100", "options": {}}
    ct2 = {**run, "options": {"beam_size": 1, "batch_size": 64, "compute_type": "auto"}}
    torch_run = {**run, "options": {**ct2["options"], "engine": "torch"}}
    assert _option_key(ct2) != _option_key(torch_run)
    assert _option_key(ct2) == _option_key(
        {**ct2, "options": {**ct2["options"], "engine": "ctranslate2"}}
    )
