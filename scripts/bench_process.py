#!/usr/bin/env python
"""Side-by-side document benchmark, one process run, same documents, model and task.

(a) a one-document-at-a-time loop: the backend loaded once, ``run_task`` called with one
    document per call (what a plain script would do); CTranslate2 with ``--threads``
    threads (default: every core)
(b) vLLM only: the same first-round prompts submitted to the engine at once, as one raw
    ``llm.generate`` does (the engine's own ceiling), on the engine that (a) used
(c) overnight's document job (``jobs.process.run_process``: Ray Data, text extraction
    tasks, LLM actors that batch many documents per engine call), end to end: Ray's
    scheduling, actor start and model load included

The loops run first, before Ray starts. All run the same model (default: the embedded
SmolLM2-135M-Instruct; for vLLM in float32, eager mode, on CPU) on synthesized call
transcripts and support emails of about 50-300 words, plus ``--long-pages`` of one long
report, summarizing each in at most 30 words with at most 48 new tokens, greedy. For each
compute type it prints tokens per second (prompt and generated tokens, the engine's own
counts), the ratios (c)/(a) and (c)/(b) (for (c) also from its engine's ready time, since
(a) and (b) are timed on an engine already started), time to first result, the ok rows
(in (a) and (c) a summary passes overnight's checks to be ok: one that loops, echoes the
prompt or never finishes a sentence is an error; (b)'s raw texts are not checked), the share
of outputs identical to (a)'s, CPU seconds and peak memory (RSS of the whole process tree,
Ray's processes included; read from Linux /proc), with the load average next to every
figure: on a shared machine wall-clock throughput moves with the load.

    python scripts/bench_process.py --json bench-process.json           # CTranslate2, CPU
    python scripts/bench_process.py --backend vllm --docs 48 --long-pages 55   # vLLM, CPU
    python scripts/bench_process.py --backend vllm --model PATH --docs 256  # GPU (gpu_check.sh)

``--pipelines`` are the pipeline variants, ACTORSxTHREADS[/ITEMS_PER_CALL[/MAX_BATCH]]
(default ``2x1``: two actors of one CTranslate2 thread, each given half the documents in one
call; for vLLM one actor, its model on every core, as ``overnight process``'s sizing gives it
on a CPU node: ``1x2`` on 2 cores; on a GPU the threads do not matter). ``--quality`` also
extracts promised amounts (the promise_to_pay task) and counts exact matches per compute type.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SUMMARY_WORDS, MAX_NEW_TOKENS = 30, 48
# vLLM: the loop's engine and the pipeline actor's share one GPU in this one process run.
VLLM_MEMORY = 0.35

# -- the documents ---------------------------------------------------------------------------

NAMES = ("Maria Lopez", "James Carter", "Aisha Khan", "Tom Becker", "Li Wei", "Sofia Rossi")
AGENT = (
    "Thank you for calling Northwind billing, this is {agent}, how can I help you today?",
    "Can I have your account number and the postal code on the account, please?",
    "I see an overdue balance of {balance} dollars from the {month} invoice.",
    "I can set up a payment arrangement for you if that helps.",
    "Let me check the last payments on your file, one moment please.",
    "I have noted that, you will receive a confirmation email within the hour.",
    "Is there anything else I can help you with today?",
    "I am sorry about the inconvenience, I will escalate this to the technical team.",
    "The technician can come on {day} between nine and eleven in the morning.",
    "Your reference number for this call is {ref}.",
)
CUSTOMER = (
    "Hi, I am calling about my last bill, it looks much higher than usual.",
    "Sure, the account number is {ref} and I live at the same address as before.",
    "I was charged twice for the internet service this month.",
    "The connection keeps dropping every evening since last week.",
    "I never received the refund you promised me three weeks ago.",
    "Could you call me back tomorrow afternoon? I am driving right now.",
    "I want to cancel the premium plan at the end of this cycle.",
    "No, that is all, thank you for your help.",
)
PROMISE = "I can pay {amount} dollars on {day}, my salary comes in on Thursday."
EMAIL = (
    "I am writing about order {ref}, which was supposed to arrive on {day}.",
    "The package was delivered to the wrong address and the tracking page shows it as received.",
    "I paid {balance} dollars by card and I would like a full refund or a replacement.",
    "I have attached a photo of the damaged box and the invoice from {month}.",
    "This is the second time this has happened and I am starting to lose patience.",
    "Please let me know what you need from me to resolve this quickly.",
    "My phone number is on the account if it is easier to call me.",
    "I also noticed a late fee on my statement that I do not think is correct.",
    "I would appreciate a reply before the end of the week.",
    "Your mobile application shows an error whenever I try to sign in.",
)
DAYS = ("Monday", "Tuesday", "Friday", "the fifteenth", "next Wednesday")
MONTHS = ("March", "April", "May", "June")
AMOUNTS = (50, 75, 120, 200, 340)


def _fill(template: str, rng: random.Random, **fixed: Any) -> str:
    values = {
        "agent": rng.choice(NAMES).split()[0],
        "balance": rng.choice(AMOUNTS),
        "month": rng.choice(MONTHS),
        "day": rng.choice(DAYS),
        "ref": rng.randint(1000, 9999),
        **fixed,
    }
    return template.format(**values)


def _document(i: int, rng: random.Random) -> tuple[str, int | None]:
    """(text, promised amount or None): even numbers are call transcripts, odd are emails."""
    target = rng.randint(45, 285)
    words, lines = 0, []
    if i % 2 == 0:
        promise_at = rng.randint(1, 5) * 2 + 1 if i % 4 == 0 else -1
        amount = rng.choice(AMOUNTS)
        turn = 0
        while words < target or turn <= promise_at:
            if turn == promise_at:
                line = "Customer: " + _fill(PROMISE, rng, amount=amount)
            elif turn % 2 == 0:
                line = "Agent: " + _fill(rng.choice(AGENT), rng)
            else:
                line = "Customer: " + _fill(rng.choice(CUSTOMER), rng)
            lines.append(line)
            words += len(line.split())
            turn += 1
        return "\n".join(lines), (amount if promise_at >= 0 else None)
    lines = ["Subject: a problem with my account", "", "Hello,", ""]
    while words < target:
        line = _fill(rng.choice(EMAIL), rng)
        lines.append(line)
        words += len(line.split())
    return "\n".join([*lines, "", "Best regards,", rng.choice(NAMES)]), None


def make_corpus(
    folder: Path, n: int, seed: int = 0, long_pages: int = 0
) -> dict[str, dict[str, Any]]:
    """n .txt documents of about 50-300 words, plus one of ``long_pages`` pages of about 450
    words when asked; returns {name: {"text", "promise"}}."""
    refs_path = folder / "references.json"
    want = n + (1 if long_pages else 0)
    if refs_path.exists():
        refs: dict[str, dict[str, Any]] = json.loads(refs_path.read_text())
        if len(refs) == want:
            return refs
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "docs").mkdir(parents=True)
    rng = random.Random(seed)
    refs = {}
    for i in range(n):
        text, promise = _document(i, rng)
        name = f"doc_{i:05d}.txt"
        (folder / "docs" / name).write_text(text)
        refs[name] = {"text": text, "promise": promise}
    if long_pages:
        pages = []
        for page in range(long_pages):
            body = []
            while sum(len(x.split()) for x in body) < 450:
                body.append(_fill(rng.choice(EMAIL), rng))
            pages.append(f"Page {page + 1}\n" + " ".join(body))
        text = "\n\n".join(pages)
        (folder / "docs" / "long_report.txt").write_text(text)
        refs["long_report.txt"] = {"text": text, "promise": None}
    refs_path.write_text(json.dumps(refs))
    return refs


# -- measuring -------------------------------------------------------------------------------


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> tuple[int, float, int, float]:
    """(parent pid, start time in ticks, resident bytes, CPU seconds) from Linux /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is field 3 of proc(5): state; ppid is field 4, utime 14, stime 15,
    # starttime 22, rss (pages) 24.
    ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
    start, rss_pages = float(fields[19]), int(fields[21])
    return ppid, start, rss_pages * os.sysconf("SC_PAGE_SIZE"), (utime + stime) / _CLOCK_TICKS


