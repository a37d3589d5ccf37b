"""Specifications for ``on_ray.ensure_ray`` as the Python API meets it: a process holds one
Ray, whichever thread or call starts it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from overnight.jobs.errors import ConfigError
from overnight.jobs.run import on_ray


def test_an_address_other_than_the_ray_this_process_holds_is_refused_not_ignored(ray_local):
    # The API left a first call's Ray running; a later call's ray_address ran on it silently.
    with pytest.raises(ConfigError) as caught:
        on_ray.ensure_ray("127.0.0.1:1")
    assert "already connected to the Ray at" in str(caught.value)
    gcs = ray_local.get_runtime_context().gcs_address
    on_ray.ensure_ray(gcs)  # the Ray it holds, named: fine
    on_ray.ensure_ray(None)


def test_two_threads_starting_ray_at_once_share_one_start():
    script = textwrap.dedent(
        """
        import threading
        import ray
        from overnight.jobs.run import on_ray

        failures = []

        def start():
            try:
                on_ray.ensure_ray(None)
            except BaseException as exc:
                failures.append(repr(exc))

        threads = [threading.Thread(target=start) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print("failures:", failures, "initialized:", ray.is_initialized())
        on_ray.stop_local_ray()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180
    )
    assert "failures: [] initialized: True" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("address", [None, "auto"])
def test_a_ray_that_fails_to_start_is_one_paragraph_saying_what_to_do(monkeypatch, address):
    import ray

    from overnight.jobs.errors import ClusterUnreachable

    def timed_out(**_: object) -> None:
        raise Exception("The current node timed out during startup. This could happen because")

    monkeypatch.setattr(ray, "init", timed_out)
    with pytest.raises(ClusterUnreachable) as caught:
        on_ray._start(address, verbose=False)
    message = str(caught.value)
    assert "timed out during startup" in message and "rerun" in message, message
    assert ("start on this machine" in message) is (address is None), message
