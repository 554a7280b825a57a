"""pull(): a hosted module as a real torch.nn.Module.

The tree comes from GetModule: containers and library layers (see
_layers.LAYERS) become their torch classes, built on the meta device from
the arguments the server reports and checked against the hosted tree;
anything else becomes an nn.Module subclass named after the hosted type,
with the same parameters, buffers (persistent or not) and children. The
values come in two streams, each distinct tensor once (named_parameters()
and named_buffers()); the tensors made from the received bytes become the
module's own, and load_state_dict(strict=True) with the server's
state_dict keys checks that nothing is missing or left over. A key the
streams leave out is a tied tensor: it gets the very tensor it is tied to.
"""

import collections
import warnings

from . import _layers, _tensors
from ._remote import (RemoteModule, _missing_unexpected_text, entry_devices,
                      join)
from .v1 import model_state_service_pb2 as pb
from .v1 import module_pb2

torch = _tensors.torch
nn = _layers.nn
_SELECT = pb.GetStateDictRequest
ENTRY_PARAMETER = module_pb2.ENTRY_KIND_PARAMETER
ENTRY_BUFFER = module_pb2.ENTRY_KIND_BUFFER


def entry_keys(info):
    """Every parameter and buffer slot of a ModuleInfo tree (not None),
    under each path of a shared submodule."""
    return list(entry_devices(info))


class PullNote(UserWarning):
    """A hosted library layer that could not be rebuilt as its torch class
    (this torch lacks an argument), or a tie that could not be told apart."""


_classes = {}


def custom_class(type_name):
    """The nn.Module subclass standing for a hosted custom type."""
    cls = _classes.get(type_name)
    if cls is None:
        short = type_name.rpartition(".")[2] or "Module"
        cls = type(short, (nn.Module,), {
            "__module__": "modelstate.pulled", "__qualname__": short,
            "__doc__": f"A module pulled from modelstate: type {type_name}.",
            # Pickled (torch.save) as this factory's class for type_name:
            # no module holds the class by its name, and two hosted types
            # may share a short one.
            "__reduce__": lambda self: (_unpickled, (type_name,),
                                        self.__dict__)})
        _classes[type_name] = cls
    return cls


def _unpickled(type_name):
    """An empty instance of custom_class(type_name), for pickle to give
    its state (nn.Module.__setstate__)."""
    cls = custom_class(type_name)
    return cls.__new__(cls)


def _note(text):
    warnings.warn(PullNote(f"pull: {text}"), stacklevel=4)


