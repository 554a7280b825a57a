"""push(): a live torch module hosted on the server.

The module's spec is derived from the module itself: containers as
containers, library layers (see _layers.LAYERS) from their constructor
arguments read back from the module, any other class as a custom module
with its own parameters and buffers and its children. A library layer is
used only when rebuilding it from those arguments (on the meta device)
gives exactly the same tree; otherwise it is hosted as a custom module and
a note says why. Tied tensors become the spec's `ties`, shared submodules
its `ref`s. The server builds the spec (its hooks see every registration,
in construction order), then the weights are streamed in with
load_state_dict(strict=True).

torch records no order across a module's parameters, buffers and
submodules, so a custom module's members are registered parameters first,
then buffers, then submodules, each in the module's own order; models built
inside record_construction() are registered in the order their __init__
registered them.
"""

import contextlib
import warnings

from google.protobuf import struct_pb2

from . import _layers, _tensors
from ._errors import FailedPreconditionError
from ._order import recorded_order
from ._remote import RemoteModule, join
from .client import fresh_name
from .v1 import model_state_service_pb2 as pb
from .v1 import module_pb2

torch = _tensors.torch
nn = _layers.nn


class PushNote(UserWarning):
    """A module hosted differently than its class suggests (a library layer
    as a custom module), or a property the server cannot keep."""


# ------------------------------------------------------------- values ----
def _value(x):
    """A constructor argument as a google.protobuf.Value."""
    v = struct_pb2.Value()
    if x is None:
        v.null_value = 0
    elif isinstance(x, bool):
        v.bool_value = x
    elif isinstance(x, (int, float)):
        v.number_value = x
    elif isinstance(x, str):
        v.string_value = x
    elif isinstance(x, (tuple, list)):
        v.list_value.SetInParent()
        for item in x:
            v.list_value.values.append(_value(item))
    else:
        raise _layers.Inexpressible(f"{x!r} is no spec value")
    return v


def _dtype_name(dtype):
    return _tensors.dtype_name(_tensors.dtype_number(dtype))


def _type_name(cls):
    """A custom module's type: its class name; the qualified name for a
    torch class and for a class named like a library type, so that the
    server never builds a library layer instead (now or once it has
    one)."""
    name = cls.__name__
    if name in _layers.LAYERS or name in _layers.CONTAINERS or \
            cls.__module__.split(".")[0] == "torch":
        return f"{cls.__module__}.{name}"
    return name


def _tensors_of(module):
    return [t for t in list(module._parameters.values()) +
            list(module._buffers.values()) if t is not None]


# ------------------------------------------------------------- planner ----
class Plan:
    """What push() sends: the spec, the build dtype and device, the
    registrations made after the build, the training flag, notes."""

    def __init__(self):
        self.spec = None
        self.build_dtype = None
        self.device = "cpu"
        self.cast = None       # push(dtype=...)
        self.fixups = []       # ("freeze", path, name, tensor) or
        #                        ("share", parent path, name, first path)
        self.training = True
        self.notes = []


