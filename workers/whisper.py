"""The Whisper batch worker: one model per actor, batches filled across recordings.

faster-whisper's ``BatchedInferencePipeline`` batches the 30-second chunks of *one* file, so
a backlog of short calls gives it batches of one. This worker receives Ray Data batches of
recordings (already decoded into feature chunks by ``workers.audio``, or into chunks of
speech samples whose features the engine's front end computes here), several calls at once;
its ``ContinuousBatcher`` pools the chunks of every call in flight, runs model batches
through the pipeline's batched forward pass, and each call gets its recordings' segments
back, in time order.

The time of every model batch is measured and apportioned to the chunks in it by their share
of audio seconds, which is what the cost ledger prices.

Over 600 lines: the batcher and the worker share the chunk records and the model's forward
pass; the batch planning (``plan_batches``) is model-free and tested on its own.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from overnight.schemas import ErrorCode
from overnight.schemas.stages import WHISPER_OUTPUT
from overnight.workers.analytics import call_analytics
from overnight.workers.audio import FRAMES_PER_SECOND, features_of, span_to_original_time
from overnight.workers.devices import resolve_device, worker_id
from overnight.workers.whisper_guard import (
    BEST_OF,
    FALLBACK_TEMPERATURES,
    check,
    cut_repetition,
    token_cap,
)
from overnight.workers.whisper_models import ModelLoadError, resolve_model
from overnight.workers.whisper_options import WhisperOptions, is_english, resolve_engine


@dataclass(frozen=True)
class WhisperWorkerConfig:
    whisper: WhisperOptions
    # Everything else that shaped the result (audio options), merged into `options`.
    extra_options: tuple[tuple[str, Any], ...] = ()
    # A diarized mono call's speakers named by who speaks first (``agent``, ``customer``);
    # empty: SPEAKER_00, SPEAKER_01, ...
    speaker_roles: tuple[str, ...] = ()


Prompt = tuple[str | None, str | None]  # (initial_prompt, hotwords)


@dataclass
class _ChunkRef:
    row: int
    channel: int
    clips: list[tuple[float, float]]
    features: np.ndarray
    language: str
    # (initial_prompt, hotwords) of its recording: faster-whisper builds one decoder prompt
    # per model batch, so only chunks with the same prompt may share a batch.
    prompt: Prompt = (None, None)
    call: Any = field(default=None, compare=False, repr=False)  # the _Call it belongs to
    queued_at: int = field(default=0, compare=False, repr=False)  # batches taken before it came
    # Its encoder output at Whisper's 30 s window, on the host, when language detection has
    # already computed it (a recording's first chunk): its model batch decodes from it.
    encoded: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def duration(self) -> float:
        return sum(e - s for s, e in self.clips)

    @property
    def frames(self) -> int:
        return int(self.features.shape[1])


def window_frames(frames: int, step_s: int) -> int:
    """Encoder input length (feature frames) of a chunk of ``frames`` frames: the next
    multiple of ``step_s`` seconds, at most Whisper's 30 s (step 0: always 30 s)."""
    full = 30 * FRAMES_PER_SECOND
    step = step_s * FRAMES_PER_SECOND
    if step <= 0 or frames >= full:
        return full
    return min(full, max(step, -(-frames // step) * step))


def _text(output: list[dict]) -> str:
    return " ".join(seg["text"] for seg in output)


def repeats_itself(text: str, min_words: int = 3) -> bool:
    """Whether ``text`` says a run of at least ``min_words`` words twice back to back, the
    shape of a decoder that started the utterance over (case and punctuation ignored)."""
    words = re.findall(r"[\w']+", text.lower())
    n_max = len(words) // 2
    for n in range(min_words, n_max + 1):
        for i in range(len(words) - 2 * n + 1):
            if words[i : i + n] == words[i + n : i + 2 * n]:
                return True
    return False


def _degenerate(chunk: _ChunkRef, output: list[dict]) -> str | None:
    """Why a chunk's decode is degenerate (``workers.whisper_guard.check``), or None."""
    tokens = sum(len(seg.get("tokens") or []) for seg in output)
    return check(_text(output), tokens, chunk.duration)


def _avg_logprob(output: list[dict]) -> float:
    return min((seg["avg_logprob"] for seg in output), default=0.0)


def _cut(seg: dict) -> dict:
    """A segment of a decode that stayed degenerate: its repetition said once, its words
    those of the text that is left, and marked."""
    text = cut_repetition(seg["text"])
    words = seg.get("words")
    if words:
        import difflib

        def key(word: str) -> str:  # the cut may drop a comma after the word it keeps
            return word.strip().strip(",.;:!?")

        said = [key(w["word"]) for w in words]
        matcher = difflib.SequenceMatcher(
            None, said, [key(w) for w in text.split()], autojunk=False
        )
        keep = {i for a, _, n in matcher.get_matching_blocks() for i in range(a, a + n)}
        words = [w for i, w in enumerate(words) if i in keep]
    return {**seg, "text": text, "words": words, "degenerate": True}


def voiced_frames(features: np.ndarray, share: float = 0.3) -> np.ndarray | None:
    """Per feature frame (10 ms) of a chunk: whether it is loud, i.e. its mean log-mel level is
    ``share`` of the way from the chunk's quiet floor (5th percentile) to its speech level
    (95th). None for a chunk too even to tell (all speech or all silence)."""
    level = features.mean(axis=0)
    floor, loud = np.percentile(level, [5, 95])
    if loud - floor < 0.1:  # log-mel units over 4: a tenth is a 2.5x power step
        return None
    return level > floor + share * (loud - floor)


def trim_to_speech(words: list[dict], voiced: np.ndarray | None) -> None:
    """Move the first word's start and the last word's end of a segment (chunk times, in
    place) off the quiet frames at its edges, onto the first and last loud frame.

    Whisper's alignment (DTW on cross-attention) lets the first word after a pause absorb
    the silence before it: every VAD chunk starts with 0.4 s of padding, and its first word
    began there (0.3 s early on synthesized calls), which adds to talk time and takes from
    overtalk. Only the segment's edges move, and only within the word, never across it,
    as stable-ts's ``suppress_silence`` does with its own silence mask."""
    if voiced is None or not words:
        return
    first, last = words[0], words[-1]
    a, b = int(first["start"] * FRAMES_PER_SECOND), int(first["end"] * FRAMES_PER_SECOND)
    loud = np.flatnonzero(voiced[a:b])
    if loud.size:
        first["start"] = max(first["start"], (a + loud[0]) / FRAMES_PER_SECOND)
    a, b = int(last["start"] * FRAMES_PER_SECOND), int(np.ceil(last["end"] * FRAMES_PER_SECOND))
    loud = np.flatnonzero(voiced[a:b])
    if loud.size:
        last["end"] = min(last["end"], (a + loud[-1] + 1) / FRAMES_PER_SECOND)


def plan_batches(
    chunks: list[_ChunkRef], batch_size: int, workers: int, window: Callable[[_ChunkRef], int]
) -> list[tuple[str, list[_ChunkRef]]]:
    """Model batches for ``chunks`` (the batcher plans one pending group at a time).

    - Batch-mates share a language and a prompt (initial prompt and hotwords: faster-whisper
      builds one decoder prompt per batch) and an encoder window
      (``window(chunk)`` frames), and are neighbours by duration, so they decode to similar
      lengths.
    - A group becomes the fewest batches of at most ``batch_size``, sized evenly: 33 chunks
      give 17 + 16, not 32 + 1, so no batch is a lone straggler.
    - While there are fewer batches than model workers, the costliest is halved, so every
      worker (each holding a share of the cores) has a part to take.
    - Costliest first (window x chunks): the batcher runs the first one.
    """
    groups: dict[tuple[str, Prompt, int], list[_ChunkRef]] = defaultdict(list)
    for c in chunks:
        groups[c.language, c.prompt, window(c)].append(c)
    planned: list[tuple[str, int, list[_ChunkRef]]] = []
    for (language, _, frames), group in groups.items():
        group.sort(key=lambda c: c.duration)
        parts = -(-len(group) // batch_size)
        bounds = [round(k * len(group) / parts) for k in range(parts + 1)]
        planned.extend((language, frames, group[a:b]) for a, b in itertools.pairwise(bounds))

    def cost(batch: tuple[str, int, list[_ChunkRef]]) -> int:
        return batch[1] * len(batch[2])

    while 0 < len(planned) < workers:
        costliest = max(range(len(planned)), key=lambda k: cost(planned[k]))
        if len(planned[costliest][2]) < 2:
            break
        language, frames, biggest = planned.pop(costliest)
        half = len(biggest) // 2
        planned += [(language, frames, biggest[:half]), (language, frames, biggest[half:])]
    planned.sort(key=cost, reverse=True)
    return [(language, part) for language, _, part in planned]


@dataclass
class _Done:
    chunk: _ChunkRef
    output: list[dict]
    seconds: float  # the chunk's share of its model batch's wall time
    fill: float  # its batch's size / batch_size
    error: str | None = None  # the chunk alone failed (its recording becomes an error row)


class _Call:
    """One actor call's chunks in the batcher: done when every chunk has its result."""

    def __init__(self, chunks: list[_ChunkRef]):
        self.left = len(chunks)
        self.results: list[_Done] = []
        self.error: BaseException | None = None
        self.finished = threading.Event()
        if not chunks:
            self.finished.set()


class ContinuousBatcher:
    """Model batches filled from every actor call in flight, run by ``workers`` threads.

    Ray Data gives the actor several calls at once (``max_concurrent_calls_per_actor``).
    Each call hands its chunks here and waits; a free worker thread takes the next batch
    from all pending chunks. So the model starts on the first call's chunks while later
    recordings are still being decoded, and a batch is filled across calls instead of
    ending with each call's leftovers.

    A free worker takes the pending (language, prompt, window) group with the most encoder
    work, plans it with ``plan_batches`` (even sizes, split into one part per worker) and
    runs the costliest planned batch. A chunk passed over by ``patience`` batches is served
    next, with its group, so no call waits behind later ones for long.
    """

    def __init__(
        self,
        forward: Callable[[list[_ChunkRef], str, dict[int, str]], list[list[dict]]],
        batch_size: int,
        workers: int,
        window: Callable[[_ChunkRef], int],
    ):
        self.forward, self.batch_size, self.window = forward, batch_size, window
        self.workers = max(1, workers)
        # A chunk passed over by this many batches is served next, whatever its group.
        self.patience = 4 * self.workers
        self._pending: list[_ChunkRef] = []
        self._broken: BaseException | None = None
        self._taken = 0  # batches taken so far
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []

    def run(self, chunks: list[_ChunkRef]) -> list[_Done]:
        """Transcribe ``chunks`` (with other calls' chunks); one result per chunk."""
        call = _Call(chunks)
        with self._cv:
            if self._broken is not None:
                raise RuntimeError(f"the Whisper engine failed earlier: {self._broken}")
            for c in chunks:
                c.call, c.queued_at = call, self._taken
            self._pending.extend(chunks)
            while len(self._threads) < self.workers:  # started on first use
                t = threading.Thread(target=self._loop, name="whisper-batch", daemon=True)
                self._threads.append(t)
                t.start()
            self._cv.notify_all()
        call.finished.wait()
        if call.error is not None:
            raise call.error
        return call.results

    def _take(self) -> tuple[str, list[_ChunkRef]]:
        # Chunks with different prompts form separate groups (one decoder prompt per model
        # batch); items that share a prompt, the job's or none, still batch across calls.
        groups: dict[tuple[str, Prompt, int], list[_ChunkRef]] = defaultdict(list)
        for c in self._pending:
            groups[c.language, c.prompt, self.window(c)].append(c)
        oldest = self._pending[0]
        oldest_key = (oldest.language, oldest.prompt, self.window(oldest))
        if self._taken - oldest.queued_at >= self.patience:
            key = oldest_key
        else:  # the fullest group (by encoder work): the biggest batches
            key = max(groups, key=lambda k: k[2] * len(groups[k]))
        # Planned for all workers, not just the free ones: a group smaller than a batch is
        # halved even while the other worker is busy, so the other half is there when it
        # frees up, and the job's last group does not end on one worker while others idle
        # (seen: 5 s of one idle worker at the end of a 60-file run).
        planned = plan_batches(groups[key], self.batch_size, self.workers, self.window)
        if key == oldest_key:
            language, part = next(b for b in planned if any(c is oldest for c in b[1]))
        else:
            language, part = planned[0]
        taken = {id(c) for c in part}
        self._pending = [c for c in self._pending if id(c) not in taken]
        self._taken += 1
        return language, part

    def _loop(self) -> None:
        while True:
            part: list[_ChunkRef] = []
            try:
                with self._cv:
                    while not self._pending:
                        self._cv.wait()
                    language, part = self._take()
                self._run(language, part)
            except BaseException as exc:  # the engine (or this code), not one input
                self._fail(part, exc)

    def _run(self, language: str, part: list[_ChunkRef]) -> None:
        failed: dict[int, str] = {}  # id(chunk) -> why it failed alone
        t0 = time.perf_counter()
        outputs = self.forward(part, language, failed)
        elapsed = time.perf_counter() - t0
        total_audio = sum(c.duration for c in part) or 1.0
        fill = len(part) / self.batch_size
        with self._cv:
            for c, out in zip(part, outputs, strict=True):
                call = c.call
                share = elapsed * c.duration / total_audio
                call.results.append(_Done(c, out, share, fill, failed.get(id(c))))
                call.left -= 1
                if call.left == 0:
                    call.finished.set()

    def _fail(self, part: list[_ChunkRef], exc: BaseException) -> None:
        """Every call in flight raises ``exc``; later calls are refused (a dead engine
        stops the job, as Ray Data retries cannot fix it)."""
        with self._cv:
            self._broken = exc
            calls = {id(c.call): c.call for c in [*part, *self._pending]}
            self._pending = []
            for call in calls.values():
                call.error = exc
                call.finished.set()


# Seconds between chunks on the timeline a model batch is aligned on (``_forward``): more than
# a 30 s chunk plus faster-whisper's pause (4 median word lengths, at most 2.8 s).
_CHUNK_SPACING_S = 60.0

CPU_ENCODER_BATCH = 1  # see WhisperOptions.encoder_batch_size; scripts/profile_whisper.py


def encoder_batch(opts: WhisperOptions, device: str) -> int:
    """Chunks per encoder pass; 0 means the whole model batch."""
    if device == "cuda":
        return 0
    return opts.encoder_batch_size or CPU_ENCODER_BATCH


def encode_in_parts(encode: Callable[[np.ndarray], Any], features: np.ndarray, micro: int):
    """``encode(features)`` run ``micro`` chunks at a time, as one encoder output (a
    CTranslate2 StorageView on CPU); ``micro`` 0 runs the whole batch at once."""
    if micro <= 0 or features.ndim < 3 or len(features) <= micro:
        return encode(features)
    # np.asarray views each CPU StorageView (it keeps it alive); concatenate copies.
    parts = [np.asarray(encode(features[i : i + micro])) for i in range(0, len(features), micro)]
    return ct2_encoder_output(np.concatenate(parts))


def ct2_encoder_output(rows: np.ndarray) -> Any:
    """Host encoder rows as CTranslate2 takes them (it moves them to the model's device)."""
    import ctranslate2

    return ctranslate2.StorageView.from_array(np.ascontiguousarray(rows))


def seed_samplers(seed: int) -> None:
    """Seed the generators the fallback decode samples from (``SamplingModel``). Unseeded,
    CTranslate2 seeds each of its threads from ``std::random_device``, so a looping chunk
    came out worded differently run to run (5 of the redaction corpus's 80 calls differed
    between two runs over the same audio; none with a seed). CTranslate2 seeds a thread's
    generator from this value when that thread first samples, and a model's threads are its
    own: a model loaded after this call starts its sampling from ``seed``, and one model
    worker fed the same batches draws the same samples. With several model workers, batches
    reach whichever worker is free, each with its own generator, so there the draws still
    vary; CTranslate2 has no per-call seed. The global ``torch`` generator serves the torch
    engine; torch is seeded only when it is loaded."""
    import sys

    import ctranslate2

    ctranslate2.set_random_seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def host_array(encoded: Any) -> np.ndarray:
    """An encoder output (a CTranslate2 StorageView on any device, or the torch engine's
    tensor) as a host array."""
    import ctranslate2

    if isinstance(encoded, ctranslate2.StorageView):
        if encoded.device != "cpu":
            encoded = encoded.to_device(ctranslate2.Device.cpu)
        return np.asarray(encoded)  # a view that keeps the StorageView alive
    return encoded.detach().float().cpu().numpy()  # a torch tensor


class ReusedEncoderModel:
    """The model as faster-whisper's batched pass sees it, except that ``encode`` answers
    the rows whose encoder output was already computed (``kept[i]``, e.g. by language
    detection) from it and runs the encoder on the other rows only. Rows are independent
    in Whisper's encoder, so the spliced output is the one a single pass would give."""

    def __init__(
        self,
        model: Any,
        kept: Sequence[np.ndarray | None],
        to_engine: Callable[[np.ndarray], Any] = ct2_encoder_output,
    ):
        self._model = model
        self._kept = list(kept)
        self._to_engine = to_engine  # host rows as the engine takes an encoder output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def encode(self, features: np.ndarray) -> Any:
        missing = [i for i, k in enumerate(self._kept) if k is None]
        fresh = iter(host_array(self._model.encode(features[missing])) if missing else [])
        rows = [k if k is not None else next(fresh) for k in self._kept]
        return self._to_engine(np.stack(rows))


class SamplingModel:
    """The model as faster-whisper's batched pass sees it, except that its decoder samples
    at ``temperature`` where the pass would beam-search: the sequential ``transcribe``'s
    fallback decode. (The batched pass hands its temperature to CTranslate2 with top-k 1, so
    on its own it never samples.) Of the ``best_of`` samples of a chunk, the pass takes the
    best by score among those ``accept(position, token_ids)`` accepts, else the best."""

    def __init__(
        self,
        model: Any,
        temperature: float,
        best_of: int,
        accept: Callable[[int, list[int]], bool] | None = None,
    ):
        self._model = model
        self.model = _SamplingDecoder(model.model, temperature, best_of, accept)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


class _SamplingDecoder:
    def __init__(self, decoder: Any, temperature: float, best_of: int, accept):
        self._decoder, self._temperature, self._best_of = decoder, temperature, best_of
        self._accept = accept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("patience", None)
        kwargs.update(
            beam_size=1,
            num_hypotheses=self._best_of,
            sampling_topk=0,
            sampling_temperature=self._temperature,
            return_scores=True,
        )
        results = self._decoder.generate(*args, **kwargs)
        return [_Ranked(r, k, self._accept) for k, r in enumerate(results)]


class _Ranked:
    """A generation result with its hypotheses reordered: accepted ones first, each group
    by score (CTranslate2's log-probability, normalized by length)."""

    def __init__(self, result: Any, position: int, accept):
        order = sorted(
            range(len(result.sequences_ids)),
            key=lambda h: (
                not (accept is None or accept(position, result.sequences_ids[h])),
                -result.scores[h],
            ),
        )
        self.sequences_ids = [result.sequences_ids[h] for h in order]
        self.scores = [result.scores[h] for h in order]
        self.no_speech_prob = result.no_speech_prob


def micro_batched_model(model_cls: type, micro: int) -> type:
    """A ``WhisperModel`` class whose ``encode`` runs ``micro`` chunks at a time.
    faster-whisper's batched forward pass calls ``encode`` once per batch, so this is where
    the split goes without copying that pass."""

    class MicroBatchedWhisperModel(model_cls):  # type: ignore[valid-type,misc]
        def encode(self, features: np.ndarray):
            return encode_in_parts(super().encode, features, micro)

    return MicroBatchedWhisperModel


class WhisperWorker:
    """``map_batches`` callable: decoded recordings in (``schemas.stages.DECODED``), this
    worker's transcript columns out (``WHISPER_OUTPUT``), one row per input row, in order; the
    runner adds the run's provenance when it commits (``jobs.dataset.commits.with_provenance``)."""

    def __init__(self, config: WhisperWorkerConfig, model_path: str | None = None):
        """``model_path``: a local copy of ``config.whisper.model`` (which may be a URL that
        the job fetched); the rows still record the model as configured."""
        from faster_whisper import BatchedInferencePipeline

        self.config = config
        opts = config.whisper
        self.device = resolve_device(opts.device)
        self.engine = resolve_engine(opts.engine)
        self.encoder_batch = encoder_batch(opts, self.device)
        # Host encoder rows (language detection's, kept) as this engine takes them back.
        self._to_engine: Callable[[np.ndarray], Any] = ct2_encoder_output
        # Chunks' samples to features (``features_from_samples``); the torch engine's is set
        # by ``_load``, CTranslate2's built when first needed.
        self._front_end: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None
        try:
            self.model = self._load(opts, model_path or resolve_model(opts.model))
            # One forward pass on a second of silence, inside the load's try: CTranslate2's
            # CUDA build opens cuBLAS/cuDNN only when it first computes, so a missing
            # libcublas.so.12 would otherwise turn every batch into error rows.
            self.model.encode(np.zeros((1, self.model.model.n_mels, 100), np.float32))
        except Exception as exc:  # any load failure stops the job: nothing could run
            raise ModelLoadError(f"cannot load Whisper model {opts.model!r}: {exc}") from exc
        self.multilingual = bool(self.model.model.is_multilingual)
        if opts.task == "translate" and not self.multilingual:
            raise ModelLoadError(
                f"task 'translate' needs a multilingual model; {opts.model!r} is English-only"
            )
        self._pipeline_class = BatchedInferencePipeline
        self.worker = worker_id()
        effective = {
            **opts.model_dump(),
            "device": self.device,
            "engine": self.engine,
            "compute_type": self.compute_type,
            "encoder_batch_size": self.encoder_batch,
        }
        effective.update(dict(config.extra_options))
        self.effective_options = effective
        self.options_json = json.dumps(effective, sort_keys=True)
        self._tokenizers: dict[str, Any] = {}
        self._tokenizer_lock = threading.Lock()
        self.model_workers = max(1, opts.model_workers)
        # With several model workers, batches run concurrently, each on its share of the
        # actor's cores: a batch's wall time is priced at that share (asr_units, which the
        # job's plan declares: jobs.transcribe).
        self.batcher = ContinuousBatcher(
            self._forward_isolating,
            opts.batch_size,
            self.model_workers,
            lambda c: self._window_frames(c.frames),
        )

    # -- model plumbing -------------------------------------------------------------------
    def _load(self, opts: WhisperOptions, path: str) -> Any:
        """The faster-whisper ``WhisperModel`` on this worker's engine; sets ``compute_type``."""
        if self.engine == "torch":
            try:
                from overnight.workers.whisper_torch import (
                    TorchWhisper,
                    chunk_features,
                    faster_whisper_model,
                )
            except ImportError as exc:
                raise ModelLoadError(
                    f"engine 'torch' needs PyTorch ({exc}): install torch on this node, or "
                    "use engine = 'ctranslate2'"
                ) from exc
            engine = TorchWhisper.from_path(
                path, device=self.device, compute_type=opts.compute_type
            )
            self.compute_type = engine.compute_type
            self._to_engine = engine.from_host
            self._front_end = functools.partial(
                chunk_features, n_mels=engine.n_mels, device=engine.torch_device
            )
            if opts.cpu_threads:
                import torch

                torch.set_num_threads(opts.cpu_threads)
            seed_samplers(opts.seed)
            return faster_whisper_model(engine, path, self.encoder_batch)
        from faster_whisper import WhisperModel

        seed_samplers(opts.seed)
        compute_type = opts.compute_type
        if compute_type == "auto":
            compute_type = "float16" if self.device == "cuda" else "int8"
        self.compute_type = compute_type
        return micro_batched_model(WhisperModel, self.encoder_batch)(
            path,
            device=self.device,
            compute_type=compute_type,
            cpu_threads=opts.cpu_threads,
            num_workers=max(1, opts.model_workers),
        )

    def features_from_samples(self, samples: list[np.ndarray]) -> list[np.ndarray]:
        """The features of chunks that came as 16 kHz samples (``AudioOptions.features_on_model``),
        as the decode stage would have computed them (``workers.audio.features_of``), with this
        engine's front end: the torch engine's ``LogMel`` on its device
        (``whisper_torch.chunk_features``), CTranslate2's faster-whisper ``FeatureExtractor``
        on the host."""
        if self._front_end is None:
            from faster_whisper.feature_extractor import FeatureExtractor

            extractor = FeatureExtractor(feature_size=self.model.model.n_mels)
            self._front_end = lambda chunks: [features_of(extractor, s) for s in chunks]
        return self._front_end(samples)

    def _chunk_features(
        self, raw: list[tuple[int, dict, np.ndarray]], asr_s: list[float]
    ) -> list[np.ndarray]:
        """Each chunk's features, from (row, DECODED chunk, its ``features`` buffer as float32):
        as the decode stage shipped them, or computed here from the samples of a chunk whose
        ``feature_size`` is 0. That computation is model time of the rows, by their share of
        its samples."""
        out: list[np.ndarray | None] = [
            data.reshape(ch["feature_size"], -1) if ch["feature_size"] else None
            for _, ch, data in raw
        ]
        todo = [k for k, f in enumerate(out) if f is None]
        if todo:
            t0 = time.perf_counter()
            computed = self.features_from_samples([raw[k][2] for k in todo])
            elapsed = time.perf_counter() - t0
            total = sum(len(raw[k][2]) for k in todo) or 1
            for k, feats in zip(todo, computed, strict=True):
                out[k] = feats
                asr_s[raw[k][0]] += elapsed * len(raw[k][2]) / total
        return [f for f in out if f is not None]  # every one, now

    def _tokenizer(self, language: str):
        from faster_whisper.tokenizer import Tokenizer

        with self._tokenizer_lock:  # model batches run on several threads
            if language not in self._tokenizers:
                self._tokenizers[language] = Tokenizer(
                    self.model.hf_tokenizer,
                    self.model.model.is_multilingual,
                    task=self.config.whisper.task,
                    language=language,
                )
            return self._tokenizers[language]

    def _transcription_options(self, tokenizer, prompt: Prompt = (None, None)):
        from faster_whisper.transcribe import TranscriptionOptions, get_suppressed_tokens

        opts = self.config.whisper
        initial_prompt, hotwords = prompt
        if initial_prompt is not None:
            # The sequential transcribe() encodes " " + the stripped prompt, the batched
            # generate_segment_batched the text as given: given this, both see the same tokens.
            initial_prompt = " " + initial_prompt.strip()
        # The batched pipeline's own defaults, pinned here so that the sequential and batched
        # code paths of faster-whisper cannot silently change what a job does.
        return TranscriptionOptions(
            beam_size=opts.beam_size,
            best_of=5,
            patience=1,
            length_penalty=1,
            repetition_penalty=1,
            no_repeat_ngram_size=0,
            log_prob_threshold=opts.log_prob_threshold,
            no_speech_threshold=opts.no_speech_threshold,
            compression_ratio_threshold=2.4,
            condition_on_previous_text=False,
            prompt_reset_on_temperature=0.5,
            temperatures=[0.0],
            initial_prompt=initial_prompt,
            prefix=None,
            suppress_blank=True,
            suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
            without_timestamps=not opts.timestamps,
            max_initial_timestamp=0.0,
            word_timestamps=opts.word_timestamps,
            prepend_punctuations="\"'“¿([{-",
            append_punctuations="\"'.。,，!！?？:：”)]}、",
            multilingual=False,
            max_new_tokens=None,
            clip_timestamps=[],
            hallucination_silence_threshold=None,
            hotwords=hotwords,
        )

    def _window_frames(self, frames: int) -> int:
        return window_frames(frames, self.config.whisper.window_step_s)

    def _pad(self, feats: list[np.ndarray], frames: int | None = None) -> np.ndarray:
        from faster_whisper.audio import pad_or_trim

        return np.stack([pad_or_trim(f, frames or 30 * FRAMES_PER_SECOND) for f in feats])

    def language_scores(self, encoded: Any) -> list[list[tuple[str, float]]]:
        """Per chunk, (language token, probability) pairs, best first: CTranslate2's
        detection head on an encoder output (multilingual models only)."""
        return self.model.model.detect_language(encoded)

    def _detect_languages(self, chunks: list[_ChunkRef]) -> list[tuple[str, float]]:
        """The most likely language of each chunk, from its encoder output at the 30 s
        window; that output is kept on the chunk, so its model batch does not encode it
        again (faster-whisper's own detect-then-transcribe encodes twice)."""
        encoded = self.model.encode(self._pad([c.features for c in chunks]))
        results = self.language_scores(encoded)
        for c, kept in zip(chunks, host_array(encoded), strict=True):
            c.encoded = kept
        return [(r[0][0][2:-2], float(r[0][1])) for r in results]

    def _forward(self, batch: list[_ChunkRef], language: str) -> list[list[dict]]:
        tokenizer = self._tokenizer(language)
        # Batch-mates share one prompt (plan_batches groups by it).
        options = self._transcription_options(tokenizer, batch[0].prompt)
        full = 30 * FRAMES_PER_SECOND
        prompt = self.model.get_prompt(
            tokenizer,
            tokenizer.encode(options.initial_prompt) if options.initial_prompt else [],
            without_timestamps=options.without_timestamps,
            hotwords=options.hotwords,
        )
        room = self.model.max_length - len(prompt)  # what Whisper's 448 positions leave

        def forward(
            chunks: list[_ChunkRef],
            frames: int,
            temperature: float = 0.0,
            kept: Sequence[np.ndarray | None] | None = None,
        ) -> list[list[dict]]:
            """``temperature`` > 0: sampled, the best of ``BEST_OF`` that is not degenerate."""
            # Chunk k sits at minute k + 1 of a made-up timeline, and its times are taken back
            # to the chunk's own below. With word_timestamps the pipeline aligns the words of
            # the whole batch on the encoder output it just computed (``add_word_timestamps``:
            # one alignment pass per model batch, none over the audio again), and it carries
            # the last speech time from one chunk to the next: a first word that ends long
            # after it is cut to twice the median word length (faster-whisper's fix for the
            # silence the first word after a pause absorbs). Every chunk here starts after a
            # pause, the VAD's, so each is placed long after the one before: the same rule
            # for every chunk, whichever recordings share its batch.
            meta = [
                {"offset": _CHUNK_SPACING_S * (k + 1), "duration": c.duration}
                for k, c in enumerate(chunks)
            ]
            feats = self._pad([c.features for c in chunks], frames)
            # Encoder outputs kept by language detection are at the 30 s window: reused
            # only by a pass at that window.
            if kept is None:
                kept = [c.encoded if frames == full else None for c in chunks]
            model: Any = (
                self.model
                if all(k is None for k in kept)
                else ReusedEncoderModel(self.model, kept, self._to_engine)
            )
            if temperature > 0:

                def accept(k: int, ids: list[int]) -> bool:
                    return check(tokenizer.decode(ids), len(ids), chunks[k].duration) is None

                model = SamplingModel(model, temperature, BEST_OF, accept)
            # A pipeline per batch: it keeps that last speech time, and batches run on several
            # threads here.
            # No chunk needs more tokens than its speech can hold (whisper_guard): a decode
            # that loops stops there instead of at Whisper's 448, and with it the batch, which
            # decodes as long as its longest member.
            cap = max(token_cap(c.duration) for c in chunks) + 1
            capped = dataclasses.replace(options, max_new_tokens=min(cap, room))
            outputs = self._pipeline_class(model).forward(feats, tokenizer, meta, capped)
            for m, output in zip(meta, outputs, strict=True):
                for seg in output:
                    for timed in [seg, *(seg.get("words") or [])]:
                        timed["start"] -= m["offset"]
                        timed["end"] -= m["offset"]
            return outputs

        frames = max(self._window_frames(c.frames) for c in batch)
        outputs = forward(batch, frames)
        if frames < full:
            # Whisper was trained on 30 s windows. Padded only to a shorter window, the
            # decoder sometimes starts the utterance over once it has said it ("Can you call
            # me back? Can you call me back?"): 2 of 55 short synthesized calls, 0 of 55 at
            # 30 s. The chunks whose text says a run of words twice in a row are decoded
            # again at the full window, the trained configuration.
            again = [i for i, out in enumerate(outputs) if repeats_itself(_text(out))]
            if again:
                redone = forward([batch[i] for i in again], full)
                for i, out in zip(again, redone, strict=True):
                    outputs[i] = out
        self._fall_back(batch, outputs, forward)
        for c in batch:
            c.encoded = None  # decoded: its encoder output is not needed again
        return outputs

    def _fall_back(
        self,
        batch: list[_ChunkRef],
        outputs: list[list[dict]],
        forward: Callable[..., list[list[dict]]],
    ) -> None:
        """Degenerate decodes (``workers.whisper_guard``) decoded again in place, as
        faster-whisper's sequential ``transcribe`` does: sampled at each of
        ``FALLBACK_TEMPERATURES`` in turn (best of ``BEST_OF``), the chunks that still need
        it batched together, at the full 30 s window, on one encoder pass. A chunk whose every
        attempt fails keeps its best one (the highest average log-probability, preferring
        those that do not compress too well, as faster-whisper picks) with the repetition cut,
        and its segments are marked ``degenerate``."""
        full = 30 * FRAMES_PER_SECOND
        why = {
            i: _degenerate(c, out) for i, (c, out) in enumerate(zip(batch, outputs, strict=True))
        }
        failing = [i for i, reason in why.items() if reason]
        if not failing:
            return
        tried = {i: [(outputs[i], why[i] or "")] for i in failing}
        encoded = [c.encoded for c in batch]  # language detection's, when it ran
        todo = [i for i in failing if encoded[i] is None]
        if todo:
            fresh = host_array(self.model.encode(self._pad([batch[i].features for i in todo])))
            for i, enc in zip(todo, fresh, strict=True):
                encoded[i] = enc
        for temperature in FALLBACK_TEMPERATURES:
            if not failing:
                break
            redone = forward(
                [batch[i] for i in failing], full, temperature, [encoded[i] for i in failing]
            )
            still = []
            for i, out in zip(failing, redone, strict=True):
                reason = _degenerate(batch[i], out)
                tried[i].append((out, reason or ""))
                if reason is None:
                    outputs[i] = out
                else:
                    still.append(i)
            failing = still
        for i in failing:
            clear = [t for t in tried[i] if t[1] != "compression"] or tried[i]
            best, _ = max(clear, key=lambda t: _avg_logprob(t[0]))
            outputs[i] = [_cut(seg) for seg in best]

    # -- the batch contract ---------------------------------------------------------------
    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = batch.to_pylist()
        n = len(rows)
        opts = self.config.whisper
        segments: list[list[dict]] = [[] for _ in range(n)]
        asr_s = [0.0] * n
        fills: list[list[float]] = [[] for _ in range(n)]
        languages: list[str | None] = [None] * n
        lang_probs: list[float | None] = [None] * n
        mismatch: list[bool | None] = [None] * n
        prompts: list[Prompt] = [(None, None)] * n
        failed: dict[int, str] = {}

        raw: list[tuple[int, dict, np.ndarray]] = []  # (row, DECODED chunk, its buffer)
        hints: list[str] = [""] * n
        for i, row in enumerate(rows):
            if row["status"] != "ok":
                continue
            hint = row.get("language") or opts.language
            mismatch[i] = False
            if not self.multilingual:
                # An English-only model can only write English: the row says so
                # (language_mismatch) rather than passing off the forced "en" as the answer;
                # the driver warns once per run (jobs.transcribe).
                mismatch[i] = not is_english(hint)
                hint = "en"
            if hint:
                languages[i], lang_probs[i] = hint, 1.0
            prompts[i] = self.item_prompt(row)
            hints[i] = hint or ""
            raw += [
                (i, ch, np.frombuffer(ch["features"], np.float32)) for ch in row["chunks"] or []
            ]

        chunks: list[_ChunkRef] = []
        first_chunk: dict[int, _ChunkRef] = {}
        for (i, ch, _), feats in zip(raw, self._chunk_features(raw, asr_s), strict=True):
            clips = [tuple(c) for c in ch["clips"]]
            ref = _ChunkRef(i, ch["channel"], clips, feats, hints[i], prompts[i])
            chunks.append(ref)
            first_chunk.setdefault(i, ref)

        # Language detection for multilingual models without a hint, batched like the rest.
        undetected = [i for i in first_chunk if languages[i] is None]
        for start in range(0, len(undetected), opts.batch_size):
            ids = undetected[start : start + opts.batch_size]
            t0 = time.perf_counter()
            detected = self._detect_languages([first_chunk[i] for i in ids])
            share = (time.perf_counter() - t0) / len(ids)
            for i, (lang, prob) in zip(ids, detected, strict=True):
                languages[i], lang_probs[i] = lang, prob
                asr_s[i] += share
        for c in chunks:
            c.language = c.language or languages[c.row] or "en"

        # Longest window, then longest audio, first: the batcher serves a call's first chunk
        # in the part that holds it, so that part is the call's costliest, and its short
        # chunks come last.
        chunks.sort(key=lambda c: (-self._window_frames(c.frames), -c.duration))
        for done in self.batcher.run(chunks):
            c = done.chunk
            asr_s[c.row] += done.seconds
            fills[c.row].append(done.fill)
            if done.error is not None:
                failed[c.row] = done.error
            segments[c.row].extend(self._segments(c, done.output, rows[c.row]))

        out_rows = []
        for i, row in enumerate(rows):
            out_rows.append(
                self._row(
                    row,
                    segments[i],
                    languages[i],
                    lang_probs[i],
                    asr_s[i],
                    fills[i],
                    failed.get(i),
                )
            )
            out_rows[-1]["language_mismatch"] = (
                mismatch[i] if out_rows[-1]["status"] == "ok" else None
            )
            out_rows[-1]["options"] = self._options_json(prompts[i])
        return pa.Table.from_pylist(out_rows, schema=WHISPER_OUTPUT)

    def item_prompt(self, row: dict) -> Prompt:
        """(initial_prompt, hotwords) for a recording: its manifest columns, else the job's."""
        opts = self.config.whisper
        return (
            row.get("initial_prompt") or opts.initial_prompt,
            row.get("hotwords") or opts.hotwords,
        )

    def _options_json(self, prompt: Prompt) -> str:
        """The row's ``options``: the actor's, with the prompt its recording was decoded with."""
        opts = self.config.whisper
        if prompt == (opts.initial_prompt, opts.hotwords):
            return self.options_json
        initial_prompt, hotwords = prompt
        effective = {
            **self.effective_options,
            "initial_prompt": initial_prompt,
            "hotwords": hotwords,
        }
        return json.dumps(effective, sort_keys=True)

    def _forward_isolating(
        self, part: list[_ChunkRef], language: str, failed: dict[int, str]
    ) -> list[list[dict]]:
        """One model batch; if it raises, the chunks are run one by one so that only the
        recording at fault fails (``failed``: id(chunk) -> why)."""
        try:
            return self._forward(part, language)
        except Exception:
            return self._forward_one_by_one(part, language, failed)

    def _forward_one_by_one(self, part, language, failed) -> list[list[dict]]:
        """A batch raised: isolate the chunk at fault so its recording alone fails."""
        outputs: list[list[dict]] = []
        errors = 0
        last: Exception | None = None
        for c in part:
            try:
                outputs.extend(self._forward([c], language))
            except Exception as exc:
                errors += 1
                last = exc
                failed[id(c)] = f"{type(exc).__name__}: {exc}"[:500]
                outputs.append([])
        if errors == len(part) and len(part) > 1:
            # Every chunk fails on its own too: the engine is broken, not the input.
            raise RuntimeError(f"Whisper engine failed on every chunk of a batch: {last}") from last
        return outputs

    def _segments(self, chunk: _ChunkRef, output: list[dict], row: dict) -> list[dict]:
        opts = self.config.whisper
        # Labels name channels transcribed apart: a one-channel recording in a job with
        # labels is not split (the decode stage), and its one voice is no labelled party.
        labels = (row.get("channel_labels") or []) if row.get("_split") else []
        speaker = labels[chunk.channel] if chunk.channel < len(labels) else None
        if speaker is None and row.get("_split"):
            speaker = f"ch{chunk.channel}"
        result = []

        def at(start: float, end: float, whole: bool = False) -> tuple[float, float]:
            # chunk times → recording times (this channel's), a word inside one VAD clip
            a, b = span_to_original_time(chunk.clips, start, end, whole)
            return round(a, 3), round(b, 3)

        voiced = voiced_frames(chunk.features) if opts.word_timestamps else None
        for seg in output:
            text = seg["text"].strip()
            # Whisper's own rule against hallucinated text on non-speech.
            if not text or (
                seg["no_speech_prob"] > opts.no_speech_threshold
                and seg["avg_logprob"] < opts.log_prob_threshold
            ):
                continue
            words: list[tuple[dict, float, float]] | None = None
            if opts.word_timestamps:
                trim_to_speech(seg["words"], voiced)
                # Each word through the clip it was spoken in, never across a VAD gap.
                words = [(w, *at(w["start"], w["end"])) for w in seg["words"]]
            if words:  # the segment is its words, in the recording's time too
                start, end = words[0][1], words[-1][2]
            else:
                start, end = at(seg["start"], seg["end"], whole=True)
            result.append(
                {
                    "start": start,
                    "end": end,
                    "text": text,
                    "channel": chunk.channel,
                    "speaker": speaker,
                    "avg_logprob": float(seg["avg_logprob"]),
                    "no_speech_prob": float(seg["no_speech_prob"]),
                    "degenerate": bool(seg.get("degenerate")),
                    "words": [
                        {
                            "word": w["word"].strip(),
                            "start": w_start,
                            "end": w_end,
                            "probability": float(w["probability"]),
                        }
                        for w, w_start, w_end in words
                    ]
                    if words is not None
                    else None,
                }
            )
        return result

    def _diarized(self, segments: list[dict], turns: list[dict]) -> list[dict]:
        """A mono call's segments given their speakers: each word to the speaker whose turn
        it overlaps most, segments split where the speaker changes, then named by role."""
        from overnight.workers.diarize.assign import (
            assign_speakers,
            first_speaker_roles,
            relabel,
        )

        segments = assign_speakers(segments, turns)
        if self.config.speaker_roles:
            segments = relabel(segments, first_speaker_roles(turns, self.config.speaker_roles))
        return segments

    def _row(self, row, segments, language, lang_prob, asr_s, fills, failure) -> dict:
        segments.sort(key=lambda s: (s["start"], s["channel"]))
        split = bool(row.get("_split"))
        turns = row.get("_speaker_turns")
        diarized = not split and turns is not None and row["status"] == "ok"
        if diarized:
            segments = self._diarized(segments, turns)
        if split:
            text = "\n".join(f"{s['speaker']}: {s['text']}" for s in segments)
        elif diarized:
            from overnight.workers.diarize.assign import dialogue_text

            text = dialogue_text(segments)
        else:
            text = " ".join(s["text"] for s in segments)
        status, code, message = row["status"], row["error_code"], row["error_message"]
        if status == "ok" and failure is not None:
            status, code, message = "error", ErrorCode.MODEL_ERROR.value, failure
        ok = status == "ok"
        # Split-channel calls: one speaker a channel is what makes talk, overtalk and
        # interruptions attributable. Words when the row has them, else segment timings.
        analytics = call_analytics(segments, row["duration_s"] or 0.0) if ok and split else None
        if ok and diarized:
            from overnight.workers.diarize.assign import mono_call_analytics

            analytics = mono_call_analytics(segments, row["duration_s"] or 0.0)
        return {
            "item_id": row["item_id"],
            "status": status,
            "error_code": code,
            "error_message": message,
            "text": text if ok else None,
            "language": language if ok else None,
            "language_probability": lang_prob if ok else None,
            "duration_s": row["duration_s"],
            "speech_s": row["speech_s"],
            "segments": segments if ok else [],
            "degenerate": any(s["degenerate"] for s in segments) if ok else None,
            "analytics": analytics,
            "num_chunks": len(row["chunks"] or []),
            "model": self.config.whisper.model,
            "options": self.options_json,
            "worker": self.worker,
            "asr_s": asr_s,  # asr_resource and asr_units are the runner's (jobs.run.stage)
            "batch_fill": float(np.mean(fills)) if fills else None,
        }