class TreeMeter:
    """Peak resident memory and CPU seconds of this process and, with ``tree``, all its
    descendants (Ray's raylet, workers and actors), plus the 1-minute load average at start
    and end. Reads Linux /proc."""

    def __init__(self, tree: bool = True, interval: float = 0.1):
        self.pid = os.getpid()
        self.tree, self.interval, self.peak = tree, interval, 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, start time) -> cpu seconds
        self._stop = threading.Event()

    def _sample(self) -> None:
        stats = {}
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()] if self.tree else [self.pid]
        for pid in pids:
            # A process may end between listing and reading it.
            with contextlib.suppress(OSError, ValueError, IndexError):
                stats[pid] = _proc_stat(pid)
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in stats.items():
            children.setdefault(ppid, []).append(pid)
        total, todo = 0, [self.pid]
        while todo:
            pid = todo.pop()
            if pid not in stats:
                continue
            _, start, rss, cpu = stats[pid]
            total += rss
            self._cpu[(pid, start)] = cpu
            todo.extend(children.get(pid, []))
        self.peak = max(self.peak, total)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.interval)

    def __enter__(self) -> TreeMeter:
        self.load_start = os.getloadavg()[0]
        self._sample()
        self._cpu_start = dict(self._cpu)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.load_end = os.getloadavg()[0]
        # Processes that ended while running count up to their last sample.
        self.cpu_s = sum(v - self._cpu_start.get(k, 0.0) for k, v in self._cpu.items())


