"""flashattn: exact attention, IO-aware (C++/CUDA library, Python bindings over its C ABI)."""

from ._capi import (  # noqa: F401
    BackendUnavailableError,
    DeviceError,
    FlashAttnError,
    InternalError,
    InvalidArgumentError,
    OutOfMemoryError,
    UnsupportedError,
    backend_available,
    backend_unavailable_reason,
    library_path,
)
from ._capi import version as library_version  # noqa: F401

__version__ = "0.1.0"
