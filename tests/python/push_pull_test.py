"""push() and pull() against the real server and real PyTorch: torch
modules hosted and fetched back as torch modules, bit for bit, with their
ties, shared submodules, flags and registration order; plus the rest of the
RemoteModule API that mirrors nn.Module (forward, the tree, submodule views,
requires_grad_, removing entries, progress).

Run by ctest: /usr/bin/python3 push_pull_test.py SERVER_BINARY PACKAGE_DIR
"""

import collections
import contextlib
import copy
import io
import os
import pickle
import sys
import unittest
import warnings

SERVER = sys.argv[1]
sys.path.insert(0, sys.argv[2])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
del sys.argv[1:3]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import modelstate  # noqa: E402
from modelstate import _transfer  # noqa: E402
import server_process  # noqa: E402
import torch_models  # noqa: E402

KINDS = {1: "parameter", 2: "buffer", 3: "module"}


def setUpModule():
    global server, ms
    server = server_process.Server(SERVER)
    ms = modelstate.connect(server.address, progress=False)


def tearDownModule():
    ms.close()
    server.stop()


@contextlib.contextmanager
def torch_registrations(events):
    """What torch 2's global registration hooks would see, in torch 1.13:
    (module, kind, name) for every register_parameter, register_buffer and
    submodule assignment while the block runs. Written apart from the
    client's own record_construction(), so the two check each other."""
    M = nn.Module
    saved = {k: getattr(M, k) for k in ("register_parameter",
                                        "register_buffer", "add_module",
                                        "__setattr__")}

    def register_parameter(self, name, param):
        events.append((self, "parameter", name))
        return saved["register_parameter"](self, name, param)

    def register_buffer(self, name, tensor, persistent=True):
        events.append((self, "buffer", name))
        return saved["register_buffer"](self, name, tensor, persistent)

    def add_module(self, name, module):
        events.append((self, "module", name))
        return saved["add_module"](self, name, module)

    def setattr_(self, name, value):
        if isinstance(value, nn.Module):
            events.append((self, "module", name))
        return saved["__setattr__"](self, name, value)

    M.register_parameter, M.register_buffer = register_parameter, \
        register_buffer
    M.add_module, M.__setattr__ = add_module, setattr_
    try:
        yield
    finally:
        for key, fn in saved.items():
            setattr(M, key, fn)


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().reshape(-1).view(torch.uint8),
        b.detach().reshape(-1).view(torch.uint8))


class Checks(unittest.TestCase):

    def assertSameLoadError(self, local, remote, path, sd, strict):
        """Loading `sd` into the submodule at `path` raises torch's
        RuntimeError, word for word, on the remote module as on a copy of
        the local one."""
        with self.assertRaises(RuntimeError) as theirs:
            copy.deepcopy(local.get_submodule(path)).load_state_dict(
                sd, strict=strict)
        with self.assertRaises(RuntimeError) as ours:
            remote.get_submodule(path).load_state_dict(sd, strict=strict)
        self.assertEqual(str(ours.exception), str(theirs.exception))

    def assertSameModule(self, got, want):
        """State, ties, shared modules, classes, flags: `got` is `want`."""
        a, b = got.state_dict(), want.state_dict()
        self.assertEqual(list(a), list(b))
        for key in b:
            self.assertTrue(same_bits(a[key], b[key]), key)
        self.assertEqual(a._metadata, b._metadata)
        self.assertEqual([n for n, _ in got.named_parameters()],
                         [n for n, _ in want.named_parameters()])
        for (n, x), (_, y) in zip(got.named_buffers(), want.named_buffers()):
            self.assertTrue(same_bits(x, y), n)
        mine = dict(got.named_modules())
        self.assertEqual(list(mine), [n for n, _ in want.named_modules()])
        for name, theirs in want.named_modules():
            ours = mine[name]
            if type(theirs).__module__.startswith("torch.nn"):
                self.assertIs(type(ours), type(theirs), name)
            else:
                self.assertEqual(type(ours).__name__, type(theirs).__name__)
            self.assertEqual(ours.training, theirs.training, name)
        for (n, p), (_, q) in zip(got.named_parameters(),
                                  want.named_parameters()):
            self.assertIsInstance(p, nn.Parameter, n)
            self.assertEqual(p.requires_grad, q.requires_grad, n)


