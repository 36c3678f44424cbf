"""Low-level binding of the flashattn C ABI (include/flashattn/flashattn.h) with ctypes.

Functions here take any tensor that describes its memory: PyTorch tensors (CPU
or CUDA; read directly through data_ptr()/stride()/dtype/device, torch itself
is never imported by this module), NumPy arrays and anything else exposing
``__array_interface__`` (host memory), and objects speaking DLPack
(``__dlpack__``). Outputs are written in place; nothing is allocated here
except what the library allocates itself.

Library lookup order: the ``FLASHATTN_LIBRARY`` environment variable (a path
to libflashattn.so), the copy installed inside this package (``lib/``), then
the system loader's search path.

Errors from the library raise :class:`FlashAttnError` subclasses carrying the
library's message (``fa_last_error()``): :class:`InvalidArgumentError` is a
``ValueError``, :class:`UnsupportedError` a ``NotImplementedError``, the others
are ``RuntimeError``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import numbers
import operator
import os
import sys
import threading
from typing import Any, Optional, Sequence, Tuple

__all__ = [
    "FA_MAX_DIMS",
    "FaTensor",
    "FaVarlen",
    "FaOptions",
    "FlashAttnError",
    "InvalidArgumentError",
    "UnsupportedError",
    "BackendUnavailableError",
    "DeviceError",
    "OutOfMemoryError",
    "InternalError",
    "library",
    "library_path",
    "version",
    "backend_available",
    "backend_unavailable_reason",
    "forward",
    "backward",
    "forward_workspace_size",
    "backward_workspace_size",
    "FaKvCache",
    "forward_kvcache",
    "forward_kvcache_workspace_size",
    "FaBlockMask",
    "BlockMask",
    "block_mask_parts",
]

FA_MAX_DIMS = 4

# fa_status
FA_OK = 0
FA_ERROR_INVALID_ARGUMENT = 1
FA_ERROR_UNSUPPORTED = 2
FA_ERROR_BACKEND_UNAVAILABLE = 3
FA_ERROR_DEVICE = 4
FA_ERROR_OUT_OF_MEMORY = 5
FA_ERROR_INTERNAL = 6

# fa_dtype
FA_F32 = 0
FA_F16 = 1
FA_BF16 = 2
FA_I32 = 3  # index tensors only (block masks)

# fa_device_type
FA_DEVICE_CPU = 0
FA_DEVICE_CUDA = 1

# fa_backend
FA_BACKEND_AUTO = 0
FA_BACKEND_CPU = 1
FA_BACKEND_CUDA = 2

_BACKENDS = {None: FA_BACKEND_AUTO, "auto": FA_BACKEND_AUTO, "cpu": FA_BACKEND_CPU,
             "cuda": FA_BACKEND_CUDA}

_DTYPE_NAMES = {FA_F32: "float32", FA_F16: "float16", FA_BF16: "bfloat16"}


# ----------------------------------------------------------------------------
# Exceptions


class FlashAttnError(Exception):
    """An error reported by the flashattn library. ``status`` is the fa_status code."""

    status: int = FA_ERROR_INTERNAL

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        if status is not None:
            self.status = status


class InvalidArgumentError(FlashAttnError, ValueError):
    """A bad shape, stride, option or pointer (FA_ERROR_INVALID_ARGUMENT)."""

    status = FA_ERROR_INVALID_ARGUMENT


class UnsupportedError(FlashAttnError, NotImplementedError):
    """Valid, but not implemented: a dtype, head dim, ... (FA_ERROR_UNSUPPORTED)."""

    status = FA_ERROR_UNSUPPORTED


class BackendUnavailableError(FlashAttnError, RuntimeError):
    """The backend was not built, or no device is present (FA_ERROR_BACKEND_UNAVAILABLE)."""

    status = FA_ERROR_BACKEND_UNAVAILABLE


class DeviceError(FlashAttnError, RuntimeError):
    """A CUDA call failed (FA_ERROR_DEVICE)."""

    status = FA_ERROR_DEVICE


class OutOfMemoryError(FlashAttnError, RuntimeError):
    """An allocation failed (FA_ERROR_OUT_OF_MEMORY)."""

    status = FA_ERROR_OUT_OF_MEMORY


class InternalError(FlashAttnError, RuntimeError):
    """A bug in flashattn (FA_ERROR_INTERNAL)."""

    status = FA_ERROR_INTERNAL


_STATUS_EXCEPTIONS = {
    FA_ERROR_INVALID_ARGUMENT: InvalidArgumentError,
    FA_ERROR_UNSUPPORTED: UnsupportedError,
    FA_ERROR_BACKEND_UNAVAILABLE: BackendUnavailableError,
    FA_ERROR_DEVICE: DeviceError,
    FA_ERROR_OUT_OF_MEMORY: OutOfMemoryError,
    FA_ERROR_INTERNAL: InternalError,
}


# ----------------------------------------------------------------------------
# ABI structs (must match include/flashattn/flashattn.h field for field)


class FaTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("device", ctypes.c_int),
        ("device_index", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * FA_MAX_DIMS),
        ("strides", ctypes.c_int64 * FA_MAX_DIMS),
    ]


_Dims = ctypes.c_int64 * FA_MAX_DIMS


class FaVarlen(ctypes.Structure):
    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("batch", ctypes.c_int32),
        ("max_seqlen_q", ctypes.c_int32),
        ("max_seqlen_k", ctypes.c_int32),
    ]


class FaOptions(ctypes.Structure):
    _fields_ = [
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("deterministic", ctypes.c_int32),
        ("backend", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("num_threads", ctypes.c_int32),
        ("reserved", ctypes.c_int32 * 7),
    ]


class FaKvCache(ctypes.Structure):
    _fields_ = [
        ("k_cache", ctypes.POINTER(FaTensor)),
        ("v_cache", ctypes.POINTER(FaTensor)),
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("max_blocks", ctypes.c_int32),
        ("cache_seqlens", ctypes.c_void_p),
        ("cache_seqlen", ctypes.c_int32),
        ("cache_batch_idx", ctypes.c_void_p),
        ("k_new", ctypes.POINTER(FaTensor)),
        ("v_new", ctypes.POINTER(FaTensor)),
        ("rotary_cos", ctypes.POINTER(FaTensor)),
        ("rotary_sin", ctypes.POINTER(FaTensor)),
        ("rotary_interleaved", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("trust_indices", ctypes.c_int32),
        ("reserved", ctypes.c_int32 * 7),
    ]


class FaBlockMask(ctypes.Structure):
    _fields_ = [
        ("block_q", ctypes.c_int32),
        ("block_k", ctypes.c_int32),
        ("kv_num_blocks", ctypes.POINTER(FaTensor)),
        ("kv_indices", ctypes.POINTER(FaTensor)),
        ("full_kv_num_blocks", ctypes.POINTER(FaTensor)),
        ("full_kv_indices", ctypes.POINTER(FaTensor)),
        ("reserved", ctypes.c_int32 * 4),
    ]


class FaExtras(ctypes.Structure):
    _fields_ = [
        ("alibi_slopes", ctypes.POINTER(FaTensor)),
        ("sinks", ctypes.POINTER(FaTensor)),
        ("dsinks", ctypes.POINTER(FaTensor)),
        ("dropout_p", ctypes.c_float),
        ("dropout_seed", ctypes.c_uint64),
        ("dropout_offset", ctypes.c_uint64),
        ("block_mask", ctypes.POINTER(FaBlockMask)),
        ("reserved", ctypes.c_int32 * 6),
    ]


_P = ctypes.POINTER
_SIGNATURES = {
    "fa_default_options": (FaOptions, []),
    "fa_last_error": (ctypes.c_char_p, []),
    "fa_status_string": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_version": (ctypes.c_char_p, []),
    "fa_build_commit": (ctypes.c_char_p, []),
    "fa_backend_available": (ctypes.c_int, [ctypes.c_int]),
    "fa_backend_unavailable_reason": (ctypes.c_char_p, [ctypes.c_int]),
    "fa_forward": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                  _P(FaTensor), _P(FaVarlen), _P(FaOptions)]),
    "fa_forward_workspace_size": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor),
                                                 _P(FaVarlen), _P(FaOptions),
                                                 _P(ctypes.c_size_t)]),
    "fa_backward_workspace_size": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor),
                                                  _P(FaVarlen), _P(FaOptions),
                                                  _P(ctypes.c_size_t)]),
    "fa_backward": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                   _P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                   _P(FaTensor), _P(FaVarlen), _P(FaOptions), ctypes.c_void_p,
                                   ctypes.c_size_t]),
    "fa_forward_kvcache": (ctypes.c_int, [_P(FaTensor), _P(FaKvCache), _P(FaTensor), _P(FaTensor),
                                          _P(FaOptions), ctypes.c_void_p, ctypes.c_size_t]),
    "fa_forward_kvcache_ex": (ctypes.c_int, [_P(FaTensor), _P(FaKvCache), _P(FaTensor), _P(FaTensor),
                                             _P(FaOptions), _P(FaExtras), ctypes.c_void_p, ctypes.c_size_t]),
    "fa_forward_kvcache_workspace_size": (ctypes.c_int, [_P(FaTensor), _P(FaKvCache),
                                                         _P(FaOptions), _P(ctypes.c_size_t)]),
    "fa_forward_ex": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                     _P(FaTensor), _P(FaVarlen), _P(FaOptions), _P(FaExtras)]),
    "fa_backward_ex": (ctypes.c_int, [_P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                      _P(FaTensor), _P(FaTensor), _P(FaTensor), _P(FaTensor),
                                      _P(FaTensor), _P(FaVarlen), _P(FaOptions), _P(FaExtras),
                                      ctypes.c_void_p, ctypes.c_size_t]),
    "fa_dropout_mask": (ctypes.c_int, [_P(FaExtras), _P(FaTensor)]),
}


# ----------------------------------------------------------------------------
# Library loading

_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lib_lock = threading.Lock()


def _candidate_paths():
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        # An explicit choice: no fallback, so a typo is not hidden by another copy.
        return [env], True
    here = os.path.dirname(os.path.abspath(__file__))
    # A wheel holds the library under its SONAME only (libflashattn.so.0, no symlinks).
    paths = [os.path.join(here, d, name) for d in ("lib", "lib64")
             for name in ("libflashattn.so.0", "libflashattn.so")]
    found = ctypes.util.find_library("flashattn")
    if found:
        paths.append(found)
    return paths, False


def library() -> ctypes.CDLL:
    """The loaded libflashattn (loaded on first use)."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        paths, explicit = _candidate_paths()
        errors = []
        for path in paths:
            if not explicit and os.path.sep in path and not os.path.exists(path):
                errors.append(f"{path}: not found")
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
            if missing:
                errors.append(f"{path}: older than this package (no {', '.join(missing[:3])})")
                continue
            for name, (restype, argtypes) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = argtypes
            _lib, _lib_path = lib, path
            return lib
        hint = ("FLASHATTN_LIBRARY is set but the library could not be loaded"
                if explicit else
                "install the package with `pip install .` from the flashattn repository, or set "
                "FLASHATTN_LIBRARY=/path/to/libflashattn.so")
        raise OSError("cannot load libflashattn: " + "; ".join(errors) + ". " + hint)


