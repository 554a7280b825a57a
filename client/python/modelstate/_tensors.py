"""Tensors on the wire: dtype names and numbers, and conversions between
torch tensors (or numpy arrays when torch is absent) and contiguous
little-endian bytes, copying only where the wire format forces it."""

import mmap

import numpy as np

from .v1 import tensor_pb2

try:  # torch is optional: without it tensors come back as numpy arrays
    import torch
except ImportError:  # pragma: no cover - exercised by a subprocess test
    torch = None

# proto number -> (name, numpy dtype, torch dtype name)
_DTYPES = {
    tensor_pb2.DTYPE_FLOAT32: ("float32", np.float32, "float32"),
    tensor_pb2.DTYPE_FLOAT64: ("float64", np.float64, "float64"),
    tensor_pb2.DTYPE_FLOAT16: ("float16", np.float16, "float16"),
    # numpy has no bfloat16: without torch its values come as raw uint16.
    tensor_pb2.DTYPE_BFLOAT16: ("bfloat16", np.uint16, "bfloat16"),
    tensor_pb2.DTYPE_INT8: ("int8", np.int8, "int8"),
    tensor_pb2.DTYPE_INT16: ("int16", np.int16, "int16"),
    tensor_pb2.DTYPE_INT32: ("int32", np.int32, "int32"),
    tensor_pb2.DTYPE_INT64: ("int64", np.int64, "int64"),
    tensor_pb2.DTYPE_UINT8: ("uint8", np.uint8, "uint8"),
    tensor_pb2.DTYPE_BOOL: ("bool", np.bool_, "bool"),
}
_BY_NAME = {name: number for number, (name, _, _) in _DTYPES.items()}
_BY_NUMPY = {np.dtype(npt): number for number, (name, npt, _) in _DTYPES.items()
             if name != "bfloat16"}
if torch is not None:
    _BY_TORCH = {getattr(torch, t): number
                 for number, (_, _, t) in _DTYPES.items()}


def dtype_name(number):
    """'float32' for DTYPE_FLOAT32."""
    return _DTYPES[number][0]


def torch_dtype(number):
    return getattr(torch, _DTYPES[number][2])