def summarize_task() -> Any:
    from overnight.workers.llm.tasks import TaskSpec

    return TaskSpec(kind="summarize", summary_words=SUMMARY_WORDS, max_new_tokens=MAX_NEW_TOKENS)


def run_loop(
    refs: dict[str, dict[str, Any]],
    backend_name: str,
    model: str | None,
    compute_type: str,
    threads: int,
) -> dict[str, dict]:
    """(a): one backend loaded once, one document per ``run_task`` call."""
    from overnight.workers.llm.adapter import load_backend
    from overnight.workers.llm.tasks import TaskInput, run_task

    if backend_name == "vllm":
        backend = VLLM_ENGINE["backend"]  # loaded once, outside the timed runs
    else:
        backend = load_backend(
            "ctranslate2", model, device="cpu", compute_type=compute_type, cpu_threads=threads
        )
    spec = summarize_task()
    out = {}
    started = time.perf_counter()
    for name, ref in refs.items():
        [result] = run_task(backend, spec, [TaskInput(name, ref["text"])])
        out[name] = {
            "text": result.output_text or "",
            "status": result.status,
            "input_tokens": result.input_tokens,
            "output_tokens": result.output_tokens,
            "done_s": time.perf_counter() - started,
        }
    if backend_name != "vllm":
        backend.close()
    return out


VLLM_ENGINE: dict[str, Any] = {}