def library_path() -> str:
    """The path libflashattn was loaded from (loads it on first use)."""
    library()
    assert _lib_path is not None
    return _lib_path


def version() -> str:
    """The loaded library's version (fa_version())."""
    return library().fa_version().decode()


def build_commit() -> str:
    """The git commit the loaded library was built from ("+dirty" if uncommitted changes)."""
    return library().fa_build_commit().decode()


def _backend_code(backend) -> int:
    if isinstance(backend, int) and not isinstance(backend, bool):
        if backend not in (FA_BACKEND_AUTO, FA_BACKEND_CPU, FA_BACKEND_CUDA):
            raise InvalidArgumentError(f"unknown backend code {backend}")
        return backend
    key = backend.lower() if isinstance(backend, str) else backend
    if key not in _BACKENDS:
        raise InvalidArgumentError(f"backend must be None, 'auto', 'cpu' or 'cuda', got {backend!r}")
    return _BACKENDS[key]


def backend_available(backend="cuda") -> bool:
    """True if the backend was compiled in and can run here (CUDA: a device is visible)."""
    return bool(library().fa_backend_available(_backend_code(backend)))


def backend_unavailable_reason(backend="cuda") -> str:
    """Why a backend cannot run here, or '' if it can."""
    return library().fa_backend_unavailable_reason(_backend_code(backend)).decode()


def _check(status: int) -> None:
    if status == FA_OK:
        return
    lib = library()
    message = lib.fa_last_error().decode(errors="replace")
    if not message:
        message = lib.fa_status_string(status).decode()
    raise _STATUS_EXCEPTIONS.get(status, InternalError)(message, status)


# ----------------------------------------------------------------------------
# Tensor descriptions


