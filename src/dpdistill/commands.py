"""The commands methods declare (options.py), by name: the module whose `COMMAND` declares each, and its summary.
Light on purpose: the command line lists them, and `dpdistill --help` prints, without importing any method; a
command's declaration is imported when it runs or its own help is asked. A method with its own command adds its
line here. A party's command of a federation across machines is two words (`federated serve`)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dpdistill.options import CommandSpec


@dataclass(frozen=True)
class Declared:
    module: str  # where the declaration lives
    summary: str  # the first line of its help
    docs: str  # its page under docs/, which shows its option table
    attribute: str = "COMMAND"  # the declaration's name in its module

    def spec(self) -> "CommandSpec":
        return getattr(importlib.import_module(self.module), self.attribute)


DECLARED: dict[str, Declared] = {
    "transcribe": Declared("dpdistill.methods.dpsd_family", "Convert a teacher into a private student and "
                                                            "generator.", "methods/dpsd.md"),
    "pate": Declared("dpdistill.methods.pate", "PATE: an ensemble labels public images by noisy votes. A student "
                                               "learns from the answers.", "methods/pate.md"),
    "train-private": Declared("dpdistill.methods.dpsgd", "Train the student on the private data directly with DP.",
                              "methods/dpsgd.md"),
    "federated": Declared("dpdistill.federated.method", "Data owners answer through secure aggregation (Flower).",
                          "methods/federated.md"),
    "federated serve": Declared("dpdistill.federated.parties", "A federation's server, owners on other machines.",
                                "methods/federated.md", "SERVE"),
    "federated finish": Declared("dpdistill.federated.parties", "A served federation's student, from its journal.",
                                 "methods/federated.md", "FINISH"),
    "synthesize": Declared("dpdistill.methods.datalens", "Make a private labelled synthetic set from the data.",
                           "methods/datalens.md"),
    "release": Declared("dpdistill.methods.release", "Train a DP teacher and transcribe it for free.",
                        "methods/release.md"),
    "dgd": Declared("dpdistill.methods.dgd", "DGD: noisy votes and a VAE teach a student.", "methods/dgd.md"),
}
