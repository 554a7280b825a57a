"""The server's library layers as torch classes: for each one, how its
constructor arguments are read back from a built module.

One function per layer reads the arguments through a view that both a live
torch module (push) and a hosted module's ModuleInfo (pull) provide, so a
new library layer needs one entry in LAYERS and nothing else. A value the
server cannot take (a string padding, a callable activation, a None inside
a tuple) raises Inexpressible: push then hosts that module as a custom
module with its own tensors, and pull builds a plain nn.Module.
"""

import inspect

try:
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError:  # push and pull need torch; the rest of the client not
    torch = nn = F = None


class Inexpressible(Exception):
    """A module the server's library cannot build exactly; str() says why."""


# ------------------------------------------------------------- views ------
class TorchView:
    """Reads a live torch module."""

    def __init__(self, module):
        self.module = module

    def attr(self, name):
        try:
            return getattr(self.module, name)
        except AttributeError:
            raise Inexpressible(f"it has no attribute '{name}'") from None

    def has(self, name):
        """Whether a parameter or buffer `name` is registered and not None."""
        m = self.module
        return (m._parameters.get(name) is not None or
                m._buffers.get(name) is not None)

    def child(self, name):
        child = self.module._modules.get(name)
        if child is None:
            raise Inexpressible(f"it has no submodule '{name}'")
        return TorchView(child)


class WireNumber(float):
    """A number as the wire carries it: google.protobuf.Value holds every
    number as a double, so 2 and 2.0 arrive alike (the spec reads a number
    with no fractional part as an int). A converter that keeps numbers as
    torch's constructor received them (_number) passes it on, and
    Layer.torch_kwargs decides: the argument's torch default when the
    value equals it (Softplus's beta=1, Hardtanh's min_val=-1.0), else an
    int when it has no fractional part, else a float."""

    __slots__ = ()

    def resolve(self, default=inspect.Parameter.empty):
        if isinstance(default, (int, float)) and \
                not isinstance(default, bool) and default == self:
            return default
        return int(self) if self.is_integer() else float(self)