class _Planner:
    def __init__(self, model, dtype, device):
        self.model = model
        self.cast = _tensors.as_torch_dtype(dtype)
        self.plan = Plan()
        self.plan.cast = self.cast
        self.first_module = {}   # id(module) -> first path
        self.first_tensor = {}   # id(tensor) -> first key
        self.tie_sources = set()  # keys other entries are tied to
        self.ties = []           # (target key, source key)
        self.shared = {}         # path -> first path (second occurrences)
        self.kinds = {}          # path -> "container" | "layer" | "custom"
        self.layer_args = {}     # path -> (Layer, kwargs, dtype or None)
        self.ties_at = {}        # custom module path -> [Tie]
        self.modules = []        # (path, module), each module once
        all_tensors = []
        self._scan(model, "", all_tensors)
        self._choose_device(all_tensors, device)
        self.plan.build_dtype = self.cast or next(
            (t.dtype for t in all_tensors if t.dtype.is_floating_point),
            torch.float32)

    def _scan(self, module, path, all_tensors):
        self.first_module[id(module)] = path
        self.modules.append((path, module))
        getter = type(module).get_extra_state
        if getter is not nn.Module.get_extra_state:
            raise ValueError(f"push: {path or 'the model'} "
                             f"({type(module).__name__}) defines "
                             "get_extra_state(); the server hosts tensors "
                             "only")
        for name, t in list(module._parameters.items()) + \
                list(module._buffers.items()):
            if t is None:
                continue
            key = join(path, name)
            if id(t) in self.first_tensor:
                source = self.first_tensor[id(t)]
                self.ties.append((key, source))
                self.tie_sources.add(source)
            else:
                self.first_tensor[id(t)] = key
                all_tensors.append(t)
        for name, child in module._modules.items():
            if child is None:
                continue
            child_path = join(path, name)
            if id(child) in self.first_module:
                self.shared[child_path] = self.first_module[id(child)]
            else:
                self._scan(child, child_path, all_tensors)

    def _choose_device(self, all_tensors, device):
        if isinstance(device, torch.device):  # as pull() and build() take
            device = str(device)
        on_meta = [t.is_meta for t in all_tensors]
        if device is None and on_meta and all(on_meta):
            device = "meta"
        elif device != "meta" and any(on_meta):
            raise ValueError("push: some of the model's tensors are on the "
                             "meta device and hold no values; push with "
                             "device='meta' to host the structure only")
        if device not in (None, "cpu", "meta"):
            raise ValueError(f"push: device must be 'cpu' or 'meta', got "
                             f"{device!r} (the server builds there; move "
                             "the hosted module afterwards)")
        self.plan.device = device or "cpu"

    # ----------------------------------------------------------- kinds --
    def decide(self, module, path):
        cls = type(module)
        own = _tensors_of(module) or module._parameters or module._buffers
        if cls.__name__ in _layers.CONTAINERS and \
                cls is getattr(nn, cls.__name__) and not own and \
                None not in module._modules.values():
            self.kinds[path] = "container"
        else:
            layer = _layers.LAYERS.get(cls.__name__)
            if layer is not None and cls is layer.torch_class():
                try:
                    self.layer_args[path] = self._express(layer, module, path)
                    self.kinds[path] = "layer"
                    return
                except _layers.Inexpressible as why:
                    self._note(f"{path or 'the model'} ({cls.__name__}) is "
                               f"hosted as a custom module with its own "
                               f"tensors: {why}")
            self.kinds[path] = "custom"
            if cls.__name__ in _layers.BUILT_FROM_CHILDREN and \
                    cls is getattr(nn, cls.__name__, None):
                self._note(f"{path or 'the model'} ({cls.__name__}) is "
                           "hosted as a custom module holding its layers: "
                           "push does not build the server's "
                           f"{cls.__name__}, which takes its layer as a "
                           "child")
            elif layer is None and cls.__module__.startswith("torch.nn.") \
                    and cls.__name__ not in _layers.CONTAINERS:
                self._note(f"{path or 'the model'} ({cls.__name__}) is "
                           "hosted as a custom module with its own "
                           "tensors: the server has no such library layer")
        for name, child in module._modules.items():
            child_path = join(path, name)
            if child is not None and child_path not in self.shared:
                self.decide(child, child_path)

    def _express(self, layer, module, path):
        """(layer, kwargs, dtype) that rebuild `module` exactly, or
        Inexpressible."""
        args = layer.read(_layers.TorchView(module))
        floating = {t.dtype for t in _tensors_of_tree(module)
                    if t.dtype.is_floating_point}
        if len(floating) > 1:
            raise _layers.Inexpressible(
                "its tensors have several dtypes "
                f"({', '.join(sorted(map(str, floating)))})")
        own = floating.pop() if floating else None
        # Rebuilt in its own dtype: a push with dtype= only changes the
        # dtype argument.
        why = _layers.differences(module, layer.construct(args, "meta", own))
        if why:
            raise _layers.Inexpressible(why)
        self._note_numbers(layer, module, args, path)
        dtype = self.cast if self.cast is not None and own is not None \
            else own
        for sub_path, sub in _named_modules_of(module, path):
            if sub_path != path and sub_path in self.shared:
                raise _layers.Inexpressible(
                    f"its submodule {sub_path} is shared with "
                    f"{self.shared[sub_path]}")
        freeze = []
        for sub_path, sub in _named_modules_of(module, path):
            for name, p in sub._parameters.items():
                key = join(sub_path, name)
                if p is None or p.requires_grad or \
                        self.first_tensor.get(id(p)) != key:
                    continue  # a tie target takes its source's flag
                if key in self.tie_sources:
                    raise _layers.Inexpressible(
                        f"{key} is frozen and other parameters are tied "
                        "to it")
                freeze.append(("freeze", sub_path, name, p))
        self.plan.fixups.extend(freeze)
        layer_dtype = dtype if dtype is not None and \
            dtype != self.plan.build_dtype else None
        return layer, args, layer_dtype

    def _note_numbers(self, layer, module, args, path):
        """A note for each argument that pull will not give back as torch
        received it: the wire has one kind of number (a double), and pull
        reads an integral one as an int unless it is torch's default, so
        Hardtanh(-2.0, 2.0) comes back as Hardtanh(-2, 2). The server
        computes with the same values either way."""
        try:
            want = layer.torch_kwargs(args)
            back = layer.torch_kwargs(layer.read(
                _layers.WireView(_layers.TorchView(module))))
        except _layers.Inexpressible:
            return
        for key, value in want.items():
            got = back.get(key, value)
            if type(got) is not type(value) or got != value:
                self._note(
                    f"{path or 'the model'} ({type(module).__name__}): pull "
                    f"gives back {key}={got!r} for {key}={value!r} (the "
                    "wire carries numbers as doubles; pull reads one "
                    "without a fractional part as an int unless it is "
                    "torch's default)")

    def _note(self, text):
        self.plan.notes.append(text)
        warnings.warn(PushNote(f"push: {text}"), stacklevel=4)

    # ------------------------------------------------------------ ties --
    def place_ties(self):
        for target, source in self.ties:
            a = target.rpartition(".")[0].split(".") if "." in target else []
            b = source.rpartition(".")[0].split(".") if "." in source else []
            common = []
            for x, y in zip(a, b):
                if x != y:
                    break
                common.append(x)
            while True:
                scope = ".".join(common)
                if self.kinds.get(scope) == "custom":
                    break
                if not common:
                    raise ValueError(
                        f"push: {target} is tied to {source}, but no module "
                        "holding both is a custom module (the spec ties "
                        "tensors inside custom modules only)")
                common.pop()
            n = len(scope) + 1 if scope else 0
            self.ties_at.setdefault(scope, []).append(
                module_pb2.Tie(target=target[n:], source=source[n:]))

    # ------------------------------------------------------------ emit --
    def emit(self, module, path):
        kind = self.kinds[path]
        if kind == "layer":
            layer, args, dtype = self.layer_args[path]
            spec = module_pb2.ModuleSpec(type=layer.name)
            for key, value in args.items():
                spec.kwargs[key].CopyFrom(_value(value))
            if dtype is not None:
                spec.kwargs["dtype"].string_value = _dtype_name(dtype)
            return spec
        if kind == "container":
            spec = module_pb2.ModuleSpec(type=type(module).__name__)
            earlier = []
            for name, child in module._modules.items():
                child_spec = self._child_spec(child, join(path, name), path,
                                              earlier, "Identity")
                spec.children.add(name=name, spec=child_spec)
                earlier.append(name)
            return spec
        return self._emit_custom(module, path)

    def _child_spec(self, child, child_path, parent, earlier, placeholder):
        """The spec of a child slot: its own, a `ref` to an earlier
        sibling's subtree, or (shared with a module out of reach of a ref)
        a placeholder replaced after the build."""
        first = self.shared.get(child_path)
        if first is None:
            return self.emit(child, child_path)
        rel = first[len(parent) + 1:] if parent else first
        in_scope = not parent or first.startswith(parent + ".")
        if in_scope and rel.split(".")[0] in earlier:
            return module_pb2.ModuleSpec(ref=rel)
        self.plan.fixups.append(("share", parent, child_path.rpartition(
            ".")[2], first))
        return None if placeholder is None else \
            module_pb2.ModuleSpec(type=placeholder)

    def _emit_custom(self, module, path):
        spec = module_pb2.ModuleSpec(type=_type_name(type(module)),
                                     custom=True)
        earlier = []
        for kind, name in _member_order(module):
            member = spec.members.add()
            if kind == "module":
                child = module._modules[name]
                slot = member.module
                slot.name = name
                if child is None:
                    slot.none = True
                else:
                    child_spec = self._child_spec(child, join(path, name),
                                                  path, earlier, None)
                    if child_spec is None:
                        slot.none = True
                    else:
                        slot.spec.CopyFrom(child_spec)
                earlier.append(name)
                continue
            table = module._parameters if kind == "parameter" else \
                module._buffers
            slot = member.parameter if kind == "parameter" else member.buffer
            self._tensor_member(slot, name, table[name], kind, module)
        spec.ties.extend(self.ties_at.get(path, []))
        return spec

    def _tensor_member(self, slot, name, t, kind, module):
        slot.name = name
        if t is None:
            slot.none = True
            return
        dtype = self.cast if self.cast is not None and \
            t.dtype.is_floating_point else t.dtype
        if kind == "parameter":
            slot.requires_grad = t.requires_grad
        else:
            slot.persistent = name not in module._non_persistent_buffers_set
        if kind == "buffer" and not slot.persistent and \
                self.plan.device != "meta":
            # Not in the state_dict: its values travel with the spec.
            slot.data.CopyFrom(_tensors.to_proto(t.detach().to(dtype)))
            return
        slot.dtype = _dtype_name(dtype)
        slot.shape.extend(t.shape)
        slot.init.kind = "empty"

    def run(self):
        self.decide(self.model, "")
        self.place_ties()
        self.plan.spec = self.emit(self.model, "")
        flags = {m.training for _, m in self.modules}
        self.plan.training = self.model.training
        if len(flags) > 1:
            self._note("its modules are in training and in eval mode; the "
                       "server sets the mode of whole modules only, so all "
                       f"are hosted in the model's "
                       f"({'training' if self.model.training else 'eval'})")
        return self.plan