def dtype_number(dtype):
    """The proto number of a torch dtype, numpy dtype or dtype name."""
    if torch is not None and isinstance(dtype, torch.dtype):
        if dtype not in _BY_TORCH:
            raise TypeError(f"modelstate has no {dtype} tensors")
        return _BY_TORCH[dtype]
    if isinstance(dtype, str):
        name = dtype[len("torch."):] if dtype.startswith("torch.") else dtype
        if name in _BY_NAME:
            return _BY_NAME[name]
        raise TypeError(f"unknown dtype '{dtype}'")
    try:
        return _BY_NUMPY[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise TypeError(f"modelstate has no {dtype} tensors") from None


def as_torch_dtype(dtype):
    """A torch.dtype for a torch dtype, numpy dtype or dtype name (None
    stays None)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    return torch_dtype(dtype_number(dtype))


def is_tensor(value):
    return (torch is not None and isinstance(value, torch.Tensor)) or \
        isinstance(value, np.ndarray)


def describe(value):
    """(dtype number, shape, byte length) of a tensor or array, without
    touching its data."""
    if torch is not None and isinstance(value, torch.Tensor):
        return (dtype_number(value.dtype), list(value.shape),
                value.numel() * value.element_size())
    if isinstance(value, np.ndarray):
        return dtype_number(value.dtype), list(value.shape), value.nbytes
    raise TypeError(f"expected a tensor, got {type(value).__name__}")


def bytes_source(value):
    """A callable returning a memoryview of `value`'s bytes, copying (to the
    host, or to make it contiguous) only when it is called."""
    return lambda: memoryview(host_bytes(value)[2]).cast("B")


def host_bytes(value):
    """(dtype number, shape, uint8 numpy view of the bytes) of a tensor or
    array, without copying when it is already contiguous on the CPU."""
    if torch is not None and isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        number = dtype_number(t.dtype)
        flat = t.reshape(-1)
        raw = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
        return number, list(t.shape), raw.numpy()
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        number = dtype_number(a.dtype)
        return number, list(a.shape), a.reshape(-1).view(np.uint8)
    raise TypeError(f"expected a tensor, got {type(value).__name__}")


# Buffers from this size up get a mapping of their own (as the C++ core's
# storages do): see empty_bytes.
_OWN_MAPPING_BYTES = 4 << 20
_HUGE_PAGE = 2 << 20


def empty_bytes(n):
    """An uninitialised byte buffer of n bytes that a tensor can own (via
    torch.from_numpy): a numpy array. A large one views a mapping of its
    own, aligned to 2 MiB and marked for huge pages, which is unmapped when
    the last array or tensor viewing it goes. numpy's own large arrays come
    from malloc, unaligned and, once malloc reuses its heap, on 4 KiB pages:
    faulting those in costs this machine's kernel about 280 ms per 600 MiB,
    and the server's later writes into them (pull(into=) of a pulled GPT-2)
    took 105 to 120 ms against 61 to 65 ms into aligned huge pages."""
    if n < _OWN_MAPPING_BYTES:
        return np.empty(n, dtype=np.uint8)
    mapping = mmap.mmap(-1, n + _HUGE_PAGE,
                        flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = -np.frombuffer(mapping, dtype=np.uint8,
                           count=1).ctypes.data % _HUGE_PAGE
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE, start - start % mmap.PAGESIZE,
                        n + start % mmap.PAGESIZE)
    return np.frombuffer(mapping, dtype=np.uint8, count=n, offset=start)


def address(raw):
    """The address of the first byte of a buffer from empty_bytes(), or of
    a contiguous tensor."""
    if isinstance(raw, np.ndarray):
        return raw.ctypes.data
    return raw.data_ptr()


def writable_view(raw):
    """A flat byte memoryview of a buffer from empty_bytes(), or of a
    contiguous cpu tensor of any dtype (its bytes)."""
    if isinstance(raw, np.ndarray):
        return memoryview(raw).cast("B")
    return memoryview(raw.detach().reshape(-1).view(torch.uint8).numpy())


def from_bytes(raw, number, shape, requires_grad=False, parameter=False):
    """A tensor (or numpy array) viewing `raw`, a uint8 torch tensor or
    numpy array that it then owns."""
    if torch is None:
        return raw.view(_DTYPES[number][1]).reshape(shape)
    if isinstance(raw, np.ndarray):
        raw = torch.from_numpy(raw)
    if raw.numel() == 0:
        # numpy gives an empty array stride 0, which view() to a wider
        # dtype refuses; an empty tensor has no bytes to own anyway.
        raw = torch.empty(0, dtype=torch.uint8)
    t = raw.view(torch_dtype(number)).reshape(shape)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t


def meta_from_entry(number, shape, requires_grad=False, parameter=False):
    """A meta tensor (None without torch) of this dtype and shape."""
    if torch is None:
        return None
    t = torch.empty(shape, dtype=torch_dtype(number), device="meta")
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def to_proto(value, requires_grad=None):
    """A TensorProto holding `value`'s bytes (and its device when it has
    one other than the CPU). requires_grad is sent only when given: a
    replacement without it keeps the proposed parameter's flag."""
    number, shape, raw = host_bytes(value)
    proto = tensor_pb2.TensorProto(dtype=number, shape=shape,
                                   data=raw.tobytes())
    if torch is not None and isinstance(value, torch.Tensor) and \
            value.device.type != "cpu":
        proto.device = str(value.device)
    if requires_grad is not None:
        proto.requires_grad = bool(requires_grad)
    return proto


def none_proto():
    """The TensorProto that stands for None (no dtype)."""
    return tensor_pb2.TensorProto()


def from_proto(proto, parameter=False):
    raw = np.frombuffer(proto.data, dtype=np.uint8).copy()
    return from_bytes(raw, proto.dtype, list(proto.shape),
                      requires_grad=proto.requires_grad, parameter=parameter)


def meta_tensor(info):
    """A stand-in with the shape and dtype of a TensorInfo but no values (a
    torch meta tensor, or None without torch)."""
    if torch is None:
        return None
    return torch.empty(list(info.shape), dtype=torch_dtype(info.dtype),
                       device="meta")