class RoundTripTest(Checks):

    def test_models_round_trip_bit_for_bit_in_torchs_order(self):
        for name, cls in torch_models.MODELS.items():
            with self.subTest(name):
                events = []
                torch.manual_seed(0)
                with torch_registrations(events), \
                        modelstate.record_construction():
                    model = cls()
                paths = {id(m): p for p, m in model.named_modules()}
                torch_model = torch_models.randomize(model, 1).eval()
                remote = ms.push(torch_model, f"rt/{name}")
                self.assertEqual(remote.notes, [])
                # Hooks saw what torch's global hooks would have seen.
                self.assertEqual(
                    [(r.path, KINDS[r.kind], r.name)
                     for r in remote.last_registrations],
                    [(paths[id(o)], kind, n) for o, kind, n in events])
                back = ms.pull(f"rt/{name}")
                self.assertSameModule(back, torch_model)
                hosted = remote.state_dict()
                for key, value in torch_model.state_dict().items():
                    self.assertTrue(same_bits(hosted[key], value), key)

    def test_pulled_library_layers_compute_what_the_originals_do(self):
        torch.manual_seed(1)
        gpt, bert = torch_models.GPT().eval(), torch_models.Bert().eval()
        ms.push(gpt, "fw/gpt")
        ms.push(bert, "fw/bert")
        gpt2, bert2 = ms.pull("fw/gpt"), ms.pull("fw/bert")
        x = torch.randn(2, 5, 64)
        self.assertTrue(torch.equal(gpt2.h[1].mlp.c_fc(x),
                                    gpt.h[1].mlp.c_fc(x)))
        self.assertTrue(torch.equal(bert2.layers[0](x), bert.layers[0](x)))
        ids = torch.randint(0, 512, (2, 7))
        self.assertTrue(torch.equal(gpt2.wte(ids), gpt.wte(ids)))
        self.assertIs(gpt2.lm_head.weight, gpt2.wte.weight)
        self.assertTrue(torch.equal(gpt2.h[0].attn.bias,
                                    gpt.h[0].attn.bias))
        self.assertNotIn("h.0.attn.bias", gpt2.state_dict())

    def test_recurrent_and_transformer_models_round_trip(self):
        """Library RNNs and nn.Transformer go up as library layers, come
        back bit for bit and compute what the originals do. (nn.Transformer
        is not in MODELS: torch registers the one layer its stacks copy,
        modelstate each copy at its place.)"""
        torch.manual_seed(3)
        x, y = torch.randn(3, 7, 16), torch.randn(3, 5, 16)
        for name, model in (("seq2seq", torch_models.Seq2Seq()),
                            ("translator", torch_models.Translator())):
            with self.subTest(name):
                model = torch_models.randomize(model, 4).eval()
                remote = ms.push(model, f"rnn/{name}")
                self.assertEqual(remote.notes, [])
                back = ms.pull(f"rnn/{name}")
                self.assertSameModule(back, model)
                # The pulled classes are torch's own: they compute alike.
                with torch.no_grad():
                    if name == "seq2seq":
                        out, (h, c) = back.encoder(x)
                        want, (h0, c0) = model.encoder(x)
                        for ours, theirs in ((out, want), (h, h0), (c, c0)):
                            self.assertTrue(torch.equal(ours, theirs))
                        self.assertTrue(torch.equal(
                            back.decoder(y, (h, c))[0],
                            model.decoder(y, (h0, c0))[0]))
                    else:
                        src, tgt = torch.randn(3, 7, 32), torch.randn(3, 5, 32)
                        self.assertTrue(torch.equal(
                            back.transformer(src, tgt),
                            model.transformer(src, tgt)))
                if name == "seq2seq":
                    # The server runs the LSTM too: [x] -> [out, h_n, c_n].
                    out = remote.get_submodule("encoder")(x)
                    want, (h, c) = model.encoder(x)
                    for ours, theirs in zip(out, (want, h, c)):
                        self.assertLess((ours - theirs).abs().max().item(),
                                        1e-5)

    def test_a_unet_with_upsampling_round_trips(self):
        """Upsample and its 2-d aliases go up as library layers (scale
        factors as floats, sizes as given), come back as torch's classes
        and compute alike, on the server too."""

        class UNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.down1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                                           nn.BatchNorm2d(8), nn.ReLU())
                self.pool = nn.MaxPool2d(2)
                self.down2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1),
                                           nn.ReLU())
                self.up = nn.Upsample(scale_factor=2, mode="bilinear",
                                      align_corners=False)
                self.fuse = nn.Conv2d(24, 8, 1)
                self.up_sized = nn.Upsample(size=(12, 10), mode="bicubic",
                                            align_corners=True)
                self.up_nearest = nn.UpsamplingNearest2d(scale_factor=1.5)
                self.up_bilinear = nn.UpsamplingBilinear2d((8, 8))
                self.head = nn.Conv2d(8, 2, 1)

            def forward(self, x):
                a = self.down1(x)
                b = self.down2(self.pool(a))
                y = self.fuse(torch.cat([a, self.up(b)], 1))
                return self.head(self.up_bilinear(
                    self.up_nearest(self.up_sized(y))))

        torch.manual_seed(5)
        model = torch_models.randomize(UNet(), 6).eval()
        with torch.no_grad():  # a variance, not randn's: no NaN in eval
            model.down1[1].running_var.abs_()
        remote = ms.push(model, "unet/model")
        self.assertEqual(remote.notes, [])
        info = remote.info().info
        types = {c.name: c.module.type for c in info.children}
        self.assertEqual(types["up"], "Upsample")
        self.assertEqual(types["up_nearest"], "UpsamplingNearest2d")
        back = ms.pull("unet/model")
        self.assertSameModule(back, model)
        for name in ("up", "up_sized", "up_nearest", "up_bilinear"):
            ours, theirs = getattr(back, name), getattr(model, name)
            self.assertIs(type(ours), type(theirs))
            self.assertEqual(repr(ours), repr(theirs))
            for key in ("size", "scale_factor", "mode", "align_corners",
                        "recompute_scale_factor", "name"):
                self.assertEqual(getattr(ours, key), getattr(theirs, key),
                                 f"{name}.{key}")
        x = torch.randn(2, 3, 8, 6)
        with torch.no_grad():
            # The pulled root is a plain module: run UNet's forward on it.
            self.assertTrue(torch.equal(UNet.forward(back, x), model(x)))
            y = torch.randn(2, 8, 5, 4)
            for name in ("up_sized", "up_nearest"):
                # The server's forward: within 1e-5 of torch's.
                out = remote.get_submodule(name)(y)
                want = getattr(model, name)(y)
                self.assertEqual(out.shape, want.shape)
                self.assertLess((out - want).abs().max().item(), 1e-5)

    def test_the_last_small_layers_round_trip(self):
        """Issue 18's last layers (activations with arguments, channel
        shuffle, local response norm, feature alpha dropout, distances) go
        up as library layers with their arguments as torch keeps them, come
        back as torch's classes and compute alike, on the server too.
        The wire cannot tell 2 from 2.0, so integral arguments here are
        ints (see test_numbers_come_back_as_torch_received_them)."""

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 8, 3, padding=1)
                self.act = nn.Hardtanh(-2, 2.5)
                self.lrn = nn.LocalResponseNorm(3, alpha=1e-3, k=2)
                self.shuffle = nn.ChannelShuffle(4)
                self.glu = nn.GLU(dim=1)
                self.drop = nn.FeatureAlphaDropout(0.2)
                self.body = nn.Sequential(
                    nn.ReLU6(), nn.SELU(), nn.CELU(0.5), nn.LogSigmoid(),
                    nn.Softsign(), nn.Softshrink(0.1), nn.Hardshrink(0.05),
                    nn.Tanhshrink(), nn.Threshold(-0.5, 3))
                self.softmin = nn.Softmin(dim=1)
                self.softmax2d = nn.Softmax2d()
                self.cos = nn.CosineSimilarity(dim=1, eps=1e-6)
                self.dist = nn.PairwiseDistance(p=1, keepdim=True)
                self.lp = nn.LPPool2d(2, (2, 3), stride=1)
                self.unfold = nn.Unfold((2, 3), padding=1, stride=(1, 2))
                self.fold = nn.Fold((6, 5), (2, 3), padding=1, stride=(1, 2))

            def forward(self, x):
                y = self.glu(self.shuffle(self.lrn(self.act(self.conv(x)))))
                y = self.softmax2d(self.body(self.drop(y)))
                y = self.fold(self.unfold(y))
                z = self.lp(self.softmin(y)).flatten(1)
                return self.cos(z, z.flip(1)), self.dist(z, z.flip(1))

        torch.manual_seed(7)
        model = torch_models.randomize(Net(), 7).eval()
        remote = ms.push(model, "small/net")
        self.assertEqual(remote.notes, [])
        info = remote.info().info
        types = {c.name: c.module.type for c in info.children}
        for name in ("act", "lrn", "shuffle", "glu", "drop", "softmin",
                     "softmax2d", "cos", "dist", "lp", "fold", "unfold"):
            self.assertEqual(types[name], type(getattr(model, name)).__name__)
        back = ms.pull("small/net")
        self.assertSameModule(back, model)
        for name, theirs in model.named_modules():
            if name and type(theirs) is not nn.Sequential:
                self.assertEqual(repr(back.get_submodule(name)), repr(theirs),
                                 name)
        x = torch.randn(2, 3, 6, 5)
        with torch.no_grad():
            for ours, theirs in zip(Net.forward(back, x), model(x)):
                self.assertTrue(torch.equal(ours, theirs))
            # The server's forward: within 1e-5 of torch's.
            y = torch.randn(2, 8, 6, 5)
            for name in ("act", "lrn", "shuffle", "glu", "body",
                         "softmax2d", "lp", "unfold"):
                out = remote.get_submodule(name)(y)
                want = getattr(model, name)(y)
                self.assertEqual(out.shape, want.shape)
                self.assertLess((out - want).abs().max().item(), 1e-5, name)
            a, b = torch.randn(4, 9), torch.randn(4, 9)
            for name in ("cos", "dist"):
                out = remote.get_submodule(name)(a, b)
                want = getattr(model, name)(a, b)
                self.assertEqual(out.shape, want.shape)
                self.assertLess((out - want).abs().max().item(), 1e-5, name)

    def test_numbers_come_back_as_torch_received_them(self):
        """Arguments torch keeps as given (Softplus's beta, Hardtanh's
        bounds, CELU's alpha, LPPool's norm_type, ...) come back as torch's
        constructor received them: ints as ints, floats as floats, torch's
        defaults as torch's defaults. The wire has one kind of number (a
        double), so pull reads an integral one as an int unless it is the
        default; push notes an argument that will not come back so."""
        layers = [
            nn.Softplus(), nn.Softplus(2, 10), nn.Softplus(0.5, 3),
            nn.Hardtanh(), nn.Hardtanh(-2, 2), nn.Hardtanh(-0.5, 3),
            nn.CELU(), nn.CELU(2), nn.CELU(0.5),
            nn.LPPool2d(2, 3), nn.LPPool1d(1.5, 2), nn.LPPool1d(3, 2),
            nn.Softshrink(), nn.Softshrink(1), nn.Hardshrink(2),
            nn.Threshold(0, 1), nn.Threshold(-1, 2.5),
            nn.LocalResponseNorm(3), nn.LocalResponseNorm(3, 1, 1, 2),
            nn.PairwiseDistance(), nn.PairwiseDistance(1),
            nn.PairwiseDistance(3, 0), nn.CosineSimilarity(1, 0),
            nn.CosineSimilarity(eps=1e-6), nn.ReLU6(), nn.ELU(),
            nn.LeakyReLU(0.2), nn.Dropout(0.0), nn.Upsample(scale_factor=2),
            nn.LSTM(3, 4, 2, dropout=1), nn.BatchNorm1d(3, momentum=None)]
        model = nn.Sequential(*layers)
        remote = ms.push(model, "numbers/all")
        self.assertEqual(remote.notes, [])
        back = ms.pull("numbers/all")
        for i, theirs in enumerate(layers):
            ours = back[i]
            with self.subTest(repr(theirs)):
                self.assertIs(type(ours), type(theirs))
                self.assertEqual(repr(ours), repr(theirs))
                for key, value in vars(theirs).items():
                    if key.startswith("_") or callable(value) or \
                            isinstance(value, (dict, set)):
                        continue
                    self.assertIs(type(getattr(ours, key)), type(value), key)
                    self.assertEqual(getattr(ours, key), value, key)
        self.assertEqual(repr(back), repr(model))
        x = torch.randn(2, 3, 6, 6).abs() + 0.1
        with torch.no_grad():
            for i in (1, 4, 7, 9, 14, 15):
                self.assertTrue(torch.equal(back[i](x), layers[i](x)), i)
                out = remote.get_submodule(str(i))(x)
                self.assertLess((out - layers[i](x)).abs().max().item(),
                                1e-5, i)
        # What the wire cannot say: a note, and the layer is still hosted.
        for layer, note in ((nn.Hardtanh(-2.0, 2.0), "min_val=-2 for "
                             "min_val=-2.0"),
                            (nn.CELU(1), "alpha=1.0 for alpha=1")):
            with self.subTest(note):
                with self.assertWarns(modelstate.PushNote):
                    remote = ms.push(layer, "numbers/note")
                self.assertIn(note, remote.notes[0])
                self.assertEqual(remote.type_name, type(layer).__name__)
                remote.delete()

    def test_dtype_and_meta_in_both_directions(self):
        torch.manual_seed(2)
        gpt = torch_models.randomize(torch_models.GPT(), 3)
        ms.push(gpt, "dt/gpt")
        half = ms.pull("dt/gpt", dtype=torch.float16)
        self.assertSameModule(half, copy.deepcopy(gpt).half())
        meta = ms.pull("dt/gpt", device="meta")
        self.assertTrue(all(t.is_meta for t in meta.state_dict().values()))
        self.assertIs(meta.lm_head.weight, meta.wte.weight)
        self.assertEqual({k: (v.shape, v.dtype) for k, v in
                          meta.state_dict().items()},
                         {k: (v.shape, v.dtype) for k, v in
                          gpt.state_dict().items()})
        remote = ms.push(gpt, "dt/double", dtype=torch.float64)
        self.assertEqual(remote.state_dict()["wte.weight"].dtype,
                         torch.float64)
        self.assertSameModule(ms.pull("dt/double"),
                              copy.deepcopy(gpt).double())
        structure = ms.push(gpt, "dt/structure", device="meta")
        self.assertTrue(all(t.is_meta for t in
                            structure.state_dict().values()))
        on_meta = torch_models.Bert().to("meta")
        self.assertTrue(all(t.is_meta for t in ms.push(
            on_meta, "dt/meta-model").state_dict().values()))

    def test_push_takes_a_torch_device(self):
        lin = nn.Linear(2, 3)
        on_cpu = ms.push(lin, "dev/cpu", device=torch.device("cpu"))
        self.assertTrue(torch.equal(on_cpu.state_dict()["weight"],
                                    lin.weight))
        for name, model in (("dev/meta", lin),
                            ("dev/meta-model", nn.Linear(2, 3,
                                                         device="meta"))):
            remote = ms.push(model, name, device=torch.device("meta"))
            self.assertTrue(all(t.is_meta for t in
                                remote.state_dict().values()))
        with self.assertRaisesRegex(ValueError, "'cpu' or 'meta'"):
            ms.push(lin, "dev/cuda", device=torch.device("cuda"))

    def test_empty_tensors_of_any_dtype_come_back(self):
        """Tensors with no elements, of dtypes wider than a byte, on every
        way back: state_dict, the tables, pull, pull(into=), a hook's
        argument and a forward's output, over gRPC and shared memory."""
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(0, 3)  # weight float32 [3, 0]
                self.head = nn.Linear(4, 2)
                self.register_buffer("ids", torch.empty(0, dtype=torch.int64))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # initialising empty tensors
            model, into = torch_models.randomize(Net(), 4), Net()
        seen = []

        def shapes(module, name, param):
            seen.append((name, tuple(param.shape), param.dtype))

        for shared in (True, False):
            with self.subTest(shared_memory=shared), modelstate.connect(
                    server.address, progress=False,
                    shared_memory=shared) as client:
                seen.clear()
                with client.register_module_parameter_registration_hook(
                        shapes):
                    remote = client.push(model, f"empty/net-{shared}")
                self.assertIn(("weight", (3, 0), torch.float32), seen)
                hosted = remote.state_dict()
                for key, value in model.state_dict().items():
                    self.assertTrue(same_bits(hosted[key], value), key)
                self.assertTrue(same_bits(dict(remote.named_buffers())["ids"],
                                          model.ids))
                self.assertTrue(same_bits(
                    dict(remote.named_parameters())["lin.weight"],
                    model.lin.weight))
                self.assertSameModule(client.pull(remote.name), model)
                client.pull(remote.name, into=into)
                self.assertSameModule(into, model)
                x = torch.randn(0, 4)
                out = remote.get_submodule("head")(x)
                self.assertEqual((out.shape, out.dtype), ((0, 2),
                                                          torch.float32))

    def test_frozen_parameters_and_training_flags(self):
        torch.manual_seed(3)
        model = torch_models.Bert()
        model.embeddings.requires_grad_(False)  # library layers, frozen
        model.layers[1].eval()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            remote = ms.push(model, "flags/bert")
        self.assertTrue(any("training and in eval mode" in str(w.message)
                            for w in caught))
        back = ms.pull("flags/bert")
        for (n, p), (_, q) in zip(back.named_parameters(),
                                  model.named_parameters()):
            self.assertEqual(p.requires_grad, q.requires_grad, n)
        self.assertTrue(torch.equal(
            back.embeddings.word_embeddings.weight,
            model.embeddings.word_embeddings.weight))
        remote.eval()
        self.assertFalse(any(m.training for m in
                             ms.pull("flags/bert").modules()))

    def test_shared_submodules_stay_shared(self):
        class Wrapper(nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner  # a module of another branch

        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(3, 3)
                self.b = self.a               # a sibling: a spec ref
                self.seq = nn.Sequential(self.a, nn.ReLU())
                self.w = Wrapper(self.a)      # out of a ref's reach

        model = torch_models.randomize(Shared(), 4)
        ms.push(model, "shared/model")
        back = ms.pull("shared/model")
        self.assertSameModule(back, model)
        self.assertIs(back.b, back.a)
        self.assertIs(back.seq[0], back.a)
        self.assertIs(back.w.inner, back.a)
        twice = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
        twice.append(twice[0])
        ms.push(twice, "shared/seq")
        again = ms.pull("shared/seq")
        self.assertIs(type(again), nn.Sequential)
        self.assertIs(again[2], again[0])

    def test_tied_tensors_keep_their_place_and_their_tie(self):
        class Tied(nn.Module):
            def __init__(self):
                super().__init__()
                self.w = nn.Parameter(torch.randn(4, 4))
                self.v = self.w                      # tied, in the middle
                self.u = nn.Parameter(torch.randn(2))
                self.proj = nn.Linear(4, 4)
                self.proj.weight = self.w            # into a library layer
                self.register_buffer("scale", torch.ones(4))
                self.register_buffer("scale2", self.scale)

        model = Tied()
        ms.push(model, "tied/model")
        back = ms.pull("tied/model")
        self.assertSameModule(back, model)
        self.assertEqual(list(back._parameters), ["w", "v", "u"])
        self.assertIs(back.v, back.w)
        self.assertIs(back.proj.weight, back.w)
        self.assertIs(back.scale2, back.scale)
        tied_seq = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5))
        tied_seq[1].weight = tied_seq[0].weight
        with self.assertRaisesRegex(ValueError, "custom module"):
            ms.push(tied_seq, "tied/seq")

    def test_layers_the_server_cannot_build_become_custom_modules(self):
        class MyLinear(nn.Linear):
            pass

        class Linear(nn.Module):  # a user class named like a library one
            def __init__(self):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(2))

        model = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding="same"), MyLinear(4, 4),
            nn.TransformerEncoderLayer(8, 2, 16, activation=nn.GELU()),
            Linear(), nn.SyncBatchNorm(2))
        seen = {}

        def record(module, name, param):
            seen[module.path] = (type(module).__name__,
                                 isinstance(module, nn.SyncBatchNorm),
                                 isinstance(module, nn.Conv2d))

        with warnings.catch_warnings(record=True) as caught, \
                ms.register_module_parameter_registration_hook(record):
            warnings.simplefilter("always")
            remote = ms.push(model, "fallback/model")
        # Hooks still see torch's classes in what was hosted as custom.
        self.assertEqual(seen["4"], ("SyncBatchNorm", True, False))
        self.assertEqual(seen["0"], ("Conv2d", False, True))
        self.assertEqual(len(remote.notes), 3, remote.notes)
        self.assertIn("padding='same'", remote.notes[0])
        self.assertIn("activation", remote.notes[1])
        self.assertIn("SyncBatchNorm", remote.notes[2])
        self.assertIn("no such library layer", remote.notes[2])
        self.assertEqual(len([w for w in caught if "hosted as a custom"
                              in str(w.message)]), 3)
        info = remote.info().info
        self.assertEqual([c.module.type for c in info.children],
                         ["torch.nn.modules.conv.Conv2d", "MyLinear",
                          "torch.nn.modules.transformer."
                          "TransformerEncoderLayer",
                          "__main__.Linear",
                          "torch.nn.modules.batchnorm.SyncBatchNorm"])
        # The encoder layer's own children are still library layers.
        self.assertEqual(info.children[2].module.children[0].module.type,
                         "MultiheadAttention")
        back = ms.pull("fallback/model")
        a, b = back.state_dict(), model.state_dict()
        self.assertEqual(list(a), list(b))
        self.assertTrue(all(same_bits(a[k], b[k]) for k in b))
        self.assertEqual(type(back[0]).__name__, "Conv2d")
        # A standalone TransformerEncoder: its layers are still library
        # layers, and the note says why the stack is not.
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, 16), 2, enable_nested_tensor=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            remote = ms.push(encoder, "fallback/encoder")
        self.assertEqual(len(remote.notes), 1, remote.notes)
        self.assertIn("holding its layers", remote.notes[0])
        self.assertNotIn("no such library layer", remote.notes[0])
        info = remote.info().info
        self.assertEqual(info.children[0].module.children[0].module.type,
                         "TransformerEncoderLayer")
        self.assertIsNot(type(back[0]), nn.Conv2d)

    def test_a_pulled_custom_module_pickles_and_saves(self):
        class Linear(nn.Module):  # hosted as "__main__.Linear"
            def __init__(self):
                super().__init__()
                self.scale = nn.Parameter(torch.randn(4))

        # The same short name in another module.
        Other = type("Linear", (Linear,), {"__module__": "other"})

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.mine, self.theirs = Linear(), Other()
                self.lin = nn.Linear(4, 4)
                self.register_buffer("steps", torch.tensor(3))

        model = Block()
        ms.push(model, "pickle/block")
        back = ms.pull("pickle/block")
        self.assertIsNot(type(back.mine), type(back.theirs))
        buffer = io.BytesIO()
        torch.save(back, buffer)
        buffer.seek(0)
        for copy_ in (torch.load(buffer), pickle.loads(pickle.dumps(back))):
            self.assertSameModule(copy_, model)
            for name in ("", "mine", "theirs"):
                self.assertIs(type(copy_.get_submodule(name)),
                              type(back.get_submodule(name)), name)

    def test_push_is_all_or_nothing_by_default(self):
        def no_bias(module, name, param):
            return modelstate.REJECT if name == "bias" else None

        model = nn.Sequential(nn.Linear(2, 2))
        with ms.register_module_parameter_registration_hook(no_bias):
            with self.assertRaises(modelstate.FailedPreconditionError):
                ms.push(model, "blocked/all")
            partial = ms.push(model, "blocked/partial", all_or_nothing=False)
        self.assertNotIn("blocked/all", ms.modules("blocked"))
        self.assertEqual(list(partial.state_dict()), ["0.weight"])
        self.assertTrue(torch.equal(partial.state_dict()["0.weight"],
                                    model[0].weight))

    def test_wrong_types_say_what_was_expected(self):
        remote = ms.build({"type": "Linear", "args": [2, 2]}, "types/lin")
        cases = [
            (lambda: ms.build(nn.Linear(2, 2)), "Client.push"),
            (lambda: remote.load_state_dict(nn.Linear(2, 2)),
             "module.state_dict()"),
            (lambda: remote.load_state_dict([1, 2]), "got list"),
            (lambda: ms.push({"type": "Linear"}), "torch.nn.Module"),
            (lambda: remote.register_parameter("p", 3),
             "cannot assign .int. object to parameter .p. "
             r"\(torch.nn.Parameter or None required\)"),
            (lambda: remote.register_module("m", 3), "got int"),
            (lambda: remote(5), "forward input 0"),
        ]
        for call, text in cases:
            with self.subTest(text):
                with self.assertRaisesRegex(TypeError, text):
                    call()