class _Desc:
    """What the library needs to know about one array, plus whatever keeps it alive."""

    __slots__ = ("ptr", "dtype", "device", "device_index", "shape", "strides", "itemsize",
                 "readonly", "keepalive", "kind")

    def __init__(self, ptr, dtype, device, device_index, shape, strides, itemsize, readonly,
                 keepalive, kind):
        self.ptr = ptr
        self.dtype = dtype          # fa_dtype code, or a string naming an integer type
        self.device = device        # FA_DEVICE_*
        self.device_index = device_index
        self.shape = shape if type(shape) is tuple else tuple(shape)
        self.strides = strides if type(strides) is tuple else tuple(strides)  # elements
        self.itemsize = itemsize
        self.readonly = readonly
        self.keepalive = keepalive
        self.kind = kind            # "torch", "numpy", "dlpack"

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for s in self.shape:
            n *= s
        return n

    def is_contiguous(self) -> bool:
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True


def _torch_module():
    return sys.modules.get("torch")


def _is_torch_tensor(x) -> bool:
    torch = _torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


_TORCH_DTYPES = {}  # torch.dtype -> fa_dtype code or integer type name (filled on first use)


def _torch_dtype_code(torch, dt):
    if not _TORCH_DTYPES:
        _TORCH_DTYPES.update({torch.float32: FA_F32, torch.float16: FA_F16, torch.bfloat16: FA_BF16,
                              torch.int32: "int32", torch.uint8: "uint8"})
    code = _TORCH_DTYPES.get(dt)
    return code if code is not None else str(dt).replace("torch.", "")


def _describe_torch(x, name: str) -> _Desc:
    # NOTES: on the per-call path of every torch op (eager attention calls cost
    # tens of microseconds of Python per tensor before this was trimmed): no
    # torch.device objects, one dict lookup for the dtype.
    torch = _torch_module()
    code = _torch_dtype_code(torch, x.dtype)
    if x.is_cuda:
        device, index = FA_DEVICE_CUDA, x.get_device()
    elif x.is_cpu:
        device, index = FA_DEVICE_CPU, 0
    else:
        raise InvalidArgumentError(f"{name} is on device {x.device}; flashattn takes cpu and cuda tensors")
    if x.layout != torch.strided:
        raise InvalidArgumentError(f"{name} must be a strided (dense) tensor, got layout {x.layout}")
    return _Desc(x.data_ptr(), code, device, index, x.shape, x.stride(), x.element_size(),
                 False, x, "torch")


_NUMPY_TYPESTR = {"f4": FA_F32, "f2": FA_F16, "i4": "int32", "u1": "uint8"}


