"""The order in which modules' __init__ registered their parameters,
buffers and submodules, recorded while they are constructed. torch keeps
the three in separate dicts, so a finished module no longer tells; push()
uses this order for a custom module's members when it was recorded."""

import contextlib
import threading
import weakref

try:
    from torch import nn
except ImportError:  # record_construction() needs torch
    nn = None

_order = weakref.WeakKeyDictionary()
_recording = threading.local()
_patch_lock = threading.Lock()
_patch_depth = [0]
_originals = {}


def _note_registration(module, kind, name):
    if getattr(_recording, "active", 0):
        seen = _order.setdefault(module, [])
        if (kind, name) not in seen:
            seen.append((kind, name))


def _patched():
    orig = _originals

    def register_parameter(self, name, param):
        _note_registration(self, "parameter", name)
        return orig["register_parameter"](self, name, param)

    def register_buffer(self, name, tensor, persistent=True):
        _note_registration(self, "buffer", name)
        return orig["register_buffer"](self, name, tensor, persistent)

    def add_module(self, name, module):
        _note_registration(self, "module", name)
        return orig["add_module"](self, name, module)

    def setattr_(self, name, value):
        if isinstance(value, nn.Module) or (
                value is None and name in self.__dict__.get("_modules", {})):
            _note_registration(self, "module", name)
        return orig["__setattr__"](self, name, value)

    return {"register_parameter": register_parameter,
            "register_buffer": register_buffer, "add_module": add_module,
            "__setattr__": setattr_}


@contextlib.contextmanager
def record_construction():
    """Records, for the modules constructed inside it (on this thread), the
    order in which their __init__ registered parameters, buffers and
    submodules, so that push() registers them on the server in that order.

        with modelstate.record_construction():
            model = MyModel()
        ms.push(model, "team/model")
    """
    if nn is None:
        raise ImportError("record_construction() needs torch")
    with _patch_lock:
        if _patch_depth[0] == 0:
            for key, fn in _patched().items():
                _originals[key] = getattr(nn.Module, key)
                setattr(nn.Module, key, fn)
        _patch_depth[0] += 1
    _recording.active = getattr(_recording, "active", 0) + 1
    try:
        yield
    finally:
        _recording.active -= 1
        with _patch_lock:
            _patch_depth[0] -= 1
            if _patch_depth[0] == 0:
                for key, fn in _originals.items():
                    setattr(nn.Module, key, fn)


def recorded_order(module):
    """[(kind, name)] as `module` registered them, or None."""
    return _order.get(module)
