"""aiv_transport: a Mooncake-compatible transfer engine for Ascend NPUs (CPU twin runtime by default).

``aiv_transport.TransferEngine`` is a drop-in for ``mooncake.engine.TransferEngine``: same method names, positional
argument order, defaults and return conventions (ints: 0 success, negative failure). See docs/python.md.

Importing this package never touches ``sys.modules['mooncake']``; the opt-in drop-in that makes
``from mooncake.engine import TransferEngine`` resolve here is ``aiv_transport.drop_in`` (AIV_TRANSPORT_AS_MOONCAKE=1).
"""

from aiv_transport._native import (
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
    __version__,
)

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "__version__",
]
