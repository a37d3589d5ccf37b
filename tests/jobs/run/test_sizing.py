"""``auto`` pool sizing (jobs/run/sizing.py): the model gets what the CPU stage does not need,
one actor per GPU, and an explicit value always wins."""

from __future__ import annotations

from overnight.jobs.process import llm_pool
from overnight.jobs.run import sizing
from overnight.jobs.spec import ProcessOptions, TranscribeOptions
from overnight.jobs.transcribe import whisper_options, whisper_pool


def _cores_of_model(pool: sizing.Pool) -> int:
    return pool.model_workers * pool.threads


def test_auto_on_the_local_2_core_ray_gives_the_model_at_least_one_and_a_half_cores(ray_local):
    nodes = sizing.nodes_of_cluster()
    assert sum(n.cpus for n in nodes) == 2  # the session's Ray (tests/conftest.py)
    pool = whisper_pool(TranscribeOptions(), "cpu", nodes)
    assert pool.actors == 1
    assert pool.cpus_per_actor >= 1.5
    assert _cores_of_model(pool) >= 1.5
    # What is left fits at least one decode task beside the actor, or the model starves.
    assert 2 - pool.cpus_per_actor >= pool.task_cpus
    opts = whisper_options(TranscribeOptions(), "cpu", pool)
    assert opts.model_workers * opts.cpu_threads >= 1.5
    assert opts.units == pool.cpus_per_actor  # what the ledger prices
    assert set(pool.auto) >= {"actors", "cpus_per_actor", "task_cpus", "model_workers"}
    assert "auto (" in pool.describe("Whisper", "decode")


def test_explicit_values_are_kept_and_only_the_rest_is_sized():
    nodes = [sizing.Node(cpus=2)]
    opts = TranscribeOptions(actors=2, cpus_per_actor=1.0, decode_cpus=0.5, model_workers=1)
    pool = whisper_pool(opts, "cpu", nodes)
    assert (pool.actors, pool.cpus_per_actor, pool.task_cpus, pool.model_workers) == (
        2,
        1.0,
        0.5,
        1,
    )
    assert pool.auto == ("threads",)
    assert sizing.record(pool)["auto"] == ["cpu_threads"]
    # Only the actor count given: the model's CPUs are shared among them.
    two = whisper_pool(TranscribeOptions(actors=2), "cpu", [sizing.Node(cpus=16)])
    assert two.actors == 2 and two.cpus_per_actor == 7.0
    # Only the share given: as many actors as fit.
    many = whisper_pool(TranscribeOptions(cpus_per_actor=2.0), "cpu", [sizing.Node(cpus=16)])
    assert many.actors == 7 and many.cpus_per_actor == 2.0


def test_gpu_nodes_get_one_actor_per_gpu_and_cpu_only_clusters_one_per_node():
    gpu = whisper_pool(TranscribeOptions(), "cuda", [sizing.Node(16, 4), sizing.Node(16, 4)])
    assert (gpu.actors, gpu.gpus_per_actor, gpu.cpus_per_actor, gpu.model_workers) == (8, 1, 1, 1)
    assert gpu.task_cpus == sizing.GPU_NODE_TASK_CPUS
    cpu = whisper_pool(TranscribeOptions(), "cpu", [sizing.Node(0), sizing.Node(8), sizing.Node(8)])
    assert cpu.actors == 2 and cpu.cpus_per_actor == 7.0 and cpu.model_workers == 7
    # A light-decoder Whisper runs two model workers per GPU (measured: 1.09-1.36x one), a
    # deep one one; an explicit value wins either way.
    turbo = TranscribeOptions(model="large-v3-turbo")
    assert whisper_pool(turbo, "cuda", [sizing.Node(16, 1)]).model_workers == 2
    assert (
        whisper_pool(
            TranscribeOptions(model="distil-large-v3"), "cuda", [sizing.Node(16, 1)]
        ).model_workers
        == 2
    )
    assert (
        whisper_pool(
            TranscribeOptions(model="large-v3"), "cuda", [sizing.Node(16, 1)]
        ).model_workers
        == 1
    )
    one = TranscribeOptions(model="large-v3-turbo", model_workers=1)
    assert whisper_pool(one, "cuda", [sizing.Node(16, 1)]).model_workers == 1
    assert whisper_pool(turbo, "cpu", [sizing.Node(8)]).model_workers == 7  # CPU: one per core
    # No node yet (an autoscaling cluster before its first worker): Ray's default shape.
    assert whisper_pool(TranscribeOptions(), "cpu", []).cpus_per_actor == 1.0


def test_the_llm_pool_is_sized_by_the_same_rule_with_one_engine_per_actor():
    pool = llm_pool(ProcessOptions(), "cpu", [sizing.Node(cpus=2)])
    assert (pool.actors, pool.cpus_per_actor, pool.model_workers, pool.threads) == (1, 1.5, 1, 2)
    assert sizing.record(pool)["extract_cpus"] == sizing.CPU_TASK_CPUS
    gpu = llm_pool(ProcessOptions(), "cuda", [sizing.Node(32, 8)])
    assert gpu.actors == 8 and gpu.threads == 0
    kept = llm_pool(ProcessOptions(actors=3, cpus_per_actor=0.5), "cpu", [sizing.Node(cpus=2)])
    assert (kept.actors, kept.cpus_per_actor) == (3, 0.5)


def test_actors_that_fit_leave_each_node_the_decode_tasks_reserve():
    from overnight.jobs.run.sizing import Node, Pool, actors_that_fit

    def pool(cpus: float, gpus: float = 0.0) -> Pool:
        return Pool(
            actors=99,
            cpus_per_actor=cpus,
            gpus_per_actor=gpus,
            task_cpus=0.25,
            model_workers=1,
            threads=1,
            auto=(),
            basis="",
        )

    # 2 cores give the model 1.5: one actor of 1 CPU (two left the decode tasks none)
    assert actors_that_fit(pool(1.0), [Node(2)]) == 1
    assert actors_that_fit(pool(0.75), [Node(2)]) == 2
    assert actors_that_fit(pool(64.0), [Node(2)]) == 0
    # a GPU actor needs its GPU too, on the same node
    assert actors_that_fit(pool(1.0, 1.0), [Node(16, 2), Node(16, 0)]) == 2
