"""RemoteModule: a hosted module (or one of its submodules), shaped like
torch.nn.Module where a remote module can be. Reads fetch from the server
each time; changes go to the server and through its registration hooks."""

import collections
import collections.abc
import json
import warnings

import grpc
from google.protobuf import json_format

from . import _tensors, _transfer
from ._errors import DTypeError, FailedPreconditionError, NotFoundError
from .v1 import model_state_service_pb2 as pb
from .v1 import module_pb2

torch = _tensors.torch
_SELECT = pb.GetStateDictRequest

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


def join(path, name):
    """"a.b" + "c" -> "a.b.c"; "" + "c" -> "c"."""
    return f"{path}.{name}" if path and name else path or name


def entry_devices(info, path="", out=None, seen=None):
    """{state_dict-style key: device} for every parameter and buffer of a
    ModuleInfo tree, shared submodules listed under each of their paths."""
    out = collections.OrderedDict() if out is None else out
    seen = {} if seen is None else seen
    seen[path] = info
    for entry in list(info.parameters) + list(info.buffers):
        if not entry.is_none:
            out[join(path, entry.name)] = entry.tensor.device
    for child in info.children:
        child_path = join(path, child.name)
        if child.same_as:
            entry_devices(seen[child.same_as], child_path, out, seen)
        elif child.HasField("module"):
            entry_devices(child.module, child_path, out, seen)
    return out


def entry_tensors(info, path="", out=None, seen=None):
    """{key: TensorInfo} for every parameter and buffer of a ModuleInfo
    tree, each shared submodule's under its first path only."""
    out = collections.OrderedDict() if out is None else out
    seen = set() if seen is None else seen
    for entry in list(info.parameters) + list(info.buffers):
        if not entry.is_none:
            out[join(path, entry.name)] = entry.tensor
    for child in info.children:
        if not child.same_as and child.HasField("module"):
            entry_tensors(child.module, join(path, child.name), out, seen)
    return out


_FLOATING = ("float16", "bfloat16", "float32", "float64")
# Tensor.type()'s names (torch.FloatTensor, torch.cuda.FloatTensor...).
_TENSOR_TYPES = {"Float": "float32", "Double": "float64", "Half": "float16",
                 "BFloat16": "bfloat16", "Long": "int64", "Int": "int32",
                 "Short": "int16", "Char": "int8", "Byte": "uint8",
                 "Bool": "bool"}


def _parse_type(dst_type):
    """(dtype, device or None) of Tensor.type()'s argument: a dtype keeps
    the device; a tensor type names the device too (cpu or cuda). Anything
    else is torch's ValueError("invalid type: '...'")."""
    if torch is not None and isinstance(dst_type, torch.dtype):
        return dst_type, None
    if torch is None and not isinstance(dst_type, str):
        return dst_type, None  # a numpy dtype
    name = dst_type if isinstance(dst_type, str) else \
        f"{getattr(dst_type, '__module__', '')}." \
        f"{getattr(dst_type, '__name__', '')}"
    device = "cpu"
    rest = name[len("torch."):] if name.startswith("torch.") else None
    if rest is not None and rest.startswith("cuda."):
        device, rest = "cuda", rest[len("cuda."):]
    if rest is None or not rest.endswith("Tensor") or \
            rest[:-len("Tensor")] not in _TENSOR_TYPES:
        if torch is None and isinstance(dst_type, str) and \
                not dst_type.startswith("torch."):
            return dst_type, None  # a dtype name, without torch
        raise ValueError(f"invalid type: '{name}'")
    return _TENSOR_TYPES[rest[:-len("Tensor")]], device


def _stand_in():
    """An empty tensor (array without torch) that stands in for a value
    the wire cannot carry."""
    if torch is not None:
        return torch.empty(0, dtype=torch.uint8)
    return _tensors.np.empty(0, dtype=_tensors.np.uint8)


def check_state_dict(state_dict, what="state_dict", values=True):
    """A TypeError naming what was expected for anything but a mapping of
    names to tensors (an nn.Module above all); values=False: any values
    (load_state_dict looks at them itself)."""
    if torch is not None and isinstance(state_dict, torch.nn.Module):
        raise TypeError(f"{what}: expected a state_dict (a mapping of names "
                        f"to tensors), got the module "
                        f"{type(state_dict).__name__}; pass "
                        f"module.state_dict(), or push the module with "
                        f"Client.push()")
    if not isinstance(state_dict, collections.abc.Mapping):
        raise TypeError(f"{what}: expected a state_dict (a mapping of names "
                        f"to tensors), got {type(state_dict).__name__}")
    for key, value in state_dict.items() if values else ():
        if not _tensors.is_tensor(value):
            raise TypeError(f"{what}['{key}']: expected a tensor, got "
                            f"{type(value).__name__}")


