"""flashattn: exact attention, IO-aware (C++/CUDA library, Python bindings over its C ABI)."""

from ._capi import (  # noqa: F401
    BackendUnavailableError,
    BlockMask,
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
from ._capi import build_commit as library_commit  # noqa: F401

__version__ = "0.1.0"

from .interface import (  # noqa: E402,F401
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)

try:  # ring attention (context parallelism) needs PyTorch with torch.distributed
    from .ring import ring_attention  # noqa: E402,F401
except ImportError:
    pass
