"""The connection to a modelstate server: build, push and pull modules,
list and open hosted ones, and register remote hooks."""

import threading
import uuid

import grpc
import grpc.experimental

from . import _shm, _tensors, _transfer
from ._errors import from_rpc_error
from ._hooks import HookHandle
from ._remote import RemoteModule, spec_proto
from .v1 import model_state_service_pb2 as pb
from .v1 import model_state_service_pb2_grpc as pb_grpc

_MiB = 1 << 20


class Client:
    """A connection to a modelstate server (see connect()).

    On the server's own host, state_dict transfers (state_dict(),
    load_state_dict(), push(), pull()) pass their bytes through a ring of
    shared memory (32 MiB, made on the first transfer, handed to the server
    over its Unix-domain socket once, and reused until close()) instead of
    gRPC messages, when the server offers it: the same results, each byte
    copied once instead of streamed. One transfer at a time uses the ring;
    another thread's transfer meanwhile goes over gRPC. shared_memory=False,
    or the environment variable MODELSTATE_SHARED_MEMORY=0, keeps every byte
    on gRPC. A state_dict()/pull() lets the server write the bytes straight
    into the new tensors where the kernel allows it (one copy instead of
    two); shared_memory_direct=False keeps them in the ring's slots."""

    def __init__(self, target, *, timeout=30.0, transfer_timeout=1800.0,
                 chunk_bytes=_MiB, metadata=(), credentials=None,
                 progress="auto", shared_memory=True,
                 shared_memory_direct=True):
        if not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes: expected a positive int, got "
                             f"{chunk_bytes!r}")
        options = [("grpc.max_receive_message_length", 1 << 30),
                   ("grpc.max_send_message_length", 1 << 30),
                   # A restarted server is found again within seconds
                   # (hooks subscribe again; grpc's own cap is 2 minutes).
                   ("grpc.max_reconnect_backoff_ms", 2000),
                   # GetStateDict's messages are read on the caller's
                   # thread, not handed over from a helper thread: about a
                   # third less client CPU per byte pulled.
                   (grpc.experimental.ChannelOptions
                    .SingleThreadedUnaryStream, 1)]
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options)
        self._stub = pb_grpc.ModelStateServiceStub(self._channel)
        self._get_state_dict = _transfer.get_state_dict_call(self._channel)
        self._load_state_dict = _transfer.load_state_dict_call(self._channel)
        self._timeout = timeout
        self._transfer_timeout = transfer_timeout
        self._chunk_bytes = chunk_bytes
        self._metadata = tuple(metadata)
        self.target = target
        # How transfers report progress unless a call says otherwise: see
        # connect().
        self.progress = progress
        self._shared_memory = _shm.wanted(shared_memory)
        self._shared_memory_direct = bool(shared_memory_direct)
        self._shm_path = None  # not asked yet: see _shm.socket_path
        self._shm_ring = None  # made on the first transfer: see _shm.take
        self._shm_setup = threading.Lock()

    def close(self):
        self._channel.close()
        _shm.close(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, invalid_argument=None, timeout=None):
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout or self._timeout,
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
        its RemoteModule. To host a torch module, use push()."""
        request = pb.BuildModuleRequest(
            spec=spec_proto(spec, "build"), seed=seed,
            all_or_nothing=all_or_nothing,
            device=str(device) if device is not None else "",
            dtype=_dtype_text(dtype) if dtype is not None else "")
        request.module = name if name is not None else fresh_name(
            request.spec.type)
        response = self._call("BuildModule", request)
        module = RemoteModule(self, response.module)
        module.last_registrations = list(response.registrations)
        return module

    def push(self, model, name=None, *, dtype=None, device=None,
             all_or_nothing=True, seed=0, progress=None):
        """Hosts the torch module `model` as `name`: its spec is derived
        from the module (library layers from their constructor arguments,
        any other class as a custom module with its own tensors), built on
        the server (hooks see every registration), and its weights are
        streamed in. Returns the RemoteModule; its `notes` say which
        modules could not be hosted as library layers, and why. dtype=
        converts floating tensors; device="meta" hosts the structure only.
        all_or_nothing (default) fails the push if a hook blocks anything."""
        from . import _push
        return _push.push(self, model, name, dtype=dtype, device=device,
                          all_or_nothing=all_or_nothing, seed=seed,
                          progress=progress)

    def pull(self, name, *, dtype=None, device=None, progress=None,
             into=None):
        """The hosted module `name` as a torch.nn.Module: library layers as
        their torch classes, other modules as nn.Modules with the same tree,
        weights loaded with strict=True, ties, shared submodules and
        training flags as hosted. dtype= converts floating tensors on the
        server; device="meta" builds the structure without fetching data;
        another device gets the module moved there after the pull.

        into=model refreshes a module you already have instead, and returns
        it: the hosted state_dict's bytes overwrite model's own parameters
        and buffers in place (same tensor objects and memory; on this host
        the server writes them there itself, so no memory is allocated).
        Its keys must be the hosted ones (RuntimeError with PyTorch's
        load_state_dict text otherwise), each tensor of the hosted dtype
        (after dtype=) and shape, contiguous and on cpu (ValueError naming
        the key otherwise), all checked before any byte moves. After a
        failed transfer the tensors' values are unspecified."""
        from . import _pull
        return _pull.pull(self, name, "", dtype=dtype, device=device,
                          progress=progress, into=into)

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
    (seconds per call), transfer_timeout (state_dict streams, forward),
    chunk_bytes, metadata (pairs sent with every call, e.g. an
    authorization token), credentials (grpc.ssl_channel_credentials(...)
    for TLS), progress (how transfers longer than a second report: "auto",
    the default, draws a tqdm bar when stderr is a terminal and tqdm is
    installed; True always shows one; False none; a callable is called as
    progress(done_bytes, total_bytes) during every transfer), shared_memory
    (True, the default: state_dict bytes go through a ring of shared memory
    when the server is on this host and offers it; False, or the
    environment variable MODELSTATE_SHARED_MEMORY=0: always over gRPC),
    shared_memory_direct (True, the default: a state_dict() or pull() through
    shared memory lets the server write the bytes straight into the new
    tensors where the kernel allows it; False: through the ring's slots)."""
    return Client(target, **options)


def fresh_name(type_name):
    """A new module name in "default" for a module of this type."""
    kind = "".join(c for c in type_name.lower() if c.isalnum()) or "module"
    return f"default/{kind[:64]}-{uuid.uuid4().hex[:12]}"


def _dtype_text(dtype):
    return _tensors.dtype_name(_tensors.dtype_number(dtype))