class WireView:
    """Reads a live torch module as pull will read it back from the wire:
    its numbers as WireNumbers (push compares the two readings)."""

    def __init__(self, view):
        self.view = view

    def attr(self, name):
        value = self.view.attr(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return WireNumber(value)
        return value

    def has(self, name):
        return self.view.has(name)

    def child(self, name):
        return WireView(self.view.child(name))


def value_to_python(value):
    """A google.protobuf.Value as Python: numbers are floats, lists lists."""
    kind = value.WhichOneof("kind")
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [value_to_python(v) for v in value.list_value.values]
    return None


class InfoView:
    """Reads a hosted module's ModuleInfo."""

    def __init__(self, info):
        self.info = info

    def attr(self, name):
        if name not in self.info.attributes:
            raise Inexpressible(f"it has no attribute '{name}'")
        value = value_to_python(self.info.attributes[name])
        return WireNumber(value) if isinstance(value, float) else value

    def has(self, name):
        for entry in list(self.info.parameters) + list(self.info.buffers):
            if entry.name == name:
                return not entry.is_none
        return False

    def child(self, name):
        for c in self.info.children:
            if c.name == name and c.HasField("module"):
                return InfoView(c.module)
        raise Inexpressible(f"it has no submodule '{name}'")


# -------------------------------------------------------- converters ------
def _int(x):
    if isinstance(x, bool):
        raise Inexpressible(f"{x!r} is not an int")
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    raise Inexpressible(f"{x!r} is not an int")


def _float(x):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Inexpressible(f"{x!r} is not a float")
    return float(x)


def _bool(x):
    if not isinstance(x, bool):
        raise Inexpressible(f"{x!r} is not a bool")
    return x


def _str(x):
    if not isinstance(x, str):
        raise Inexpressible(f"{x!r} is not a str")
    return x


def _ints(x):
    """An int, or a tuple of ints (the server's IntOrTuple)."""
    if isinstance(x, (tuple, list)):
        return tuple(_int(i) for i in x)
    return _int(x)


def _floats(x):
    """A float, or a tuple of floats (Upsample's scale_factor)."""
    if isinstance(x, (tuple, list)):
        return tuple(_float(i) for i in x)
    return _float(x)


def _number(x):
    """An int or a float, kept as torch's constructor received it
    (Softplus's beta and threshold default to ints, Hardtanh(-2, 2) keeps
    ints): from the wire a WireNumber, which Layer.torch_kwargs resolves."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise Inexpressible(f"{x!r} is not a number")
    return x


def _optional(convert):
    return lambda x: None if x is None else convert(x)


def _activation(x):
    """TransformerEncoderLayer's activation: "relu" or "gelu" (torch keeps
    the function)."""
    if x in ("relu", "gelu"):
        return x
    if F is not None and x is F.relu:
        return "relu"
    if F is not None and x is F.gelu:
        return "gelu"
    raise Inexpressible(f"activation {x!r} is neither relu nor gelu")


def _read(view, spec):
    """{arg: converted attribute} for (arg, converter) pairs."""
    out = {}
    for name, convert in spec:
        value = view.attr(name)
        try:
            out[name] = convert(value)
        except Inexpressible as why:
            raise Inexpressible(f"{name}={value!r}: {why}") from None
    return out


# ------------------------------------------------------------ layers ------
def _linear(v):
    args = _read(v, [("in_features", _int), ("out_features", _int)])
    args["bias"] = v.has("bias")
    return args


def _bilinear(v):
    args = _read(v, [("in1_features", _int), ("in2_features", _int),
                     ("out_features", _int)])
    args["bias"] = v.has("bias")
    return args


_CONV = [("in_channels", _int), ("out_channels", _int),
         ("kernel_size", _ints), ("stride", _ints), ("padding", _ints),
         ("dilation", _ints), ("groups", _int), ("padding_mode", _str)]


def _conv(v):
    args = _read(v, _CONV)
    args["bias"] = v.has("bias")
    return args


def _conv_transpose(v):
    args = _conv(v)
    args["output_padding"] = _ints(v.attr("output_padding"))
    return args


def _batch_norm(v):
    return _read(v, [("num_features", _int), ("eps", _float),
                     ("momentum", _optional(_float)), ("affine", _bool),
                     ("track_running_stats", _bool)])


def _layer_norm(v):
    args = _read(v, [("normalized_shape", lambda x: tuple(_ints(x))),
                     ("eps", _float), ("elementwise_affine", _bool)])
    if args["elementwise_affine"] and not v.has("bias"):
        args["bias"] = False  # torch 2.1's LayerNorm(bias=False)
    return args


def _group_norm(v):
    return _read(v, [("num_groups", _int), ("num_channels", _int),
                     ("eps", _float), ("affine", _bool)])


def _embedding(v):
    return _read(v, [("num_embeddings", _int), ("embedding_dim", _int),
                     ("padding_idx", _optional(_int)),
                     ("max_norm", _optional(_float)), ("norm_type", _float),
                     ("scale_grad_by_freq", _bool), ("sparse", _bool)])


def _multihead_attention(v):
    args = _read(v, [("embed_dim", _int), ("num_heads", _int),
                     ("dropout", _float), ("add_zero_attn", _bool),
                     ("kdim", _int), ("vdim", _int), ("batch_first", _bool)])
    args["bias"] = v.has("in_proj_bias")
    args["add_bias_kv"] = v.has("bias_k")
    return args


def _transformer_encoder_layer(v):
    attn, linear1 = v.child("self_attn"), v.child("linear1")
    args = {
        "d_model": _int(attn.attr("embed_dim")),
        "nhead": _int(attn.attr("num_heads")),
        "dim_feedforward": _int(linear1.attr("out_features")),
        "dropout": _float(v.child("dropout").attr("p")),
        "activation": _activation(v.attr("activation")),
        "layer_norm_eps": _float(v.child("norm1").attr("eps")),
        "batch_first": _bool(attn.attr("batch_first")),
        "norm_first": _bool(v.attr("norm_first")),
    }
    if not linear1.has("bias"):
        args["bias"] = False  # torch 2.1's bias=False
    return args


def _rnn(v):
    """RNN, LSTM and GRU (RNNBase): RNN's nonlinearity and LSTM's proj_size
    only where the class takes them."""
    args = _read(v, [("input_size", _int), ("hidden_size", _int),
                     ("num_layers", _int), ("bias", _bool),
                     ("batch_first", _bool), ("dropout", _float),
                     ("bidirectional", _bool)])
    mode = _str(v.attr("mode"))
    if mode == "LSTM":
        args["proj_size"] = _int(v.attr("proj_size"))
    elif mode in ("RNN_TANH", "RNN_RELU"):
        args["nonlinearity"] = _str(v.attr("nonlinearity"))
    elif _int(v.attr("proj_size")) != 0:
        raise Inexpressible("proj_size is only supported for LSTM")
    return args


def _cell(v, nonlinearity=False):
    args = _read(v, [("input_size", _int), ("hidden_size", _int)])
    args["bias"] = v.has("bias_ih")
    if nonlinearity:
        args["nonlinearity"] = _str(v.attr("nonlinearity"))
    return args


def _transformer(v):
    """nn.Transformer without custom encoder or decoder: the arguments of
    its first encoder layer, the stacks' depths and the final norm's eps."""
    encoder, decoder = v.child("encoder"), v.child("decoder")
    args = _transformer_encoder_layer(
        encoder.child("layers").child("0"))
    args["num_encoder_layers"] = _int(encoder.attr("num_layers"))
    args["num_decoder_layers"] = _int(decoder.attr("num_layers"))
    args["layer_norm_eps"] = _float(encoder.child("norm").attr("eps"))
    args["batch_first"] = _bool(v.attr("batch_first"))
    if args.pop("d_model") != _int(v.attr("d_model")) or \
            args.pop("nhead") != _int(v.attr("nhead")):
        raise Inexpressible("its layers' width differs from d_model")
    args["d_model"] = _int(v.attr("d_model"))
    args["nhead"] = _int(v.attr("nhead"))
    return args


def _embedding_bag(v):
    return _read(v, [("num_embeddings", _int), ("embedding_dim", _int),
                     ("max_norm", _optional(_float)), ("norm_type", _float),
                     ("scale_grad_by_freq", _bool), ("mode", _str),
                     ("sparse", _bool), ("include_last_offset", _bool),
                     ("padding_idx", _optional(_int))])


class Layer:
    """A library layer: its torch class name, how to read its constructor
    arguments, whether it takes device= and dtype=, and the arguments newer
    than the local torch may know, with the server's defaults."""

    def __init__(self, name, read, factory=True, newer=None):
        self.name = name
        self.read = read
        self.factory = factory
        self.newer = newer or {}

    def torch_class(self):
        return getattr(nn, self.name, None) if nn is not None else None

    def torch_kwargs(self, args):
        """The arguments for the local torch class: an argument it does not
        know is dropped when it has the server's default, else the layer
        cannot be built here (Inexpressible)."""
        cls = self.torch_class()
        if cls is None:
            raise Inexpressible(f"this torch has no nn.{self.name}")
        known = inspect.signature(cls.__init__).parameters
        # LSTM(*args, **kwargs) takes any keyword its base class knows.
        anything = any(p.kind == p.VAR_KEYWORD for p in known.values())
        out = {}
        for key, value in args.items():
            if isinstance(value, WireNumber):
                param = known.get(key)
                value = value.resolve(
                    param.default if param is not None else param.empty)
            if key in known or anything:
                out[key] = value
            elif self.newer.get(key, object()) != value:
                raise Inexpressible(
                    f"{key}={value!r} needs a newer torch than "
                    f"{torch.__version__}")
        return out

    def construct(self, args, device, dtype):
        """The torch layer built from `args` on `device` (meta: no memory)."""
        kwargs = self.torch_kwargs(args)
        if self.factory:
            kwargs["device"] = device
            if dtype is not None:
                kwargs["dtype"] = dtype
        return self.torch_class()(**kwargs)