def _describe_array_interface(x, name: str) -> _Desc:
    ai = x.__array_interface__
    typestr = ai["typestr"]
    byteorder, kind_size = typestr[0], typestr[1:]
    if byteorder == ">" and kind_size[1:] != "1":
        raise InvalidArgumentError(f"{name} is big-endian; flashattn takes native (little-endian) arrays")
    itemsize = int(kind_size[1:])
    code = _NUMPY_TYPESTR.get(kind_size, "numpy typestr " + typestr)
    ptr, readonly = ai["data"]
    shape = tuple(int(s) for s in ai["shape"])
    byte_strides = ai.get("strides")
    if byte_strides is None:  # C-contiguous
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        strides = []
        for bs in byte_strides:
            if bs % itemsize:
                raise InvalidArgumentError(f"{name} has a stride of {bs} bytes, not a multiple of its "
                                 f"{itemsize}-byte elements")
            strides.append(bs // itemsize)
        strides = tuple(strides)
    if ai.get("mask") is not None:
        raise InvalidArgumentError(f"{name} is a masked array; pass plain data")
    offset = ai.get("offset", 0) or 0
    return _Desc((ptr or 0) + offset, code, FA_DEVICE_CPU, 0, shape, strides, itemsize,
                 bool(readonly), x, "numpy")


# DLPack (v0.x ABI: the capsule holds a DLManagedTensor).
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_kDLCPU, _kDLCUDA, _kDLCUDAHost, _kDLCUDAManaged = 1, 2, 3, 13
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat = 0, 1, 2, 4

_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _describe_dlpack(x, name: str, stream) -> _Desc:
    # The capsule is borrowed, not consumed: it stays named "dltensor", so the
    # producer's deleter runs when the capsule is collected after the call.
    try:
        capsule = x.__dlpack__(stream=stream) if stream is not None else x.__dlpack__()
    except TypeError:
        capsule = x.__dlpack__()
    ptr = _PyCapsule_GetPointer(capsule, b"dltensor")
    t = _DLTensor.from_address(ptr)  # DLManagedTensor starts with its DLTensor
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if lanes != 1:
        raise InvalidArgumentError(f"{name} has vector dtype lanes={lanes}")
    dtype = {(_kDLFloat, 32): FA_F32, (_kDLFloat, 16): FA_F16, (_kDLBfloat, 16): FA_BF16,
             (_kDLInt, 32): "int32", (_kDLUInt, 8): "uint8"}.get(
                 (code, bits), f"DLPack dtype code {code} bits {bits}")
    if t.strides:
        strides = tuple(t.strides[i] for i in range(ndim))
    else:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    dt = t.device.device_type
    if dt in (_kDLCPU, _kDLCUDAHost):
        device, index = FA_DEVICE_CPU, 0
    elif dt in (_kDLCUDA, _kDLCUDAManaged):
        device, index = FA_DEVICE_CUDA, t.device.device_id
    else:
        raise InvalidArgumentError(f"{name} is on DLPack device type {dt}; flashattn takes CPU and CUDA")
    data = (t.data or 0) + t.byte_offset
    return _Desc(data, dtype, device, index, shape, strides, max(bits // 8, 1), False,
                 (x, capsule), "dlpack")


def _describe(x, name: str, stream=None) -> _Desc:
    if x is None:
        raise InvalidArgumentError(f"{name} is None")
    if _is_torch_tensor(x):
        return _describe_torch(x, name)
    if hasattr(x, "__array_interface__"):
        return _describe_array_interface(x, name)
    if hasattr(x, "__dlpack__"):
        return _describe_dlpack(x, name, stream)
    raise TypeError(f"{name} must be a torch.Tensor, a NumPy array (or other object with "
                    f"__array_interface__) or a DLPack tensor, got {type(x).__name__}")


def _fa_tensor(d: _Desc, name: str, *, output: bool = False) -> FaTensor:
    if not isinstance(d.dtype, int):
        raise UnsupportedError(f"{name} has dtype {d.dtype}; flashattn takes float32, float16 "
                               f"and bfloat16 (bfloat16 only from torch or DLPack)")
    if len(d.shape) > FA_MAX_DIMS:
        raise InvalidArgumentError(f"{name} has {len(d.shape)} dimensions, at most {FA_MAX_DIMS} allowed")
    if output and d.readonly:
        raise InvalidArgumentError(f"{name} is read-only but is written as an output")
    return FaTensor(d.ptr or None, d.dtype, d.device, d.device_index, len(d.shape),
                    _Dims(*d.shape), _Dims(*d.strides))


def _cu_seqlens_ptr(x, name: str, q: _Desc, stream) -> Tuple[int, int, Any]:
    d = _describe(x, name, stream)
    if d.dtype != "int32":
        got = d.dtype if isinstance(d.dtype, str) else _DTYPE_NAMES[d.dtype]
        raise InvalidArgumentError(f"{name} must be int32, got {got}")
    if len(d.shape) != 1:
        raise InvalidArgumentError(f"{name} must be 1-dimensional (batch + 1,), got shape {d.shape}")
    if d.shape[0] > 1 and d.strides[0] != 1:
        raise InvalidArgumentError(f"{name} must be contiguous")
    if d.shape[0] < 1:
        raise InvalidArgumentError(f"{name} must have batch + 1 >= 1 entries")
    if d.device != q.device or (d.device == FA_DEVICE_CUDA and d.device_index != q.device_index):
        where = "cpu" if d.device == FA_DEVICE_CPU else f"cuda:{d.device_index}"
        qwhere = "cpu" if q.device == FA_DEVICE_CPU else f"cuda:{q.device_index}"
        raise InvalidArgumentError(f"{name} is on {where} but q is on {qwhere}; cu_seqlens must live with q")
    return d.ptr, d.shape[0] - 1, d


def _torch_current_stream(x):
    """The current torch stream of CUDA tensor x's device, as an int (None = the default stream)."""
    torch = _torch_module()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # ~20x cheaper
    if raw is not None:
        return raw(x.get_device()) or None
    return torch.cuda.current_stream(x.device).cuda_stream or None


def _resolve_stream(stream, q: _Desc):
    """The cudaStream_t to pass as an integer (or None = the default stream)."""
    if q.device != FA_DEVICE_CUDA:
        return None
    if stream is None:
        return _torch_current_stream(q.keepalive) if q.kind == "torch" else None
    if isinstance(stream, int):
        return stream or None
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream, cupy Stream (.ptr)
    if handle is None:
        handle = getattr(stream, "ptr", None)
    if handle is None:
        raise TypeError("stream must be an int (cudaStream_t), or have .cuda_stream or .ptr")
    return int(handle) or None


_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _int32(value, name: str) -> int:
    """value as an int for an int32 field of the C ABI; ctypes would silently keep the low
    32 bits (a window of 2**32 would become 0), so values outside int32 are an error."""
    try:
        n = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}") from None
    if not _INT32_MIN <= n <= _INT32_MAX:
        raise InvalidArgumentError(f"{name} = {n} does not fit in int32 "
                                   f"[{_INT32_MIN}, {_INT32_MAX}]")
    return n


_default_options: Optional[FaOptions] = None


def _options(*, softmax_scale, causal, window_size, softcap, deterministic, backend, stream,
             num_threads) -> FaOptions:
    global _default_options
    if _default_options is None:
        _default_options = library().fa_default_options()
    o = FaOptions.from_buffer_copy(_default_options)
    if softmax_scale is not None:
        scale = float(softmax_scale)
        if not scale > 0:
            # 0 means "default" to the C ABI; refuse it rather than silently change it.
            raise InvalidArgumentError(f"softmax_scale must be > 0 (or None for 1/sqrt(head_dim)), "
                             f"got {softmax_scale}")
        o.softmax_scale = scale
    o.causal = 1 if causal else 0
    if window_size is None:
        window_size = (-1, -1)
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"window_size must be a pair (left, right), got {window_size!r}") from None
    o.window_left = _int32(left, "window_size[0]")
    o.window_right = _int32(right, "window_size[1]")
    o.softcap = float(softcap or 0.0)
    o.deterministic = 1 if deterministic else 0
    o.backend = _backend_code(backend)
    o.stream = stream
    o.num_threads = _int32(num_threads, "num_threads")
    return o


class _Structs:
    """The ctypes structs of one library call, built from Python arguments, and what they
    point into (kept alive in .keep until the call returns)."""

    def __init__(self, q, stream):
        self.keep = []
        # (argument name, struct, field): where each array argument's data pointer went, so a
        # prepared call (_prepare) can point the same structs at the next call's arrays.
        self.slots = []
        # (argument name, struct, field, convert): integer arguments that change from call to
        # call without changing anything else (dropout's seed and offset, an int
        # cache_seqlens), set again on reuse as convert(value).
        self.values = []
        self.qd = _describe(q, "q")
        self.stream = _resolve_stream(stream, self.qd)
        self.q = self.tensor(q, "q", desc=self.qd)

    def tensor(self, x, name, *, output=False, desc=None):
        d = desc if desc is not None else _describe(x, name, self.stream)
        self.keep.append(d)
        t = _fa_tensor(d, name, output=output)
        self.slots.append((name, t, "data"))
        return t

    def pointer(self, struct, field, d: _Desc, name: str) -> None:
        """struct.field = the data pointer of array argument `name` (described by d)."""
        setattr(struct, field, d.ptr or None)
        self.slots.append((name, struct, field))

    def extras(self, alibi_slopes=None, sinks=None, dsinks=None, dropout=None, block_mask=None):
        """An FaExtras over the given tensors (None = off), dropout (None, or
        (p, seed, offset)) and block mask (see block_mask_parts), or None when all are off."""
        dropping = dropout is not None and dropout[0] > 0
        parts = block_mask_parts(block_mask)
        if alibi_slopes is None and sinks is None and dsinks is None and not dropping and parts is None:
            return None
        e = _dropout_extras(dropout)
        if dropping:
            self.values += [("dropout_seed", e, "dropout_seed", _u64), ("dropout_offset", e, "dropout_offset", _u64)]
        if parts is not None:
            e.block_mask = ctypes.pointer(self.block_mask(parts))
        if alibi_slopes is not None:
            e.alibi_slopes = ctypes.pointer(self.tensor(alibi_slopes, "alibi_slopes"))
        if sinks is not None:
            e.sinks = ctypes.pointer(self.tensor(sinks, "sinks"))
        if dsinks is not None:
            e.dsinks = ctypes.pointer(self.tensor(dsinks, "dsinks", output=True))
        self.keep.append(e)
        return e

    def index_tensor(self, x, name):
        """An int32 tensor (FA_I32) of a block mask; the library checks where it lives."""
        d = _describe(x, name, self.stream)
        if d.dtype != "int32":
            got = d.dtype if isinstance(d.dtype, str) else _DTYPE_NAMES[d.dtype]
            raise InvalidArgumentError(f"{name} must be int32, got {got}")
        if len(d.shape) > FA_MAX_DIMS:
            raise InvalidArgumentError(f"{name} has {len(d.shape)} dimensions, at most {FA_MAX_DIMS} allowed")
        self.keep.append(d)
        return FaTensor(d.ptr or None, FA_I32, d.device, d.device_index, len(d.shape),
                        _Dims(*d.shape), _Dims(*d.strides))

    def block_mask(self, parts):
        block_q, block_k, num, indices, full_num, full_indices = parts
        m = FaBlockMask()
        m.block_q = _int32(block_q, "block_mask.BLOCK_SIZE[0]")
        m.block_k = _int32(block_k, "block_mask.BLOCK_SIZE[1]")
        m.kv_num_blocks = ctypes.pointer(self.index_tensor(num, "block_mask.kv_num_blocks"))
        m.kv_indices = ctypes.pointer(self.index_tensor(indices, "block_mask.kv_indices"))
        if full_num is not None:
            m.full_kv_num_blocks = ctypes.pointer(self.index_tensor(full_num, "block_mask.full_kv_num_blocks"))
        if full_indices is not None:
            m.full_kv_indices = ctypes.pointer(self.index_tensor(full_indices, "block_mask.full_kv_indices"))
        self.keep.append(m)
        return m


