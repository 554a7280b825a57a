"""Remote registration hooks: a Python function that runs as one of the
server's interceptors. The server sends each registration it selects; the
function sees (module, name, value) like a torch.nn global registration
hook and answers: None approves, a tensor replaces the value, REJECT blocks.
A tensor the function changed in place (requires_grad, or its values)
counts as a replacement, so PyTorch-style hooks that mutate their argument
work unchanged."""

import importlib
import itertools
import os
import queue
import re
import threading
import time

import grpc

from . import _tensors
from ._errors import from_rpc_error
from .v1 import model_state_service_pb2 as pb
from .v1 import module_pb2


class _Reject:
    def __repr__(self):
        return "modelstate.REJECT"


# What a hook returns to block a registration.
REJECT = _Reject()

_KINDS = {
    "parameter": module_pb2.ENTRY_KIND_PARAMETER,
    "buffer": module_pb2.ENTRY_KIND_BUFFER,
    "module": module_pb2.ENTRY_KIND_MODULE,
}


try:
    from torch import nn as _nn
except ImportError:  # tensors are numpy arrays then; no torch classes
    _nn = None


class ModuleRef:
    """The module a registration goes into, as a hook sees it: its class is
    named after the module's type, so type(module).__name__ == "Linear",
    and, with torch, derives from the torch.nn class of that name (or
    nn.Module), so isinstance(module, nn.Linear) holds as in the seeds'
    hooks. It is a stand-in, not a constructed torch module: it has no
    parameters of its own. `module` is the hosted module's
    "namespace/name", `path` the dotted path inside it ("" for the
    root)."""

    def __init__(self, module, path):
        # Set past nn.Module.__setattr__: no nn.Module.__init__ ran.
        object.__setattr__(self, "module", module)
        object.__setattr__(self, "path", path)

    @property
    def type_name(self):
        return type(self).__name__

    def __repr__(self):
        where = f"{self.module}:{self.path}" if self.path else self.module
        return f"<{self.type_name} {where}>"


_ref_classes = {}
_ref_lock = threading.Lock()


def _torch_base(type_name):
    """The torch.nn class a stand-in for `type_name` derives from: the
    class of that name in torch.nn or one of its modules (MultiheadAttention's
    NonDynamicallyQuantizableLinear lives in torch.nn.modules.linear), the
    class a dotted "torch.nn.modules.x.Name" names, or nn.Module."""
    if _nn is None:
        return None
    candidates = [getattr(_nn, type_name, None)]
    if "." in type_name:
        module_name, _, attr = type_name.rpartition(".")
        if module_name.startswith("torch.nn"):
            try:
                candidates.append(getattr(
                    importlib.import_module(module_name), attr, None))
            except ImportError:
                pass
    else:
        candidates += [getattr(getattr(_nn.modules, m, None), type_name, None)
                       for m in dir(_nn.modules) if not m.startswith("_")]
    for cls in candidates:
        if isinstance(cls, type) and issubclass(cls, _nn.Module):
            return cls
    return _nn.Module


def _module_ref(type_name, module, path):
    with _ref_lock:
        cls = _ref_classes.get(type_name)
        if cls is None:
            base = _torch_base(type_name)
            bases = (ModuleRef,) if base is None else (ModuleRef, base)
            cls = type(type_name.rpartition(".")[2] or "Module", bases,
                       {"__init__": ModuleRef.__init__,
                        "__repr__": ModuleRef.__repr__})
            _ref_classes[type_name] = cls
    return cls(module, path)


_names = itertools.count(1)


def subscriber_name(kind, hook):
    """A subscriber name for `hook` within the server's alphabet
    ([A-Za-z0-9_.:@-], at most 128): a lambda is "lambda", a partial or
    other callable without a __name__ is named after its class."""
    label = getattr(hook, "__name__", None) or type(hook).__name__
    label = re.sub(r"[^A-Za-z0-9_.:@-]", "", label)[:48] or "hook"
    return f"python-{os.getpid()}-{kind}-{label}-{next(_names)}"