def _same_tensor(a, b):
    """Whether two fetched tensors may be one hosted tensor: the same
    dtype, shape and values (meta tensors: dtype and shape)."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    if torch is None:
        return bool((a == b).all())
    if a.is_meta or b.is_meta:
        return a.is_meta and b.is_meta
    return torch.equal(a.detach(), b.detach())


def _missing_unexpected_text(cls_name, missing, unexpected, others=()):
    """PyTorch's load_state_dict error for missing / unexpected keys (and
    its `others` messages, which follow them)."""
    msgs = []
    if missing:
        msgs.append("Missing key(s) in state_dict: " + ", ".join(
            f'"{k}"' for k in missing) + ". ")
    if unexpected:
        msgs.append("Unexpected key(s) in state_dict: " + ", ".join(
            f'"{k}"' for k in unexpected) + ". ")
    msgs += others
    return f"Error(s) in loading state_dict for {cls_name}:\n\t" + \
        "\n\t".join(msgs)


class RemoteModule:
    """A module hosted on the server, or a submodule of one (`path`)."""

    def __init__(self, client, name, path=""):
        self._client = client
        self.name = name
        self.path = path
        # The registrations of the call that created or last changed it.
        self.last_registrations = []

    def __repr__(self):
        if self.path:
            return f"RemoteModule('{self.name}', path='{self.path}')"
        return f"RemoteModule('{self.name}')"

    def info(self, path="", with_hashes=False):
        """The GetModuleResponse describing the tree at `path`."""
        return self._client._call("GetModule", pb.GetModuleRequest(
            module=self.name, path=join(self.path, path),
            with_hashes=with_hashes))

    @property
    def type_name(self):
        return self.info().info.type

    @property
    def training(self):
        return self.info().info.training

    def _whole_module_only(self, what):
        if self.path:
            raise NotImplementedError(
                f"{what} applies to a whole hosted module; the server has "
                f"no call for the submodule '{self.path}' alone")

    # -------------------------------------------------------------- state --
    def _fetch(self, selection, *, key_glob="", metadata_only=False,
               target_dtype=None, progress=None, into=None):
        """(header, [(key, entry, tensor)]) of one selection, keys relative
        to this module. Meta tensors come back as meta tensors. With into=
        (see _transfer.fetch) the bytes go into the caller's tensors and
        the list is empty."""
        prefix = self.path + "." if self.path else ""
        request = pb.GetStateDictRequest(
            module=self.name, selection=selection, key_prefix=prefix,
            key_glob=key_glob, metadata_only=metadata_only,
            chunk_bytes=self._client._chunk_bytes,
            target_dtype=target_dtype or 0)
        label = f"{self.name}{':' + self.path if self.path else ''}"
        try:
            header, buffers = _transfer.fetch(self._client, request, label,
                                              progress, into)
        except FailedPreconditionError:
            if into:  # meta tensors have no bytes to write in place
                raise
            devices = entry_devices(self.info().info, self.path)
            if "meta" not in devices.values():
                raise
            return self._fetch_with_meta(selection, devices, target_dtype)
        if into:
            return header, []
        items = []
        parameters = selection == _SELECT.SELECTION_PARAMETERS
        for i, entry in enumerate(header.entries):
            tensor = None
            if buffers:
                tensor = _tensors.from_bytes(
                    buffers[i], entry.dtype, list(entry.shape),
                    requires_grad=entry.requires_grad and parameters,
                    parameter=parameters and torch is not None)
            items.append((entry.key[len(prefix):], entry, tensor))
        if parameters and self.path and not key_glob:
            items = self._with_firsts_outside(items, metadata_only,
                                              target_dtype)
        return header, items

    def _with_firsts_outside(self, items, metadata_only, target_dtype):
        """A submodule's named_parameters() as torch lists them. The
        server lists each parameter once, under its first key in the whole
        module, so one tied to (or in a submodule shared with) a module
        outside this view is missing: it is added where torch lists it,
        once per tensor, told apart from the others by dtype, shape and
        values (as pull() tells ties apart)."""
        listed = {k: (e, t) for k, e, t in items}
        if all(k in listed for k in self._param_keys()):
            return items
        _, state = self._fetch(_SELECT.SELECTION_STATE_DICT,
                               target_dtype=target_dtype)
        values = {k: t for k, _, t in state}
        seen = [values[k] for k in listed]
        out = []
        for key, entry, value in state:
            if key in listed:
                out.append((key,) + listed[key])
            elif entry.kind == module_pb2.ENTRY_KIND_PARAMETER and \
                    not any(_same_tensor(value, t) for t in seen):
                seen.append(value)
                tensor = None
                if not metadata_only and torch is not None:
                    tensor = torch.nn.Parameter(
                        value, requires_grad=entry.requires_grad)
                elif not metadata_only:
                    tensor = value
                out.append((key, entry, tensor))
        return out

    def _fetch_with_meta(self, selection, devices, target_dtype):
        """As _fetch, for a tree with meta tensors (the server sends no
        bytes for those): meta tensors for them, the others one by one."""
        header, items = self._fetch(selection, metadata_only=True,
                                    target_dtype=target_dtype)
        prefix = self.path + "." if self.path else ""
        parameters = selection == _SELECT.SELECTION_PARAMETERS
        out = []
        for key, entry, _ in items:
            if devices.get(entry.key) == "meta":
                tensor = _tensors.meta_from_entry(
                    entry.dtype, list(entry.shape),
                    entry.requires_grad and parameters, parameters)
            else:
                glob = "".join("?" if c in "*?[]\\" else c for c in key)
                _, one = self._fetch(selection, key_glob=prefix + glob,
                                     target_dtype=target_dtype)
                found = [t for k, _, t in one if k == key]
                if not found:  # listed under its first key outside the view
                    _, one = self._fetch(_SELECT.SELECTION_STATE_DICT,
                                         key_glob=prefix + glob,
                                         target_dtype=target_dtype)
                    found = [torch.nn.Parameter(
                        t, requires_grad=entry.requires_grad)
                        for k, _, t in one if k == key]
                tensor = found[0]
            out.append((key, entry, tensor))
        return header, out

    def _metadata(self, header, prefix):
        """PyTorch's _metadata for this module from a header's versions."""
        out = collections.OrderedDict()
        for m in header.metadata:
            if self.path and m.path != self.path and \
                    not m.path.startswith(self.path + "."):
                continue
            rel = m.path[len(self.path) + 1:] if self.path and \
                m.path != self.path else ("" if self.path else m.path)
            out[prefix + rel if rel else prefix.rstrip(".")] = {
                "version": m.version}
        return out

    def state_dict(self, *args, destination=None, prefix="", keep_vars=False,
                   dtype=None, progress=None):
        """PyTorch's state_dict(): an OrderedDict of tensors (numpy arrays
        without torch) in PyTorch's key order, with `_metadata`. As in
        torch, `destination` (a dict) is filled and returned instead (its
        `_metadata`, if it has one, gets this module's versions), and
        destination, prefix and keep_vars may still be given by position,
        with torch's deprecation warning. dtype= converts floating entries
        on the server; progress= see Client."""
        if args:  # torch 1.13's parsing of the deprecated positional form
            if destination is None:
                destination = args[0]
            if len(args) > 1 and prefix == "":
                prefix = args[1]
            if len(args) > 2 and keep_vars is False:
                keep_vars = args[2]
            warnings.warn(
                "Positional args are being deprecated, use kwargs instead. "
                "Refer to https://pytorch.org/docs/master/generated/"
                "torch.nn.Module.html#torch.nn.Module.state_dict for "
                "details.")
        header, items = self._fetch(
            _SELECT.SELECTION_STATE_DICT, progress=progress,
            target_dtype=_tensors.dtype_number(dtype) if dtype else None)
        out = destination
        if out is None:
            out = collections.OrderedDict()
            out._metadata = collections.OrderedDict()
        if hasattr(out, "_metadata"):
            out._metadata.update(self._metadata(header, prefix))
        for key, entry, tensor in items:
            if keep_vars and torch is not None and \
                    entry.kind == module_pb2.ENTRY_KIND_PARAMETER:
                tensor = torch.nn.Parameter(tensor,
                                            requires_grad=entry.requires_grad)
            out[prefix + key] = tensor
        return out

    def _named(self, selection, prefix, recurse):
        _, items = self._fetch(selection)
        for key, _, tensor in items:
            if recurse or "." not in key:
                yield join(prefix, key), tensor

    def named_parameters(self, prefix="", recurse=True):
        """PyTorch's named_parameters(): (name, Parameter) pairs, each
        parameter once."""
        return self._named(_SELECT.SELECTION_PARAMETERS, prefix, recurse)

    def parameters(self, recurse=True):
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix="", recurse=True):
        """PyTorch's named_buffers(): non-persistent buffers included."""
        return self._named(_SELECT.SELECTION_BUFFERS, prefix, recurse)

    def buffers(self, recurse=True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def load_state_dict(self, state_dict, strict=True, *, assign=False,
                        atomic=True, progress=None):
        """PyTorch's load_state_dict(): returns _IncompatibleKeys; raises
        RuntimeError (a FailedPreconditionError) with PyTorch's text. Atomic
        unless atomic=False: a failed load changes nothing."""
        check_state_dict(state_dict, "load_state_dict", values=False)
        prefix = self.path + "." if self.path else ""
        state_dict = self._stand_ins(state_dict, strict)
        self._check_meta(state_dict, strict)
        if self.path:
            self._check_keys(state_dict, strict)
        entries, sources = [], []
        for key, value in state_dict.items():
            number, shape, nbytes = _tensors.describe(value)
            entries.append(pb.StateDictEntry(key=prefix + key, dtype=number,
                                             shape=shape, byte_length=nbytes))
            sources.append(_tensors.bytes_source(value))
        header = pb.StateDictHeader(entries=entries, total_bytes=sum(
            e.byte_length for e in entries))
        for path, data in (getattr(state_dict, "_metadata", None) or
                           {}).items():
            if isinstance(data, dict) and "version" in data:
                header.metadata.add(path=join(self.path, path),
                                    version=int(data["version"]))
        start = pb.LoadStart(
            module=self.name, header=header,
            options=pb.LoadOptions(strict=strict and not self.path,
                                   atomic=atomic, assign=assign))
        try:
            response = _transfer.send(self._client, start, sources,
                                      f"{self.name}: load_state_dict",
                                      progress)
        except FailedPreconditionError as error:
            text = self._torch_text(error.message)
            if text == error.message:
                raise
            raise FailedPreconditionError(error.code, text) from None
        self.last_registrations = list(response.registrations)

        def mine(keys):
            return [k[len(prefix):] for k in keys if k.startswith(prefix)]
        return _IncompatibleKeys(mine(response.missing_keys),
                                 mine(response.unexpected_keys))

    def _stand_ins(self, state_dict, strict):
        """`state_dict` with a stand-in (an empty uint8 tensor) for each
        value of an unexpected key that the wire cannot carry (not a
        tensor, or of a dtype modelstate lacks): torch never looks at an
        unexpected key's value, and the server then lists the key where
        torch does (or raises torch's strict error). A value that is no
        tensor under one of the module's own keys is torch's RuntimeError
        ("expected torch.Tensor or Tensor-like object"), with the load's
        other errors, and nothing is loaded; a tensor of a dtype modelstate
        lacks there stays a TypeError."""
        def carried(value):
            if not _tensors.is_tensor(value):
                return False
            try:
                _tensors.describe(value)
            except TypeError:
                return False
            return True

        bad = [k for k, v in state_dict.items() if not carried(v)]
        if not bad:
            return state_dict
        header, _ = self._fetch(_SELECT.SELECTION_STATE_DICT,
                                metadata_only=True)
        prefix = self.path + "." if self.path else ""
        own = {e.key[len(prefix):] for e in header.entries}
        out = collections.OrderedDict(state_dict)
        if hasattr(state_dict, "_metadata"):
            out._metadata = state_dict._metadata
        for key in bad:
            value = state_dict[key]
            if key in own and _tensors.is_tensor(value):
                _tensors.describe(value)  # its TypeError
            out[key] = _stand_in()
        if any(key in own for key in bad):
            missing, unexpected, errors = self._view_load_errors(state_dict)
            raise FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                _missing_unexpected_text(
                    self.type_name, missing if strict else [],
                    unexpected if strict else [], errors))
        return out

    def _torch_text(self, text):
        """A view's load error as torch words it for this submodule: its
        class name and its own keys (the server loads at the root and
        words them for the root)."""
        head, sep, body = text.partition(":\n\t")
        if not self.path or not sep or \
                not head.startswith("Error(s) in loading state_dict for "):
            return text
        prefix = self.path + "."
        lines = []
        for line in body.split("\n\t"):
            for before in ("size mismatch for ",
                           'While copying the parameter named "'):
                if line.startswith(before + prefix):
                    line = before + line[len(before) + len(prefix):]
                    break
            else:
                if line.startswith(("Missing key(s)", "Unexpected key(s)",
                                    "Unexpected running stats buffer(s)")):
                    line = line.replace(f'"{prefix}', '"')
            lines.append(line)
        return f"Error(s) in loading state_dict for {self.type_name}" + \
            sep + "\n\t".join(lines)

    def _check_meta(self, state_dict, strict):
        """PyTorch's error for a meta tensor loaded into a tensor that has
        values (its copy_() fails), with the load's other errors as PyTorch
        words them, before anything is sent: a meta tensor has no bytes to
        send."""
        if torch is None or not any(
                isinstance(v, torch.Tensor) and v.is_meta
                for v in state_dict.values()):
            return
        header, _ = self._fetch(_SELECT.SELECTION_STATE_DICT,
                                metadata_only=True)
        devices = entry_devices(self.info().info, self.path)
        prefix = self.path + "." if self.path else ""
        hosted = [(e.key[len(prefix):], e.key, torch.Size(e.shape))
                  for e in header.entries]
        errors, copies = [], False
        for key, full_key, shape in hosted:
            value = state_dict.get(key)
            if value is None:
                continue
            if value.shape != shape:
                errors.append(f"size mismatch for {key}: copying a param "
                              f"with shape {value.shape} from checkpoint, "
                              f"the shape in current model is {shape}.")
            elif getattr(value, "is_meta", False) and \
                    devices.get(full_key) != "meta":
                # torch 1.13's copy_() out of a meta tensor, as its
                # load_state_dict words the exception's args.
                args = ("Cannot copy out of meta tensor; no data!",)
                errors.append(f'While copying the parameter named "{key}", '
                              f"whose dimensions in the model are {shape} "
                              f"and whose dimensions in the checkpoint are "
                              f"{value.shape}, an exception occurred : "
                              f"{args}.")
                copies = True
        if not copies:
            return
        names = {key for key, _, _ in hosted}
        missing = [k for k, _, _ in hosted if k not in state_dict] \
            if strict else []
        unexpected = [k for k in state_dict if k not in names] \
            if strict else []
        raise FailedPreconditionError(
            grpc.StatusCode.FAILED_PRECONDITION,
            _missing_unexpected_text(self.type_name, missing, unexpected,
                                     errors))

    def _check_keys(self, state_dict, strict):
        """A submodule's strict load, checked before anything is sent: the
        server loads whole modules only, so the view's missing and
        unexpected keys are found here, by the rules the server applies at
        the root (PyTorch 2.x's; see _view_load_errors). torch reports the
        size mismatches with them, so they are in the same error."""
        if not strict:
            return
        missing, unexpected, errors = self._view_load_errors(state_dict)
        if missing or unexpected:
            raise FailedPreconditionError(
                grpc.StatusCode.FAILED_PRECONDITION,
                _missing_unexpected_text(self.type_name, missing,
                                         unexpected, errors))

    def _view_load_errors(self, state_dict):
        """(missing, unexpected, other errors) of loading `state_dict` into
        this module or submodule, as torch's load_state_dict walks it: each module in
        pre-order over its raw children, its parameters and persistent
        buffers, then its extra state, then the keys under its prefix that
        name nothing it has (a dotted rest must start with a child's name,
        a plain one must be local state). A BatchNorm whose _metadata
        version is absent or below 2 takes its counter as given, so a
        missing num_batches_tracked is no missing key there."""
        header, _ = self._fetch(_SELECT.SELECTION_STATE_DICT,
                                metadata_only=True)
        prefix = self.path + "." if self.path else ""
        shapes = {e.key[len(prefix):]: tuple(e.shape)
                  for e in header.entries}
        meta = getattr(state_dict, "_metadata", None) or {}
        missing, unexpected, errors = [], [], []
        described = {}

        def check_shape(key, value):
            if not _tensors.is_tensor(value):
                errors.append(f'While copying the parameter named "{key}", '
                              f"expected torch.Tensor or Tensor-like object "
                              f"from checkpoint but received {type(value)}")
                return
            target = shapes[key]
            _, shape, _ = _tensors.describe(value)
            shape = tuple(shape)
            if len(target) == 0 and len(shape) == 1:
                shape = ()  # torch copies input[0] into a 0-dim tensor
            if shape != target:
                size = torch.Size if torch is not None else tuple
                errors.append(f"size mismatch for {key}: copying a param "
                              f"with shape {size(value.shape)} from "
                              f"checkpoint, the shape in current model is "
                              f"{size(target)}.")

        def walk(info, rel):
            described[rel] = info
            own = rel + "." if rel else ""
            local_meta = meta.get(rel)
            version = local_meta.get("version") \
                if isinstance(local_meta, dict) else None
            local = [e.name for e in info.parameters if not e.is_none]
            buffers = [e.name for e in info.buffers
                       if not e.is_none and e.tensor.persistent]
            dropped = []
            track = info.attributes.get("track_running_stats")
            if version is None and info.qualified_type.startswith(
                    "torch.nn.modules.instancenorm.") and \
                    track is not None and not track.bool_value:
                # _InstanceNorm: an old checkpoint's running stats.
                dropped = [own + n for n in ("running_mean", "running_var")
                           if own + n in state_dict]
            if dropped:
                klass = info.type
                names = " and ".join(f'"{k}"' for k in dropped)
                errors.append(
                    f"Unexpected running stats buffer(s) {names} "
                    f"for {klass} with track_running_stats=False. If "
                    f"state_dict is a checkpoint saved before 0.4.0, this may "
                    f"be expected because {klass} does not track running "
                    f"stats by default since 0.4.0. Please remove these keys "
                    f"from state_dict. If the running stats are actually "
                    f"needed, instead set track_running_stats=True in "
                    f"{klass} to enable them. See the documentation of "
                    f"{klass} for details.")
            for name in local + buffers:
                key = own + name
                if key in state_dict:
                    check_shape(key, state_dict[key])
                elif not (name == "num_batches_tracked" and
                          name in buffers and info.version >= 2 and
                          (version is None or version < 2)):
                    missing.append(key)
            local += buffers
            extra = own + "_extra_state"
            if extra in shapes and extra not in state_dict:
                missing.append(extra)
            elif extra in shapes and not _tensors.is_tensor(state_dict[extra]):
                # The hosted extra state is a tensor: a value the wire
                # cannot carry gets torch's words for a tensor slot.
                errors.append(f'While copying the parameter named "{extra}", '
                              f"expected torch.Tensor or Tensor-like object "
                              f"from checkpoint but received "
                              f"{type(state_dict[extra])}")
            children = {c.name for c in info.children}
            for key in state_dict:
                if not key.startswith(own) or key in dropped or \
                        (key == extra and extra in shapes):
                    continue
                rest = key[len(own):]
                if ("." in rest and rest.split(".")[0] not in children) or \
                        ("." not in rest and rest not in local):
                    unexpected.append(key)
            for child in info.children:
                if child.is_none:
                    continue
                path = own + child.name
                if child.same_as:
                    walk(described.get(child.same_as) or
                         self.info(child.same_as).info, path)
                else:
                    walk(child.module, path)

        walk(self.info().info, "")
        return missing, unexpected, errors

    # ---------------------------------------------------------- changes --
    def to(self, *args, **kwargs):
        """PyTorch's to(device=None, dtype=None) (also to(dtype), to(device),
        to(tensor)): floating tensors change dtype, every tensor moves.
        Returns self."""
        self._whole_module_only("to()")
        device, dtype = _parse_to(args, kwargs)
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

    def type(self, dst_type):
        """PyTorch's type(dst_type): every parameter and buffer becomes
        `dst_type` (a dtype, or a tensor type such as torch.DoubleTensor or
        "torch.cuda.HalfTensor", which also picks the device), integer and
        bool ones included, unlike to() (MoveModule with convert_all). As
        in torch, a buffer tied into several modules becomes one tensor per
        module, and an integer dtype while a parameter requires grad is a
        RuntimeError (here nothing changes). Returns self."""
        self._whole_module_only("type()")
        dtype, device = _parse_type(dst_type)
        request = pb.MoveModuleRequest(module=self.name, dtype=str(dtype),
                                       convert_all=True)
        if device is not None:
            request.device = str(device)
        self._client._call("MoveModule", request)
        return self

    def train(self, mode=True):
        self._whole_module_only("train()")
        self._client._call("SetTraining", pb.SetTrainingRequest(
            module=self.name, training=mode))
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        """PyTorch's requires_grad_(): every parameter below this module
        gets the flag. The server has no call that flips the flag alone, so
        each parameter that changes is registered again (same values, hooks
        and audit log see it); a tied parameter cannot be, and raises
        NotImplementedError before anything changes."""
        params = list(self.named_parameters())
        distinct = {k for k, _ in params}
        tied = [k for k in self._param_keys() if k not in distinct]
        changing = [(k, p) for k, p in params
                    if p.requires_grad != bool(requires_grad)]
        if self.path and changing:
            tied += self._tied_outside([k for k, _ in changing])
        if changing and tied:
            raise NotImplementedError(
                f"requires_grad_: {', '.join(tied)} are tied to other "
                "parameters, and registering them again would untie them "
                "(the server has no call that sets requires_grad alone)")
        for key, p in changing:
            owner, _, name = key.rpartition(".")
            request = pb.RegisterTensorRequest(
                module=self.name, path=join(self.path, owner), name=name,
                requires_grad=bool(requires_grad))
            request.tensor.CopyFrom(_tensors.to_proto(p.detach()))
            self.last_registrations = list(self._client._call(
                "RegisterParameter", request).registrations)
        return self

    def _tied_outside(self, keys):
        """Those of this view's parameter `keys` that are tied to a
        parameter outside it: the whole module lists them under another
        key, and not because their module is shared (registering in a
        shared module reaches every path of it)."""
        root = RemoteModule(self._client, self.name)
        header, _ = root._fetch(_SELECT.SELECTION_PARAMETERS,
                                metadata_only=True)
        firsts = {e.key for e in header.entries}
        same = {}

        def walk(info, path):
            for child in info.children:
                child_path = join(path, child.name)
                if child.same_as:
                    same[child_path] = child.same_as
                elif child.HasField("module"):
                    walk(child.module, child_path)
        walk(root.info().info, "")
        out = []
        for key in keys:
            owner, _, name = join(self.path, key).rpartition(".")
            first = ""
            for part in owner.split("."):
                first = join(first, part)
                first = same.get(first, first)
            if join(first, name) not in firsts:
                out.append(key)
        return out

    def _param_keys(self):
        out = []

        def walk(info, path):
            out.extend(join(path, e.name) for e in info.parameters
                       if not e.is_none)
            for child in info.children:
                if child.HasField("module"):
                    walk(child.module, join(path, child.name))
        walk(self.info().info, "")
        return out

    def register_parameter(self, name, param, *, path="", seed=0):
        """Registers a parameter (a torch.nn.Parameter, or None) in the
        submodule at `path`; the server's hooks decide. As in torch, any
        other value is a TypeError (after torch's checks of the name);
        without torch, where there is no Parameter, an array is registered
        with requires_grad True."""
        if torch is not None and param is not None and \
                not isinstance(param, torch.nn.Parameter):
            _check_name(name, "parameter")
            raise TypeError(f"cannot assign '{torch.typename(param)}' object "
                            f"to parameter '{name}' (torch.nn.Parameter or "
                            f"None required)")
        request = pb.RegisterTensorRequest(seed=seed)
        if param is not None:
            request.requires_grad = bool(getattr(param, "requires_grad",
                                                 True))
        self._register_tensor("RegisterParameter", request, name, param,
                              path)

    def register_buffer(self, name, tensor, persistent=True, *, path=""):
        """Registers a buffer (a tensor, or None) in the submodule at
        `path`."""
        self._register_tensor(
            "RegisterBuffer", pb.RegisterTensorRequest(persistent=persistent),
            name, tensor, path)

    def _register_tensor(self, method, request, name, value, path):
        request.module, request.name = self.name, name
        request.path = join(self.path, path)
        if value is None:
            request.none = True
        else:
            what = "register_" + method[len("Register"):].lower()
            _check_tensor(value, what)
            request.tensor.CopyFrom(_tensors.to_proto(value))
        self.last_registrations = list(
            self._client._call(method, request).registrations)

    def register_module(self, name, module, *, path="", seed=0):
        """Registers a submodule in the submodule at `path`: a ModuleSpec
        (a dict, JSON text or proto), a torch nn.Module (its spec and
        weights, as push() does), a RemoteModule of this same module (shared
        with it), or None."""
        from . import _push  # torch only when a torch module is pushed
        where = join(self.path, path)
        request = pb.RegisterSubmoduleRequest(module=self.name, path=where,
                                              name=name, seed=seed)
        if torch is not None and isinstance(module, torch.nn.Module):
            _push.push_submodule(self, where, name, module)
            return
        if isinstance(module, RemoteModule):
            if module.name != self.name:
                raise ValueError(f"register_module: {module!r} is part of "
                                 f"another hosted module than {self.name}")
            request.existing_path = module.path
        elif module is None:
            request.none = True
        else:
            request.spec.CopyFrom(spec_proto(module, "register_module"))
        self.last_registrations = list(
            self._client._call("RegisterSubmodule", request).registrations)

    add_module = register_module

    def remove_entry(self, name, *, path=""):
        """Removes the parameter, buffer or submodule `name` of the
        submodule at `path` (PyTorch's `del module.name`); hooks see an
        unregistration and may block it. NotFoundError if there is none."""
        self.last_registrations = list(self._client._call(
            "RemoveEntry", pb.RemoveEntryRequest(
                module=self.name, path=join(self.path, path),
                name=name)).registrations)

    def delete(self):
        """Deletes the whole hosted module from the server."""
        self._whole_module_only("delete()")
        self._client.delete(self.name)

    # ------------------------------------------------------------ tree --
    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """PyTorch's named_modules(): (name, RemoteModule) for this module
        and every submodule, a shared one once unless remove_duplicate is
        False."""
        out = []

        def walk(info, path, rel):
            out.append((join(prefix, rel), RemoteModule(
                self._client, self.name, join(self.path, path))))
            for child in info.children:
                if child.same_as and not remove_duplicate:
                    walk(self.info(child.same_as).info,
                         join(path, child.name), join(rel, child.name))
                elif child.HasField("module"):
                    walk(child.module, join(path, child.name),
                         join(rel, child.name))
        walk(self.info().info, "", "")
        return iter(out)

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        """PyTorch's named_children(): (name, RemoteModule) of the direct
        submodules, each once."""
        seen = set()
        for child in self.info().info.children:
            if child.is_none:
                continue
            key = child.same_as or child.name
            if key in seen:
                continue
            seen.add(key)
            yield child.name, RemoteModule(self._client, self.name,
                                           join(self.path, child.name))

    def children(self):
        for _, m in self.named_children():
            yield m

    def get_submodule(self, target):
        """PyTorch's get_submodule("a.b"): a RemoteModule for that
        submodule (AttributeError, PyTorch's text, if there is none)."""
        if not target:
            return self
        try:
            self.info(target)
        except NotFoundError as error:
            raise AttributeError(str(error)) from None
        return RemoteModule(self._client, self.name, join(self.path, target))

    def pull(self, *, dtype=None, device=None, progress=None, into=None):
        """This module as a torch.nn.Module, or into= one refreshed in
        place (see Client.pull)."""
        from . import _pull
        return _pull.pull(self._client, self.name, self.path, dtype=dtype,
                          device=device, progress=progress, into=into)

    # --------------------------------------------------------- forward --
    def forward(self, *inputs, training=None, seed=0):
        """module(*inputs) on the server (Forward): tensors in, a tensor
        out (a tuple for several outputs). None stands for an input left
        out. training= runs this call in that mode only; seed= seeds the
        Dropout masks of a training-mode call."""
        request = pb.ForwardRequest(module=self.name, path=self.path,
                                    seed=seed)
        if training is not None:
            request.training = bool(training)
        for i, value in enumerate(inputs):
            if value is None:
                request.inputs.append(_tensors.none_proto())
            else:
                _check_tensor(value, f"forward input {i}")
                request.inputs.append(_tensors.to_proto(value))
        response = self._client._call("Forward", request,
                                      timeout=self._client._transfer_timeout)
        outputs = tuple(None if o.dtype == 0 else _tensors.from_proto(o)
                        for o in response.outputs)
        return outputs[0] if len(outputs) == 1 else outputs

    __call__ = forward


def spec_proto(spec, what):
    """A ModuleSpec proto from a dict, JSON text or proto; a TypeError
    naming the expected types for anything else (a torch module above
    all)."""
    if isinstance(spec, module_pb2.ModuleSpec):
        return spec
    if torch is not None and isinstance(spec, torch.nn.Module):
        raise TypeError(f"{what}: expected a ModuleSpec (a dict, JSON text "
                        f"or modelstate.v1.ModuleSpec), got the module "
                        f"{type(spec).__name__}; host a torch module with "
                        f"Client.push(module, name)")
    if isinstance(spec, (str, bytes)):
        try:
            spec = json.loads(spec)
        except ValueError as error:
            raise ValueError(f"{what}: spec is not JSON: {error}") from None
    if not isinstance(spec, collections.abc.Mapping):
        raise TypeError(f"{what}: expected a ModuleSpec (a dict, JSON text "
                        f"or modelstate.v1.ModuleSpec), got "
                        f"{type(spec).__name__}")
    try:
        return json_format.ParseDict(spec, module_pb2.ModuleSpec())
    except json_format.ParseError as error:
        raise ValueError(f"{what}: spec: {error}") from None


def _check_name(name, what):
    """torch's register_parameter/register_buffer checks of a name, which
    come before its check of the value."""
    if not isinstance(name, str):
        raise TypeError(f"{what} name should be a string. Got "
                        f"{torch.typename(name)}")
    if "." in name:
        raise KeyError(f"{what} name can't contain \".\"")
    if name == "":
        raise KeyError(f"{what} name can't be empty string \"\"")


def _check_tensor(value, what):
    if not _tensors.is_tensor(value):
        raise TypeError(f"{what}: expected a tensor, got "
                        f"{type(value).__name__}")


def _parse_to(args, kwargs):
    """(device, dtype) of PyTorch's to() arguments; dtype names work too
    (half() passes "float16")."""
    if torch is None:
        device, dtype = kwargs.get("device"), kwargs.get("dtype")
        for arg in args:
            if _is_dtype(arg):
                dtype = arg
            else:
                device = arg
        return device, dtype
    if isinstance(kwargs.get("dtype"), str):
        kwargs = dict(kwargs, dtype=_tensors.as_torch_dtype(kwargs["dtype"]))
    args = tuple(_tensors.as_torch_dtype(a) if isinstance(a, str) and
                 _is_dtype(a) else a for a in args)
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    return device, dtype


def _is_dtype(value):
    try:
        _tensors.dtype_number(value)
        return True
    except TypeError:
        return False
