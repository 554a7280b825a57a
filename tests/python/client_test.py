"""The Python client against the real server, checked against real PyTorch:
models built locally are pushed and fetched back bit for bit, models built
on the server load into torch.nn models, errors carry PyTorch's own texts,
and the seeds' registration hook examples run as remote hooks.

Run by ctest: /usr/bin/python3 client_test.py SERVER_BINARY PYTHON_PACKAGE_DIR
"""

import collections
import contextlib
import io
import json
import os
import subprocess
import sys
import time
import unittest
import warnings

SERVER = sys.argv[1]
PACKAGE_DIR = sys.argv[2]
sys.path.insert(0, PACKAGE_DIR)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
del sys.argv[1:3]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import modelstate  # noqa: E402
from modelstate.v1 import model_state_service_pb2 as service_pb  # noqa: E402,E501
import server_process  # noqa: E402


def Server():
    return server_process.Server(SERVER)


def setUpModule():
    global server, ms
    server = Server()
    ms = modelstate.connect(server.address)


def tearDownModule():
    ms.close()
    server.stop()


def randomize(model, seed):
    """Values no initializer would produce, running stats included, so a
    round trip that dropped anything shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=g))
            else:
                t.fill_(int(torch.randint(0, 1000, (), generator=g)))
    return model


MLP_SPEC = {"type": "Sequential", "children": [
    {"spec": {"type": "Linear", "args": [784, 256]}},
    {"spec": {"type": "BatchNorm1d", "args": [256]}},
    {"spec": {"type": "ReLU"}},
    {"spec": {"type": "Linear", "args": [256, 10]}}]}


def mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.BatchNorm1d(256), nn.ReLU(),
                         nn.Linear(256, 10))


TINY_SPEC = {"type": "TinyModel", "members": [
    {"module": {"name": "linear1",
                "spec": {"type": "Linear", "args": [100, 200]}}},
    {"module": {"name": "activation", "spec": {"type": "ReLU"}}},
    {"module": {"name": "linear2",
                "spec": {"type": "Linear", "args": [200, 10]}}},
    {"module": {"name": "softmax",
                "spec": {"type": "Softmax", "kwargs": {"dim": 1}}}}]}


class TinyModel(nn.Module):
    """The seeds' TinyModel."""

    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)
        self.softmax = nn.Softmax(dim=1)


CNN_SPEC = {"type": "Sequential", "children": [
    {"spec": {"type": "Conv2d", "args": [3, 8, 3], "kwargs": {"padding": 1}}},
    {"spec": {"type": "BatchNorm2d", "args": [8]}},
    {"spec": {"type": "ReLU"}},
    {"spec": {"type": "Conv2d", "args": [8, 16, 3]}},
    {"spec": {"type": "BatchNorm2d", "args": [16]}},
    {"spec": {"type": "Flatten"}},
    {"spec": {"type": "Linear", "args": [16 * 6 * 6, 10]}}]}


def cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8),
                         nn.ReLU(), nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16),
                         nn.Flatten(), nn.Linear(16 * 6 * 6, 10))


MODELS = [("mlp", MLP_SPEC, mlp), ("tiny", TINY_SPEC, TinyModel),
          ("cnn", CNN_SPEC, cnn)]