class _Call(_Structs):
    """Everything one library call needs, built from Python arguments."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 softmax_scale, causal, window_size, softcap, deterministic, backend, stream,
                 num_threads):
        super().__init__(q, stream)
        self.k = self.tensor(k, "k")
        self.v = self.tensor(v, "v")
        if (cu_seqlens_q is None) != (cu_seqlens_k is None):
            raise InvalidArgumentError("cu_seqlens_q and cu_seqlens_k must be given together")
        self.varlen = None
        if cu_seqlens_q is not None:
            _, bq, dq = _cu_seqlens_ptr(cu_seqlens_q, "cu_seqlens_q", self.qd, self.stream)
            _, bk, dk = _cu_seqlens_ptr(cu_seqlens_k, "cu_seqlens_k", self.qd, self.stream)
            if bq != bk:
                raise InvalidArgumentError(f"cu_seqlens_q has {bq + 1} entries but cu_seqlens_k has "
                                 f"{bk + 1}; both must have batch + 1")
            self.keep += [dq, dk]
            vl = FaVarlen()
            self.pointer(vl, "cu_seqlens_q", dq, "cu_seqlens_q")
            self.pointer(vl, "cu_seqlens_k", dk, "cu_seqlens_k")
            vl.batch = bq
            vl.max_seqlen_q = _int32(max_seqlen_q, "max_seqlen_q")
            vl.max_seqlen_k = _int32(max_seqlen_k, "max_seqlen_k")
            self.varlen = vl
        self.options = _options(softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap,
                                deterministic=deterministic, backend=backend,
                                stream=self.stream, num_threads=num_threads)

    @property
    def varlen_ptr(self):
        return ctypes.byref(self.varlen) if self.varlen is not None else None


class BlockMask:
    """A block-sparse mask in FlexAttention's BlockMask vocabulary, for callers without
    torch.nn.attention.flex_attention (NumPy arrays, or torch tensors built by hand).

    kv_num_blocks: int32 (B, H, q_blocks); kv_indices: int32 (B, H, q_blocks, max_blocks):
    per (sequence, query head, query block) the first kv_num_blocks entries are the key
    blocks it visits ("partial": the causal/window/length mask applies inside them).
    full_kv_num_blocks / full_kv_indices: the same for "full" blocks, or None. B may be 1 or
    batch, H 1 or heads_q (1 = shared). BLOCK_SIZE: (block_q, block_k) or one int for both.
    flashattn has no mask_mod: both kinds of blocks take only the element mask of the call
    (causal, window_size, sequence lengths); docs/variants.md."""

    def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks=None, full_kv_indices=None,
                 BLOCK_SIZE=(128, 128)):  # noqa: N803 (FlexAttention's attribute name)
        self.kv_num_blocks = kv_num_blocks
        self.kv_indices = kv_indices
        self.full_kv_num_blocks = full_kv_num_blocks
        self.full_kv_indices = full_kv_indices
        self.BLOCK_SIZE = BLOCK_SIZE


def block_mask_parts(block_mask):
    """(block_q, block_k, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices) of a
    block mask: None; a FlexAttention BlockMask or a BlockMask (duck-typed: kv_num_blocks,
    kv_indices, optional full_kv_num_blocks / full_kv_indices, BLOCK_SIZE); or these six
    parts already. Its q_num_blocks / q_indices, if any, are not used: the library builds the
    transposed lists the backward walks from the kv lists it has validated."""
    if block_mask is None or isinstance(block_mask, tuple):
        return block_mask
    try:
        num, indices, block = block_mask.kv_num_blocks, block_mask.kv_indices, block_mask.BLOCK_SIZE
    except AttributeError:
        raise TypeError(f"block_mask must have kv_num_blocks, kv_indices and BLOCK_SIZE (a "
                        f"FlexAttention BlockMask or flashattn.BlockMask), got "
                        f"{type(block_mask).__name__}") from None
    block_q, block_k = (block, block) if isinstance(block, int) else tuple(block)
    return (int(block_q), int(block_k), num, indices, getattr(block_mask, "full_kv_num_blocks", None),
            getattr(block_mask, "full_kv_indices", None))


def _u64(value) -> int:
    """A seed or offset as the C ABI's uint64 (Python ints of any size, modulo 2^64)."""
    return int(value) & 0xFFFFFFFFFFFFFFFF


def _cache_seqlen(value) -> int:
    return _int32(value, "cache_seqlens")


def _dropout_extras(dropout) -> FaExtras:
    """An FaExtras with only the dropout fields set (dropout: None or (p, seed, offset))."""
    e = FaExtras()
    if dropout:
        p, seed, offset = dropout
        e.dropout_p = float(p)
        e.dropout_seed = _u64(seed)
        e.dropout_offset = _u64(offset)
    return e


