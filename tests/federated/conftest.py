"""Ray, the engine of Flower's simulation, started once per test worker for all its simulations."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _one_ray_per_worker():
    """Flower's Ray backend starts Ray where none runs and stops it after every simulation: on two cores a start
    is a dozen processes and about 8 s of both cores, paid again by each of a worker's simulations. Here a
    simulation stops only its own actors (its ClientApps' processes), as Flower's backend does before stopping Ray,
    and Ray stops once, after the worker's last test."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    def terminate_actors_only(backend: RayBackend) -> None:
        if backend.pool:
            backend.pool.terminate_all_actors()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RayBackend, "terminate", terminate_actors_only)
        yield
    import ray

    ray.shutdown()