def _named_modules_of(module, path):
    out, seen = [], set()

    def walk(m, p):
        if id(m) in seen:
            return
        seen.add(id(m))
        out.append((p, m))
        for name, child in m._modules.items():
            if child is not None:
                walk(child, join(p, name))
    walk(module, path)
    return out


def _tensors_of_tree(module):
    return [t for _, m in _named_modules_of(module, "") for t in
            _tensors_of(m)]


def _member_order(module):
    """(kind, name) of a custom module's members in registration order."""
    default = [("parameter", n) for n in module._parameters] + \
        [("buffer", n) for n in module._buffers] + \
        [("module", n) for n in module._modules]
    recorded = recorded_order(module)
    if not recorded:
        return default
    rank = {entry: i for i, entry in enumerate(recorded)}
    return sorted(default, key=lambda e: (rank.get(e, len(rank)),
                                          default.index(e)))


def plan_push(model, dtype=None, device=None):
    """The Plan for hosting `model` (a torch nn.Module)."""
    if nn is None:
        raise ImportError("push needs torch")
    if not isinstance(model, nn.Module):
        raise TypeError(f"push: expected a torch.nn.Module, got "
                        f"{type(model).__name__} (build a ModuleSpec with "
                        "Client.build(), load a state_dict with "
                        "RemoteModule.load_state_dict())")
    return _Planner(model, dtype, device).run()