def dropout_mask(mask, dropout_p, seed, offset) -> None:
    """Writes the dropout factors the kernels use for (dropout_p, seed, offset) into ``mask``,
    a float32 host array (batch, heads_q, seqlen_q, seqlen_k): 1 / (1 - dropout_p) where the
    probability of (sequence b, head h, row i, key j) is kept, 0 where it is dropped."""
    d = _describe(mask, "mask")
    t = _fa_tensor(d, "mask", output=True)
    e = _dropout_extras((dropout_p, seed, offset))
    _check(library().fa_dropout_mask(ctypes.byref(e), ctypes.byref(t)))


def _common_kwargs(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                   causal, window_size, softcap, deterministic, backend, stream, num_threads):
    return dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                window_size=window_size, softcap=softcap, deterministic=deterministic,
                backend=backend, stream=stream, num_threads=num_threads)


def _workspace_buffer(workspace, size, c) -> Tuple[Optional[int], int]:
    """(pointer, bytes) of a caller's workspace: None, a buffer on q's device, or a callable
    taking the byte count (size()) and returning one."""
    if callable(workspace):
        nbytes = size()
        workspace = workspace(nbytes) if nbytes else None
    if workspace is None:
        return None, 0
    wd = _describe(workspace, "workspace", c.stream)
    c.keep.append(wd)
    if not wd.is_contiguous():
        raise InvalidArgumentError("workspace must be contiguous")
    if wd.readonly:
        raise InvalidArgumentError("workspace is read-only")
    if wd.device != c.qd.device or (wd.device == FA_DEVICE_CUDA
                                     and wd.device_index != c.qd.device_index):
        raise InvalidArgumentError("workspace must live on the same device as q")
    ws_bytes = wd.nbytes
    return (wd.ptr if ws_bytes > 0 else None), ws_bytes


# ----------------------------------------------------------------------------
# Prepared calls
#
# NOTES: on small problems building a call's ctypes structs costs more host time than the
# library call itself (a decode step, measured on the H100's host: ~40 us of Python around
# ~11-25 us in C). So a call whose arrays are all torch tensors is keyed on everything its
# structs depend on except the data pointers (shapes, strides, dtypes, devices, the other
# arguments, the stream it runs on), and a later call with the same key reuses the structs,
# pointing them at its own tensors. Every value the Python checks read is in the key, so a
# reused call passed them; the library validates every call in C as before. Per thread
# (a reused struct is never shared between two calls in flight) and bounded.

_PREPARED_MAX = 64  # keys kept per thread (first in, first out): a model's distinct shapes
_PLAIN_TYPES = (int, float, bool, str)
_PER_CALL_VALUES = ("dropout_seed", "dropout_offset", "cache_seqlens")  # ints: _Structs.values, not in the key
_prepared_calls = threading.local()


def _signature(named) -> Optional[tuple]:
    """The key of a call's arguments (by position: each kind of call builds `named` in one
    order), or None when an argument keeps the call from being reused (a non-torch array,
    a block mask, a stream object, ...)."""
    torch = _torch_module()
    if torch is None:
        return None
    tensor, strided, plain = torch.Tensor, torch.strided, _PLAIN_TYPES
    sig = []
    append = sig.append
    for name, x in named.items():
        if x is None:
            append(None)
        elif type(x) in plain:
            append(name if name in _PER_CALL_VALUES else x)
        elif isinstance(x, tensor):
            if x.layout is not strided:
                return None
            append((x.shape, x.stride(), x.dtype, x.get_device()))
        elif type(x) is tuple and all(type(e) in plain for e in x):
            append(x)
        elif name == "workspace" and callable(x):
            append(name)
        else:
            return None
    return tuple(sig)


def _current_stream(q, stream):
    """stream, or the current torch stream of a torch CUDA q when stream is None."""
    if stream is None and _is_torch_tensor(q) and q.is_cuda:
        return _torch_current_stream(q)
    return stream


class _Prepared:
    """One call's structs (built, or reused from an earlier call with the same key)."""

    __slots__ = ("structs", "slots", "values", "ws_size", "ws_bytes")

    def __init__(self, structs, c, ws_size, ws_bytes):
        self.structs, self.slots, self.values = structs, c.slots, c.values
        self.ws_size, self.ws_bytes = ws_size, ws_bytes

    def point_at(self, named, workspace):
        """Points the structs at this call's arrays; (workspace pointer, bytes, the
        workspace buffer to keep alive until the call returns)."""
        for name, struct, field in self.slots:
            setattr(struct, field, named[name].data_ptr() or None)
        for name, struct, field, convert in self.values:
            setattr(struct, field, convert(named[name]))
        if callable(workspace):
            workspace = workspace(self.ws_size) if self.ws_size else None
            return (workspace.data_ptr() if workspace is not None else None), self.ws_size, workspace
        if workspace is None:
            return None, 0, None
        return workspace.data_ptr() or None, self.ws_bytes, workspace


def _prepare(kind: str, named: dict, build):
    """(structs, workspace pointer, workspace bytes, done) for a call. build() -> (call,
    structs, workspace size function or None) builds it from scratch. The caller holds
    done (it keeps the call's buffers alive) and calls it once the library accepted the
    call, which keeps the structs for reuse."""
    key = _signature(named)
    calls = getattr(_prepared_calls, "calls", None)
    if calls is None:
        calls = _prepared_calls.calls = {}
    entry = calls.get((kind, key)) if key is not None else None
    workspace = named.get("workspace")
    if entry is not None:
        ws_ptr, ws_bytes, buffer = entry.point_at(named, workspace)
        return entry.structs, ws_ptr, ws_bytes, (lambda: buffer)
    c, structs, size = build()
    sizes = []

    def measured_size():
        sizes.append(size())
        return sizes[-1]

    ws_ptr, ws_bytes = _workspace_buffer(workspace, measured_size, c) if size else (None, 0)
    reusable = key is not None and all(s[0] in named for s in c.slots + c.values)

    def done():  # holds c (and through it the call's buffers) until the caller drops it
        if reusable:
            if len(calls) >= _PREPARED_MAX:
                del calls[next(iter(calls))]
            calls[(kind, key)] = _Prepared(structs, c, sizes[0] if sizes else 0, ws_bytes)
    return structs, ws_ptr, ws_bytes, done


def _byrefs(structs):
    return [ctypes.byref(x) if x is not None else None for x in structs]