class RemoteModuleTest(Checks):

    @classmethod
    def setUpClass(cls):
        torch.manual_seed(5)
        cls.local = torch_models.randomize(torch_models.GPT(), 6).eval()
        ms.push(cls.local, "tree/gpt")
        cls.remote = ms.module("tree/gpt")

    def test_forward_runs_on_the_server(self):
        mlp = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
        remote = ms.push(mlp, "fw/mlp")
        x = torch.randn(3, 6)
        self.assertTrue(torch.allclose(remote(x), mlp(x), atol=1e-6))
        self.assertTrue(torch.allclose(remote.forward(x, training=False),
                                       mlp(x), atol=1e-6))
        lin = remote.get_submodule("0")
        self.assertTrue(torch.allclose(lin(x), mlp[0](x), atol=1e-6))
        with self.assertRaises(modelstate.ModelStateError):
            self.remote(torch.zeros(1, 3, dtype=torch.int64))

    def test_the_tree_like_named_modules(self):
        self.assertEqual([n for n, _ in self.remote.named_modules()],
                         [n for n, _ in self.local.named_modules()])
        self.assertEqual([n for n, _ in self.remote.named_children()],
                         [n for n, _ in self.local.named_children()])
        attn = self.remote.get_submodule("h.0.attn")
        self.assertEqual(attn.type_name, "CausalSelfAttention")
        sd = attn.state_dict()
        self.assertEqual(list(sd), list(self.local.h[0].attn.state_dict()))
        self.assertEqual(sd._metadata,
                         self.local.h[0].attn.state_dict()._metadata)
        self.assertEqual([n for n, _ in attn.named_buffers()], ["bias"])
        with self.assertRaises(AttributeError):
            self.remote.get_submodule("h.9")
        pulled = attn.pull()
        self.assertIs(type(pulled.c_attn), nn.Linear)
        self.assertTrue(torch.equal(pulled.c_attn.weight,
                                    self.local.h[0].attn.c_attn.weight))

    def test_a_submodule_loads_its_own_state_dict(self):
        mlp = ms.push(torch_models.MLP(8), "view/mlp")
        fc = mlp.get_submodule("c_fc")
        new = nn.Linear(8, 32)
        self.assertEqual(str(fc.load_state_dict(new.state_dict())),
                         "<All keys matched successfully>")
        self.assertTrue(torch.equal(mlp.state_dict()["c_fc.weight"],
                                    new.weight))
        partial = {"weight": new.weight.detach()}
        with self.assertRaises(RuntimeError) as theirs:
            nn.Linear(8, 32).load_state_dict(partial)
        with self.assertRaises(RuntimeError) as ours:
            fc.load_state_dict(partial)
        self.assertEqual(str(ours.exception), str(theirs.exception))
        result = fc.load_state_dict(partial, strict=False)
        self.assertEqual(result.missing_keys, ["bias"])

    def test_a_submodules_load_errors_are_worded_for_it(self):
        """A submodule view's load_state_dict errors say what torch says
        for that submodule: its class name and its own keys (the server
        loads at the root and words them for the root), through nested
        views too."""
        model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(
            nn.LayerNorm(3), nn.Linear(3, 4)))
        remote = ms.push(model, "view/errors")
        cases = [
            ("0", {"weight": torch.ones(7), "bias": torch.ones(3)}, True),
            ("1", {"0.weight": torch.ones(3), "0.bias": torch.ones(2),
                   "1.weight": torch.ones(4, 3), "1.bias": torch.ones(4)},
             True),
            ("1.1", {"weight": torch.ones(4, 3), "bias": torch.ones(5),
                     "step": 5}, False),
            ("1", {"0.weight": torch.ones(3), "0.bias": torch.ones(3),
                   "1.weight": torch.ones(4, 2), "1.bias": torch.ones(1)},
             False),
            ("1", {"0.weight": torch.ones(3), "0.bias": torch.ones(3),
                   "1.weight": torch.ones(4, 3), "1.bias": torch.ones(4),
                   "1.step": 1}, True),
        ]
        for path, sd, strict in cases:
            with self.subTest(path=path, keys=list(sd)):
                with self.assertRaises(RuntimeError) as theirs:
                    copy.deepcopy(model.get_submodule(path)).load_state_dict(
                        sd, strict=strict)
                with self.assertRaises(RuntimeError) as ours:
                    remote.get_submodule(path).load_state_dict(sd,
                                                               strict=strict)
                self.assertEqual(str(ours.exception), str(theirs.exception))
        # Atomic: nothing changed.
        for key, value in model.state_dict().items():
            self.assertTrue(same_bits(remote.state_dict()[key], value), key)

    def test_a_submodules_strict_load_applies_torchs_key_rules(self):
        """A view's strict keys follow the rules the root's load follows:
        an old checkpoint without BatchNorm's num_batches_tracked loads,
        keys under a None child are ignored, unexpected keys come module
        by module, and the size mismatches torch finds are in the same
        error as the missing and unexpected keys."""
        class Inner(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(2, 2)
                self.norm = nn.BatchNorm1d(2)
                self.register_module("gone", None)
                self.register_buffer("count", torch.tensor(0))

        class Outer(nn.Module):
            def __init__(self):
                super().__init__()
                self.pre = nn.Linear(1, 1)
                self.inner = Inner()

        torch.manual_seed(0)
        model = Outer()
        remote = ms.push(model, "view/keyrules")
        view = remote.get_submodule("inner")
        own = model.inner.state_dict()
        no_counter = collections.OrderedDict(own)
        del no_counter["norm.num_batches_tracked"]
        old_meta = collections.OrderedDict(own)
        del old_meta["norm.num_batches_tracked"]
        old_meta._metadata = {"": {"version": 1}, "norm": {"version": 1}}
        cases = [
            no_counter,
            old_meta,
            dict(own, **{"gone.weight": torch.ones(1)}),
            dict(own, **{"norm.zz": torch.ones(1), "zz": torch.ones(1),
                         "lin.zz": torch.ones(1)}),
            dict({k: v for k, v in own.items() if k != "lin.bias"},
                 **{"norm.weight": torch.ones(3), "count": torch.ones(1),
                    "lin.weight": torch.ones(1, 2), "zz": torch.ones(1)}),
        ]
        for sd in cases:
            with self.subTest(keys=list(sd)):
                mine = copy.deepcopy(model.inner)
                try:
                    want = mine.load_state_dict(sd)
                except RuntimeError as e:
                    with self.assertRaises(RuntimeError) as ours:
                        view.load_state_dict(sd)
                    self.assertEqual(str(ours.exception), str(e))
                else:
                    self.assertEqual(repr(view.load_state_dict(sd)),
                                     repr(want))

    def test_an_old_checkpoints_instance_norm_stats_are_torchs_error(self):
        """A state_dict without _metadata (pre-0.4.0) with running stats
        for an InstanceNorm that does not track them: torch's error, even
        with strict=False, at the root and in a view; nothing is loaded."""
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(
            nn.InstanceNorm1d(3, affine=True)))
        remote = ms.push(model, "view/instancenorm")
        before = remote.state_dict()
        old = dict(model.state_dict(), **{
            "1.0.running_mean": torch.zeros(3),
            "1.0.running_var": torch.ones(3), "zz": torch.ones(1)})
        for path in ("", "1"):
            rel = len(path) + 1 if path else 0
            sd = {k[rel:]: v for k, v in old.items() if k.startswith(path)}
            for strict in (True, False):
                with self.subTest(path=path, strict=strict):
                    self.assertSameLoadError(model, remote, path, sd, strict)
        for key, value in before.items():
            self.assertTrue(same_bits(remote.state_dict()[key], value), key)
        # With _metadata they are plain unexpected keys.
        sd = collections.OrderedDict(old)
        sd._metadata = model.state_dict()._metadata
        self.assertEqual(remote.load_state_dict(sd, strict=False),
                         copy.deepcopy(model).load_state_dict(sd,
                                                              strict=False))

    def test_values_the_wire_cannot_carry_are_looked_at_as_torch_does(self):
        """An unexpected key's value is never looked at: torch lists the
        key (a Python number or a complex tensor is no TypeError), and
        strict=True raises torch's text naming it."""
        torch.manual_seed(3)
        local = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
        remote = ms.push(local, "carry/mlp")
        good = local.state_dict()
        extras = [{"step": 5}, {"0.freqs": torch.ones(2,
                                                      dtype=torch.complex64)},
                  {"opt": {"lr": 0.1}, "1.x": None},
                  {"extra": "x", "0.bias": torch.ones(5)}]
        for extra in extras:
            sd = collections.OrderedDict(good, **extra)
            for strict in (False, True):
                with self.subTest(keys=list(extra), strict=strict):
                    mine = copy.deepcopy(local)
                    try:
                        want = mine.load_state_dict(sd, strict=strict)
                    except RuntimeError as e:
                        with self.assertRaises(RuntimeError) as ours:
                            remote.load_state_dict(sd, strict=strict)
                        self.assertEqual(str(ours.exception), str(e))
                    else:
                        got = remote.load_state_dict(sd, strict=strict)
                        self.assertEqual(got, want)
                        self.assertEqual(repr(got), repr(want))
        # In a view too.
        view = remote.get_submodule("0")
        sd = dict(local[0].state_dict(), step=torch.tensor(1j))
        self.assertEqual(view.load_state_dict(sd, strict=False),
                         local[0].load_state_dict(sd, strict=False))
        # A value that is no tensor under an own key is torch's
        # RuntimeError, with the load's other errors (strict or not), in a
        # view too; nothing is loaded.
        before = remote.state_dict()
        bad_values = [{"0.weight": 1.5}, {"0.bias": None, "zz": 3},
                      {"0.bias": [1.0] * 4, "0.weight": torch.ones(5)}]
        for bad in bad_values:
            for strict in (True, False):
                for path in ("", "0"):
                    rel = len(path) + 1 if path else 0
                    sd = {k[rel:]: v for k, v in dict(good, **bad).items()
                          if k.startswith(path)}
                    with self.subTest(keys=list(bad), strict=strict,
                                      path=path):
                        self.assertSameLoadError(local, remote, path, sd,
                                                 strict)
        for key, value in before.items():
            self.assertTrue(same_bits(remote.state_dict()[key], value), key)
        # A tensor of a dtype modelstate lacks stays a TypeError.
        with self.assertRaisesRegex(TypeError, "complex64"):
            remote.load_state_dict(dict(good, **{"0.bias": torch.ones(
                4, dtype=torch.complex64)}), strict=False)

    def test_requires_grad_and_removing_entries(self):
        mlp = ms.push(torch_models.MLP(4), "grad/mlp")
        self.assertIs(mlp.requires_grad_(False), mlp)
        self.assertFalse(any(p.requires_grad for p in mlp.parameters()))
        mlp.get_submodule("c_fc").requires_grad_(True)
        self.assertEqual({n: p.requires_grad for n, p in
                          mlp.named_parameters()},
                         {"c_fc.weight": True, "c_fc.bias": True,
                          "c_proj.weight": False, "c_proj.bias": False})
        with self.assertRaises(NotImplementedError):
            self.remote.requires_grad_(False)  # lm_head is tied
        mlp.remove_entry("bias", path="c_proj")
        mlp.remove_entry("dropout")
        local = torch_models.MLP(4)
        del local.c_proj.bias, local.dropout
        self.assertEqual(list(mlp.state_dict()), list(local.state_dict()))
        self.assertEqual([n for n, _ in mlp.named_children()],
                         [n for n, _ in local.named_children()])
        with self.assertRaises(modelstate.NotFoundError):
            mlp.remove_entry("nothing")

    def test_a_view_lists_what_it_shares_with_the_rest(self):
        """A submodule whose parameter is tied to, or whose submodule is
        shared with, a module outside it lists, pulls and freezes them as
        torch's submodule does (a tie cannot be re-registered: it raises
        as for the whole module)."""
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = nn.Embedding(10, 4)
                self.lm_head = nn.Linear(4, 10, bias=False)
                self.lm_head.weight = self.wte.weight

        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.a = nn.Linear(2, 2)
                self.b = nn.Sequential(self.a, nn.Linear(2, 2))

        for model, sub in ((LM(), "lm_head"), (Shared(), "b")):
            with self.subTest(sub):
                remote = ms.push(model, f"outside/{sub}")
                view, local = remote.get_submodule(sub), \
                    model.get_submodule(sub)
                ours = list(view.named_parameters())
                self.assertEqual([k for k, _ in ours],
                                 [k for k, _ in local.named_parameters()])
                for (k, p), q in zip(ours, local.parameters()):
                    self.assertIsInstance(p, nn.Parameter)
                    self.assertTrue(same_bits(p, q), k)
                self.assertSameModule(view.pull(), local)
        with self.assertRaises(NotImplementedError):
            ms.module("outside/lm_head").get_submodule(
                "lm_head").requires_grad_(False)
        ms.module("outside/b").get_submodule("b").requires_grad_(False)
        self.assertEqual({k: p.requires_grad for k, p in
                          ms.module("outside/b").named_parameters()},
                         {"a.weight": False, "a.bias": False,
                          "b.1.weight": False, "b.1.bias": False})

    def test_registering_torch_modules_and_shared_ones(self):
        host = ms.build({"type": "Host", "custom": True}, "reg/host")
        lin = nn.Linear(3, 2)
        host.register_module("lin", lin)
        host.register_module("again", host.get_submodule("lin"))
        sd = host.state_dict()
        self.assertTrue(torch.equal(sd["lin.weight"], lin.weight))
        back = ms.pull("reg/host")
        self.assertIs(back.again, back.lin)

    def test_progress_is_reported(self):
        calls = []
        ms.module("tree/gpt").state_dict(
            progress=lambda done, total: calls.append((done, total)))
        total = calls[-1][1]
        self.assertEqual(calls[-1], (total, total))
        self.assertEqual([d for d, _ in calls], sorted(d for d, _ in calls))
        loads = []
        self.remote.load_state_dict(self.local.state_dict(),
                                    progress=lambda d, t: loads.append(d))
        self.assertEqual(loads[-1], total)
        delay, _transfer.Progress.DELAY_S = _transfer.Progress.DELAY_S, 0
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                self.remote.state_dict(progress=True)
        finally:
            _transfer.Progress.DELAY_S = delay
        self.assertIn("tree/gpt", err.getvalue())


if __name__ == "__main__":
    unittest.main(verbosity=2)
