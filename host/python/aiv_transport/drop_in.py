"""Opt-in drop-in: ``from mooncake.engine import TransferEngine`` resolves to ``aiv_transport``.

Off by default. The wheel installs ``aiv_transport_as_mooncake.pth`` into site-packages; at interpreter start it calls
``install()`` when the environment has ``AIV_TRANSPORT_AS_MOONCAKE=1``, so a program such as vLLM-Ascend needs no
edit. ``install()`` may also be called by hand before anything imports ``mooncake.engine``.

What it does: it puts a finder first on ``sys.meta_path`` that serves ``mooncake.engine`` from ``aiv_transport``.
``mooncake`` itself is served (as an empty package) only when the real Mooncake package is not installed; when it
is, ``mooncake`` and all its other modules (``mooncake.store``, ...) stay the real ones. Importing ``aiv_transport``
alone never touches ``sys.modules['mooncake']``.

    python -m aiv_transport      # says whether the drop-in is active and what mooncake.engine resolves to
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

ENV = "AIV_TRANSPORT_AS_MOONCAKE"

# What the served mooncake.engine exports (Mooncake's names this package provides).
_EXPORTS = (
    "TransferEngine",
    "TransferOpcode",
    "TransferNotify",
    "Read",
    "Write",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
)


def enabled():
    """Whether the environment asks for the drop-in (``AIV_TRANSPORT_AS_MOONCAKE=1``)."""
    return os.environ.get(ENV, "").strip() == "1"


def _missing(name):
    raise AttributeError(
        f"module 'mooncake.engine' (served by aiv_transport, {ENV}=1) has no attribute {name!r}: aiv_transport "
        f"provides {', '.join(_EXPORTS)}; Mooncake's RPC interface, SharedSegment and InnerTransferEngine need the "
        f"real mooncake wheel (unset {ENV})"
    )


class _EngineLoader(importlib.abc.Loader):
    """Fills ``mooncake.engine`` with aiv_transport's classes."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from aiv_transport import _native

        for name in _EXPORTS:
            setattr(module, name, getattr(_native, name))
        module.__getattr__ = _missing
        module.__all__ = list(_EXPORTS)
        module.SERVED_BY_AIV_TRANSPORT = True


class _PackageLoader(importlib.abc.Loader):
    """An empty ``mooncake`` package, for when the real one is not installed."""

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.SERVED_BY_AIV_TRANSPORT = True


class MooncakeEngineFinder(importlib.abc.MetaPathFinder):
    """Serves ``mooncake.engine`` (and ``mooncake`` when the real package is absent)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mooncake.engine":
            # The module's origin (and __file__) is the extension that serves it, so that tools which report or hash
            # "the loaded mooncake.engine" name aiv_transport's file, not Mooncake's.
            native = importlib.util.find_spec("aiv_transport._native")
            spec = importlib.machinery.ModuleSpec(
                fullname, _EngineLoader(), origin=native.origin if native is not None else "aiv_transport"
            )
            spec.has_location = native is not None and bool(native.origin)
            return spec
        if fullname == "mooncake" and not self._real_mooncake_exists():
            spec = importlib.machinery.ModuleSpec(
                fullname, _PackageLoader(), origin="aiv_transport (stand-in for mooncake)", is_package=True
            )
            spec.submodule_search_locations = []
            return spec
        return None

    def _real_mooncake_exists(self):
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, MooncakeEngineFinder):
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            try:
                if find_spec("mooncake", None) is not None:
                    return True
            except Exception:
                continue
        return False


def install():
    """Puts the finder first on ``sys.meta_path`` (once). Returns True when ``mooncake.engine`` will be served here."""
    if not any(isinstance(finder, MooncakeEngineFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MooncakeEngineFinder())
    loaded = sys.modules.get("mooncake.engine")
    if loaded is not None and not getattr(loaded, "SERVED_BY_AIV_TRANSPORT", False):
        warnings.warn(
            "aiv_transport.drop_in.install(): the real mooncake.engine was imported before the drop-in was "
            "installed; modules that imported it keep Mooncake's engine",
            RuntimeWarning,
            stacklevel=2,
        )
        return False
    return True


def active():
    """Whether the finder is on ``sys.meta_path``."""
    return any(isinstance(finder, MooncakeEngineFinder) for finder in sys.meta_path)
