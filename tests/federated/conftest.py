"""Ray, the engine of Flower's simulation, started once for a worker's consecutive simulations, with one process
for the simulated owners."""

import sys

import pytest


@pytest.fixture(scope="session", autouse=True)
def _ray_outlives_a_simulation():
    """Flower's Ray backend starts Ray where none runs and stops it after every simulation: a start is a dozen
    processes and seconds of both cores, paid again by each simulation of a test that resumes one. Here a
    simulation stops only its own actors (its ClientApps' processes), as Flower's backend does before stopping Ray;
    Ray stops after the test (`pytest_runtest_teardown`). Ray is told of one CPU, so one actor answers for all the
    owners in turn: each actor is a process that imports torch, Flower and the accountant (seconds of a core) to
    answer a few small teachers (the six simulating tests alone, both cores' busy time: 214 core-seconds with an
    actor a core, 150 with one actor; the same protocol either way)."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    def terminate_actors_only(backend: RayBackend) -> None:
        if backend.pool:
            backend.pool.terminate_all_actors()

    flowers_init = RayBackend.init_ray

    def one_owner_process(backend: RayBackend, backend_config: dict) -> None:
        init_args = {**backend_config.get(backend.init_args_key, {}), "num_cpus": 1}
        flowers_init(backend, {**backend_config, backend.init_args_key: init_args})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RayBackend, "terminate", terminate_actors_only)
        patch.setattr(RayBackend, "init_ray", one_owner_process)
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