def forward(q, k, v, out, lse=None, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
            max_seqlen_k=0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
            backend=None, stream=None, deterministic=False, num_threads=0, alibi_slopes=None,
            sinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0, block_mask=None) -> None:
    """out = softmax(scale * q k^T + mask) v, written into ``out``; logsumexp into ``lse``.

    ``alibi_slopes``: float32 (heads_q,) or (batch, heads_q), scores -= slope * |i + seqlen_k -
    seqlen_q - j|. ``sinks``: float32 (heads_q,), a logit per head in each row's softmax
    denominator (no value); lse includes it. Both on q's device, None = off. ``dropout_p`` > 0
    drops attention probabilities by Philox bits of (dropout_seed, dropout_offset); the
    backward needs the same three values. ``block_mask``: a FlexAttention BlockMask, a
    flashattn.BlockMask or block_mask_parts() of one (host int32 lists, for the CPU and the
    CUDA backend; under CUDA-graph capture after a warm-up call with the same lists; with
    dropout too): only the listed key blocks of each query block are visited, the
    element mask (causal, window) applying inside them; the backward needs the same mask.

    q (batch, seqlen_q, heads_q, head_dim), k/v (batch, seqlen_k, heads_kv, head_dim), out like
    q, lse f32 (batch, heads_q, seqlen_q) or None. With cu_seqlens_q/k (int32, batch+1, on q's
    device) the batch dimension is dropped: q (total_q, heads_q, head_dim), lse (heads_q,
    total_q). ``stream``: a cudaStream_t (int) or stream object; by default the current torch
    stream for torch CUDA tensors, else the default stream.
    """
    stream = _current_stream(q, stream)
    named = dict(q=q, k=k, v=v, out=out, lse=lse, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                 softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                 softcap=softcap, backend=backend, stream=stream, deterministic=deterministic,
                 num_threads=num_threads, alibi_slopes=alibi_slopes, sinks=sinks,
                 dropout_p=dropout_p, dropout_seed=dropout_seed, dropout_offset=dropout_offset,
                 block_mask=block_mask)

    def build():
        c = _Call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                  causal, window_size, softcap, deterministic, backend, stream, num_threads)
        o = c.tensor(out, "out", output=True)
        lse_t = c.tensor(lse, "lse", output=True) if lse is not None else None
        extras = c.extras(alibi_slopes, sinks, dropout=(dropout_p, dropout_seed, dropout_offset),
                          block_mask=block_mask)
        return c, (c.q, c.k, c.v, o, lse_t, c.varlen, c.options, extras), None

    structs, _, _, done = _prepare("forward", named, build)
    _check(library().fa_forward_ex(*_byrefs(structs)))
    done()


def _workspace_size(fn_name, q, k, v, kwargs) -> int:
    c = _Call(q, k, v, **kwargs)
    nbytes = ctypes.c_size_t(0)
    status = getattr(library(), fn_name)(ctypes.byref(c.q), ctypes.byref(c.k), ctypes.byref(c.v),
                                         c.varlen_ptr, ctypes.byref(c.options),
                                         ctypes.byref(nbytes))
    _check(status)
    return int(nbytes.value)


def forward_workspace_size(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                           max_seqlen_k=0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, backend=None, stream=None,
                           deterministic=False, num_threads=0) -> int:
    """Bytes of scratch memory forward() uses beyond its inputs and outputs."""
    return _workspace_size("fa_forward_workspace_size", q, k, v, _common_kwargs(
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, softcap, deterministic, backend, stream, num_threads))


def backward_workspace_size(q, k, v, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
                            max_seqlen_k=0, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, backend=None, stream=None,
                            deterministic=False, num_threads=0) -> int:
    """Bytes of scratch memory backward() needs, on the tensors' device."""
    return _workspace_size("fa_backward_workspace_size", q, k, v, _common_kwargs(
        cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, softcap, deterministic, backend, stream, num_threads))


def backward(q, k, v, out, dout, lse, dq, dk, dv, *, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=0, max_seqlen_k=0, softmax_scale=None, causal=False,
             window_size=(-1, -1), softcap=0.0, deterministic=False, workspace=None,
             backend=None, stream=None, num_threads=0, alibi_slopes=None, sinks=None,
             dsinks=None, dropout_p=0.0, dropout_seed=0, dropout_offset=0, block_mask=None) -> None:
    """Gradients dq, dk, dv (written in place) from dout and the forward's out and lse.

    ``alibi_slopes``, ``sinks``, ``block_mask`` and the dropout arguments as given to forward(); with sinks,
    ``dsinks`` (float32 (heads_q,)) receives their gradient.

    ``workspace``: None (the library allocates), a contiguous buffer on the tensors' device of
    at least backward_workspace_size() bytes (e.g. torch.empty(n, dtype=torch.uint8)), or a
    callable taking that byte count and returning such a buffer (the size is then queried from
    the same argument descriptions, without a second backward_workspace_size call).
    """
    stream = _current_stream(q, stream)
    named = dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, dq=dq, dk=dk, dv=dv,
                 cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                 max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=causal,
                 window_size=window_size, softcap=softcap, deterministic=deterministic,
                 workspace=workspace, backend=backend, stream=stream, num_threads=num_threads,
                 alibi_slopes=alibi_slopes, sinks=sinks, dsinks=dsinks, dropout_p=dropout_p,
                 dropout_seed=dropout_seed, dropout_offset=dropout_offset, block_mask=block_mask)

    def build():
        c = _Call(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                  causal, window_size, softcap, deterministic, backend, stream, num_threads)
        tensors = (c.q, c.k, c.v, c.tensor(out, "out"), c.tensor(dout, "dout"), c.tensor(lse, "lse"),
                   c.tensor(dq, "dq", output=True), c.tensor(dk, "dk", output=True),
                   c.tensor(dv, "dv", output=True))
        extras = c.extras(alibi_slopes, sinks, dsinks,
                          dropout=(dropout_p, dropout_seed, dropout_offset), block_mask=block_mask)

        def size():
            nbytes = ctypes.c_size_t(0)
            _check(library().fa_backward_workspace_size(ctypes.byref(c.q), ctypes.byref(c.k),
                                                        ctypes.byref(c.v), c.varlen_ptr,
                                                        ctypes.byref(c.options), ctypes.byref(nbytes)))
            return nbytes.value
        return c, tensors + (c.varlen, c.options, extras), size

    structs, ws_ptr, ws_bytes, done = _prepare("backward", named, build)
    _check(library().fa_backward_ex(*_byrefs(structs), ws_ptr, ws_bytes))
    done()


# ----------------------------------------------------------------------------
# Attention against a KV cache


