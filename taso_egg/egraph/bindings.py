"""egglog's bindings (its Rust extension, ``egglog.bindings``), loaded without the
``egglog`` package's Python front end where that can be done, with the import hook
that gives the front end, imported later, the same extension module.
"""

from __future__ import annotations

import sys


def bindings():
    """egglog's bindings (its Rust extension, ``egglog.bindings``), which is all this
    package uses. Importing them the ordinary way first runs the ``egglog`` package's
    Python front end (0.4 s in a fresh process, most of a small model's saturation),
    so the extension is loaded alone where it can be; the front end still imports
    normally later, onto the same module. Any failure falls back to the ordinary import."""
    mod = sys.modules.get("egglog.bindings")
    if mod is not None:
        return mod
    if "egglog" not in sys.modules:
        try:
            return _load_extension_alone()
        except Exception:  # whatever it is, the ordinary import still works (or says why)
            sys.modules.pop("egglog.bindings", None)
    import egglog.bindings

    return egglog.bindings


def _load_extension_alone():
    import importlib.machinery
    import importlib.util
    from pathlib import Path

    package = importlib.util.find_spec("egglog")  # finds the package without running it
    for folder in package.submodule_search_locations or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder) / f"bindings{suffix}"
            if path.is_file():
                loader = importlib.machinery.ExtensionFileLoader("egglog.bindings", str(path))
                spec = importlib.util.spec_from_file_location("egglog.bindings", path, loader=loader)
                mod = importlib.util.module_from_spec(spec)
                sys.modules["egglog.bindings"] = mod
                loader.exec_module(mod)
                sys.meta_path.insert(0, _LinkBindings())
                return mod
    raise ImportError("egglog's bindings extension not found")


class _LinkBindings:
    """A one-shot import hook: when the ``egglog`` package itself is imported later, its
    ``bindings`` attribute is the extension already loaded (Python sets a package's
    attribute only for a submodule it imports itself)."""

    def find_spec(self, name, path=None, target=None):
        if name != "egglog":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module):
                module.bindings = sys.modules["egglog.bindings"]
                run(module)

            spec.loader.exec_module = exec_module
        return spec


__all__ = ["bindings"]
