"""``python -m aiv_transport``: the package version, and whether the mooncake.engine drop-in is active."""

import os
import sys


def main():
    import aiv_transport
    from aiv_transport import drop_in

    print(f"aiv_transport {aiv_transport.__version__} ({os.path.dirname(aiv_transport.__file__)})")
    print(f"{drop_in.ENV}={os.environ.get(drop_in.ENV, '')!r}: drop-in {'active' if drop_in.active() else 'not active'}")
    try:
        import mooncake.engine as engine
    except ImportError as error:
        print(f"mooncake.engine: not importable ({error})")
        return 0
    served = getattr(engine, "SERVED_BY_AIV_TRANSPORT", False)
    print(f"mooncake.engine: {'aiv_transport' if served else 'the real Mooncake wheel'} ({engine.TransferEngine!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