# -------------------------------------------------------------- apply ----
def _apply_fixups(client, module_name, prefix, plan, tolerate_blocks):
    """Registers what the spec cannot say; returns the reports."""
    reports = []
    for fix in plan.fixups:
        if fix[0] == "freeze":
            _, path, name, p = fix
            dtype = plan.cast if plan.cast is not None else p.dtype
            request = pb.RegisterTensorRequest(
                module=module_name, path=join(prefix, path), name=name,
                requires_grad=False)
            if plan.device == "meta":
                request.tensor.CopyFrom(module_pb2.TensorProto(
                    dtype=_tensors.dtype_number(dtype), shape=list(p.shape),
                    device="meta"))
            else:
                request.init.dtype = _dtype_name(dtype)
                request.init.shape.extend(p.shape)
                request.init.init.kind = "empty"
            method = "RegisterParameter"
        else:
            _, parent, name, first = fix
            request = pb.RegisterSubmoduleRequest(
                module=module_name, path=join(prefix, parent), name=name,
                existing_path=join(prefix, first))
            method = "RegisterSubmodule"
        try:
            reports += client._call(method, request).registrations
        except FailedPreconditionError as blocked:
            if not tolerate_blocks:
                raise
            plan.notes.append(str(blocked))
    return reports


def _load_weights(view, model, plan, strict, progress):
    state = model.state_dict()
    if plan.cast is not None:
        metadata = getattr(state, "_metadata", None)
        state = type(state)((k, v.to(plan.cast) if v.is_floating_point()
                             else v) for k, v in state.items())
        state._metadata = metadata
    return view.load_state_dict(state, strict=strict, progress=progress)


