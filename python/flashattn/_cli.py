"""The ``flashattn`` console command of a pip install: runs the CLI binary that the
wheel carries inside this package (``bin/flashattn``, linked statically against
the library and the CUDA runtime, so it needs no libcudart.so)."""

import os
import sys


def executable() -> str:
    """Path of the CLI binary inside the installed package."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "flashattn")


def main() -> None:
    exe = executable()
    if not os.access(exe, os.X_OK):
        sys.exit(f"flashattn: the command-line tool is missing from this install ({exe}); "
                 "it is built unless FLASHATTN_BUILD_TOOLS=OFF")
    # Replaces this Python process: exit status, signals and streams are the tool's own.
    os.execv(exe, [exe] + sys.argv[1:])