def _no_args(v):
    return {}


def _only(*spec):
    return lambda v: _read(v, spec)


LAYERS = {layer.name: layer for layer in [
    Layer("Identity", _no_args, factory=False),
    Layer("Linear", _linear),
    Layer("Bilinear", _bilinear),
    Layer("Conv1d", _conv),
    Layer("Conv2d", _conv),
    Layer("ConvTranspose2d", _conv_transpose),
    Layer("BatchNorm1d", _batch_norm),
    Layer("BatchNorm2d", _batch_norm),
    Layer("LayerNorm", _layer_norm, newer={"bias": True}),
    Layer("GroupNorm", _group_norm),
    Layer("Embedding", _embedding),
    Layer("Dropout", _only(("p", _float), ("inplace", _bool)), factory=False),
    Layer("ReLU", _only(("inplace", _bool)), factory=False),
    Layer("GELU", _only(("approximate", _str)), factory=False),
    Layer("SiLU", _only(("inplace", _bool)), factory=False),
    Layer("Tanh", _no_args, factory=False),
    Layer("Sigmoid", _no_args, factory=False),
    Layer("Softmax", _only(("dim", _optional(_int))), factory=False),
    Layer("Flatten", _only(("start_dim", _int), ("end_dim", _int)),
          factory=False),
    Layer("MaxPool2d", _only(("kernel_size", _ints), ("stride", _ints),
                             ("padding", _ints), ("dilation", _ints),
                             ("return_indices", _bool),
                             ("ceil_mode", _bool)), factory=False),
    Layer("AdaptiveAvgPool2d", _only(("output_size", _ints)), factory=False),
    Layer("MultiheadAttention", _multihead_attention),
    Layer("TransformerEncoderLayer", _transformer_encoder_layer,
          newer={"bias": True}),
    # Issue 18.
    Layer("Conv3d", _conv),
    Layer("ConvTranspose1d", _conv_transpose),
    Layer("ConvTranspose3d", _conv_transpose),
    Layer("EmbeddingBag", _embedding_bag),
    Layer("BatchNorm3d", _batch_norm),
    Layer("InstanceNorm1d", _batch_norm),
    Layer("InstanceNorm2d", _batch_norm),
    Layer("InstanceNorm3d", _batch_norm),
    Layer("PReLU", _only(("num_parameters", _int))),
    Layer("LeakyReLU", _only(("negative_slope", _float), ("inplace", _bool)),
          factory=False),
    Layer("ELU", _only(("alpha", _float), ("inplace", _bool)), factory=False),
    Layer("Hardswish", _only(("inplace", _bool)), factory=False),
    Layer("Hardsigmoid", _only(("inplace", _bool)), factory=False),
    Layer("Mish", _only(("inplace", _bool)), factory=False),
    Layer("Softplus", _only(("beta", _number), ("threshold", _number)),
          factory=False),
    Layer("LogSoftmax", _only(("dim", _optional(_int))), factory=False),
    *[Layer(f"{kind}Pad{d}d", _only(("padding", _ints)), factory=False)
      for kind in ("Reflection", "Replication") for d in (1, 2, 3)],
    *[Layer(f"ConstantPad{d}d", _only(("padding", _ints), ("value", _float)),
            factory=False) for d in (1, 2, 3)],
    Layer("ZeroPad2d", _only(("padding", _ints)), factory=False),
    *[Layer(f"MaxPool{d}d", _only(("kernel_size", _ints), ("stride", _ints),
                                  ("padding", _ints), ("dilation", _ints),
                                  ("return_indices", _bool),
                                  ("ceil_mode", _bool)), factory=False)
      for d in (1, 3)],
    Layer("AvgPool1d", _only(("kernel_size", _ints), ("stride", _ints),
                             ("padding", _ints), ("ceil_mode", _bool),
                             ("count_include_pad", _bool)), factory=False),
    *[Layer(f"AvgPool{d}d", _only(("kernel_size", _ints), ("stride", _ints),
                                  ("padding", _ints), ("ceil_mode", _bool),
                                  ("count_include_pad", _bool),
                                  ("divisor_override", _optional(_int))),
            factory=False) for d in (2, 3)],
    *[Layer(f"AdaptiveAvgPool{d}d", _only(("output_size", _ints)),
            factory=False) for d in (1, 3)],
    *[Layer(f"AdaptiveMaxPool{d}d", _only(("output_size", _ints),
                                          ("return_indices", _bool)),
            factory=False) for d in (1, 2, 3)],
    *[Layer(name, _only(("p", _float), ("inplace", _bool)), factory=False)
      for name in ("Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout")],
    Layer("Unflatten", _only(("dim", _int), ("unflattened_size", _ints)),
          factory=False),
    Layer("PixelShuffle", _only(("upscale_factor", _int)), factory=False),
    Layer("PixelUnshuffle", _only(("downscale_factor", _int)), factory=False),
    Layer("Upsample", _only(("size", _optional(_ints)),
                            ("scale_factor", _optional(_floats)),
                            ("mode", _str),
                            ("align_corners", _optional(_bool)),
                            ("recompute_scale_factor", _optional(_bool))),
          factory=False),
    *[Layer(name, _only(("size", _optional(_ints)),
                        ("scale_factor", _optional(_floats))), factory=False)
      for name in ("UpsamplingNearest2d", "UpsamplingBilinear2d")],
    Layer("RNN", _rnn),
    Layer("LSTM", _rnn),
    Layer("GRU", _rnn),
    Layer("RNNCell", lambda v: _cell(v, nonlinearity=True)),
    Layer("LSTMCell", _cell),
    Layer("GRUCell", _cell),
    Layer("TransformerDecoderLayer", _transformer_encoder_layer,
          newer={"bias": True}),
    Layer("Transformer", _transformer, newer={"bias": True}),
    # Issue 18's last layers: float arguments are kept as given (ints stay
    # ints), as torch keeps them.
    Layer("ReLU6", _only(("inplace", _bool)), factory=False),
    Layer("Hardtanh", _only(("min_val", _number), ("max_val", _number),
                            ("inplace", _bool)), factory=False),
    Layer("SELU", _only(("inplace", _bool)), factory=False),
    Layer("CELU", _only(("alpha", _number), ("inplace", _bool)),
          factory=False),
    Layer("GLU", _only(("dim", _int)), factory=False),
    Layer("Softmin", _only(("dim", _optional(_int))), factory=False),
    *[Layer(name, _no_args, factory=False)
      for name in ("LogSigmoid", "Softsign", "Tanhshrink", "Softmax2d")],
    *[Layer(name, _only(("lambd", _number)), factory=False)
      for name in ("Softshrink", "Hardshrink")],
    Layer("Threshold", _only(("threshold", _number), ("value", _number),
                             ("inplace", _bool)), factory=False),
    Layer("FeatureAlphaDropout", _only(("p", _float), ("inplace", _bool)),
          factory=False),
    Layer("ChannelShuffle", _only(("groups", _int)), factory=False),
    Layer("LocalResponseNorm", _only(("size", _int), ("alpha", _number),
                                     ("beta", _number), ("k", _number)),
          factory=False),
    # torch keeps PairwiseDistance's p as `norm`.
    Layer("PairwiseDistance", lambda v: {
        "p": _number(v.attr("norm")), "eps": _number(v.attr("eps")),
        "keepdim": _bool(v.attr("keepdim"))}, factory=False),
    Layer("CosineSimilarity", _only(("dim", _int), ("eps", _number)),
          factory=False),
    *[Layer(f"LPPool{d}d", _only(("norm_type", _number),
                                 ("kernel_size", _ints),
                                 ("stride", _optional(_ints)),
                                 ("ceil_mode", _bool)), factory=False)
      for d in (1, 2)],
    Layer("Unfold", _only(("kernel_size", _ints), ("dilation", _ints),
                          ("padding", _ints), ("stride", _ints)),
          factory=False),
    Layer("Fold", _only(("output_size", _ints), ("kernel_size", _ints),
                        ("dilation", _ints), ("padding", _ints),
                        ("stride", _ints)), factory=False),
]}