def push(client, model, name, *, dtype, device, all_or_nothing, seed,
         progress):
    """Client.push()."""
    plan = plan_push(model, dtype, device)
    request = pb.BuildModuleRequest(
        module=name if name is not None else fresh_name(plan.spec.type),
        spec=plan.spec, seed=seed, device=plan.device,
        dtype=_dtype_name(plan.build_dtype), all_or_nothing=all_or_nothing)
    response = client._call("BuildModule", request,
                            timeout=client._transfer_timeout)
    remote = RemoteModule(client, response.module)
    try:
        reports = list(response.registrations)
        reports += _apply_fixups(client, remote.name, "", plan,
                                 not all_or_nothing)
        if not plan.training:
            remote.train(False)
        if plan.device != "meta":
            _load_weights(remote, model, plan, all_or_nothing, progress)
    except BaseException:
        with contextlib.suppress(Exception):
            client.delete(remote.name)
        raise
    remote.last_registrations = reports
    remote.notes = plan.notes
    return remote


def push_submodule(remote, where, name, module):
    """RemoteModule.register_module(name, torch_module): the module's spec
    registered at `where`, then its weights loaded into that submodule."""
    plan = plan_push(module)
    client = remote._client
    request = pb.RegisterSubmoduleRequest(
        module=remote.name, path=where, name=name, spec=plan.spec,
        device=plan.device, dtype=_dtype_name(plan.build_dtype))
    reports = list(client._call("RegisterSubmodule", request,
                                timeout=client._transfer_timeout)
                   .registrations)
    child = join(where, name)
    try:
        reports += _apply_fixups(client, remote.name, child, plan, False)
        if plan.device != "meta":
            _load_weights(RemoteModule(client, remote.name, child), module,
                          plan, True, None)
    except BaseException:
        with contextlib.suppress(Exception):
            client._call("RemoveEntry", pb.RemoveEntryRequest(
                module=remote.name, path=where, name=name))
        raise
    remote.last_registrations = reports
    remote.notes = plan.notes