def run_raw(refs: dict[str, dict[str, Any]]) -> dict[str, dict]:
    """(b) for vLLM: the same first-round prompts (each document's, or each of its chunks',
    summary prompt) submitted to the engine at once, as one raw ``llm.generate`` does: the
    engine's own ceiling."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    from overnight.workers.llm.tasks import summarize_messages

    backend = VLLM_ENGINE["backend"]
    spec = summarize_task()
    budget = backend.context_length - MAX_NEW_TOKENS - 200
    prompts, owners = [], []
    for name, ref in refs.items():
        chunks = backend.split_by_tokens(ref["text"], budget)
        for n, chunk in enumerate(chunks):
            part = f"Part {n + 1} of {len(chunks)}" if len(chunks) > 1 else None
            conv = summarize_messages(spec, chunk, SUMMARY_WORDS, part=part)
            ids = backend._tokenizer.encode(backend.render_chat(conv), add_special_tokens=False)
            prompts.append({"prompt_token_ids": ids})
            owners.append(name)
    params = SamplingParams(
        temperature=0,
        max_tokens=MAX_NEW_TOKENS,
        repetition_penalty=1.1,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )
    started = time.perf_counter()
    outputs = backend._engine.run(prompts, [params] * len(prompts), gated=False)
    done = time.perf_counter() - started
    out: dict[str, dict] = {}
    for name, (o, _) in zip(owners, outputs, strict=True):
        row = out.setdefault(
            name, {"text": "", "status": "ok", "input_tokens": 0, "output_tokens": 0}
        )
        row["text"] += o.outputs[0].text
        row["input_tokens"] += len(o.prompt_token_ids)
        row["output_tokens"] += len(o.outputs[0].token_ids)
        row["done_s"] = done  # one call: everything arrives at its end
    return out


def run_overnight(
    folder: Path,
    output: Path,
    backend_name: str,
    model: str | None,
    compute_type: str,
    variant: dict,
) -> dict[str, dict]:
    """(c): the document job on the folder, with this variant's actors and batching."""
    import pyarrow.dataset as pads

    from overnight.jobs.process import run_process
    from overnight.jobs.spec import build_spec

    spec = build_spec(
        overrides={
            "job": {
                "kind": "process",
                "input": str(folder / "docs"),
                "output": str(output),
                "progress": False,
            },
            "process": {
                "task": "summarize",
                "summary_words": SUMMARY_WORDS,
                "max_new_tokens": MAX_NEW_TOKENS,
                "backend": backend_name,
                "model": model,
                "device": "auto" if backend_name == "vllm" else "cpu",
                "compute_type": compute_type,
                "actors": variant["actors"],
                "cpu_threads": variant["threads"],
                "cpus_per_actor": variant["cpus_per_actor"],
                "extract_cpus": variant["extract_cpus"],
                "items_per_call": variant["items_per_call"],
                "max_batch_size": variant["max_batch_size"],
                "gpu_memory_utilization": VLLM_MEMORY,
                # vLLM's own context for the model, not the 16k cap: SmolLM2's is 8192.
                "max_model_len": None,
            },
        }
    )
    started = datetime.now(UTC)
    summary = run_process(spec)
    run_overnight.last_summary = summary  # type: ignore[attr-defined]
    rows = pads.dataset(str(output / "results"), format="parquet").to_table(
        columns=[
            "source_uri",
            "output_text",
            "status",
            "input_tokens",
            "output_tokens",
            "processed_at",
        ]
    )
    return {
        Path(r["source_uri"]).name: {
            **r,
            "text": r["output_text"] or "",
            "done_s": (r["processed_at"] - started).total_seconds(),
        }
        for r in rows.to_pylist()
    }


def last_summary_tokens() -> int:
    """Prompt plus generated tokens of the last pipeline run, from its run summary."""
    summary = run_overnight.last_summary  # type: ignore[attr-defined]
    return int(summary["input_tokens"] + summary["output_tokens"])


