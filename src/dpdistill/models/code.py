"""The Python code of a user's model: a factory file (`path/to/file.py:callable`) and the modules and packages
beside it, importable wherever the model is built, copied, pickled or loaded again, and kept beside a saved model.

A factory file runs as `python path/to/file.py` would: the modules beside it (and the folder above its outermost
package) importable under their own names (`from blocks import ConvBlock`). Those modules stay loaded afterwards,
so the model's classes keep the names pickle looks them up by (Opacus' ModuleValidator.fix copies a model through
torch.save; so do deepcopy's fallbacks and process pools), and their folders stay at the end of sys.path, so a
process started from this one (multiprocessing's spawn) imports them too. One process holds one module per name:
where two model folders hold a module of the same name whose code differs, the second is refused when both would
run in one process, never mixed. A saved model keeps that code in its directory (CODE_DIR: the factory file's folder,
or the folder above its outermost package), and is rebuilt from there on every load, from any working directory and
without PYTHONPATH.

This runs Python code the user chose to run, as any `import` does; weights are never unpickled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pkgutil
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from dpdistill.errors import ConfigError

CODE_DIR = "code"  # in a saved model's directory: its factory file and the code beside it
MAX_CODE_FILES, MAX_CODE_BYTES = 500, 20 * 10**6
# top-level module name -> the digest of the model code it was loaded from, for the modules loaded beside factory
# files in this process
LOADED_CODE: dict[str, str] = {}


def is_factory_file(spec: str) -> bool:
    """Whether `spec` names a Python file (`file.py:callable`) rather than an importable module."""
    return spec.rpartition(":")[0].endswith(".py")


def code_roots(path: Path) -> list[Path]:
    """Where the modules a factory file imports live: its own folder and, where that folder is a package (it holds
    an __init__.py), the folder above the outermost package, as `python path` or `python -m` would find them."""
    root = path.parent
    while (root / "__init__.py").is_file() and root.parent != root:
        root = root.parent
    return list(dict.fromkeys([path.parent, root]))


def offered_modules(roots: list[Path]) -> dict[str, Path]:
    """The top-level modules and packages the roots make importable, by name (the first root's where two offer
    one), with the file or package folder each comes from."""
    offered: dict[str, Path] = {}
    for module in pkgutil.iter_modules([str(root) for root in roots]):
        origin = Path(module.module_finder.find_spec(module.name).origin)
        offered.setdefault(module.name, origin.parent if module.ispkg else origin)
    return offered


def code_digest(offered: dict[str, Path]) -> str:
    """A digest of what the modules are: their names, and the bytes of every Python file in them."""
    digest = hashlib.sha256()
    for name, location in sorted(offered.items()):
        files = [location] if location.is_file() else python_files(location)
        for file in files:
            digest.update(f"{name}/{file.relative_to(location.parent)}\0".encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _with_submodules(names: set[str]) -> list[str]:
    return [loaded for loaded in sys.modules if loaded.partition(".")[0] in names]


@contextlib.contextmanager
def code_beside(path: Path) -> Iterator[None]:
    """Run (or call) the factory file `path` with the code beside it importable (see the module docstring); the
    modules it imports stay loaded. Refused where it imports a module of the same name as another model folder's,
    already loaded, whose code differs: the two models would silently share one of them."""
    roots = code_roots(path)
    offered = offered_modules(roots)
    digest = code_digest(offered)
    # modules of another model's code under a name this folder offers: set aside while this code runs, so that its
    # imports find its own modules, and refused below if it imported one of them
    other = {name for name in offered if LOADED_CODE.get(name, digest) != digest and name in sys.modules}
    held = {name: sys.modules.pop(name) for name in _with_submodules(other)}
    folders = [str(root) for root in roots]
    sys.path[:] = folders + [entry for entry in sys.path if entry not in folders]
    try:
        yield
    finally:
        sys.path[:] = [entry for entry in sys.path if entry not in folders] + folders  # importable, last
        clashes = sorted(name for name in other if name in sys.modules)
        if clashes:
            for name in _with_submodules(set(clashes)):
                del sys.modules[name]
        sys.modules.update(held)
        for name in offered:
            if name in sys.modules and name not in clashes and _comes_from(sys.modules[name], roots):
                LOADED_CODE[name] = digest
    if clashes:
        name = clashes[0]
        raise ConfigError(f"the model code in {roots[-1]} imports its module {name!r}, but this process already "
                          f"runs another model's module {name!r} ({getattr(sys.modules[name], '__file__', None)}), "
                          f"whose code differs: one process holds one module of a name; rename one of them, or run "
                          f"the models in separate processes")


def _comes_from(module: Any, roots: list[Path]) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and any(Path(file).is_relative_to(root) for root in roots)


def python_files(root: Path, limit: int | None = None) -> list[Path]:
    """The .py files under `root`, hidden folders and caches aside, sorted; the walk stops past `limit` files."""
    found: list[Path] = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith(".") and name != "__pycache__")
        found += [Path(folder) / name for name in files if name.endswith(".py")]
        if limit is not None and len(found) > limit:
            break
    return sorted(found)


@dataclass(frozen=True)
class FactoryCode:
    """What a saved model keeps of a factory: the file, the folder of code it lives in, and that folder's .py
    files."""

    source: Path
    root: Path
    files: list[Path]
    name: str  # the callable


def factory_code(factory: str, code: Path | None = None) -> FactoryCode | None:
    """The code a factory file brings (that of the folder its modules are imported from, the folder above its
    outermost package where it is in one, or of `code`), checked before anything is written; None for a module,
    which stays a reference."""
    if not is_factory_file(factory):
        return None
    location, _, name = factory.rpartition(":")
    source = Path(location).expanduser().resolve()
    root = (code or code_roots(source)[-1]).expanduser().resolve()
    return FactoryCode(source, root, code_files(source, root), name)


def code_files(factory: Path, root: Path) -> list[Path]:
    """The .py files under `root` (hidden folders and caches aside) that go with the factory file, refused where
    the folder is not the model's code: the factory outside it, or more than MAX_CODE_FILES / MAX_CODE_BYTES."""
    if not root.is_dir():
        raise ConfigError(f"--code {root} is not a folder")
    if not factory.is_relative_to(root):
        raise ConfigError(f"the factory file {factory} is not inside --code {root}: name the folder that holds it")
    files = python_files(root, limit=MAX_CODE_FILES)
    size = sum(path.stat().st_size for path in files)
    if len(files) > MAX_CODE_FILES or size > MAX_CODE_BYTES:
        many = f"more than {MAX_CODE_FILES}" if len(files) > MAX_CODE_FILES else str(len(files))
        raise ConfigError(f"{root} holds {many} Python files ({size / 1e6:.1f} MB), more than a model's code (at "
                          f"most {MAX_CODE_FILES} files, {MAX_CODE_BYTES // 10**6} MB): put the model's code in a "
                          f"folder of its own (or name it with --code), or install it as a package and give "
                          f"module:callable")
    return files


def keep_factory(factory: str, kept: FactoryCode | None, directory: Path) -> tuple[str, dict[str, Any]]:
    """(the `arch` to record, the `factory` entry of the description): a factory file is copied into `directory`
    with the code beside it (CODE_DIR), a module stays a reference."""
    shutil.rmtree(directory / CODE_DIR, ignore_errors=True)  # an earlier run's, replaced by --overwrite
    if kept is None:
        return factory, {"reference": factory, "note": "imported by name: the module must be importable (installed "
                                                       "or on PYTHONPATH) wherever this model is loaded"}
    for file in kept.files:
        target = directory / CODE_DIR / file.relative_to(kept.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, target)
    path = f"{CODE_DIR}/{kept.source.relative_to(kept.root).as_posix()}"
    return f"{path}:{kept.name}", {"file": path, "callable": kept.name, "copied_from": str(kept.source),
                                   "code": str(kept.root), "code_files": len(kept.files),
                                   "note": "Python code run on every load of this model"}