CONTAINERS = ("Sequential", "ModuleList", "ModuleDict")

# Library layers of the server that a spec builds from named children
# (encoder_layer, norm), not from constructor arguments alone: push hosts
# them as custom modules holding their (library) layers.
BUILT_FROM_CHILDREN = ("TransformerEncoder", "TransformerDecoder")

# Entries of a module's __dict__ that are torch's bookkeeping, not state
# (an RNN's _flat_weights lists its own parameters again).
_BOOKKEEPING = {"training", "_parameters", "_buffers", "_modules",
                "_non_persistent_buffers_set", "_is_full_backward_hook",
                "_flat_weights"}


def plain_attributes(module):
    """A module's plain attributes: what its constructor set besides
    tensors and submodules."""
    return {k: v for k, v in vars(module).items()
            if k not in _BOOKKEEPING and not k.endswith("hooks")}


def _same_value(a, b):
    if callable(a) or callable(b):
        return a is b
    try:
        return type(a) == type(b) and bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==
        return False


def differences(got, want, path=""):
    """Why `got` (a live module) is not `want` (the same layer rebuilt from
    its arguments): the first difference found, or None."""
    where = path or "the module"
    if type(got) is not type(want):
        return f"{where} is a {type(got).__name__}, not a " \
               f"{type(want).__name__}"
    for kind in ("_parameters", "_buffers"):
        a, b = getattr(got, kind), getattr(want, kind)
        if list(a) != list(b):
            return f"{where} has {kind[1:]} {list(a)}, not {list(b)}"
        for name in a:
            x, y = a[name], b[name]
            if (x is None) != (y is None):
                return f"{where}.{name} is {'None' if x is None else 'set'}"
            if x is not None and (x.shape != y.shape or x.dtype != y.dtype):
                return (f"{where}.{name} is {x.dtype} {tuple(x.shape)}, not "
                        f"{y.dtype} {tuple(y.shape)}")
    if got._non_persistent_buffers_set != want._non_persistent_buffers_set:
        return f"{where} has other non-persistent buffers"
    mine = plain_attributes(got)
    for key, value in plain_attributes(want).items():
        if key not in mine or not _same_value(mine[key], value):
            return f"{where}.{key} is {mine.get(key, 'missing')!r}, not " \
                   f"{value!r}"
    if list(got._modules) != list(want._modules):
        return f"{where} has submodules {list(got._modules)}"
    for name, child in got._modules.items():
        other = want._modules[name]
        if (child is None) != (other is None):
            return f"{where}.{name} is None on one side only"
        if child is not None:
            why = differences(child, other, f"{path}.{name}" if path else name)
            if why:
                return why
    return None
