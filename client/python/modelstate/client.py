"""The connection to a modelstate server and the handle of one hosted
module, shaped like torch.nn.Module where a remote module can be."""

import collections
import itertools
import json
import uuid

import grpc
import numpy as np
from google.protobuf import json_format

from . import _tensors
from ._errors import DTypeError, from_rpc_error
from ._hooks import HookHandle
from .v1 import model_state_service_pb2 as pb
from .v1 import model_state_service_pb2_grpc as pb_grpc
from .v1 import module_pb2

torch = _tensors.torch

if torch is not None:
    from torch.nn.modules.module import _IncompatibleKeys
else:  # the same shape and repr as PyTorch's
    class _IncompatibleKeys(
            collections.namedtuple("IncompatibleKeys",
                                   ["missing_keys", "unexpected_keys"])):
        def __repr__(self):
            if not self.missing_keys and not self.unexpected_keys:
                return "<All keys matched successfully>"
            return super().__repr__()

        __str__ = __repr__

_MiB = 1 << 20


class Client:
    """A connection to a modelstate server (see connect())."""

    def __init__(self, target, *, timeout=30.0, transfer_timeout=1800.0,
                 chunk_bytes=_MiB, metadata=(), credentials=None):
        options = [("grpc.max_receive_message_length", 1 << 30),
                   ("grpc.max_send_message_length", 1 << 30),
                   # A restarted server is found again within seconds
                   # (hooks subscribe again; grpc's own cap is 2 minutes).
                   ("grpc.max_reconnect_backoff_ms", 2000)]
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options)
        self._stub = pb_grpc.ModelStateServiceStub(self._channel)
        self._timeout = timeout
        self._transfer_timeout = transfer_timeout
        self._chunk_bytes = chunk_bytes
        self._metadata = tuple(metadata)
        self.target = target

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, invalid_argument=None):
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout,
                                               metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error, invalid_argument) from None

    def health(self):
        """The server's grpc.health.v1 status name ("SERVING")."""
        # HealthCheckRequest{} is empty on the wire; the response's only
        # field is the status enum (field 1, a one-byte varint here).
        check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda _: b"",
            response_deserializer=lambda raw: raw)
        try:
            raw = check(None, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        status = raw[1] if len(raw) >= 2 and raw[0] == 0x08 else 0
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING"}.get(
            status, "UNKNOWN")

    # ----------------------------------------------------------- modules --
    def build(self, spec, name=None, *, seed=0, device=None, dtype=None,
              all_or_nothing=False):
        """Builds `spec` (a ModuleSpec as a dict, JSON text or proto) on
        the server as `name` ("namespace/name"; a fresh name in "default"
        when omitted) with torch.manual_seed(seed) semantics, and returns
        its RemoteModule."""
        request = pb.BuildModuleRequest(
            spec=_spec_proto(spec), seed=seed, all_or_nothing=all_or_nothing,
            device=str(device) if device is not None else "",
            dtype=_dtype_text(dtype) if dtype is not None else "")
        if name is None:
            kind = request.spec.type.lower() or "module"
            name = f"default/{kind}-{uuid.uuid4().hex[:12]}"
        request.module = name
        response = self._call("BuildModule", request)
        module = RemoteModule(self, response.module)
        module.last_registrations = list(response.registrations)
        return module

    def module(self, name):
        """The RemoteModule of an existing module (NotFoundError if none)."""
        response = self._call("GetModule", pb.GetModuleRequest(module=name))
        return RemoteModule(self, response.module)

    def modules(self, namespace=""):
        """Names of the hosted modules, in order."""
        names = []
        token = ""
        while True:
            response = self._call("ListModules", pb.ListModulesRequest(
                namespace=namespace, page_size=1000, page_token=token))
            names.extend(m.module for m in response.modules)
            token = response.next_page_token
            if not token:
                return names

    def delete(self, name):
        self._call("DeleteModule", pb.DeleteModuleRequest(module=name))

    # ------------------------------------------------------------- hooks --
    def register_module_parameter_registration_hook(self, hook, **options):
        """Like torch.nn.modules.module.register_module_parameter_
        registration_hook, for every module on the server: hook(module,
        name, param) returns None (keep), a tensor (replace) or
        modelstate.REJECT (block). Options: name, timeout (seconds),
        priority, fail_open, namespaces, max_data_bytes."""
        return HookHandle(self, "parameter", hook, **options)

    def register_module_buffer_registration_hook(self, hook, **options):
        """As the parameter hook, for buffers: hook(module, name, buffer)."""
        return HookHandle(self, "buffer", hook, **options)

    def register_module_module_registration_hook(self, hook, **options):
        """As the parameter hook, for submodules: hook(module, name,
        submodule) returns None (keep) or modelstate.REJECT (block)."""
        return HookHandle(self, "module", hook, **options)


