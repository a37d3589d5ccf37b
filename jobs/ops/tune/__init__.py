"""SLA-driven tuning: measure a grid of configurations on a sample, pick the cheapest that meets it.

``overnight tune SAMPLE --kind transcribe --sla "deadline=6h,backlog_hours=2000,max_wer_increase=0.01"
[--grid FILE] [--budget 10m] [--config JOBFILE] [--out DIR]``

``--kind process`` tunes the document job the same way: the grid sets ``[process]`` options
(default: compute type {int8, float32} x ``max_batch_size`` {4, 32} with CTranslate2 on CPU;
``max_num_seqs`` {64, 256} x ``max_num_batched_tokens`` {8192, 16384} with vLLM on GPU;
``max_new_tokens``, ``model`` and quantized models go in a grid file), the job file's
``[process]`` names the task (its first task is tuned), throughput is documents per busy
second, and accuracy is the label disagreement of a classification (else the word error
rate of the generated text) against ``references.tsv`` labels/texts or the most accurate
configuration. The SLA takes ``backlog_documents`` and ``max_error_increase``/``max_error``.

1. **Grid.** Each configuration is a set of ``[transcribe]`` options laid over the job file's
   (``--config``), validated up front. ``--grid FILE`` (TOML, YAML or JSON) holds ``base``
   (options for all), ``grid`` (option -> list of values, crossed) and/or ``configs`` (a
   list of option tables, each with an optional ``name``). Without a file: beam size {1, 5}
   x batch size {4, 16} x compute type {int8, float32} on CPU; {float16, int8_float16} x
   batch {16, 64} x beam {1, 5} on GPU (model sizes go in a grid file: they download).
2. **Measure.** Each configuration runs the real transcription job on the sample into its own
   output folder (``DIR/configs/NN/``), with its own run id, so ``overnight report`` works on
   them too. From its ledger: throughput per worker while busy (audio seconds of the items
   that succeeded / busy seconds of the Whisper actor: what ``plan`` sizes with), the
   worker's resource, units and price, the CPU (fetch/decode) cost per audio second, and
   the sample's cost per audio minute; from its summary the wall real-time factor.
   A configuration that fails (unsupported compute type, model not found, out of memory,
   every item failed) is recorded with its reason and the tuning goes on. Compute types the
   driver's CTranslate2 cannot run on CPU are skipped before starting anything.
3. **Accuracy.** Word error rate (lower-cased, punctuation stripped, corpus-level: all edits
   / all reference words) against references when the sample has them: a ``reference``
   column in a manifest, or ``references.tsv`` (name TAB text), ``references.jsonl``
   (``{"name"|"uri"|"id": ..., "text"|"reference": ...}``) or a LibriSpeech
   ``*trans.txt`` (id SPACE-or-TAB text) in the sample folder, or ``--references FILE``.
   Items are matched by file name or stem; only items with a reference are scored. Without
   references the most accurate configuration of the grid by construction (largest model,
   most precise compute type, widest beam) runs first and its transcripts are the
   reference; its own WER is 0.
4. **Budget.** ``--budget`` bounds the tuning's wall time: before each configuration, if the
   time left is less than the longest configuration so far took, it is not started (and is
   listed as not run). The first configuration always runs: there is nothing to estimate
   from before it; keep samples small (``--max-items``).
5. **Choice.** The SLA: ``deadline`` and the backlog (``backlog_hours`` of audio) say what
   the nightly run must do; ``max_wer_increase`` (absolute, 0.01 = one point of WER) over
   the best WER measured, and/or ``max_wer``, bound accuracy; ``max_workers`` bounds how
   many workers can be had; ``headroom``, ``utilization``, ``startup`` as in ``plan``.
   Each configuration is sized for the backlog with ``plan``'s arithmetic: workers needed,
   finish time, cost of the backlog. The cheapest configuration meeting accuracy and
   deadline wins (ties: the faster). Without ``max_workers`` any configuration meets any
   deadline by adding workers, so the deadline only bites through rounding and start-up; a
   worker limit is what makes a tight deadline pay for a faster, pricier configuration.
6. **Outputs.** ``DIR/chosen.toml``: a job spec whose ``[transcribe]`` holds the chosen
   options (device and compute type pinned to what was measured), loadable by
   ``overnight transcribe INPUT OUTPUT --config DIR/chosen.toml``; ``DIR/profile.json``: a
   throughput profile of every measured configuration for ``overnight plan``;
   ``DIR/measurements.json``: everything measured and decided. ``chosen.toml`` is removed
   when nothing is chosen: the three never disagree.
7. **Rerun.** ``DIR/tune-state.json`` records which tuning the folder holds (a fingerprint
   of the job file, the grid, the sample's items with their sizes and ETags or mtimes, the
   references, the device) and each configuration as soon as it is measured. A rerun into
   the same ``--out`` (after Ctrl-C, a failure, or with another SLA) resumes: a
   configuration measured before, every item ok, is reused as it was ("measured before,
   reused"); any other (interrupted, failed, not run) is measured again from a clean
   ``configs/NN/``. The decision is then the one an uninterrupted tuning makes. A folder
   holding another tuning (the sample, grid, references, ``--max-items``, job file or
   device changed), or configuration runs without ``tune-state.json``, is refused: use a
   new ``--out``.

The package, in the order above: ``sla``, ``grid``, ``measure``, ``accuracy``, ``decide``,
``orchestrate`` (the run within the budget) and ``outputs`` (files and the printed table);
``jobs.cli.tune`` is the command.
"""

from overnight.jobs.choices import DEFAULT_TUNE_BUDGET as DEFAULT_BUDGET
from overnight.jobs.choices import TUNE_KINDS as KINDS
from overnight.jobs.ops.tune.accuracy import (
    accuracy_rank,
    corpus_wer,
    error_rate,
    label_disagreement,
    read_references,
    score,
)
from overnight.jobs.ops.tune.decide import Decision, Row, decide
from overnight.jobs.ops.tune.grid import (
    CPU_GRID,
    GPU_GRID,
    GPU_TORCH_GRID,
    PROCESS_CPU_GRID,
    PROCESS_GPU_GRID,
    PROCESS_VLLM_CPU_GRID,
    Candidate,
    default_grid,
    read_grid,
)
from overnight.jobs.ops.tune.measure import (
    Context,
    Measurement,
    measure_process,
    measure_transcribe,
    unsupported_compute_type,
)
from overnight.jobs.ops.tune.orchestrate import TuneResult, tune
from overnight.jobs.ops.tune.outputs import chosen_toml, render, write_outputs
from overnight.jobs.ops.tune.sla import SLA, parse_sla

__all__ = [
    "CPU_GRID",
    "DEFAULT_BUDGET",
    "GPU_GRID",
    "GPU_TORCH_GRID",
    "KINDS",
    "PROCESS_CPU_GRID",
    "PROCESS_GPU_GRID",
    "PROCESS_VLLM_CPU_GRID",
    "SLA",
    "Candidate",
    "Context",
    "Decision",
    "Measurement",
    "Row",
    "TuneResult",
    "accuracy_rank",
    "chosen_toml",
    "corpus_wer",
    "decide",
    "default_grid",
    "error_rate",
    "label_disagreement",
    "measure_process",
    "measure_transcribe",
    "parse_sla",
    "read_grid",
    "read_references",
    "render",
    "score",
    "tune",
    "unsupported_compute_type",
    "write_outputs",
]