class StateTest(unittest.TestCase):

    def assertSameState(self, got, want):
        self.assertEqual(list(got.keys()), list(want.keys()))
        for key in want:
            a, b = got[key], want[key]
            self.assertEqual(a.dtype, b.dtype, key)
            self.assertEqual(a.shape, b.shape, key)
            # Bit for bit: compare the bytes, so NaNs and -0.0 count too.
            self.assertTrue(torch.equal(a.reshape(-1).view(torch.uint8),
                                        b.detach().reshape(-1)
                                        .view(torch.uint8)), key)

    def test_local_models_pushed_and_fetched_back_bit_for_bit(self):
        for name, spec, make in MODELS:
            with self.subTest(name):
                local = randomize(make(), 1)
                remote = ms.build(spec, f"push/{name}")
                result = remote.load_state_dict(local.state_dict())
                self.assertIsInstance(
                    result, torch.nn.modules.module._IncompatibleKeys)
                self.assertEqual(result.missing_keys, [])
                self.assertEqual(result.unexpected_keys, [])
                back = remote.state_dict()
                self.assertSameState(back, local.state_dict())
                self.assertEqual(back._metadata, local.state_dict()._metadata)

    def test_server_built_models_load_into_torch_strictly(self):
        for name, spec, make in MODELS:
            with self.subTest(name):
                remote = ms.build(spec, f"built/{name}", seed=7)
                local = randomize(make(), 2)
                self.assertEqual(
                    str(local.load_state_dict(remote.state_dict(),
                                              strict=True)),
                    "<All keys matched successfully>")
                # The server's init is PyTorch's, bit for bit.
                torch.manual_seed(7)
                self.assertSameState(remote.state_dict(),
                                     make().state_dict())

    def test_load_errors_and_partial_loads_match_pytorch(self):
        remote = ms.build(MLP_SPEC, "errors/mlp")
        local = mlp()
        bad = collections.OrderedDict(local.state_dict())
        del bad["0.bias"]
        bad["extra"] = torch.zeros(2)
        bad["3.weight"] = torch.zeros(3, 3)
        with self.assertRaises(RuntimeError) as theirs:
            local.load_state_dict(bad)
        before = remote.state_dict()
        with self.assertRaises(RuntimeError) as ours:
            remote.load_state_dict(bad)
        self.assertEqual(str(ours.exception), str(theirs.exception))
        self.assertSameState(remote.state_dict(), before)  # atomic
        ok = collections.OrderedDict(local.state_dict())
        del ok["0.bias"]
        ok["extra"] = torch.zeros(2)
        self.assertEqual(remote.load_state_dict(ok, strict=False),
                         local.load_state_dict(ok, strict=False))
        # A value that is no tensor: torch's RuntimeError, nothing loaded.
        with self.assertRaises(RuntimeError) as theirs:
            mlp().load_state_dict({"0.weight": 3})
        with self.assertRaises(RuntimeError) as ours:
            remote.load_state_dict({"0.weight": 3})
        self.assertEqual(str(ours.exception), str(theirs.exception))

    def test_each_load_error_has_pytorchs_text(self):
        remote = ms.build(MLP_SPEC, "errors/each")
        local = mlp()
        missing = collections.OrderedDict(local.state_dict())
        del missing["1.running_var"]
        unexpected = collections.OrderedDict(local.state_dict())
        unexpected["3.extra"] = torch.zeros(1)
        unexpected["zz"] = torch.zeros(1)
        mismatch = collections.OrderedDict(local.state_dict())
        mismatch["0.weight"] = torch.zeros(256, 783)
        cases = [("missing", missing, True), ("unexpected", unexpected, True),
                 ("size mismatch", mismatch, True),
                 # A size mismatch fails even when not strict.
                 ("size mismatch, not strict", mismatch, False)]
        for label, sd, strict in cases:
            with self.subTest(label):
                with self.assertRaises(RuntimeError) as theirs:
                    mlp().load_state_dict(sd, strict=strict)
                with self.assertRaises(RuntimeError) as ours:
                    remote.load_state_dict(sd, strict=strict)
                self.assertEqual(str(ours.exception), str(theirs.exception))
        # Not strict, missing and unexpected keys are the return value.
        self.assertEqual(remote.load_state_dict(unexpected, strict=False),
                         mlp().load_state_dict(unexpected, strict=False))

    def test_to_converts_like_pytorch(self):
        local = randomize(mlp(), 3)
        remote = ms.build(MLP_SPEC, "to/mlp")
        remote.load_state_dict(local.state_dict())
        self.assertIs(remote.to(torch.float16), remote)
        local.to(torch.float16)
        self.assertSameState(remote.state_dict(), local.state_dict())
        remote.to(dtype=torch.bfloat16)
        local.to(dtype=torch.bfloat16)
        self.assertSameState(remote.state_dict(), local.state_dict())
        remote.to("cpu", torch.float64)
        local.to("cpu", torch.float64)
        self.assertSameState(remote.state_dict(), local.state_dict())
        with self.assertRaises(TypeError) as theirs:
            local.to(torch.int32)
        with self.assertRaises(TypeError) as ours:
            remote.to(torch.int32)
        self.assertEqual(str(ours.exception), str(theirs.exception))
        with self.assertRaises(modelstate.FailedPreconditionError):
            remote.to("cuda:7")

    def test_dtype_shortcuts_work_with_torch_installed(self):
        """half(), float(), double() and bfloat16() convert like torch's
        (they once passed dtype names that torch's to() refused)."""
        local = randomize(mlp(), 8)
        remote = ms.build(MLP_SPEC, "to/shortcuts")
        remote.load_state_dict(local.state_dict())
        for method in ("half", "bfloat16", "double", "float"):
            with self.subTest(method):
                self.assertIs(getattr(remote, method)(), remote)
                getattr(local, method)()
                self.assertSameState(remote.state_dict(), local.state_dict())

    def test_state_dict_of_a_meta_module_has_meta_tensors(self):
        remote = ms.build(MLP_SPEC, "meta/mlp", device="meta")
        theirs = mlp().to("meta").state_dict()
        ours = remote.state_dict()
        self.assertEqual(list(ours), list(theirs))
        for key, t in theirs.items():
            self.assertTrue(ours[key].is_meta, key)
            self.assertEqual((ours[key].shape, ours[key].dtype),
                             (t.shape, t.dtype), key)
        self.assertEqual(ours._metadata, theirs._metadata)
        params = dict(remote.named_parameters())
        self.assertTrue(all(p.is_meta and isinstance(p, nn.Parameter)
                            for p in params.values()))
        self.assertEqual(list(params), [k for k, _ in
                                        mlp().named_parameters()])

    def test_named_parameters_and_buffers_match_pytorch(self):
        spec = {"type": "WithScratch", "members": [
            {"module": {"name": "embed",
                        "spec": {"type": "Embedding", "args": [6, 4]}}},
            {"module": {"name": "proj", "spec": {
                "type": "Linear", "args": [4, 6],
                "kwargs": {"bias": False}}}},
            {"module": {"name": "bn",
                        "spec": {"type": "BatchNorm1d", "args": [4]}}},
            {"buffer": {"name": "scratch", "shape": [3],
                        "persistent": False}}],
            "ties": [{"target": "proj.weight", "source": "embed.weight"}]}

        class WithScratch(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(6, 4)
                self.proj = nn.Linear(4, 6, bias=False)
                self.bn = nn.BatchNorm1d(4)
                self.register_buffer("scratch", torch.zeros(3),
                                     persistent=False)
                self.proj.weight = self.embed.weight

        remote = ms.build(spec, "named/scratch", seed=5)
        torch.manual_seed(5)
        local = WithScratch()
        ours = list(remote.named_parameters())
        theirs = list(local.named_parameters())
        self.assertEqual([n for n, _ in ours], [n for n, _ in theirs])
        for (name, a), (_, b) in zip(ours, theirs):
            self.assertIsInstance(a, nn.Parameter, name)
            self.assertEqual(a.requires_grad, b.requires_grad, name)
            self.assertTrue(torch.equal(a, b), name)
        self.assertEqual([n for n, _ in remote.named_buffers()],
                         [n for n, _ in local.named_buffers()])
        self.assertNotIn("scratch", remote.state_dict())
        self.assertEqual(len(list(remote.parameters(recurse=False))), 0)
        self.assertEqual([n for n, _ in remote.named_buffers(recurse=False)],
                         ["scratch"])

    def test_training_flags_and_registrations(self):
        remote = ms.build({"type": "Custom", "custom": True}, "reg/custom")
        self.assertTrue(remote.training)
        self.assertIs(remote.eval(), remote)
        self.assertFalse(remote.training)
        remote.register_parameter("w", nn.Parameter(torch.ones(2, 2),
                                                    requires_grad=False))
        remote.register_buffer("b", torch.arange(3), persistent=False)
        remote.register_module("lin", {"type": "Linear", "args": [2, 1]},
                               seed=3)
        remote.register_parameter("nothing", None)
        self.assertEqual(list(remote.state_dict()),
                         ["w", "lin.weight", "lin.bias"])
        w = dict(remote.named_parameters())["w"]
        self.assertFalse(w.requires_grad)
        self.assertTrue(torch.equal(dict(remote.named_buffers())["b"],
                                    torch.arange(3)))
        with self.assertRaises(KeyError) as exists:
            remote.register_buffer("w", torch.zeros(1))
        self.assertIn("attribute 'w' already exists", str(exists.exception))
        # A "." or an empty name: torch's register_* raise KeyError too.
        for call in (lambda: remote.register_parameter("a.b", None),
                     lambda: remote.register_buffer("", torch.zeros(1)),
                     lambda: remote.register_module("x.y", {"type": "ReLU"}),
                     lambda: remote.register_module("", None)):
            with self.assertRaises(KeyError) as bad_name:
                call()
            self.assertIsInstance(bad_name.exception, ValueError)
            self.assertRegex(str(bad_name.exception),
                             r"^(parameter|buffer|module) name can't ")
        with self.assertRaises(modelstate.NotFoundError):
            ms.module("reg/absent")
        self.assertIn("reg/custom", ms.modules("reg"))
        remote.delete()
        self.assertNotIn("reg/custom", ms.modules("reg"))

    def test_without_torch_tensors_come_back_as_numpy_arrays(self):
        ms.build({"type": "Linear", "args": [3, 2]}, "numpy/lin", seed=1)
        script = (
            "import sys; sys.modules['torch'] = None\n"
            f"sys.path.insert(0, {PACKAGE_DIR!r})\n"
            "import numpy, modelstate\n"
            f"ms = modelstate.connect({server.address!r})\n"
            "m = ms.module('numpy/lin')\n"
            "sd = m.state_dict()\n"
            "assert all(isinstance(v, numpy.ndarray) for v in sd.values())\n"
            "assert sd['weight'].shape == (2, 3), sd['weight'].shape\n"
            "sd['bias'] = numpy.full(2, 0.5, numpy.float32)\n"
            "print(m.load_state_dict(sd))\n"
            "print(m.state_dict()['bias'].tolist())\n")
        out = subprocess.run([sys.executable, "-c", script], check=True,
                             capture_output=True, text=True).stdout
        self.assertEqual(out, "<All keys matched successfully>\n"
                              "[0.5, 0.5]\n")

    def test_an_empty_key_is_an_unexpected_key_as_in_torch(self):
        remote = ms.build(MLP_SPEC, "load/empty_key", seed=0)
        local = mlp()
        views = ((remote, local), (remote.get_submodule("0"), local[0]))
        for view, torch_view in views:
            sub = torch_view.state_dict()
            sub[""] = torch.zeros(1)
            with self.subTest(view=view.path, strict=False):
                self.assertEqual(
                    view.load_state_dict(sub, strict=False),
                    torch_view.load_state_dict(sub, strict=False))
            with self.subTest(view=view.path, strict=True):
                with self.assertRaises(RuntimeError) as want:
                    torch_view.load_state_dict(sub)
                with self.assertRaises(RuntimeError) as got:
                    view.load_state_dict(sub)
                self.assertEqual(str(got.exception), str(want.exception))
        self.assertSameState(remote.state_dict(), local.state_dict())

    def test_ties_survive_to_where_torch_keeps_them(self):
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.l0, self.l1 = nn.Linear(2, 2), nn.Linear(2, 2)
                self.l1.weight = self.l0.weight
                self.register_buffer("a", torch.zeros(2))
                self.register_buffer("c", self.a)

        for i, to in enumerate(({"device": "meta"},
                                {"dtype": torch.float64}, {})):
            with self.subTest(to):
                local = Tied().to(**to)
                remote = ms.push(Tied(), f"ties/t{i}").to(**to)
                for listing in ("named_parameters", "named_buffers"):
                    self.assertEqual(
                        [k for k, _ in getattr(remote, listing)()],
                        [k for k, _ in getattr(local, listing)()])

    def test_register_parameter_wants_a_parameter_as_torch_does(self):
        remote = ms.build({"type": "Custom", "custom": True}, "reg/plain")
        local = nn.Module()
        for name, value in (("p", torch.zeros(2)), ("q", 3),
                            ("r", torch.zeros(2, dtype=torch.float64)),
                            ("a.b", torch.zeros(2)), ("", 3)):
            with self.subTest(name=name, value=type(value)):
                with self.assertRaises((TypeError, KeyError)) as want:
                    local.register_parameter(name, value)
                with self.assertRaises(type(want.exception)) as got:
                    remote.register_parameter(name, value)
                self.assertEqual(str(got.exception), str(want.exception))
        self.assertEqual(list(remote.state_dict()), [])

    def test_state_dict_destination_prefix_and_positional_args(self):
        remote = ms.build(MLP_SPEC, "sd/dest", seed=0)
        local = mlp()
        local.load_state_dict(remote.state_dict())
        calls = [
            lambda m: m.state_dict(destination=collections.OrderedDict(a=1),
                                   prefix="p."),
            lambda m: m.state_dict({}, "q.", True),
            lambda m: m.state_dict(collections.OrderedDict()),
            lambda m: m.state_dict(prefix="z.", keep_vars=True),
        ]
        for i, call in enumerate(calls):
            with self.subTest(i):
                seen = []
                for m in (local, remote):
                    with warnings.catch_warnings(record=True) as w:
                        warnings.simplefilter("always")
                        got = call(m)
                    seen.append((
                        type(got), list(got), [type(v) for v in got.values()],
                        dict(getattr(got, "_metadata", {"none": 0})),
                        [str(x.message) for x in w]))
                self.assertEqual(seen[1], seen[0])
        dest = {}
        self.assertIs(remote.state_dict(destination=dest), dest)

    def test_type_converts_as_torch_or_says_it_cannot(self):
        remote = ms.build({"type": "Linear", "args": [2, 2]}, "type/lin")
        local = nn.Linear(2, 2)
        for dst in (torch.float64, "torch.HalfTensor", torch.FloatTensor):
            with self.subTest(dst):
                self.assertIs(remote.type(dst), remote)
                local.type(dst)
                self.assertEqual(
                    [(k, v.dtype) for k, v in remote.state_dict().items()],
                    [(k, v.dtype) for k, v in local.state_dict().items()])
        with self.assertRaisesRegex(ValueError, r"^invalid type: 'float64'$"):
            remote.type("float64")

    def test_type_converts_integer_and_bool_tensors_as_torch(self):
        # Module.type() is _apply(lambda t: t.type(dst)): unlike to(), it
        # converts integer and bool buffers too (MoveModule convert_all). A
        # tied parameter stays tied; a buffer tied into two modules becomes
        # two tensors, as in torch.
        class Mixed(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(2, 2)
                self.register_buffer("count", torch.tensor([3, 4]))
                self.register_buffer("flag", torch.tensor([True, False]))
                self.sub = nn.Module()
                self.sub.w = self.lin.weight
                self.sub.register_buffer("count", self.count)

        def described(m):
            return ([(k, v.dtype, v.tolist())
                     for k, v in m.state_dict().items()],
                    [k for k, _ in m.named_parameters()],
                    [k for k, _ in m.named_buffers()])

        for i, dst in enumerate((torch.float64, "torch.HalfTensor",
                                 torch.float32)):
            with self.subTest(dst):
                torch.manual_seed(0)
                local = Mixed()
                remote = ms.push(local, f"type/mixed{i}")
                local.type(dst)
                self.assertIs(remote.type(dst), remote)
                self.assertEqual(described(remote), described(local))
        # An integer dtype while a parameter requires grad: torch's error
        # (set_data), and here nothing changes.
        local = Mixed()
        remote = ms.push(local, "type/int")
        with self.assertRaises(RuntimeError) as want:
            local.type(torch.int64)
        with self.assertRaises(RuntimeError) as got:
            remote.type(torch.int64)
        self.assertEqual(str(got.exception), str(want.exception))
        self.assertEqual(remote.state_dict()["count"].dtype, torch.int64)
        # Without grad, every tensor becomes an integer one.
        local = Mixed().requires_grad_(False)
        remote = ms.push(local, "type/int32")
        local.type(torch.int32)
        remote.type(torch.int32)
        self.assertEqual(described(remote), described(local))
        # BatchNorm's num_batches_tracked converts too.
        bn = ms.build({"type": "BatchNorm1d", "args": [2]}, "type/bn")
        local_bn = nn.BatchNorm1d(2).type(torch.float64)
        bn.type(torch.float64)
        self.assertEqual(described(bn), described(local_bn))

    def test_a_non_tensor_extra_state_is_torchs_tensor_error(self):
        remote = ms.build({"type": "Sequential", "children": [
            {"spec": {"type": "Net", "custom": True, "extra_state": True}}]},
            "extra/seq")
        for view, key, klass in ((remote, "0._extra_state", "Sequential"),
                                 (remote.get_submodule("0"), "_extra_state",
                                  "Net")):
            for strict in (True, False):
                with self.subTest(key=key, strict=strict):
                    with self.assertRaises(RuntimeError) as e:
                        view.load_state_dict({key: 5}, strict=strict)
                    self.assertEqual(
                        str(e.exception),
                        f"Error(s) in loading state_dict for {klass}:\n\t"
                        f'While copying the parameter named "{key}", '
                        f"expected torch.Tensor or Tensor-like object from "
                        f"checkpoint but received <class 'int'>")


class HookTest(unittest.TestCase):
    """The seeds' registration hook examples, written in Python, running
    as remote interceptors."""

    def test_buffer_hooks_convert_track_and_block(self):
        tracked = []

        # The seed's three examples, line for line (JS null is REJECT,
        # console.log is print, module.constructor.name is
        # type(module).__name__).
        def float32_buffers(module, name, buffer):
            if buffer is not None and buffer.dtype != torch.float32:
                print(f"Converting {name} from {buffer.dtype} to float32")
                return buffer.to(dtype=torch.float32)

        def track(module, name, buffer):
            if buffer is not None:
                tracked.append({"module": type(module).__name__,
                                "name": name, "shape": tuple(buffer.shape),
                                "dtype": buffer.dtype})

        def no_temp(module, name, buffer):
            if name == "temp_buffer":
                print("Blocking temporary buffer")
                return modelstate.REJECT

        hooks = [ms.register_module_buffer_registration_hook(h)
                 for h in (float32_buffers, track, no_temp)]
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                m = ms.build({"type": "Custom", "members": [
                    {"buffer": {"name": "temp_buffer", "shape": [2]}},
                    {"buffer": {"name": "table", "shape": [2, 2],
                                "dtype": "float64"}},
                    {"module": {"name": "bn", "spec": {
                        "type": "BatchNorm1d", "args": [2]}}}]},
                    "hooks/buffers")
        finally:
            for h in hooks:
                h.remove()
        buffers = dict(m.named_buffers())
        self.assertNotIn("temp_buffer", buffers)
        self.assertEqual(buffers["table"].dtype, torch.float32)
        # The tracker runs after the converter: it sees float32.
        self.assertEqual(tracked[0], {"module": "Custom", "name": "temp_buffer",
                                      "shape": (2,), "dtype": torch.float32})
        self.assertEqual(tracked[1]["dtype"], torch.float32)
        self.assertEqual([t["name"] for t in tracked[2:]],
                         ["running_mean", "running_var"])
        # Unlike torch, the server lets only floating-point tensors change
        # dtype: the converter's float32 num_batches_tracked is an invalid
        # answer, which blocks it (fail-closed) before the tracker runs.
        self.assertNotIn("bn.num_batches_tracked", buffers)
        refused = [r for r in m.last_registrations
                   if r.name == "num_batches_tracked"]
        self.assertEqual(len(refused), 1)
        self.assertIn("dtype int64 is not floating point and cannot change "
                      "to float32", refused[0].reason)
        # Each hook answers on its own thread: compare as a set of lines.
        self.assertCountEqual(printed.getvalue().splitlines(), [
            "Blocking temporary buffer",
            "Converting table from torch.float64 to float32",
            "Converting num_batches_tracked from torch.int64 to float32"])
        blocked = [r for r in m.last_registrations
                   if r.name == "temp_buffer"]
        self.assertEqual(len(blocked), 1)
        self.assertIn("rejected by", blocked[0].reason)
        # Removed hooks no longer run.
        m2 = ms.build({"type": "Custom", "members": [
            {"buffer": {"name": "temp_buffer", "shape": [1]}}]},
            "hooks/after")
        self.assertIn("temp_buffer", dict(m2.named_buffers()))

    def test_parameter_hooks_cast_log_freeze_and_initialise(self):
        log = []

        # The seed's four examples, line for line (console.log is
        # log.append here, instanceof is isinstance).
        def float32_params(module, name, param):
            if param is not None and param.dtype != torch.float32:
                log.append(f"Converting parameter '{name}' to float32")
                return param.to(dtype=torch.float32)

        def log_params(module, name, param):
            if param is not None:
                log.append(f"Parameter '{name}' in {type(module).__name__}: "
                           f"shape={param.shape}")

        def freeze_private(module, name, param):
            if param is not None and name.startswith("_"):
                param.requires_grad = False

        def custom_init(module, name, param):
            if param is not None and name == "weight" and \
                    isinstance(module, torch.nn.Linear):
                param.data.uniform_(-0.05, 0.05)

        hooks = [ms.register_module_parameter_registration_hook(h)
                 for h in (float32_params, log_params, freeze_private,
                           custom_init)]
        try:
            m = ms.build({"type": "Custom", "members": [
                {"parameter": {"name": "_scale", "shape": [3],
                               "dtype": "float64",
                               "init": {"kind": "ones"}}},
                {"module": {"name": "lin", "spec": {
                    "type": "Linear", "args": [64, 64]}}},
                {"module": {"name": "conv", "spec": {
                    "type": "Conv1d", "args": [64, 64, 1]}}}]},
                "hooks/params", seed=4)
        finally:
            for h in hooks:
                h.remove()
        params = dict(m.named_parameters())
        self.assertEqual(params["_scale"].dtype, torch.float32)
        self.assertFalse(params["_scale"].requires_grad)
        self.assertTrue(params["lin.weight"].requires_grad)
        self.assertLessEqual(float(params["lin.weight"].abs().max()), 0.05)
        # Linear's own init would exceed 0.05 somewhere in 4096 draws.
        torch.manual_seed(4)
        self.assertGreater(float(nn.Linear(64, 64).weight.abs().max()), 0.05)
        # Not a Linear: its weight keeps Conv1d's own init.
        self.assertGreater(float(params["conv.weight"].abs().max()), 0.05)
        self.assertEqual(log, [
            "Converting parameter '_scale' to float32",
            "Parameter '_scale' in Custom: shape=torch.Size([3])",
            "Parameter 'weight' in Linear: shape=torch.Size([64, 64])",
            "Parameter 'bias' in Linear: shape=torch.Size([64])",
            "Parameter 'weight' in Conv1d: shape=torch.Size([64, 64, 1])",
            "Parameter 'bias' in Conv1d: shape=torch.Size([64])"])

    def test_module_hooks_and_failing_hooks_block(self):
        def no_dropout(module, name, submodule):
            if type(submodule).__name__ == "Dropout":
                return modelstate.REJECT

        def broken(module, name, param):
            raise ValueError("no parameters today")

        with ms.register_module_module_registration_hook(no_dropout):
            m = ms.build({"type": "Sequential", "children": [
                {"spec": {"type": "Linear", "args": [2, 2]}},
                {"spec": {"type": "Dropout"}},
                {"spec": {"type": "ReLU"}}]}, "hooks/modules")
        self.assertEqual([c.name for c in m.info().info.children],
                         ["0", "2"])
        with ms.register_module_parameter_registration_hook(broken):
            with self.assertRaises(modelstate.FailedPreconditionError) as e:
                m.register_parameter("p", nn.Parameter(torch.zeros(1)))
        self.assertIn("raised ValueError: no parameters today",
                      str(e.exception))

    def test_a_lambda_or_a_partial_can_be_a_hook(self):
        import functools

        def reject_named(target, module, name, value):
            return modelstate.REJECT if name == target else None

        with ms.register_module_buffer_registration_hook(
                lambda module, name, buffer: modelstate.REJECT
                if name == "tmp" else None) as handle, \
                ms.register_module_buffer_registration_hook(
                    functools.partial(reject_named, "tmp2")) as partial:
            self.assertIn("-lambda-", handle.name)
            self.assertIn("-partial-", partial.name)
            m = ms.build({"type": "Custom", "members": [
                {"buffer": {"name": "tmp", "shape": [1]}},
                {"buffer": {"name": "tmp2", "shape": [1]}},
                {"buffer": {"name": "kept", "shape": [1]}}]}, "hooks/lambda")
        self.assertEqual([n for n, _ in m.named_buffers()], ["kept"])

    def test_a_replacement_keeps_requires_grad_unless_a_parameter(self):
        """A plain tensor returned for a parameter keeps the parameter's
        requires_grad (README); a Parameter brings its own."""
        def replace(module, name, param):
            if param is None:
                return None
            if name == "weight":
                return torch.full(param.shape, 0.25)      # plain: keeps
            return nn.Parameter(torch.full(param.shape, 0.5),
                                requires_grad=False)      # frozen

        with ms.register_module_parameter_registration_hook(replace):
            m = ms.build({"type": "Linear", "args": [3, 2]}, "hooks/grad")
        params = dict(m.named_parameters())
        self.assertTrue(params["weight"].requires_grad)
        self.assertTrue(torch.equal(params["weight"], torch.full((2, 3),
                                                                 0.25)))
        self.assertFalse(params["bias"].requires_grad)
        self.assertTrue(torch.equal(params["bias"], torch.full((2,), 0.5)))

    def test_out_proj_is_a_linear_in_hooks(self):
        """MultiheadAttention's out_proj is torch's
        NonDynamicallyQuantizableLinear, a Linear subclass."""
        seen = {}

        def record(module, name, param):
            seen[(module.path, name)] = (type(module).__name__,
                                         isinstance(module, nn.Linear))

        with ms.register_module_parameter_registration_hook(record):
            ms.build({"type": "MultiheadAttention", "args": [8, 2]},
                     "hooks/mha")
        self.assertEqual(seen[("out_proj", "weight")],
                         ("NonDynamicallyQuantizableLinear", True))
        self.assertEqual(seen[("", "in_proj_weight")],
                         ("MultiheadAttention", False))

    def test_an_answer_the_wire_cannot_carry_blocks_and_the_hook_lives(self):
        """A returned tensor of a dtype modelstate lacks, or one without
        values, is an invalid answer: it blocks that registration saying
        why, and the hook goes on answering."""
        def unsendable(module, name, buffer):
            if name == "running_mean":
                return torch.zeros(3, dtype=torch.complex64)
            if name == "running_var":
                return torch.zeros(3, device="meta")
            return None

        with ms.register_module_buffer_registration_hook(
                unsendable, timeout=5) as handle:
            for attempt in range(2):
                m = ms.build({"type": "BatchNorm1d", "args": [3]},
                             f"hooks/unsendable{attempt}")
                reasons = {r.name: r.reason for r in m.last_registrations}
                self.assertIn("hook returned an invalid tensor: TypeError: "
                              "modelstate has no torch.complex64 tensors",
                              reasons["running_mean"])
                self.assertIn("hook returned an invalid tensor: ",
                              reasons["running_var"])
                self.assertIn("meta", reasons["running_var"])
                self.assertEqual(list(dict(m.named_buffers())),
                                 ["num_batches_tracked"])
                self.assertTrue(handle._thread.is_alive())

    def test_a_blocked_registration_says_its_reason_once(self):
        def refuse(module, name, param):
            raise ValueError("not today")

        with ms.register_module_parameter_registration_hook(refuse) as h:
            m = ms.build({"type": "Custom", "custom": True}, "hooks/once")
            with self.assertRaises(modelstate.FailedPreconditionError) as e:
                m.register_parameter("p", nn.Parameter(torch.zeros(1)))
        text = str(e.exception)
        self.assertEqual(text.count(h.name), 1, text)
        self.assertEqual(text.count("not today"), 1, text)
        self.assertTrue(text.endswith(
            f"rejected by {h.name}: hook raised ValueError: not today"), text)

    def test_remove_returns_after_the_server_dropped_the_hook(self):
        """Like torch's RemovableHandle.remove(): once it returns, no
        registration reaches the hook. The server records the unsubscribe
        before it ends the stream, so the record is there at once, and a
        build right after is not held by the removed (fail-closed) hook."""
        def block_all(module, name, param):
            return modelstate.REJECT

        for attempt in range(20):
            handle = ms.register_module_parameter_registration_hook(block_all)
            handle.remove()
            self.assertIn(handle.name, unsubscribed_names())
            m = ms.build({"type": "Linear", "args": [2, 2]},
                         f"hooks/removed{attempt}")
            self.assertEqual(sorted(dict(m.named_parameters())),
                             ["bias", "weight"])


def unsubscribed_names():
    """The subscriber names of every unsubscribe record in the audit log."""
    names = []
    after = 0
    while True:
        page = ms._stub.QueryAudit(
            service_pb.QueryAuditRequest(
                filter=service_pb.AuditFilter(type="unsubscribe"),
                after_seq=after, limit=1000),
            metadata=ms._metadata)
        names += [json.loads(r.details_json)["subscriber"]
                  for r in page.records]
        if page.next_after_seq == 0:
            return names
        after = page.next_after_seq


class ReconnectTest(unittest.TestCase):

    def test_a_hook_subscribes_again_after_a_server_restart(self):
        own = Server()
        client = modelstate.connect(own.address)
        try:
            def no_temp(module, name, buffer):
                if name == "temp_buffer":
                    return modelstate.REJECT

            spec = {"type": "Custom", "members": [
                {"buffer": {"name": "temp_buffer", "shape": [1]}}]}
            handle = client.register_module_buffer_registration_hook(no_temp)
            self.assertTrue(handle.wait_connected(10))
            first = client.build(spec, "re/before")
            self.assertNotIn("temp_buffer", dict(first.named_buffers()))
            own.kill()
            own.start()
            # Nothing is registered until the hook is back: the server
            # has no interceptor before that.
            deadline = time.time() + 30
            while handle.subscriptions < 2 and time.time() < deadline:
                time.sleep(0.05)
            self.assertEqual(handle.subscriptions, 2,
                             "the hook did not subscribe again")
            self.assertTrue(handle.wait_connected(10))
            after = client.build(spec, "re/after")
            self.assertNotIn("temp_buffer", dict(after.named_buffers()))
            handle.remove()
        finally:
            client.close()
            own.stop()


README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "README.md")


class ReadmeTest(unittest.TestCase):

    def test_the_readme_python_blocks_run(self):
        """The Python blocks of README's "Python client" section, run in
        order as they are against the test server (only the address
        changes), so the README cannot drift from the client."""
        with open(README) as f:
            text = f.read()
        section = text[text.index("### Python client"):]
        section = section[:section.index("\n## ")]
        blocks = section.split("```python\n")[1:]
        self.assertGreaterEqual(len(blocks), 2)
        scope = {}
        out = io.StringIO()
        for block in blocks:
            code = block[:block.index("```")]
            self.assertIn('modelstate.connect("127.0.0.1:50051")', code)
            code = code.replace("127.0.0.1:50051", server.address)
            with contextlib.redirect_stdout(out):
                exec(compile(code, "README.md", "exec"), scope)
        self.assertEqual(out.getvalue(), "<All keys matched successfully>\n")
        # The three-line story: a torch module there and back.
        self.assertIs(type(scope["linear"]), nn.Linear)
        self.assertEqual(ms.module("team/linear").type_name, "Linear")
        remote = ms.module("team/mlp")
        # What the quick start did is on the server: float16, eval mode,
        # the first layer frozen, the last one without bias.
        sd = remote.state_dict()
        self.assertEqual({t.dtype for t in sd.values()}, {torch.float16})
        self.assertNotIn("2.bias", sd)
        self.assertFalse(remote.training)
        self.assertEqual({n: p.requires_grad for n, p in
                          remote.named_parameters()},
                         {"0.weight": False, "0.bias": False,
                          "2.weight": True})
        self.assertEqual(tuple(scope["y"].shape), (3, 10))


if __name__ == "__main__":
    unittest.main(verbosity=2)
