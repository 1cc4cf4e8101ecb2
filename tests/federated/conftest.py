"""Ray, the engine of Flower's simulation, started once for a worker's consecutive simulations."""

import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def _ray_outlives_a_simulation():
    """Flower's Ray backend starts Ray where none runs and stops it after every simulation: a start is a dozen
    processes and seconds of both cores, paid again by each simulation of a test that resumes one. Here a
    simulation stops only its own actors (its ClientApps' processes), as Flower's backend does before stopping Ray;
    Ray stops after the test (`pytest_runtest_teardown`)."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    def terminate_actors_only(backend: RayBackend) -> None:
        if backend.pool:
            backend.pool.terminate_all_actors()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RayBackend, "terminate", terminate_actors_only)
        yield


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Ray stops after a test unless the worker's next test simulates too: an idle Ray (its log monitor, raylet
    and prestarted workers) takes 3 to 4 s of CPU a minute, which a Ray kept to the session's end spent on the
    tests that followed."""
    if nextitem is not None and nextitem.get_closest_marker("simulation"):
        return
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