class _Builder:
    """Builds the torch tree of a ModuleInfo on the meta device."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.by_path = {}  # path -> module

    def build(self, info, path):
        module = self._library(info, path)
        if module is None:  # (an empty container is falsy: no `or`)
            module = self._generic(info, path)
        self.by_path[path] = module
        self._set_flags(module, info, path)
        return module

    def _set_flags(self, module, info, path):
        """Training flags and requires_grad as hosted, for this module and
        (for a library layer) its children."""
        module.training = info.training
        for entry in info.parameters:
            p = module._parameters.get(entry.name)
            if p is not None:
                p.requires_grad_(entry.tensor.requires_grad)
        for child in info.children:
            sub = module._modules.get(child.name)
            if child.HasField("module") and sub is not None and \
                    join(path, child.name) not in self.by_path:
                self.by_path[join(path, child.name)] = sub
                self._set_flags(sub, child.module, join(path, child.name))

    def _dtype_of(self, info):
        """The floating dtype of a layer's tensors (the pull's dtype=
        when given), None if it has none, or Inexpressible if several."""
        found = set()

        def walk(i):
            for e in list(i.parameters) + list(i.buffers):
                if not e.is_none:
                    dt = _tensors.torch_dtype(e.tensor.dtype)
                    if dt.is_floating_point:
                        found.add(dt)
            for c in i.children:
                if c.HasField("module"):
                    walk(c.module)
        walk(info)
        if len(found) > 1:
            raise _layers.Inexpressible("its tensors have several dtypes")
        if not found:
            return None
        return self.dtype or found.pop()

    def _library(self, info, path):
        if info.type in _layers.CONTAINERS:
            return self._container(info, path)
        layer = _layers.LAYERS.get(info.type)
        if layer is None:
            return None
        try:
            args = layer.read(_layers.InfoView(info))
            module = layer.construct(args, "meta", self._dtype_of(info))
            why = _differences(module, info, self.dtype)
        except _layers.Inexpressible as error:
            why = str(error)
        if why is None:
            return module
        _note(f"{path or 'the module'} ({info.type}) comes back as a plain "
              f"nn.Module: {why}")
        return None

    def _container(self, info, path):
        if info.parameters or info.buffers or any(
                c.is_none for c in info.children):
            return None
        module = getattr(nn, info.type)()
        self._children(module, info, path)
        return module

    def _generic(self, info, path):
        module = custom_class(info.type)()
        for entry in info.parameters:
            module.register_parameter(entry.name, None if entry.is_none else
                                      nn.Parameter(self._meta(entry)))
        for entry in info.buffers:
            module.register_buffer(
                entry.name, None if entry.is_none else self._meta(entry),
                persistent=entry.is_none or entry.tensor.persistent)
        self._children(module, info, path)
        return module

    def _meta(self, entry):
        dtype = _tensors.torch_dtype(entry.tensor.dtype)
        if self.dtype is not None and dtype.is_floating_point:
            dtype = self.dtype
        return torch.empty(list(entry.tensor.shape), dtype=dtype,
                           device="meta")

    def _children(self, module, info, path):
        for child in info.children:
            child_path = join(path, child.name)
            if child.same_as:
                sub = self.by_path[child.same_as]
            elif child.is_none:
                sub = None
            else:
                sub = self.build(child.module, child_path)
            module.add_module(child.name, sub)


def _differences(module, info, dtype):
    """Why the torch layer `module` is not the hosted tree `info`, or None."""
    for kind, entries in (("_parameters", info.parameters),
                          ("_buffers", info.buffers)):
        table = getattr(module, kind)
        if list(table) != [e.name for e in entries]:
            return f"it has {kind[1:]} {[e.name for e in entries]}, torch " \
                   f"{list(table)}"
        for e in entries:
            t = table[e.name]
            if (t is None) != e.is_none:
                return f"{e.name} is None on one side only"
            if t is None:
                continue
            want = _tensors.torch_dtype(e.tensor.dtype)
            if dtype is not None and want.is_floating_point:
                want = dtype
            if list(t.shape) != list(e.tensor.shape) or t.dtype != want:
                return f"{e.name} is {want} {list(e.tensor.shape)}"
            if kind == "_buffers" and \
                    (e.name not in module._non_persistent_buffers_set) != \
                    e.tensor.persistent:
                return f"{e.name} differs in persistence"
    children = [c.name for c in info.children]
    if list(module._modules) != children:
        return f"it has submodules {children}, torch {list(module._modules)}"
    for c in info.children:
        sub = module._modules[c.name]
        if c.same_as or (sub is None) != c.is_none:
            return f"{c.name} differs"
        if sub is not None:
            if type(sub).__name__ != c.module.type:
                return f"{c.name} is a {c.module.type}"
            why = _differences(sub, c.module, dtype)
            if why:
                return f"{c.name}: {why}"
    return None


def _install(root, items):
    """Makes the received tensors the module's own."""
    for key, entry, tensor in items:
        owner, _, name = key.rpartition(".")
        module = root.get_submodule(owner)
        if name in module._parameters:
            old = module._parameters[name]
            module._parameters[name] = nn.Parameter(
                tensor.detach(), requires_grad=old.requires_grad)
        else:
            module._buffers[name] = tensor
    # An RNN's forward reads its weights from _flat_weights, which still
    # lists the meta tensors it was built with.
    for module in root.modules():
        if isinstance(module, nn.RNNBase):
            module._flat_weights = [getattr(module, n, None)
                                    for n in module._flat_weights_names]


def _tensor_at(module, name):
    t = module._parameters.get(name)
    return t if t is not None else module._buffers.get(name)


def _tie_source(remote, key, kind, target, received, target_dtype):
    """The received key whose tensor `key` is tied to: the one of the same
    kind, dtype and shape, told apart by the values if several are."""
    candidates = [(k, t) for k, e, t in received if e.kind == kind and
                  t.dtype == target.dtype and t.shape == target.shape]
    if len(candidates) > 1 and not target.is_meta:
        glob = "".join("?" if c in "*?[]\\" else c for c in
                       join(remote.path, key))
        _, one = remote._fetch(_SELECT.SELECTION_STATE_DICT, key_glob=glob,
                               target_dtype=target_dtype)
        values = [t for k, _, t in one if k == key]
        if values:
            candidates = [(k, t) for k, t in candidates
                          if torch.equal(t.detach(), values[0])]
    if not candidates:
        raise ValueError(f"pull: {key} is tied to a tensor the server did "
                         "not send")
    if len(candidates) > 1:
        _note(f"{key} is tied to one of {[k for k, _ in candidates]}, which "
              f"hold the same values; tied to {candidates[0][0]}")
    return candidates[0][0]


