"""One module per method (dpsd, dpdfd, srr, pate, dpsgd, dpdfd_direct) behind one interface (base.py), by name in
registry.py.

The package is also callable: `dpdistill.methods()` lists every method (name, one-line description, what it needs,
its paper, the command that runs it and its presets). A function of that name in `dpdistill/__init__.py` would be
replaced by this package as soon as it is imported, so the listing lives on the package itself; the methods are
imported on the first call (they pull in PyTorch and Opacus).
"""

from __future__ import annotations

import sys
from types import ModuleType


class _ListingPackage(ModuleType):
    def __call__(self) -> list[dict[str, str]]:
        from dpdistill.methods.registry import methods as registered

        return registered()


sys.modules[__name__].__class__ = _ListingPackage