def measure(
    name: str, fn: Any, refs: dict[str, dict[str, Any]], summary_tokens: Any = None
) -> dict:
    """Run one variant, metering this process and its children: for the loops, which run
    before Ray starts, that is the loop alone (and vLLM's engine process); for a pipeline,
    Ray's processes too."""
    t0 = time.perf_counter()
    with TreeMeter() as meter:
        outputs = fn()
    wall = time.perf_counter() - t0
    tokens = (
        summary_tokens()
        if summary_tokens
        else sum(o["input_tokens"] + o["output_tokens"] for o in outputs.values())
    )
    ok = sum(1 for n in refs if outputs.get(n, {}).get("status") == "ok")
    prompt_tokens = sum(o.get("input_tokens") or 0 for o in outputs.values())
    generated = sum(o.get("output_tokens") or 0 for o in outputs.values())
    firsts = [o["done_s"] for o in outputs.values() if o.get("done_s") is not None]
    result = {
        "variant": name,
        "documents": len(refs),
        "ok": ok,
        "tokens": tokens,
        "prompt_tokens_per_s": round(prompt_tokens / wall, 2),
        "generated_tokens_per_s": round(generated / wall, 2),
        "first_result_s": round(min(firsts), 2) if firsts else None,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall, 2),
        "cpu_s": round(meter.cpu_s, 1),
        "tokens_per_cpu_s": round(tokens / meter.cpu_s, 2),
        "peak_rss_mb": round(meter.peak / 2**20),
        "load_1min": [round(meter.load_start, 1), round(meter.load_end, 1)],
        "outputs": {n: outputs.get(n, {}).get("text", "") for n in refs},
    }
    print(
        f"  {name:<44} {result['wall_s']:>7.1f} s {result['tokens_per_s']:>7.1f} tok/s "
        f"(prompt {result['prompt_tokens_per_s']:.1f}, generated "
        f"{result['generated_tokens_per_s']:.1f}), first result {result['first_result_s']} s  "
        f"{result['tokens_per_cpu_s']:>6.1f} tok/cpu-s  peak RSS {result['peak_rss_mb']:>5} MB  "
        f"ok {ok}/{len(refs)}  load {result['load_1min'][0]}->{result['load_1min'][1]}",
        flush=True,
    )
    return result


def identical(a: dict, b: dict) -> float:
    names = a["outputs"].keys()
    return sum(a["outputs"][n] == b["outputs"].get(n) for n in names) / max(1, len(names))


def parse_pipeline(text: str, docs: int, cpus: int, max_batch: int, vllm: bool = False) -> dict:
    """``ACTORSxTHREADS[/ITEMS_PER_CALL[/MAX_BATCH]]``; items per call default to an even
    share of the documents, so every actor gets work (vLLM: the job's own default, many
    small calls in flight at once)."""
    head, *rest = text.split("/")
    actors, threads = (int(x) for x in head.lower().split("x"))
    items: int | None = int(rest[0]) if rest and rest[0] else None
    if items is None and not vllm:
        items = math.ceil(docs / actors)
    batch = int(rest[1]) if len(rest) > 1 else max_batch
    # Ray CPUs are a reservation, the threads are what runs. Leave one logical CPU free:
    # Ray Data 2.60 lists the manifest files in a task of Ray's default 1 CPU (the read's
    # num_cpus does not reach it), and the actor pool starts first, so a pool holding more
    # than cpus - 1 stalls the job before its first document.
    return {
        "actors": actors,
        "threads": threads,
        "items_per_call": items,
        "max_batch_size": batch,
        "cpus_per_actor": round((cpus - 1) / actors, 2),
        "extract_cpus": 0.2,
        "label": f"{actors}x{threads}/{items or 'auto'}/{batch}",
    }


