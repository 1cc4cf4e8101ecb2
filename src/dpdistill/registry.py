"""Every method by name: what the CLI and the Python API choose from, and what `dpdistill.methods()` lists. It sits
above `methods/` and `federated/`, whose methods it names."""

from __future__ import annotations

from dpdistill.errors import ConfigError
from dpdistill.federated.method import Federated
from dpdistill.methods.base import Method
from dpdistill.methods.datalens import DataLens
from dpdistill.methods.dgd import DGD
from dpdistill.methods.dpdfd_direct import DPDFDDirect
from dpdistill.methods.dpmerf import DpMerf
from dpdistill.methods.dpsd_family import TRANSCRIPTIONS
from dpdistill.methods.dpsgd import DPSGD
from dpdistill.methods.pate import PATE
from dpdistill.methods.private_training import PrivateTrainingMethod
from dpdistill.methods.release import PrivateRelease

METHODS: dict[str, Method] = {**TRANSCRIPTIONS, **{method.name: method for method in (
    PATE(), DPSGD(), DPDFDDirect(), DataLens(), DpMerf(), Federated(), DGD(), PrivateRelease())}}


def method_named(name: str, kind: type[Method] = Method) -> Method:
    """The method called `name`, refused unless it is a `kind` (the kind a command runs)."""
    choices = [known for known, method in METHODS.items() if isinstance(method, kind)]
    if name not in choices:
        where = f" (`dpdistill {METHODS[name].command}` runs it)" if name in METHODS else ""
        raise ConfigError(f"unknown method {name!r}{where}: choose one of {', '.join(choices)}")
    return METHODS[name]


def private_training_method(name: str) -> PrivateTrainingMethod:
    return method_named(name, PrivateTrainingMethod)


def methods() -> list[dict[str, str]]:
    """Each method's name, one-line description, what it needs, its paper and presets."""
    return [method.describe() for method in METHODS.values()]