def connect(target="127.0.0.1:50051", **options):
    """A Client for the server at `target` ("host:port"). Options: timeout
    (seconds per call), transfer_timeout (state_dict streams), chunk_bytes,
    metadata (pairs sent with every call, e.g. an authorization token),
    credentials (grpc.ssl_channel_credentials(...) for TLS)."""
    return Client(target, **options)


def _spec_proto(spec):
    if isinstance(spec, module_pb2.ModuleSpec):
        return spec
    if isinstance(spec, str):
        spec = json.loads(spec)
    try:
        return json_format.ParseDict(spec, module_pb2.ModuleSpec())
    except json_format.ParseError as error:
        raise ValueError(f"spec: {error}") from None


def _is_dtype(value):
    try:
        _tensors.dtype_number(value)
        return True
    except TypeError:
        return False


def _dtype_text(dtype):
    return _tensors.dtype_name(_tensors.dtype_number(dtype))


class RemoteModule:
    """A module hosted on the server. Reads fetch from the server each time;
    changes go to the server (and through its registration hooks)."""

    def __init__(self, client, name):
        self._client = client
        self.name = name
        # The registrations of the call that created this handle.
        self.last_registrations = []

    def __repr__(self):
        return f"RemoteModule('{self.name}')"

    def info(self, path="", with_hashes=False):
        """The GetModuleResponse describing the tree at `path`."""
        return self._client._call("GetModule", pb.GetModuleRequest(
            module=self.name, path=path, with_hashes=with_hashes))

    @property
    def type_name(self):
        return self.info().info.type

    @property
    def training(self):
        return self.info().info.training

    # -------------------------------------------------------------- state --
    def _fetch(self, selection, key_prefix=""):
        """(header, [(entry, tensor)]) streamed from the server."""
        request = pb.GetStateDictRequest(
            module=self.name, selection=selection, key_prefix=key_prefix,
            chunk_bytes=self._client._chunk_bytes)
        client = self._client
        try:
            stream = client._stub.GetStateDict(
                request, timeout=client._transfer_timeout,
                metadata=client._metadata)
            header = next(stream).header
            entries = list(header.entries)
            buffers = [np.empty(e.byte_length, dtype=np.uint8)
                       for e in entries]
            index, offset = 0, 0
            for chunk in stream:
                data = memoryview(chunk.data)
                while data:
                    while index < len(entries) and \
                            offset == entries[index].byte_length:
                        index, offset = index + 1, 0
                    if index == len(entries):
                        raise ValueError("the server sent more bytes than "
                                         "its header announced")
                    n = min(len(data), entries[index].byte_length - offset)
                    buffers[index][offset:offset + n] = np.frombuffer(
                        data[:n], dtype=np.uint8)
                    offset += n
                    data = data[n:]
            if sum(e.byte_length for e in entries[:index]) + offset != \
                    header.total_bytes:
                raise ValueError(f"the state_dict stream of {self.name} "
                                 f"ended early")
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        tensors = []
        for entry, raw in zip(entries, buffers):
            parameter = entry.kind == module_pb2.ENTRY_KIND_PARAMETER and \
                selection == pb.GetStateDictRequest.SELECTION_PARAMETERS
            tensors.append((entry, _tensors.from_bytes(
                raw, entry.dtype, list(entry.shape),
                requires_grad=entry.requires_grad and parameter,
                parameter=parameter and torch is not None)))
        return header, tensors

    def state_dict(self, *, prefix="", keep_vars=False):
        """PyTorch's state_dict(): an OrderedDict of tensors (numpy arrays
        without torch) in PyTorch's key order, with `_metadata`."""
        header, tensors = self._fetch(
            pb.GetStateDictRequest.SELECTION_STATE_DICT)
        out = collections.OrderedDict()
        out._metadata = collections.OrderedDict(
            (prefix + m.path if m.path else prefix.rstrip("."),
             {"version": m.version}) for m in header.metadata)
        for entry, tensor in tensors:
            if keep_vars and torch is not None and \
                    entry.kind == module_pb2.ENTRY_KIND_PARAMETER:
                tensor = torch.nn.Parameter(tensor,
                                            requires_grad=entry.requires_grad)
            out[prefix + entry.key] = tensor
        return out

    def named_parameters(self, prefix="", recurse=True):
        """PyTorch's named_parameters(): (name, Parameter) pairs, each
        parameter once."""
        _, tensors = self._fetch(pb.GetStateDictRequest.SELECTION_PARAMETERS)
        for entry, tensor in tensors:
            if recurse or "." not in entry.key:
                yield (prefix + "." if prefix else "") + entry.key, tensor

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True):
        """PyTorch's named_buffers(): non-persistent buffers included."""
        _, tensors = self._fetch(pb.GetStateDictRequest.SELECTION_BUFFERS)
        for entry, tensor in tensors:
            if recurse or "." not in entry.key:
                yield (prefix + "." if prefix else "") + entry.key, tensor

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def load_state_dict(self, state_dict, strict=True, *, assign=False,
                        atomic=True):
        """PyTorch's load_state_dict(): returns _IncompatibleKeys; raises
        RuntimeError (a FailedPreconditionError) with PyTorch's text. Atomic
        unless atomic=False: a failed load changes nothing."""
        entries = []
        for key, value in state_dict.items():
            if not _tensors.is_tensor(value):
                raise TypeError(f"state_dict['{key}']: expected a tensor, "
                                f"got {type(value).__name__}")
            number, shape, raw = _tensors.host_bytes(value)
            entries.append((pb.StateDictEntry(
                key=key, dtype=number, shape=shape,
                byte_length=raw.nbytes), raw))
        header = pb.StateDictHeader(
            entries=[e for e, _ in entries],
            total_bytes=sum(raw.nbytes for _, raw in entries))
        for path, data in (getattr(state_dict, "_metadata", None) or
                           {}).items():
            if isinstance(data, dict) and "version" in data:
                header.metadata.add(path=path, version=int(data["version"]))
        start = pb.LoadStart(
            module=self.name, header=header,
            options=pb.LoadOptions(strict=strict, atomic=atomic,
                                   assign=assign))
        chunk = self._client._chunk_bytes

        def requests():
            yield pb.LoadStateDictRequest(start=start)
            pending = bytearray()
            for _, raw in entries:
                view = memoryview(raw)
                while view:
                    take = min(len(view), chunk - len(pending))
                    pending += view[:take]
                    view = view[take:]
                    if len(pending) == chunk:
                        yield pb.LoadStateDictRequest(data=bytes(pending))
                        pending = bytearray()
            if pending:
                yield pb.LoadStateDictRequest(data=bytes(pending))

        client = self._client
        try:
            response = client._stub.LoadStateDict(
                requests(), timeout=client._transfer_timeout,
                metadata=client._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        self.last_registrations = list(response.registrations)
        return _IncompatibleKeys(list(response.missing_keys),
                                 list(response.unexpected_keys))

    # ---------------------------------------------------------- changes --
    def to(self, *args, **kwargs):
        """PyTorch's to(device=None, dtype=None) (also to(dtype), to(device),
        to(tensor)): floating tensors change dtype, every tensor moves.
        Returns self."""
        if torch is not None:
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        else:  # positional arguments: dtype names or devices
            device = kwargs.get("device")
            dtype = kwargs.get("dtype")
            for arg in args:
                if _is_dtype(arg):
                    dtype = arg
                else:
                    device = arg
        request = pb.MoveModuleRequest(module=self.name)
        if device is not None:
            request.device = str(device)
        if dtype is not None:
            request.dtype = str(dtype)
        self._client._call("MoveModule", request, invalid_argument=DTypeError)
        return self

    def half(self):
        return self.to(dtype="float16")

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def bfloat16(self):
        return self.to(dtype="bfloat16")

    def cpu(self):
        return self.to(device="cpu")

    def train(self, mode=True):
        self._client._call("SetTraining", pb.SetTrainingRequest(
            module=self.name, training=mode))
        return self

    def eval(self):
        return self.train(False)

    def register_parameter(self, name, param, *, path="", seed=0):
        """Registers a parameter (a tensor, or None) in the submodule at
        `path`; the server's hooks decide. requires_grad comes from the
        tensor (True for anything that is not a torch tensor)."""
        request = pb.RegisterTensorRequest(module=self.name, path=path,
                                           name=name, seed=seed)
        if param is None:
            request.none = True
        else:
            request.tensor.CopyFrom(_tensors.to_proto(param))
            request.requires_grad = bool(getattr(param, "requires_grad",
                                                 True))
        self.last_registrations = list(
            self._client._call("RegisterParameter", request).registrations)

    def register_buffer(self, name, tensor, persistent=True, *, path=""):
        """Registers a buffer (a tensor, or None) in the submodule at
        `path`."""
        request = pb.RegisterTensorRequest(module=self.name, path=path,
                                           name=name, persistent=persistent)
        if tensor is None:
            request.none = True
        else:
            request.tensor.CopyFrom(_tensors.to_proto(tensor))
        self.last_registrations = list(
            self._client._call("RegisterBuffer", request).registrations)

    def register_module(self, name, module, *, path="", seed=0):
        """Registers a submodule built from `module` (a ModuleSpec as a
        dict, JSON text or proto), or None, in the submodule at `path`."""
        request = pb.RegisterSubmoduleRequest(module=self.name, path=path,
                                              name=name, seed=seed)
        if module is None:
            request.none = True
        else:
            request.spec.CopyFrom(_spec_proto(module))
        self.last_registrations = list(
            self._client._call("RegisterSubmodule", request).registrations)

    add_module = register_module

    def delete(self):
        """Deletes the module from the server."""
        self._client.delete(self.name)
