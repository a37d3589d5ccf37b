"""The vLLM backend's long-prompt gate, on asyncio alone (the engine it guards is exercised
for real in test_llm_vllm.py)."""

from __future__ import annotations

import asyncio
import time

from overnight.workers.llm.vllm_backend import _LongPromptGate

STEP = 100  # the engine step's token budget: prompts above it are long


async def _request(gate: _LongPromptGate, tokens: int, seconds: float, log: list) -> None:
    await gate.enter(tokens)
    log.append(("in", tokens, time.monotonic()))
    await asyncio.sleep(seconds)
    gate.leave(tokens)
    log.append(("out", tokens, time.monotonic()))


def _at(log: list, event: str, tokens: int) -> float:
    return next(t for e, n, t in log if e == event and n == tokens)


def test_short_prompts_never_wait_and_a_long_one_waits_until_the_short_ones_are_done():
    gate = _LongPromptGate(STEP, grace_s=0.0, hold_s=10.0)
    log: list = []

    async def scenario() -> None:
        await asyncio.gather(
            _request(gate, 50, 0.3, log),
            _request(gate, 60, 0.5, log),
            _request(gate, 500, 0.1, log),
        )

    t0 = time.monotonic()
    asyncio.run(scenario())
    assert _at(log, "in", 50) - t0 < 0.05 and _at(log, "in", 60) - t0 < 0.05
    assert _at(log, "in", 500) >= _at(log, "out", 60)
    assert gate.short == 0


def test_a_long_prompt_that_arrives_first_waits_its_grace_for_shorter_work_arriving_with_it():
    gate = _LongPromptGate(STEP, grace_s=0.2, hold_s=10.0)
    log: list = []

    async def scenario() -> None:
        long = asyncio.ensure_future(_request(gate, 500, 0.1, log))
        await asyncio.sleep(0.05)  # the next call lands a moment later
        await asyncio.gather(long, _request(gate, 50, 0.4, log))

    asyncio.run(scenario())
    assert _at(log, "in", 500) >= _at(log, "out", 50)


def test_a_long_prompt_waits_at_most_its_hold_under_a_steady_stream_of_short_ones():
    gate = _LongPromptGate(STEP, grace_s=0.0, hold_s=0.3)
    log: list = []

    async def stream() -> None:
        shorts = []
        for _ in range(8):  # overlapping short requests: one is always in flight
            shorts.append(asyncio.ensure_future(_request(gate, 50, 0.2, log)))
            await asyncio.sleep(0.1)
        await asyncio.gather(*shorts)

    async def scenario() -> None:
        feeder = asyncio.ensure_future(stream())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        await _request(gate, 500, 0.0, log)
        assert 0.25 < _at(log, "in", 500) - started < 0.6
        await feeder

    asyncio.run(scenario())
    assert gate.short == 0


def _round_then_retry(gate: _LongPromptGate, log: list) -> None:
    """A call's first round, then its retry a moment after the reply, as the actor's thread
    sends it (the long prompt waits from just after the first round began)."""

    async def call() -> None:
        await _request(gate, 50, 0.2, log)
        await asyncio.sleep(0.02)  # the actor reads the replies and sends the retry
        await _request(gate, 60, 0.3, log)

    async def scenario() -> None:
        first = asyncio.ensure_future(call())
        await asyncio.sleep(0.05)
        await asyncio.gather(first, _request(gate, 500, 0.0, log))

    asyncio.run(scenario())


def test_a_calls_next_round_sent_right_after_its_reply_goes_in_before_a_waiting_long_prompt():
    log: list = []
    _round_then_retry(_LongPromptGate(STEP, grace_s=0.0, hold_s=10.0, settle_s=0.2), log)
    assert _at(log, "in", 500) >= _at(log, "out", 60)
    # Without the settling time the long prompt slips in between the two rounds.
    log = []
    _round_then_retry(_LongPromptGate(STEP, grace_s=0.0, hold_s=10.0, settle_s=0.0), log)
    assert _at(log, "out", 50) <= _at(log, "in", 500) < _at(log, "in", 60)