class HookHandle:
    """A registered remote hook; .remove() unregisters it (like
    torch.utils.hooks.RemovableHandle)."""

    def __init__(self, client, kind, hook, name=None, timeout=None,
                 priority=0, fail_open=False, namespaces=(),
                 max_data_bytes=63 << 20):
        # 63 MiB: an event must fit in one message of the server's default
        # 64 MiB limit; the server refuses more than its limit minus 1 MiB.
        self._hook = hook
        self._kind = kind
        self._removed = False
        self._error = None
        self._acked = threading.Event()
        self.name = name or subscriber_name(kind, hook)
        subscription = pb.Subscription(
            name=self.name, mode=pb.Subscription.MODE_INTERCEPT,
            kinds=[_KINDS[kind]], namespaces=list(namespaces),
            priority=priority, timeout_ms=int((timeout or 0) * 1000),
            failure_policy=(pb.Subscription.FAIL_OPEN if fail_open
                            else pb.Subscription.FAIL_CLOSED),
            include_data=True, max_data_bytes=max_data_bytes)
        self._client = client
        self._subscription = subscription
        self._lock = threading.Lock()
        # Held while an event is answered, so that remove() half-closes the
        # stream only after the answer the hook is computing has been sent.
        self._answering = threading.Lock()
        # Subscriptions made (1 + reconnections after the server went away).
        self.subscriptions = 0
        self._connected = threading.Event()
        self._call, self._requests = self._subscribe()
        self._thread = threading.Thread(target=self._serve,
                                        args=(self._call, self._requests),
                                        daemon=True, name=self.name)
        self._thread.start()
        if not self._acked.wait(client._timeout) or self._error is not None:
            self._cancel()
            if self._error is not None:
                raise from_rpc_error(self._error)
            raise TimeoutError(f"subscribing {self.name}: no answer")

    def _subscribe(self):
        """A new Subscribe stream, and the queue feeding its requests."""
        requests = queue.Queue()
        requests.put(pb.SubscribeRequest(subscription=self._subscription))
        call = self._client._stub.Subscribe(self._outgoing(requests),
                                            metadata=self._client._metadata)
        return call, requests

    @staticmethod
    def _outgoing(requests):
        while True:
            request = requests.get()
            if request is None:
                return
            yield request

    def _serve(self, call, requests):
        """Answers events; when the server goes away (a restart), subscribes
        again until it is back, so the hook keeps running: a server without
        its interceptor would let through what the hook was there to
        check."""
        delay = 0.05
        while True:
            acked = False
            try:
                for response in call:
                    if response.HasField("ack"):
                        acked = True
                        delay = 0.05
                        self.subscriptions += 1
                        self._connected.set()
                        self._acked.set()
                        continue
                    with self._answering:
                        if self._removed:
                            # remove() has begun: the hook no longer runs,
                            # and the server, detaching the subscriber,
                            # applies its failure policy to this event.
                            continue
                        requests.put(pb.SubscribeRequest(
                            answer=self._answer(response.event)))
                ended = None  # the server closed the stream (shutting down)
            except grpc.RpcError as error:
                ended = error
            self._connected.clear()
            requests.put(None)
            if self._removed:
                break
            transient = ended is None or ended.code() in (
                grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                grpc.StatusCode.INTERNAL)
            if not self._acked.is_set() or not transient:
                # The subscription itself was refused (a bad option, a
                # name in use, no permission): trying again cannot help.
                self._error = ended
                break
            time.sleep(delay)
            delay = min(delay * 2, 1.0) if not acked else 0.05
            with self._lock:
                if self._removed:
                    break
                call, requests = self._subscribe()
                self._call, self._requests = call, requests
        self._acked.set()

    def wait_connected(self, timeout=None):
        """Waits until the hook is subscribed (again, after a server
        restart); returns whether it is."""
        return self._connected.wait(timeout)

    def _value(self, event):
        """The hook's third argument."""
        if event.action == module_pb2.REGISTRATION_ACTION_UNREGISTER:
            return None
        if event.kind == module_pb2.ENTRY_KIND_MODULE:
            if not event.value_module_type:
                return None
            child = f"{event.path}.{event.name}" if event.path else event.name
            return _module_ref(event.value_module_type,
                               f"{event.namespace}/{event.module}", child)
        if not event.HasField("value"):
            return None  # registering None
        parameter = event.kind == module_pb2.ENTRY_KIND_PARAMETER
        if event.HasField("data") and event.value.device != "meta":
            return _tensors.from_proto(event.data, parameter=parameter)
        return _tensors.meta_tensor(event.value)

    def _answer(self, event):
        answer = pb.HookAnswer(event_id=event.event_id)
        module = _module_ref(event.module_type,
                             f"{event.namespace}/{event.module}", event.path)
        try:
            value = self._value(event)
            before = _snapshot(value)
            result = self._hook(module, event.name, value)
        except Exception as error:  # a failing hook blocks, saying why
            # The server prefixes "rejected by <this subscriber>: ".
            answer.verdict = pb.HookAnswer.REJECT
            answer.reason = f"hook raised {type(error).__name__}: {error}"
            return answer
        try:
            self._verdict(answer, result, before, value)
        except Exception as error:  # noqa: BLE001 - an invalid answer
            # A tensor the wire cannot carry (a complex or meta one): an
            # invalid answer blocks this registration, saying why, and
            # the hook's thread lives on to answer the next event.
            return pb.HookAnswer(
                event_id=event.event_id, verdict=pb.HookAnswer.REJECT,
                reason=f"hook returned an invalid tensor: "
                       f"{type(error).__name__}: {error}")
        return answer

    def _verdict(self, answer, result, before, value):
        """Fills `answer` from what the hook returned (`result`) and from
        its argument `value` (`before` it ran)."""
        if result is REJECT:
            answer.verdict = pb.HookAnswer.REJECT
        elif result is None:
            if before is not None and _changed(before, value):
                # Changed in place: its values and its requires_grad count.
                answer.verdict = pb.HookAnswer.MODIFY
                answer.replacement.CopyFrom(_tensors.to_proto(
                    value, requires_grad=self._requires_grad(value)))
            else:
                answer.verdict = pb.HookAnswer.APPROVE
        elif _tensors.is_tensor(result) and self._kind != "module":
            # A Parameter brings its requires_grad; a plain tensor keeps the
            # parameter's own (README: a replacement keeps requires_grad).
            answer.verdict = pb.HookAnswer.MODIFY
            answer.replacement.CopyFrom(_tensors.to_proto(
                result, requires_grad=self._requires_grad(result)))
        else:
            answer.verdict = pb.HookAnswer.REJECT
            answer.reason = (f"hook returned {type(result).__name__}; "
                             f"expected None, "
                             f"{'' if self._kind == 'module' else 'a tensor, '}"
                             f"or modelstate.REJECT")

    def _requires_grad(self, tensor):
        """The flag a parameter replacement states: a Parameter's own,
        otherwise none (the server keeps the proposed one)."""
        if self._kind != "parameter" or _nn is None or \
                not isinstance(tensor, _nn.Parameter):
            return None
        return tensor.requires_grad

    def remove(self):
        """Unsubscribes; once it returns, no registration reaches the hook.

        Like torch's RemovableHandle.remove(), this is synchronous: it
        half-closes the stream and waits for the server to end it, which
        the server does only after it has detached the subscriber (and
        recorded the unsubscribe in the audit log). A cancelled call would
        return at once while the server might still send the next
        registration to a hook that no longer answers."""
        inside_hook = threading.current_thread() is self._thread
        with self._lock:
            first = not self._removed
            self._removed = True
            call, requests = self._call, self._requests
        if inside_hook:
            call.cancel()  # removed from inside the hook: cannot wait
            return
        wait = self._client._timeout or 30.0
        if first:
            # The answer the hook may be computing goes out before the
            # half-close (unless the hook is stuck).
            answered = self._answering.acquire(timeout=wait)
            requests.put(None)
            if answered:
                self._answering.release()
        self._thread.join(timeout=wait)
        if self._thread.is_alive():  # the server did not end the stream
            call.cancel()
            self._thread.join(timeout=10)

    def _cancel(self):
        """Stops at once, without waiting for the server."""
        with self._lock:
            self._removed = True
            self._call.cancel()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()

    def __repr__(self):
        return f"<HookHandle {self.name} ({self._kind})>"


def _snapshot(value):
    """What a tensor argument was before the hook ran (None if it holds no
    values to compare)."""
    if not _tensors.is_tensor(value) or getattr(value, "is_meta", False):
        return None
    _, _, raw = _tensors.host_bytes(value)
    return (getattr(value, "requires_grad", False), raw.tobytes())


def _changed(before, value):
    _, _, raw = _tensors.host_bytes(value)
    return before != (getattr(value, "requires_grad", False), raw.tobytes())