def _index_array(x, name: str, q: _Desc, stream, ndim: int) -> _Desc:
    """An int32 index array (cache_seqlens, cache_batch_idx, block_table) on q's device."""
    d = _describe(x, name, stream)
    if d.dtype != "int32":
        got = d.dtype if isinstance(d.dtype, str) else _DTYPE_NAMES[d.dtype]
        raise InvalidArgumentError(f"{name} must be int32, got {got}")
    if len(d.shape) != ndim:
        raise InvalidArgumentError(f"{name} must have {ndim} dimension(s), got shape {d.shape}")
    if d.shape[-1] > 1 and d.strides[-1] != 1:
        raise InvalidArgumentError(f"{name} must be contiguous in its last dimension")
    if d.device != q.device or (d.device == FA_DEVICE_CUDA and d.device_index != q.device_index):
        raise InvalidArgumentError(f"{name} must live on q's device")
    return d


class _KvCall(_Structs):
    """One fa_forward_kvcache call's structs, built from Python arguments."""

    def __init__(self, q, k_cache, v_cache, k, v, cache_seqlens, block_table, cache_batch_idx,
                 rotary_cos, rotary_sin, rotary_interleaved, num_splits, trust_indices,
                 softmax_scale, causal, window_size, softcap, backend, stream, num_threads,
                 alibi_slopes, sinks):
        super().__init__(q, stream)
        c = FaKvCache()
        self.k_cache = self.tensor(k_cache, "k_cache", output=True)
        self.v_cache = self.tensor(v_cache, "v_cache", output=True)
        c.k_cache, c.v_cache = ctypes.pointer(self.k_cache), ctypes.pointer(self.v_cache)
        for field, x, name in (("k_new", k, "k"), ("v_new", v, "v"), ("rotary_cos", rotary_cos, "rotary_cos"),
                               ("rotary_sin", rotary_sin, "rotary_sin")):
            if x is not None:
                t = self.tensor(x, name)
                self.keep.append(t)
                setattr(c, field, ctypes.pointer(t))
        if cache_seqlens is None:
            raise InvalidArgumentError("cache_seqlens is required (an int or an int32 tensor (batch,))")
        if isinstance(cache_seqlens, numbers.Integral):
            c.cache_seqlen = _int32(cache_seqlens, "cache_seqlens")
            self.values.append(("cache_seqlens", c, "cache_seqlen", _cache_seqlen))
        else:
            self.pointer(c, "cache_seqlens", self.index(cache_seqlens, "cache_seqlens", 1), "cache_seqlens")
        if block_table is not None:
            d = self.index(block_table, "block_table", 2)
            self.pointer(c, "block_table", d, "block_table")
            c.max_blocks = d.shape[1]
            c.block_table_stride = d.strides[0] if d.shape[0] > 1 else d.shape[1]
        if cache_batch_idx is not None:
            self.pointer(c, "cache_batch_idx", self.index(cache_batch_idx, "cache_batch_idx", 1),
                         "cache_batch_idx")
        c.rotary_interleaved = 1 if rotary_interleaved else 0
        c.num_splits = int(num_splits)
        c.trust_indices = 1 if trust_indices else 0
        self.cache = c
        self.options = _options(softmax_scale=softmax_scale, causal=causal,
                                window_size=window_size, softcap=softcap, deterministic=False,
                                backend=backend, stream=self.stream, num_threads=num_threads)
        self.score_extras = self.extras(alibi_slopes=alibi_slopes, sinks=sinks)

    def index(self, x, name, ndim):
        d = _index_array(x, name, self.qd, self.stream, ndim)
        self.keep.append(d)
        return d

    def workspace_size(self) -> int:
        nbytes = ctypes.c_size_t(0)
        _check(library().fa_forward_kvcache_workspace_size(
            ctypes.byref(self.q), ctypes.byref(self.cache), ctypes.byref(self.options),
            ctypes.byref(nbytes)))
        return int(nbytes.value)


_KV_DEFAULTS = dict(k=None, v=None, cache_seqlens=None, block_table=None, cache_batch_idx=None,
                    rotary_cos=None, rotary_sin=None, rotary_interleaved=True, num_splits=0,
                    trust_indices=False, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, backend=None, stream=None, num_threads=0, alibi_slopes=None,
                    sinks=None)


def forward_kvcache_workspace_size(q, k_cache, v_cache, **kwargs) -> int:
    """Bytes of scratch memory forward_kvcache() needs on q's device (same keyword arguments)."""
    return _KvCall(q, k_cache, v_cache, **{**_KV_DEFAULTS, **kwargs}).workspace_size()


def forward_kvcache(q, k_cache, v_cache, out, lse=None, *, workspace=None, **kwargs) -> None:
    """Attention of q against a KV cache, appending k/v into it first (in place).

    q (batch, seqlen_q, heads_q, d); k_cache/v_cache (batch_cache, seqlen_cache, heads_kv, d),
    or (num_blocks, block_size, heads_kv, d) with block_table (batch, max_blocks) int32;
    cache_seqlens an int or int32 (batch,); k/v (batch, seqlen_new, heads_kv, d) or None;
    rotary_cos/rotary_sin (seqlen_ro, rotary_dim / 2); cache_batch_idx int32 (batch,) or None;
    alibi_slopes f32 (heads_q) or (batch, heads_q), sinks f32 (heads_q), or None (both
    backends run them).
    out like q; lse f32 (batch, heads_q, seqlen_q) or None. ``workspace``: None (the library
    allocates), a buffer of at least forward_kvcache_workspace_size() bytes on q's device, or a
    callable taking that byte count and returning one. Index arrays are checked on the host
    (a synchronization on CUDA) unless trust_indices=True or a CUDA graph is being captured.
    """
    unknown = set(kwargs) - set(_KV_DEFAULTS)
    if unknown:
        raise TypeError(f"forward_kvcache() got unexpected keyword arguments {sorted(unknown)}")
    args = {**_KV_DEFAULTS, **kwargs}
    args["stream"] = _current_stream(q, args["stream"])
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, out=out, lse=lse, workspace=workspace, **args)

    def build():
        c = _KvCall(q, k_cache, v_cache, **args)
        o = c.tensor(out, "out", output=True)
        lse_t = c.tensor(lse, "lse", output=True) if lse is not None else None
        return c, (c.q, c.cache, o, lse_t, c.options, c.score_extras), c.workspace_size

    structs, ws_ptr, ws_bytes, done = _prepare("kvcache", named, build)
    _check(library().fa_forward_kvcache_ex(*_byrefs(structs), ws_ptr, ws_bytes))
    done()
