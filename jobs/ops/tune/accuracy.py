"""Accuracy: word error rate or label disagreement against references, and the accuracy rank."""

from __future__ import annotations

import json
from typing import Any

from overnight.jobs.dataset import storage
from overnight.jobs.ops import wer
from overnight.jobs.ops.tune.measure import Measurement, _item_key, _stem
from overnight.jobs.spec import TranscribeOptions

_REFERENCE_FILES = ("references.tsv", "references.jsonl", "references.txt")


def corpus_wer(references: dict[str, str], hypotheses: dict[str, str]) -> tuple[float | None, int]:
    """All word edits / all reference words over the items that have a reference.

    An item with a reference but no transcript (it failed in this configuration) counts as
    all words deleted.
    """
    # One metric for tune, the tests and the benchmarks: jobs.ops.wer (Whisper's normaliser, jiwer).
    return wer.corpus_wer(references, hypotheses)


def label_disagreement(
    references: dict[str, str], labels: dict[str, str]
) -> tuple[float | None, int]:
    """Share of referenced items whose label differs (case and spaces ignored); a missing
    label counts as wrong."""
    if not references:
        return None, 0
    wrong = sum(
        labels.get(k, "").strip().lower() != ref.strip().lower() for k, ref in references.items()
    )
    return wrong / len(references), len(references)


def error_rate(m: Measurement, references: dict[str, str]) -> tuple[float | None, int]:
    return label_disagreement(references, m.texts) if m.labels else corpus_wer(references, m.texts)


def read_references(sample: str, explicit: str | None = None) -> tuple[dict[str, str], str]:
    """References keyed by file name (and stem), and where they came from."""
    if explicit:
        files = [explicit]
    else:
        loc = storage.resolve(sample)
        if sample.lower().endswith((".csv", ".jsonl", ".parquet")) or not loc.fs.isdir(loc.path):
            return {}, ""
        names = [p.rsplit("/", 1)[-1] for p in storage.list_files(loc)]
        picked = [n for n in names if _is_reference_file(n)]
        files = [loc.join(n).url() for n in picked]
    refs: dict[str, str] = {}
    for url in files:
        text = storage.read_bytes(url).decode("utf-8-sig")
        for line in text.splitlines():
            if not line.strip():
                continue
            if url.endswith(".jsonl"):
                row = json.loads(line)
                key = str(row.get("name") or row.get("uri") or row.get("id") or "")
                value = str(row.get("text") or row.get("reference") or "")
            else:
                key, _, value = line.partition("\t") if "\t" in line else line.partition(" ")
            key = _item_key(key.strip())
            refs[key] = value.strip()
            refs.setdefault(_stem(key), value.strip())
    return refs, ", ".join(f.rsplit("/", 1)[-1] for f in files)


def _is_reference_file(uri: str) -> bool:
    name = _item_key(uri)
    return name in _REFERENCE_FILES or name.endswith("trans.txt")


def _match(refs: dict[str, str], keys: set[str]) -> dict[str, str]:
    out = {}
    for key in keys:
        ref = refs.get(key, refs.get(_stem(key)))
        if ref is not None:
            out[key] = ref
    return out


_MODEL_RANK = (
    ("tiny", 1),
    ("base", 2),
    ("small", 3),
    ("medium", 4),
    ("distil", 4.5),
    ("turbo", 5),
    ("large", 6),
)
_PRECISION = {
    "float32": 5,
    "bfloat16": 4,
    "float16": 4,
    "int8_float32": 3,
    "int8_bfloat16": 2.5,
    "int8_float16": 2.5,
    "auto": 2,
    "int8": 1,
}


def accuracy_rank(options: dict[str, Any]) -> tuple:
    """How accurate a configuration is by construction (larger is more accurate).

    Transcription: model size, then compute precision, then beam width. Documents: compute
    precision, then the token budget (a configured model is ranked by its name's size).
    """
    if "beam_size" not in options and any(
        k in options for k in ("max_batch_size", "max_num_seqs", "max_new_tokens", "backend")
    ):
        model = str(options.get("model") or "").lower()
        return (
            next((rank for key, rank in _MODEL_RANK if key in model), 3),
            _PRECISION.get(str(options.get("compute_type", "auto")), 2),
            int(options.get("max_new_tokens") or 0),
        )
    model = str(options.get("model", TranscribeOptions.model_fields["model"].default)).lower()
    size = next((rank for key, rank in _MODEL_RANK if key in model), 3)
    return (
        size,
        _PRECISION.get(str(options.get("compute_type", "auto")), 2),
        int(options.get("beam_size", TranscribeOptions.model_fields["beam_size"].default)),
    )


def score(measurements: list[Measurement], references: dict[str, str], source: str) -> str:
    """Fill in every ok measurement's WER; returns what accuracy is measured against."""
    ok = [m for m in measurements if m.status == "ok"]
    if not ok:
        return "nothing (no configuration succeeded)"
    keys = {k for m in ok for k in m.texts}
    refs = _match(references, keys)
    if refs:
        for m in ok:
            m.wer, m.scored_items = error_rate(m, refs)
        return f"references ({source}; {len(refs)} items)"
    best = max(ok, key=lambda m: accuracy_rank(m.options))
    for m in ok:
        m.wer, m.scored_items = error_rate(m, {k: v for k, v in best.texts.items() if v.strip()})
    return f"the most accurate configuration of the grid ({best.name}), as there are no references"