def quality(refs: dict[str, dict[str, Any]], compute_types: list[str], threads: int) -> dict:
    """promise_to_pay on the transcripts with a promise: share of exact amounts."""
    from overnight.workers.llm.adapter import load_backend
    from overnight.workers.llm.tasks import TaskInput, promise_to_pay, run_task

    docs = [(n, r) for n, r in refs.items() if r["promise"] is not None]
    scores = {}
    for ct in compute_types:
        backend = load_backend(
            "ctranslate2", None, device="cpu", compute_type=ct, cpu_threads=threads
        )
        results = run_task(backend, promise_to_pay(), [TaskInput(n, r["text"]) for n, r in docs])
        backend.close()  # type: ignore[attr-defined]
        exact = 0
        for (_, ref), res in zip(docs, results, strict=True):
            value = json.loads(res.output_json) if res.output_json else {}
            exact += value.get("amount") == ref["promise"]
        scores[ct] = {"exact": exact, "of": len(docs)}
        print(f"  quality {ct:<8} promise_to_pay amount exact {exact}/{len(docs)}", flush=True)
    return scores


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--docs", type=int, default=48)
    ap.add_argument("--backend", choices=("ctranslate2", "vllm"), default="ctranslate2")
    ap.add_argument("--model", default=None, help="default: the embedded SmolLM2-135M-Instruct")
    ap.add_argument(
        "--compute-types", default=None, help="default: float32,int8 (ctranslate2), auto (vllm)"
    )
    ap.add_argument(
        "--pipelines",
        default=None,
        help="ACTORSxTHREADS[/ITEMS_PER_CALL[/MAX_BATCH]], comma separated; default 2x1 "
        "(ctranslate2: two actors of one thread), 1xCORES (vllm: one actor; on CPU its model "
        "on every core, as the job's sizing gives it)",
    )
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 2, help="CTranslate2 threads for (a)"
    )
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--skip-loop", action="store_true", help="pipelines only (no ratio)")
    ap.add_argument("--quality", action="store_true", help="also score promise_to_pay amounts")
    ap.add_argument("--corpus", default=os.path.join(tempfile.gettempdir(), "overnight-bench-docs"))
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--long-pages", type=int, default=0, help="add one document of this many pages (~450 words)"
    )
    args = ap.parse_args()
    vllm = args.backend == "vllm"

    cpus = os.cpu_count() or 2
    corpus = Path(args.corpus) / f"n{args.docs}-long{args.long_pages}"
    refs = make_corpus(corpus, args.docs, long_pages=args.long_pages)
    words = [len(r["text"].split()) for r in refs.values()]
    compute_types = [
        c for c in (args.compute_types or ("auto" if vllm else "float32,int8")).split(",") if c
    ]
    pipelines = args.pipelines or (f"1x{cpus}" if vllm else "2x1")
    variants = [
        parse_pipeline(p, args.docs, cpus, args.max_batch_size, vllm)
        for p in pipelines.split(",")
        if p
    ]
    if vllm:
        for v in variants:
            v["cpus_per_actor"] = 1.0  # the GPU does the work; leave the CPUs to extraction
    where = (
        f"vLLM {args.model or 'SmolLM2-135M'}"
        if vllm
        else f"{args.model or 'SmolLM2-135M'} CTranslate2 CPU"
    )
    print(
        f"corpus: {len(refs)} documents, {min(words)}-{max(words)} words ({sum(words)} in all); "
        f"task summarize ({SUMMARY_WORDS} words, max {MAX_NEW_TOKENS} new tokens, greedy); "
        f"model {where}; {cpus} CPUs, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    # The loops first, with no Ray in the process tree: Ray's daemons would take a share
    # of the cores from them.
    loops: dict[str, dict] = {}
    raws: dict[str, dict] = {}
    for ct in compute_types:
        if vllm:
            from overnight.workers.llm.adapter import load_backend

            engine_started = time.perf_counter()
            VLLM_ENGINE["backend"] = load_backend(
                "vllm", args.model, compute_type=ct, gpu_memory_utilization=VLLM_MEMORY
            )
            engine_start_s = time.perf_counter() - engine_started
            print(f"  engine start for (a) and (b): {engine_start_s:.1f} s", flush=True)
        if not args.skip_loop:
            loops[ct] = measure(
                f"(a) {ct} one at a time" + ("" if vllm else f", {args.threads} threads"),
                lambda ct=ct: run_loop(refs, args.backend, args.model, ct, args.threads),
                refs,
            )
        if vllm:
            raws[ct] = measure(f"(b) {ct} one raw llm.generate", lambda: run_raw(refs), refs)
            raws[ct]["engine_start_s"] = round(engine_start_s, 2)
            VLLM_ENGINE.pop("backend").close()
    import ray

    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    work = Path(tempfile.mkdtemp(prefix="overnight-bench-process-"))
    results: list[dict] = [*loops.values(), *raws.values()]
    pipes: list[dict] = []
    for ct in compute_types:
        loop = loops.get(ct)
        for v in variants:
            out = work / f"{ct}-{v['label'].replace('/', '_')}"
            r = measure(
                f"(c) {ct} overnight {v['label']}",
                lambda ct=ct, v=v, out=out: run_overnight(
                    corpus, out, args.backend, args.model, ct, v
                ),
                refs,
                summary_tokens=last_summary_tokens,
            )
            s = run_overnight.last_summary  # type: ignore[attr-defined]
            r.update(
                variant_options=v,
                pipeline_s=s["pipeline_seconds"],
                model_busy_s=s["accelerator_seconds"],
            )
            print(
                f"      model busy {s['accelerator_seconds']:.1f} s of {s['pipeline_seconds']:.1f} s "
                f"pipeline wall ({v['actors']} actor(s))",
                flush=True,
            )
            if loop is not None:
                r["ratio"] = round(r["tokens_per_s"] / loop["tokens_per_s"], 2)
                r["ratio_cpu"] = round(r["tokens_per_cpu_s"] / loop["tokens_per_cpu_s"], 2)
                r["identical_to_loop"] = round(identical(loop, r), 3)
                print(
                    f"      ratio (c)/(a) {ct}: {r['ratio']:.2f}x tokens/s, "
                    f"{r['ratio_cpu']:.2f}x tokens/cpu-s; "
                    f"identical outputs {r['identical_to_loop']:.0%}",
                    flush=True,
                )
            # (a) and (b) are timed on an engine already started; (c)'s wall includes Ray's
            # start and the actor's engine start. From the moment its engine was ready (the
            # run's own startup timeline), (c) is on the same footing.
            st = s.get("startup") or {}
            ready_s = sum(
                st.get(k) or 0.0
                for k in ("list_s", "ray_s", "manifest_s", "actor_start_s", "model_load_s")
            )
            r["engine_ready_s"] = round(ready_s, 2)
            r["generated_tokens_per_s_after_ready"] = round(
                r["generated_tokens_per_s"] * r["wall_s"] / max(r["wall_s"] - ready_s, 1e-9), 2
            )
            print(
                f"      engine ready after {ready_s:.1f} s; from then "
                f"{r['generated_tokens_per_s_after_ready']:.1f} generated tokens/s",
                flush=True,
            )
            raw = raws.get(ct)
            if raw is not None:
                r["ratio_to_raw_generated"] = round(
                    r["generated_tokens_per_s"] / raw["generated_tokens_per_s"], 2
                )
                r["ratio_to_raw_generated_after_ready"] = round(
                    r["generated_tokens_per_s_after_ready"] / raw["generated_tokens_per_s"], 2
                )
                # The other equal footing: (b) as a script runs it, its engine start timed too.
                with_start = raw["wall_s"] + raw["engine_start_s"]
                r["ratio_to_raw_generated_with_its_start"] = round(
                    r["generated_tokens_per_s"]
                    / (raw["generated_tokens_per_s"] * raw["wall_s"] / with_start),
                    2,
                )
                print(
                    f"      ratio (c)/(b) {ct} from engine ready: "
                    f"{r['ratio_to_raw_generated_after_ready']:.2f}x generated tokens/s; "
                    f"whole run against (b) with its engine start ({with_start:.1f} s): "
                    f"{r['ratio_to_raw_generated_with_its_start']:.2f}x",
                    flush=True,
                )
                print(
                    f"      ratio (c)/(b) {ct}: {r['ratio_to_raw_generated']:.2f}x generated "
                    f"tokens/s; (b)/(a) {raw['tokens_per_s'] / loop['tokens_per_s']:.2f}x"
                    if loop
                    else "",
                    flush=True,
                )
            results.append(r)
            pipes.append(r)
    if len(loops) > 1:
        (ca, la), (cb, lb) = list(loops.items())[:2]
        print(f"  (a) {ca} vs {cb}: identical outputs {identical(la, lb):.0%}")
    if loops and pipes:
        best_a = max(loops.values(), key=lambda r: r["tokens_per_s"])
        best_b = max(pipes, key=lambda r: r["tokens_per_s"])
        print(
            f"  best (c) {best_b['variant'][4:]} vs best (a) {best_a['variant'][4:]}: "
            f"{best_b['tokens_per_s'] / best_a['tokens_per_s']:.2f}x tokens/s"
        )
    ray.shutdown()
    scores = quality(refs, compute_types, args.threads) if args.quality and not vllm else None
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"results": results, "quality": scores, "args": vars(args), "cpus": cpus}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
