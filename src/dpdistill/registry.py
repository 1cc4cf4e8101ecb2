"""Every method by name, as `dpdistill.methods()` lists them. It sits above `methods/` and `federated/`, whose
methods it names (each command chooses among its own methods where it is declared: commands.py)."""

from __future__ import annotations

from dpdistill.federated.method import Federated
from dpdistill.methods.base import Method
from dpdistill.methods.datalens import SYNTHESIS_METHODS
from dpdistill.methods.dgd import DGD
from dpdistill.methods.dpsd_family import TRANSCRIPTIONS
from dpdistill.methods.dpsgd import PRIVATE_TRAINERS
from dpdistill.methods.pate import PATE
from dpdistill.methods.release import PrivateRelease

# the methods that share a command are listed where it chooses among them
METHODS: dict[str, Method] = {**TRANSCRIPTIONS, "pate": PATE(), **PRIVATE_TRAINERS, **SYNTHESIS_METHODS, **{
    method.name: method for method in (Federated(), DGD(), PrivateRelease())}}


def methods() -> list[dict[str, str]]:
    """Each method's name, one-line description, what it needs, its paper and presets."""
    return [method.describe() for method in METHODS.values()]