def pull(client, name, path, *, dtype=None, device=None, progress=None,
         into=None):
    """Client.pull() / RemoteModule.pull()."""
    if nn is None:
        raise ImportError("pull needs torch")
    remote = RemoteModule(client, name, path)
    dtype = _tensors.as_torch_dtype(dtype)
    if dtype is not None and not dtype.is_floating_point:
        raise TypeError(f"pull: dtype must be floating point, got {dtype}")
    target = _tensors.dtype_number(dtype) if dtype is not None else None
    if into is not None:
        if device is not None:
            raise TypeError("pull: into= refreshes the module where its "
                            "tensors are; move it with .to() instead of "
                            "device=")
        return _pull_into(remote, into, target, progress)
    info = remote.info().info
    builder = _Builder(dtype)
    root = builder.build(info, "")
    meta = str(device) == "meta"
    header, _ = remote._fetch(_SELECT.SELECTION_STATE_DICT,
                              metadata_only=True, target_dtype=target)
    received = []
    for selection in (_SELECT.SELECTION_PARAMETERS,
                      _SELECT.SELECTION_BUFFERS):
        received += remote._fetch(selection, metadata_only=meta,
                                  target_dtype=target, progress=progress)[1]
    if not meta:
        _install(root, received)
    values = _tie(remote, root, builder, info, received, target)
    if not meta:
        strip = len(path) + 1 if path else 0
        state = collections.OrderedDict(
            (e.key[strip:], values[e.key[strip:]]) for e in header.entries)
        state._metadata = remote._metadata(header, "")
        root.load_state_dict(state, strict=True)
    if device is not None and not meta and str(device) != "cpu":
        root.to(device)
    return root


def _tie(remote, root, builder, info, received, target_dtype):
    """Ties every tensor slot the streams left out to the tensor it shares;
    returns {key: tensor} for every slot, shared submodules' included."""
    first = {id(m): p for p, m in builder.by_path.items()}
    owned = [(k, e, _tensor_at(*_split(root, k))) for k, e, _ in received]
    values = {k: t for k, _, t in owned}
    for key in entry_keys(info):
        owner, _, attr = key.rpartition(".")
        module = root.get_submodule(owner)
        canonical = join(first[id(module)], attr)
        if canonical not in values:
            kind = ENTRY_PARAMETER if attr in module._parameters else \
                ENTRY_BUFFER
            source = _tie_source(remote, canonical, kind,
                                 _tensor_at(module, attr), owned,
                                 target_dtype)
            setattr(module, attr, values[source])
            values[canonical] = values[source]
        values[key] = values[canonical]
    return values


def _split(root, key):
    owner, _, name = key.rpartition(".")
    return root.get_submodule(owner), name


def _pull_into(remote, model, target_dtype, progress):
    """pull(into=model): the hosted state_dict's bytes written into
    `model`'s own tensors, which keep their identity and memory (on this
    host the server writes them there itself)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"pull: into= takes a torch.nn.Module, got "
                        f"{type(model).__name__}")
    own = model.state_dict(keep_vars=True)
    strip = len(remote.path) + 1 if remote.path else 0

    def buffers(header):
        keys = [e.key[strip:] for e in header.entries]
        hosted = set(keys)
        missing = [k for k in own if k not in hosted]
        unexpected = [k for k in keys if k not in own]
        if missing or unexpected:
            raise RuntimeError(_missing_unexpected_text(
                type(model).__name__, missing, unexpected))
        out = []
        for key, entry in zip(keys, header.entries):
            t = own[key]
            want = _tensors.torch_dtype(entry.dtype)
            if t.dtype != want or list(t.shape) != list(entry.shape):
                raise ValueError(
                    f"pull: into['{key}'] is {t.dtype} {list(t.shape)}, the "
                    f"hosted entry {want} {list(entry.shape)} (dtype= "
                    f"converts floating entries on the server)")
            if t.numel() * t.element_size() != entry.byte_length:
                raise ValueError(  # the server's own header is wrong
                    f"pull: the server gave '{key}' {entry.byte_length} "
                    f"bytes, its shape and dtype need "
                    f"{t.numel() * t.element_size()}")
            if t.device.type != "cpu" or not t.is_contiguous():
                raise ValueError(
                    f"pull: into['{key}'] must be a contiguous cpu tensor "
                    f"to be written in place (it is on {t.device}"
                    f"{'' if t.is_contiguous() else ', not contiguous'})")
            out.append(t)
        return out

    remote._fetch(_SELECT.SELECTION_STATE_DICT, target_dtype=target_dtype,
                  progress=progress, into=buffers)
    return model
