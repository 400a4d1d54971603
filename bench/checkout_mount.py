"""Import a checkout's `replay` without installing it: the layout setup.py installs (engine/, ingest/
and reports/ as replay.engine, replay.ingest and replay.reports), mapped onto that checkout's folders.

For benchmarks that run several checkouts side by side (bench_ab.py): each run mounts one checkout
ahead of whatever is installed. A compiled core built in place (`python setup.py build_ext
--inplace`) sits beside its sources and is found the same way.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import tomllib
from pathlib import Path


class CheckoutFinder:
    """A meta-path finder for the mapped packages of one checkout; their submodules are then found
    through each package's __path__ as usual."""

    def __init__(self, root: Path) -> None:
        table = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
        self.dirs = {name: root / folder for name, folder in table["tool"]["setuptools"]["package-dir"].items()}

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001 - importlib protocol
        folder = self.dirs.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


def is_mapped_layout(root: Path) -> bool:
    """True for a checkout whose engine installs as replay.engine (older ones import engine directly)."""
    return (root / "replay" / "base").is_dir()


def mount(root: str | Path) -> None:
    root = Path(root).resolve()
    sys.meta_path.insert(0, CheckoutFinder(root))
    sys.path.insert(0, str(root))  # mypyc's shared library of an in-place build sits at the top


if __name__ == "__main__":  # python bench/checkout_mount.py CHECKOUT replay-args...: run that checkout's CLI
    mount(sys.argv[1])
    sys.argv = ["replay", *sys.argv[2:]]
    from replay.cli import main

    main()
