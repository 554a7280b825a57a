"""modelstate's Forward must compute what torch computes.

For each case the torch module is built with random parameters (and random
running statistics for BatchNorm in eval mode), its state_dict and the inputs
are written as safetensors, and tests/tools/forward_tool builds the same spec,
loads that state, runs the forward (N times in training mode) and writes the
outputs and its final state. Outputs must match torch's within a relative
error of 1e-5 for float32 (1e-12 for float64, 1e-2 for bfloat16), measured
as max|ours - torch| / max|torch| per tensor; the final state (BatchNorm's
running statistics and num_batches_tracked after training steps, Embedding's
max_norm renormalisation) must match likewise.

Dropout with p > 0 in training mode is random in both and is not compared.

Run by ctest with Debian's /usr/bin/python3 (which has torch):
    forward_matches_torch.py PATH/TO/forward_tool
"""
import json
import warnings
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layers_match_torch import spec  # noqa: E402
from safetensors_interop import read_safetensors, write_safetensors  # noqa: E402

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2}




def seq(*children):
    return {"type": "Sequential", "children": [{"spec": c} for c in children]}


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


class Case:
    def __init__(self, label, spec_, ctor, inputs, train=False, steps=1,
                 dtype=torch.float32, rename=None, random_params=True):
        self.label = label
        self.spec = spec_
        self.ctor = ctor
        self.inputs = inputs  # callable returning a list (None allowed)
        self.train = train
        self.steps = steps
        self.dtype = dtype
        self.rename = rename  # torch state key -> modelstate key
        self.random_params = random_params


def tail_padding(lengths, steps):
    """A key padding mask with each row's tail past its length masked."""
    return torch.arange(steps).unsqueeze(0) >= torch.tensor(lengths)[:, None]


def encoder_stack(d, heads, ff, layers, norm=False, batch_first=False,
                  **kwargs):
    """A TransformerEncoder spec: its module arguments are named children."""
    kids = [{"name": "encoder_layer", "spec": spec(
        "TransformerEncoderLayer", d, heads, ff, batch_first=batch_first)}]
    if norm:
        kids.append({"name": "norm", "spec": spec("LayerNorm", d)})
    s = {"type": "TransformerEncoder", "args": [layers], "children": kids}
    if kwargs:
        s["kwargs"] = kwargs
    return s


def bn_eval_stats(m):
    """Random running statistics, so that eval mode is not a no-op."""
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and \
                mod.running_mean is not None:
            mod.running_mean.uniform_(-1, 1)
            mod.running_var.uniform_(0.5, 2)
            mod.num_batches_tracked.fill_(7)
    return m


def mha_masks_bool():
    kpm = torch.zeros(3, 6, dtype=torch.bool)
    kpm[0, 5] = True
    kpm[2, 0] = True
    attn = torch.zeros(4, 6, dtype=torch.bool)
    attn[1, 2] = True
    attn[3, 4] = True
    return kpm, attn


def causal_float(n):
    return torch.triu(torch.full((n, n), float("-inf")), diagonal=1)


def banded_float(n, ahead, behind):
    """Query i sees keys i - behind .. i + ahead: every row ends in a run of
    -inf (which modelstate skips, as for a causal mask) and has -inf inside
    it too."""
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(n).unsqueeze(0)
    mask = torch.zeros(n, n)
    mask[(j > i + ahead) | (j < i - behind)] = float("-inf")
    return mask


def tel_masks():
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 6] = True
    kpm[1, 5] = True
    return kpm



def upsample_cases():
    """F.interpolate through Upsample: every mode on every rank it takes,
    with and without align_corners, by size and by (float) scale factor,
    recomputed or not, in float32 and float64."""
    shapes = {3: (2, 3, 7), 4: (2, 3, 5, 6), 5: (1, 2, 4, 5, 3)}
    modes = {3: ["nearest", "nearest-exact", "area", "linear"],
             4: ["nearest", "nearest-exact", "area", "bilinear", "bicubic"],
             5: ["nearest", "nearest-exact", "area", "trilinear"]}
    # (label, kwargs): sizes up and down, integral and fractional scales
    # (floor(in * s) outputs), per-dim tuples, recompute_scale_factor.
    sizing = {
        3: [("size=11", dict(size=11)), ("size=4", dict(size=4)),
            ("scale=2", dict(scale_factor=2)),
            ("scale=1.7", dict(scale_factor=1.7)),
            ("scale=0.6", dict(scale_factor=0.6)),
            ("scale=1.05 (same size)", dict(scale_factor=1.05)),
            ("scale=2.3,recompute", dict(scale_factor=2.3,
                                         recompute_scale_factor=True))],
        4: [("size=(9,4)", dict(size=(9, 4))),
            ("scale=(2,1.5)", dict(scale_factor=(2.0, 1.5))),
            ("scale=2.5", dict(scale_factor=2.5)),
            ("scale=0.7,recompute", dict(scale_factor=0.7,
                                         recompute_scale_factor=True)),
            ("scale=(1.1,3)", dict(scale_factor=(1.1, 3.0)))],
        5: [("size=(6,3,5)", dict(size=(6, 3, 5))),
            ("scale=(1.5,2,0.7)", dict(scale_factor=(1.5, 2.0, 0.7))),
            ("scale=2,recompute", dict(scale_factor=2,
                                       recompute_scale_factor=True))],
    }
    cases = []
    for rank, mode_list in modes.items():
        for mode in mode_list:
            aligns = [None] if mode in ("nearest", "nearest-exact", "area") \
                else [False, True]
            for align in aligns:
                for i, (what, kwargs) in enumerate(sizing[rank]):
                    kw = dict(kwargs, mode=mode)
                    if align is not None:
                        kw["align_corners"] = align
                    sp = {k: list(v) if isinstance(v, tuple) else v
                          for k, v in kw.items()}
                    dtype = torch.float64 if i % 2 else torch.float32
                    shape = shapes[rank]
                    cases.append(Case(
                        f"Upsample({mode},{what},align_corners={align}) "
                        f"{rank}-d {str(dtype)[6:]}",
                        spec("Upsample", **sp),
                        lambda kw=kw: nn.Upsample(**kw),
                        lambda shape=shape, dtype=dtype: [
                            randn(*shape, dtype=dtype)],
                        dtype=dtype))
    cases.append(Case("UpsamplingNearest2d(scale_factor=3)",
                      spec("UpsamplingNearest2d", scale_factor=3),
                      lambda: nn.UpsamplingNearest2d(scale_factor=3),
                      lambda: [randn(2, 3, 4, 5)]))
    cases.append(Case("UpsamplingBilinear2d((7,9)) float64",
                      spec("UpsamplingBilinear2d", [7, 9]),
                      lambda: nn.UpsamplingBilinear2d((7, 9)),
                      lambda: [randn(2, 3, 4, 5, dtype=torch.float64)],
                      dtype=torch.float64))
    cases.append(Case("UpsamplingBilinear2d(scale_factor=2.5) bfloat16",
                      spec("UpsamplingBilinear2d", scale_factor=2.5),
                      lambda: nn.UpsamplingBilinear2d(scale_factor=2.5),
                      lambda: [randn(1, 2, 4, 3, dtype=torch.bfloat16)],
                      dtype=torch.bfloat16))
    return cases


UPSAMPLE_CASES = upsample_cases()

CASES = [
    Case("Linear(5,3)", spec("Linear", 5, 3), lambda: nn.Linear(5, 3),
         lambda: [randn(4, 5)]),
    Case("Linear(5,3,bias=False) 3-D", spec("Linear", 5, 3, bias=False),
         lambda: nn.Linear(5, 3, bias=False), lambda: [randn(2, 3, 5)]),
    Case("Linear(40,20) 1-D", spec("Linear", 40, 20), lambda: nn.Linear(40, 20),
         lambda: [randn(40)]),
    Case("Linear(64,32) float64", spec("Linear", 64, 32),
         lambda: nn.Linear(64, 32).double(),
         lambda: [randn(8, 64, dtype=torch.float64)], dtype=torch.float64),
    Case("Linear(64,32) bfloat16", spec("Linear", 64, 32),
         lambda: nn.Linear(64, 32).bfloat16(),
         lambda: [randn(8, 64).bfloat16()], dtype=torch.bfloat16),
    Case("Bilinear(3,4,2)", spec("Bilinear", 3, 4, 2),
         lambda: nn.Bilinear(3, 4, 2), lambda: [randn(5, 3), randn(5, 4)]),
    Case("Bilinear(3,4,2,bias=False) 3-D", spec("Bilinear", 3, 4, 2, bias=False),
         lambda: nn.Bilinear(3, 4, 2, bias=False),
         lambda: [randn(2, 5, 3), randn(2, 5, 4)]),
    Case("Conv1d(2,4,3)", spec("Conv1d", 2, 4, 3), lambda: nn.Conv1d(2, 4, 3),
         lambda: [randn(2, 2, 10)]),
    Case("Conv1d(4,4,3,stride=2,padding=1,groups=2)",
         spec("Conv1d", 4, 4, 3, stride=2, padding=1, groups=2),
         lambda: nn.Conv1d(4, 4, 3, stride=2, padding=1, groups=2),
         lambda: [randn(2, 4, 9)]),
    Case("Conv1d unbatched, dilation=2", spec("Conv1d", 2, 3, 3, dilation=2),
         lambda: nn.Conv1d(2, 3, 3, dilation=2), lambda: [randn(2, 11)]),
    Case("Conv2d(3,8,3)", spec("Conv2d", 3, 8, 3), lambda: nn.Conv2d(3, 8, 3),
         lambda: [randn(2, 3, 9, 9)]),
    Case("Conv2d(3,8,(3,5),stride=(2,1),dilation=(1,2),bias=False)",
         spec("Conv2d", 3, 8, [3, 5], stride=[2, 1], dilation=[1, 2],
              bias=False),
         lambda: nn.Conv2d(3, 8, (3, 5), stride=(2, 1), dilation=(1, 2),
                           bias=False),
         lambda: [randn(2, 3, 11, 12)]),
    Case("Conv2d(4,4,3,padding='same',padding_mode='reflect')",
         spec("Conv2d", 4, 4, 3, padding="same", padding_mode="reflect"),
         lambda: nn.Conv2d(4, 4, 3, padding="same", padding_mode="reflect"),
         lambda: [randn(1, 4, 6, 7)]),
    Case("Conv2d(2,3,4,padding='same') (asymmetric)",
         spec("Conv2d", 2, 3, 4, padding="same"),
         lambda: nn.Conv2d(2, 3, 4, padding="same"),
         lambda: [randn(1, 2, 6, 7)]),
    Case("Conv2d(2,4,3,padding=2,padding_mode='circular')",
         spec("Conv2d", 2, 4, 3, padding=2, padding_mode="circular"),
         lambda: nn.Conv2d(2, 4, 3, padding=2, padding_mode="circular"),
         lambda: [randn(2, 2, 5, 6)]),
    Case("Conv2d(2,4,3,padding=1,padding_mode='replicate') unbatched",
         spec("Conv2d", 2, 4, 3, padding=1, padding_mode="replicate"),
         lambda: nn.Conv2d(2, 4, 3, padding=1, padding_mode="replicate"),
         lambda: [randn(2, 5, 6)]),
    Case("Conv2d(6,4,1,groups=2)", spec("Conv2d", 6, 4, 1, groups=2),
         lambda: nn.Conv2d(6, 4, 1, groups=2), lambda: [randn(2, 6, 5, 5)]),
    Case("ConvTranspose2d(2,4,3)", spec("ConvTranspose2d", 2, 4, 3),
         lambda: nn.ConvTranspose2d(2, 4, 3), lambda: [randn(2, 2, 5, 5)]),
    Case("ConvTranspose2d(4,6,(2,3),stride=2,padding=1,output_padding=1,"
         "groups=2)",
         spec("ConvTranspose2d", 4, 6, [2, 3], stride=2, padding=1,
              output_padding=1, groups=2),
         lambda: nn.ConvTranspose2d(4, 6, (2, 3), stride=2, padding=1,
                                    output_padding=1, groups=2),
         lambda: [randn(2, 4, 5, 4)]),
    Case("BatchNorm1d(4) train x3", spec("BatchNorm1d", 4),
         lambda: nn.BatchNorm1d(4), lambda: [randn(8, 4) * 3 + 1],
         train=True, steps=3),
    Case("BatchNorm1d(4) 3-D eval", spec("BatchNorm1d", 4),
         lambda: bn_eval_stats(nn.BatchNorm1d(4)),
         lambda: [randn(8, 4, 5)]),
    Case("BatchNorm1d(4,affine=False) train x3",
         spec("BatchNorm1d", 4, affine=False),
         lambda: nn.BatchNorm1d(4, affine=False),
         lambda: [randn(6, 4, 3) - 2], train=True, steps=3),
    Case("BatchNorm2d(3,momentum=None) train x3",
         spec("BatchNorm2d", 3, momentum=None),
         lambda: nn.BatchNorm2d(3, momentum=None),
         lambda: [randn(4, 3, 5, 5) * 2], train=True, steps=3),
    Case("BatchNorm2d(3) eval", spec("BatchNorm2d", 3),
         lambda: bn_eval_stats(nn.BatchNorm2d(3)),
         lambda: [randn(4, 3, 5, 5)]),
    Case("BatchNorm2d(5,track_running_stats=False) eval",
         spec("BatchNorm2d", 5, track_running_stats=False),
         lambda: nn.BatchNorm2d(5, track_running_stats=False),
         lambda: [randn(2, 5, 3, 3)]),
    Case("BatchNorm2d(3,momentum=0.3) float64 train x3",
         spec("BatchNorm2d", 3, momentum=0.3),
         lambda: nn.BatchNorm2d(3, momentum=0.3).double(),
         lambda: [randn(4, 3, 5, 5, dtype=torch.float64)], train=True,
         steps=3, dtype=torch.float64),
    Case("LayerNorm(6)", spec("LayerNorm", 6), lambda: nn.LayerNorm(6),
         lambda: [randn(3, 4, 6) * 4 + 1]),
    Case("LayerNorm([2,3])", spec("LayerNorm", [2, 3]),
         lambda: nn.LayerNorm([2, 3]), lambda: [randn(5, 2, 3)]),
    Case("LayerNorm(4,elementwise_affine=False)",
         spec("LayerNorm", 4, elementwise_affine=False),
         lambda: nn.LayerNorm(4, elementwise_affine=False),
         lambda: [randn(7, 4)]),
    Case("GroupNorm(2,4)", spec("GroupNorm", 2, 4), lambda: nn.GroupNorm(2, 4),
         lambda: [randn(3, 4, 5, 5)]),
    Case("GroupNorm(3,6,affine=False) 3-D", spec("GroupNorm", 3, 6,
                                                 affine=False),
         lambda: nn.GroupNorm(3, 6, affine=False), lambda: [randn(2, 6, 7)]),
    Case("Embedding(10,3)", spec("Embedding", 10, 3),
         lambda: nn.Embedding(10, 3),
         lambda: [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])]),
    Case("Embedding(10,3,padding_idx=2)", spec("Embedding", 10, 3,
                                               padding_idx=2),
         lambda: nn.Embedding(10, 3, padding_idx=2),
         lambda: [torch.tensor([2, 0, 9, 2])]),
    Case("Embedding(10,4,max_norm=1.0) (renormalises the weight)",
         spec("Embedding", 10, 4, max_norm=1.0),
         lambda: nn.Embedding(10, 4, max_norm=1.0),
         lambda: [torch.tensor([[1, 2, 1], [7, 0, 3]])]),
    Case("Dropout(0.5) eval", spec("Dropout", 0.5), lambda: nn.Dropout(0.5),
         lambda: [randn(4, 5)]),
    Case("Dropout(0.0) train", spec("Dropout", 0.0), lambda: nn.Dropout(0.0),
         lambda: [randn(4, 5)], train=True),
    Case("Identity", spec("Identity"), lambda: nn.Identity(),
         lambda: [randn(3, 2)]),
    Case("ReLU", spec("ReLU"), lambda: nn.ReLU(), lambda: [randn(4, 5)]),
    Case("GELU", spec("GELU"), lambda: nn.GELU(), lambda: [randn(4, 5) * 3]),
    Case("GELU(tanh)", spec("GELU", approximate="tanh"),
         lambda: nn.GELU(approximate="tanh"), lambda: [randn(4, 5) * 3]),
    Case("SiLU", spec("SiLU"), lambda: nn.SiLU(), lambda: [randn(4, 5) * 3]),
    Case("GELU over [-12, 12]", spec("GELU"), lambda: nn.GELU(),
         lambda: [torch.linspace(-12, 12, 1001)]),
    Case("GELU(tanh) over [-12, 12]", spec("GELU", approximate="tanh"),
         lambda: nn.GELU(approximate="tanh"),
         lambda: [torch.linspace(-12, 12, 1001)]),
    Case("SiLU over [-30, 30]", spec("SiLU"), lambda: nn.SiLU(),
         lambda: [torch.linspace(-30, 30, 1001)]),

    Case("Tanh", spec("Tanh"), lambda: nn.Tanh(), lambda: [randn(4, 5)]),
    Case("Sigmoid", spec("Sigmoid"), lambda: nn.Sigmoid(),
         lambda: [randn(4, 5) * 3]),
    Case("Softmax(dim=1)", spec("Softmax", dim=1), lambda: nn.Softmax(dim=1),
         lambda: [randn(3, 4, 5) * 5]),
    Case("Softmax(dim=-1)", spec("Softmax", dim=-1), lambda: nn.Softmax(dim=-1),
         lambda: [randn(3, 4, 5)]),
    Case("Softmax(dim=-1) of 37 with -inf entries",
         spec("Softmax", dim=-1), lambda: nn.Softmax(dim=-1),
         lambda: [randn(3, 37).masked_fill(torch.rand(3, 37) < 0.3,
                                           float("-inf"))]),
    Case("Softmax() implicit dim, 3-D", spec("Softmax"), lambda: nn.Softmax(),
         lambda: [randn(3, 4, 5)]),
    Case("Flatten()", spec("Flatten"), lambda: nn.Flatten(),
         lambda: [randn(2, 3, 4, 5)]),
    Case("Flatten(0,-1)", spec("Flatten", 0, -1), lambda: nn.Flatten(0, -1),
         lambda: [randn(2, 3, 4)]),
    Case("MaxPool2d(2)", spec("MaxPool2d", 2), lambda: nn.MaxPool2d(2),
         lambda: [randn(2, 3, 7, 8)]),
    Case("MaxPool2d(3,stride=2,padding=1,ceil_mode=True)",
         spec("MaxPool2d", 3, stride=2, padding=1, ceil_mode=True),
         lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
         lambda: [randn(2, 3, 8, 9)]),
    Case("MaxPool2d(2,dilation=2,return_indices=True) unbatched",
         spec("MaxPool2d", 2, dilation=2, return_indices=True),
         lambda: nn.MaxPool2d(2, dilation=2, return_indices=True),
         lambda: [randn(3, 7, 7)]),
    Case("AdaptiveAvgPool2d(1)", spec("AdaptiveAvgPool2d", 1),
         lambda: nn.AdaptiveAvgPool2d(1), lambda: [randn(2, 3, 7, 7)]),
    Case("AdaptiveAvgPool2d((3,2)) on 7x5", spec("AdaptiveAvgPool2d", [3, 2]),
         lambda: nn.AdaptiveAvgPool2d((3, 2)), lambda: [randn(2, 3, 7, 5)]),
    # Pooling in 1-d and 3-d, average pooling, adaptive max pooling.
    Case("MaxPool1d(3,2,1,dilation=1,ceil_mode=True)",
         spec("MaxPool1d", 3, 2, 1, ceil_mode=True),
         lambda: nn.MaxPool1d(3, 2, 1, ceil_mode=True),
         lambda: [randn(2, 3, 10)]),
    Case("MaxPool1d(2,dilation=3,return_indices=True) unbatched",
         spec("MaxPool1d", 2, dilation=3, return_indices=True),
         lambda: nn.MaxPool1d(2, dilation=3, return_indices=True),
         lambda: [randn(3, 11)]),
    Case("MaxPool3d((2,3,2),stride=(1,2,2),padding=(1,1,0)) float64",
         spec("MaxPool3d", [2, 3, 2], stride=[1, 2, 2], padding=[1, 1, 0]),
         lambda: nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0)),
         lambda: [randn(2, 2, 4, 6, 5, dtype=torch.float64)],
         dtype=torch.float64),
    Case("MaxPool3d(2,return_indices=True,ceil_mode=True)",
         spec("MaxPool3d", 2, return_indices=True, ceil_mode=True),
         lambda: nn.MaxPool3d(2, return_indices=True, ceil_mode=True),
         lambda: [randn(1, 2, 5, 4, 3)]),
    Case("AvgPool1d(3,2,1)", spec("AvgPool1d", 3, 2, 1),
         lambda: nn.AvgPool1d(3, 2, 1), lambda: [randn(2, 3, 9)]),
    Case("AvgPool1d(4,3,2,ceil_mode,count_include_pad=False)",
         spec("AvgPool1d", 4, 3, 2, True, False),
         lambda: nn.AvgPool1d(4, 3, 2, True, False), lambda: [randn(2, 3, 10)]),
    Case("AvgPool2d(2)", spec("AvgPool2d", 2), lambda: nn.AvgPool2d(2),
         lambda: [randn(2, 3, 7, 8)]),
    Case("AvgPool2d(3,2,1,ceil_mode,count_include_pad=False) unbatched",
         spec("AvgPool2d", 3, 2, 1, True, False),
         lambda: nn.AvgPool2d(3, 2, 1, True, False), lambda: [randn(3, 8, 9)]),
    Case("AvgPool2d((3,2),padding=1,divisor_override=5)",
         spec("AvgPool2d", [3, 2], padding=1, divisor_override=5),
         lambda: nn.AvgPool2d((3, 2), padding=1, divisor_override=5),
         lambda: [randn(2, 3, 7, 6)]),
    Case("AvgPool3d(3,2,1,ceil_mode) float64",
         spec("AvgPool3d", 3, 2, 1, True),
         lambda: nn.AvgPool3d(3, 2, 1, True),
         lambda: [randn(1, 2, 6, 7, 5, dtype=torch.float64)],
         dtype=torch.float64),
    Case("AvgPool3d((2,1,2),count_include_pad=False,padding=(1,0,1))",
         spec("AvgPool3d", [2, 1, 2], padding=[1, 0, 1],
              count_include_pad=False),
         lambda: nn.AvgPool3d((2, 1, 2), padding=(1, 0, 1),
                              count_include_pad=False),
         lambda: [randn(2, 4, 5, 3)]),
    Case("AdaptiveAvgPool1d(4) on 10", spec("AdaptiveAvgPool1d", 4),
         lambda: nn.AdaptiveAvgPool1d(4), lambda: [randn(2, 3, 10)]),
    Case("AdaptiveAvgPool3d((2,3,1))", spec("AdaptiveAvgPool3d", [2, 3, 1]),
         lambda: nn.AdaptiveAvgPool3d((2, 3, 1)),
         lambda: [randn(2, 2, 5, 7, 4)]),
    Case("AdaptiveMaxPool1d(3,return_indices=True)",
         spec("AdaptiveMaxPool1d", 3, return_indices=True),
         lambda: nn.AdaptiveMaxPool1d(3, return_indices=True),
         lambda: [randn(2, 3, 8)]),
    Case("AdaptiveMaxPool2d((3,2)) on 7x5", spec("AdaptiveMaxPool2d", [3, 2]),
         lambda: nn.AdaptiveMaxPool2d((3, 2)), lambda: [randn(2, 3, 7, 5)]),
    Case("AdaptiveMaxPool2d(2,return_indices=True) unbatched float64",
         spec("AdaptiveMaxPool2d", 2, return_indices=True),
         lambda: nn.AdaptiveMaxPool2d(2, return_indices=True),
         lambda: [randn(3, 5, 5, dtype=torch.float64)], dtype=torch.float64),
    Case("AdaptiveMaxPool3d(2)", spec("AdaptiveMaxPool3d", 2),
         lambda: nn.AdaptiveMaxPool3d(2), lambda: [randn(1, 2, 5, 4, 3)]),
    # Channel dropout and alpha dropout: eval passes through, p=0 in train.
    Case("Dropout1d(0.5) eval", spec("Dropout1d", 0.5),
         lambda: nn.Dropout1d(0.5), lambda: [randn(2, 3, 5)]),
    Case("Dropout2d(0.0) train", spec("Dropout2d", 0.0),
         lambda: nn.Dropout2d(0.0), lambda: [randn(2, 3, 4, 5)], train=True),
    Case("Dropout3d(0.3) eval", spec("Dropout3d", 0.3),
         lambda: nn.Dropout3d(0.3), lambda: [randn(2, 3, 2, 4, 5)]),
    Case("AlphaDropout(0.5) eval", spec("AlphaDropout", 0.5),
         lambda: nn.AlphaDropout(0.5), lambda: [randn(4, 5)]),
    Case("AlphaDropout(0.0) train", spec("AlphaDropout", 0.0),
         lambda: nn.AlphaDropout(0.0), lambda: [randn(4, 5)], train=True),
    Case("Unflatten(1,(2,-1,3))", spec("Unflatten", 1, [2, -1, 3]),
         lambda: nn.Unflatten(1, (2, -1, 3)), lambda: [randn(2, 12, 5)]),
    Case("Unflatten(-1,(2,2))", spec("Unflatten", -1, [2, 2]),
         lambda: nn.Unflatten(-1, (2, 2)), lambda: [randn(3, 4)]),
    Case("PixelShuffle(2)", spec("PixelShuffle", 2),
         lambda: nn.PixelShuffle(2), lambda: [randn(2, 8, 3, 4)]),
    Case("PixelShuffle(3) 5-d float64", spec("PixelShuffle", 3),
         lambda: nn.PixelShuffle(3),
         lambda: [randn(2, 1, 18, 2, 3, dtype=torch.float64)],
         dtype=torch.float64),
    Case("PixelUnshuffle(2) unbatched", spec("PixelUnshuffle", 2),
         lambda: nn.PixelUnshuffle(2), lambda: [randn(3, 4, 6)]),
    *UPSAMPLE_CASES,
    Case("MultiheadAttention(8,2) sequence-first",
         spec("MultiheadAttention", 8, 2),
         lambda: nn.MultiheadAttention(8, 2),
         lambda: [randn(4, 3, 8), randn(6, 3, 8), randn(6, 3, 8)]),
    Case("MultiheadAttention(8,2,batch_first) with bool masks",
         spec("MultiheadAttention", 8, 2, batch_first=True),
         lambda: nn.MultiheadAttention(8, 2, batch_first=True),
         lambda: [randn(3, 4, 8), randn(3, 6, 8), randn(3, 6, 8),
                  *mha_masks_bool()]),
    Case("MultiheadAttention(8,4,kdim=5,vdim=3) float 3-D mask",
         spec("MultiheadAttention", 8, 4, kdim=5, vdim=3),
         lambda: nn.MultiheadAttention(8, 4, kdim=5, vdim=3),
         lambda: [randn(4, 2, 8), randn(6, 2, 5), randn(6, 2, 3), None,
                  randn(8, 4, 6)]),
    Case("MultiheadAttention(8,2,add_bias_kv,add_zero_attn) masks",
         spec("MultiheadAttention", 8, 2, add_bias_kv=True,
              add_zero_attn=True),
         lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True,
                                       add_zero_attn=True),
         lambda: [randn(4, 3, 8), randn(6, 3, 8), randn(6, 3, 8),
                  *mha_masks_bool()]),
    Case("MultiheadAttention(6,3,bias=False) unbatched, causal",
         spec("MultiheadAttention", 6, 3, bias=False),
         lambda: nn.MultiheadAttention(6, 3, bias=False),
         lambda: [randn(5, 6), randn(5, 6), randn(5, 6), None,
                  causal_float(5)]),
    Case("TransformerEncoderLayer(8,2,16) relu",
         spec("TransformerEncoderLayer", 8, 2, dim_feedforward=16),
         lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16),
         lambda: [randn(7, 2, 8)]),
    Case("TransformerEncoderLayer gelu, norm_first, batch_first, masks",
         spec("TransformerEncoderLayer", 8, 2, dim_feedforward=16,
              activation="gelu", norm_first=True, batch_first=True),
         lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16,
                                            activation="gelu",
                                            norm_first=True,
                                            batch_first=True),
         lambda: [randn(2, 7, 8), causal_float(7), tel_masks()]),
    # Long enough for several 128-query blocks, the last one partial, so
    # that the keys a causal mask hides are skipped block by block.
    Case("TransformerEncoderLayer gelu, causal mask, 300 tokens",
         spec("TransformerEncoderLayer", 16, 4, dim_feedforward=32,
              activation="gelu", norm_first=True, batch_first=True),
         lambda: nn.TransformerEncoderLayer(16, 4, dim_feedforward=32,
                                            activation="gelu",
                                            norm_first=True,
                                            batch_first=True),
         lambda: [randn(2, 300, 16), causal_float(300)]),
    Case("TransformerEncoderLayer relu, banded mask, 260 tokens",
         spec("TransformerEncoderLayer", 16, 2, dim_feedforward=32),
         lambda: nn.TransformerEncoderLayer(16, 2, dim_feedforward=32),
         lambda: [randn(260, 1, 16), banded_float(260, 30, 100)]),
    Case("TransformerEncoderLayer dropout=0 train",
         spec("TransformerEncoderLayer", 8, 2, dim_feedforward=16,
              dropout=0.0),
         lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=16,
                                            dropout=0.0),
         lambda: [randn(5, 3, 8)], train=True),
    Case("TransformerDecoderLayer(8,2,16) relu",
         spec("TransformerDecoderLayer", 8, 2, dim_feedforward=16),
         lambda: nn.TransformerDecoderLayer(8, 2, dim_feedforward=16),
         lambda: [randn(5, 2, 8), randn(7, 2, 8)]),
    Case("TransformerDecoderLayer gelu, norm_first, batch_first, masks",
         spec("TransformerDecoderLayer", 8, 2, dim_feedforward=16,
              activation="gelu", norm_first=True, batch_first=True),
         lambda: nn.TransformerDecoderLayer(8, 2, dim_feedforward=16,
                                            activation="gelu",
                                            norm_first=True,
                                            batch_first=True),
         lambda: [randn(2, 5, 8), randn(2, 7, 8), causal_float(5), None,
                  None, tel_masks()]),
    Case("TransformerDecoderLayer dropout=0 train",
         spec("TransformerDecoderLayer", 8, 2, dim_feedforward=16,
              dropout=0.0),
         lambda: nn.TransformerDecoderLayer(8, 2, dim_feedforward=16,
                                            dropout=0.0),
         lambda: [randn(5, 3, 8), randn(4, 3, 8)], train=True),
    Case("TransformerEncoder(layer, 2, norm) with a causal mask",
         encoder_stack(8, 2, 16, 2, norm=True),
         lambda: nn.TransformerEncoder(
             nn.TransformerEncoderLayer(8, 2, 16), 2, nn.LayerNorm(8)),
         lambda: [randn(7, 3, 8), causal_float(7)]),
    # torch's nested-tensor path: padded positions come back zero, and the
    # output only as long as the longest sequence.
    Case("TransformerEncoder batch_first, key padding (nested path)",
         encoder_stack(8, 2, 16, 2, norm=True, batch_first=True),
         lambda: nn.TransformerEncoder(
             nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
             nn.LayerNorm(8)),
         lambda: [randn(2, 7, 8), None, tel_masks()]),
    Case("TransformerEncoder nested path, every row padded (output cut)",
         encoder_stack(8, 4, 16, 1, batch_first=True),
         lambda: nn.TransformerEncoder(
             nn.TransformerEncoderLayer(8, 4, 16, batch_first=True), 1),
         lambda: [randn(2, 7, 8), None, tail_padding([5, 4], 7)]),
    Case("TransformerEncoder batch_first, key padding, nested tensor off",
         encoder_stack(8, 2, 16, 2, batch_first=True,
                       enable_nested_tensor=False),
         lambda: nn.TransformerEncoder(
             nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 2,
             enable_nested_tensor=False),
         lambda: [randn(2, 7, 8), None, tel_masks()]),
    Case("TransformerDecoder(layer, 2, norm) with masks",
         {"type": "TransformerDecoder", "args": [2], "children": [
             {"name": "decoder_layer",
              "spec": spec("TransformerDecoderLayer", 8, 2, 16)},
             {"name": "norm", "spec": spec("LayerNorm", 8)}]},
         lambda: nn.TransformerDecoder(
             nn.TransformerDecoderLayer(8, 2, 16), 2, nn.LayerNorm(8)),
         lambda: [randn(5, 2, 8), randn(7, 2, 8), causal_float(5), None,
                  None, tel_masks()]),
    Case("Transformer(8,2,2,2,16) with a target mask",
         spec("Transformer", 8, 2, 2, 2, 16),
         lambda: nn.Transformer(8, 2, 2, 2, 16),
         lambda: [randn(7, 2, 8), randn(5, 2, 8), None, causal_float(5)]),
    Case("Transformer gelu, batch_first, norm_first, padding masks",
         spec("Transformer", 8, 2, 1, 2, 16, activation="gelu",
              batch_first=True, norm_first=True),
         lambda: nn.Transformer(8, 2, 1, 2, 16, activation="gelu",
                                batch_first=True, norm_first=True),
         lambda: [randn(2, 7, 8), randn(2, 5, 8), None, causal_float(5),
                  None, tel_masks(), None, tel_masks()]),
    Case("Transformer float64", spec("Transformer", 8, 2, 1, 1, 16),
         lambda: nn.Transformer(8, 2, 1, 1, 16).double(),
         lambda: [randn(6, 2, 8, dtype=torch.float64),
                  randn(4, 2, 8, dtype=torch.float64)],
         dtype=torch.float64),
    # The recurrent family: inputs and outputs flattened (call_recurrent).
    Case("LSTM(5,8)", spec("LSTM", 5, 8), lambda: nn.LSTM(5, 8),
         lambda: [randn(7, 3, 5)]),
    Case("LSTM(5,8,2,batch_first) with (h0, c0)",
         spec("LSTM", 5, 8, 2, batch_first=True),
         lambda: nn.LSTM(5, 8, 2, batch_first=True),
         lambda: [randn(3, 7, 5), randn(2, 3, 8), randn(2, 3, 8)]),
    Case("LSTM(5,8,2,bidirectional,proj_size=3) with (h0, c0)",
         spec("LSTM", 5, 8, 2, bidirectional=True, proj_size=3),
         lambda: nn.LSTM(5, 8, 2, bidirectional=True, proj_size=3),
         lambda: [randn(6, 2, 5), randn(4, 2, 3), randn(4, 2, 8)]),
    Case("LSTM(4,6,bias=False) unbatched", spec("LSTM", 4, 6, bias=False),
         lambda: nn.LSTM(4, 6, bias=False), lambda: [randn(5, 4)]),
    Case("LSTM(5,8,2,bidirectional,batch_first) packed lengths",
         spec("LSTM", 5, 8, 2, bidirectional=True, batch_first=True),
         lambda: nn.LSTM(5, 8, 2, bidirectional=True, batch_first=True),
         lambda: [randn(4, 7, 5), randn(4, 4, 8), randn(4, 4, 8),
                  torch.tensor([7, 3, 5, 1])]),
    Case("LSTM(5,8,2,dropout=0.5) eval", spec("LSTM", 5, 8, 2, dropout=0.5),
         lambda: nn.LSTM(5, 8, 2, dropout=0.5), lambda: [randn(6, 2, 5)]),
    Case("LSTM(5,8,2) train (dropout 0)", spec("LSTM", 5, 8, 2),
         lambda: nn.LSTM(5, 8, 2), lambda: [randn(6, 2, 5)], train=True),
    Case("LSTM(16,32) float64", spec("LSTM", 16, 32),
         lambda: nn.LSTM(16, 32).double(),
         lambda: [randn(9, 3, 16, dtype=torch.float64)],
         dtype=torch.float64),
    Case("GRU(5,8)", spec("GRU", 5, 8), lambda: nn.GRU(5, 8),
         lambda: [randn(7, 3, 5)]),
    Case("GRU(5,8,3,bidirectional,batch_first) with h0",
         spec("GRU", 5, 8, 3, bidirectional=True, batch_first=True),
         lambda: nn.GRU(5, 8, 3, bidirectional=True, batch_first=True),
         lambda: [randn(2, 6, 5), randn(6, 2, 8)]),
    Case("GRU(5,8,bias=False) packed lengths", spec("GRU", 5, 8, bias=False),
         lambda: nn.GRU(5, 8, bias=False),
         lambda: [randn(6, 3, 5), None, torch.tensor([2, 6, 4])]),
    Case("GRU(4,6) unbatched with h0", spec("GRU", 4, 6),
         lambda: nn.GRU(4, 6), lambda: [randn(5, 4), randn(1, 6)]),
    Case("RNN(5,8,2)", spec("RNN", 5, 8, 2), lambda: nn.RNN(5, 8, 2),
         lambda: [randn(7, 3, 5)]),
    Case("RNN(5,8,nonlinearity='relu',bidirectional) with h0",
         spec("RNN", 5, 8, nonlinearity="relu", bidirectional=True),
         lambda: nn.RNN(5, 8, nonlinearity="relu", bidirectional=True),
         lambda: [randn(7, 3, 5), randn(2, 3, 8)]),
    Case("RNNCell(5,8)", spec("RNNCell", 5, 8), lambda: nn.RNNCell(5, 8),
         lambda: [randn(3, 5), randn(3, 8)]),
    Case("RNNCell(5,8,nonlinearity='relu') unbatched",
         spec("RNNCell", 5, 8, nonlinearity="relu"),
         lambda: nn.RNNCell(5, 8, nonlinearity="relu"), lambda: [randn(5)]),
    Case("LSTMCell(5,8) with (hx, cx)", spec("LSTMCell", 5, 8),
         lambda: nn.LSTMCell(5, 8),
         lambda: [randn(3, 5), randn(3, 8), randn(3, 8)]),
    Case("LSTMCell(5,8,bias=False)", spec("LSTMCell", 5, 8, bias=False),
         lambda: nn.LSTMCell(5, 8, bias=False), lambda: [randn(3, 5)]),
    Case("GRUCell(5,8) with hx", spec("GRUCell", 5, 8),
         lambda: nn.GRUCell(5, 8), lambda: [randn(3, 5), randn(3, 8)]),
    Case("GRUCell(5,8) float64 unbatched", spec("GRUCell", 5, 8),
         lambda: nn.GRUCell(5, 8).double(),
         lambda: [randn(5, dtype=torch.float64)], dtype=torch.float64),
    # Issue 18: the 3-D and transposed convolutions.
    Case("Conv3d(2,4,3)", spec("Conv3d", 2, 4, 3), lambda: nn.Conv3d(2, 4, 3),
         lambda: [randn(2, 2, 5, 6, 7)]),
    Case("Conv3d(4,6,(1,2,3),stride=(1,2,1),padding=1,dilation=(2,1,1),"
         "groups=2) unbatched",
         spec("Conv3d", 4, 6, [1, 2, 3], stride=[1, 2, 1], padding=1,
              dilation=[2, 1, 1], groups=2),
         lambda: nn.Conv3d(4, 6, (1, 2, 3), stride=(1, 2, 1), padding=1,
                           dilation=(2, 1, 1), groups=2),
         lambda: [randn(4, 5, 6, 7)]),
    Case("Conv3d(2,3,3,padding='same',padding_mode='replicate')",
         spec("Conv3d", 2, 3, 3, padding="same", padding_mode="replicate"),
         lambda: nn.Conv3d(2, 3, 3, padding="same", padding_mode="replicate"),
         lambda: [randn(1, 2, 4, 5, 6)]),
    Case("Conv3d(2,3,3,padding=1,padding_mode='circular') float64",
         spec("Conv3d", 2, 3, 3, padding=1, padding_mode="circular"),
         lambda: nn.Conv3d(2, 3, 3, padding=1, padding_mode="circular").double(),
         lambda: [randn(1, 2, 4, 5, 6, dtype=torch.float64)],
         dtype=torch.float64),
    Case("Conv1d(3,4,3,padding=2,padding_mode='reflect')",
         spec("Conv1d", 3, 4, 3, padding=2, padding_mode="reflect"),
         lambda: nn.Conv1d(3, 4, 3, padding=2, padding_mode="reflect"),
         lambda: [randn(2, 3, 8)]),
    Case("ConvTranspose1d(3,5,4)", spec("ConvTranspose1d", 3, 5, 4),
         lambda: nn.ConvTranspose1d(3, 5, 4), lambda: [randn(2, 3, 7)]),
    Case("ConvTranspose1d(4,6,3,stride=3,padding=1,output_padding=2,"
         "dilation=2,groups=2) unbatched",
         spec("ConvTranspose1d", 4, 6, 3, stride=3, padding=1,
              output_padding=2, dilation=2, groups=2),
         lambda: nn.ConvTranspose1d(4, 6, 3, stride=3, padding=1,
                                    output_padding=2, dilation=2, groups=2),
         lambda: [randn(4, 6)]),
    Case("ConvTranspose3d(2,3,(2,3,2),stride=2,padding=(0,1,0),"
         "output_padding=1)",
         spec("ConvTranspose3d", 2, 3, [2, 3, 2], stride=2, padding=[0, 1, 0],
              output_padding=1),
         lambda: nn.ConvTranspose3d(2, 3, (2, 3, 2), stride=2,
                                    padding=(0, 1, 0), output_padding=1),
         lambda: [randn(2, 2, 3, 4, 3)]),
    Case("ConvTranspose3d(4,2,3,groups=2,bias=False) float64",
         spec("ConvTranspose3d", 4, 2, 3, groups=2, bias=False),
         lambda: nn.ConvTranspose3d(4, 2, 3, groups=2, bias=False).double(),
         lambda: [randn(1, 4, 3, 3, 3, dtype=torch.float64)],
         dtype=torch.float64),
    # EmbeddingBag: [input, offsets?, per_sample_weights?].
    Case("EmbeddingBag(10,3) 2-D mean", spec("EmbeddingBag", 10, 3),
         lambda: nn.EmbeddingBag(10, 3),
         lambda: [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])]),
    Case("EmbeddingBag(10,3,mode='sum') offsets, weights, an empty bag",
         spec("EmbeddingBag", 10, 3, mode="sum"),
         lambda: nn.EmbeddingBag(10, 3, mode="sum"),
         lambda: [torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]),
                  torch.tensor([0, 3, 3, 5]), randn(8)]),
    Case("EmbeddingBag(10,4,mode='max',include_last_offset) offsets",
         spec("EmbeddingBag", 10, 4, mode="max", include_last_offset=True),
         lambda: nn.EmbeddingBag(10, 4, mode="max", include_last_offset=True),
         lambda: [torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]),
                  torch.tensor([0, 2, 2, 7, 8])]),
    Case("EmbeddingBag(10,3,padding_idx=2) mean skips padding",
         spec("EmbeddingBag", 10, 3, padding_idx=2),
         lambda: nn.EmbeddingBag(10, 3, padding_idx=2),
         lambda: [torch.tensor([[2, 2, 4], [2, 3, 1]])]),
    Case("EmbeddingBag(10,4,max_norm=1.0,mode='sum') renormalises",
         spec("EmbeddingBag", 10, 4, max_norm=1.0, mode="sum"),
         lambda: nn.EmbeddingBag(10, 4, max_norm=1.0, mode="sum"),
         lambda: [torch.tensor([[1, 2, 1], [7, 0, 3]])]),
    # Normalisation in 3-D and per instance.
    Case("BatchNorm3d(3) train x3", spec("BatchNorm3d", 3),
         lambda: nn.BatchNorm3d(3), lambda: [randn(2, 3, 4, 3, 5) * 2 + 1],
         train=True, steps=3),
    Case("BatchNorm3d(3) eval", spec("BatchNorm3d", 3),
         lambda: bn_eval_stats(nn.BatchNorm3d(3)),
         lambda: [randn(2, 3, 4, 3, 5)]),
    Case("InstanceNorm1d(4)", spec("InstanceNorm1d", 4),
         lambda: nn.InstanceNorm1d(4), lambda: [randn(3, 4, 9) * 3 + 1]),
    Case("InstanceNorm1d(4) unbatched", spec("InstanceNorm1d", 4),
         lambda: nn.InstanceNorm1d(4), lambda: [randn(4, 9)]),
    Case("InstanceNorm2d(4,affine,track_running_stats) train x3",
         spec("InstanceNorm2d", 4, affine=True, track_running_stats=True),
         lambda: nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
         lambda: [randn(3, 4, 5, 6) * 2 - 1], train=True, steps=3),
    Case("InstanceNorm2d(4,affine,track_running_stats) eval",
         spec("InstanceNorm2d", 4, affine=True, track_running_stats=True),
         lambda: bn_eval_stats(nn.InstanceNorm2d(
             4, affine=True, track_running_stats=True)),
         lambda: [randn(3, 4, 5, 6)]),
    Case("InstanceNorm3d(2,affine) float64",
         spec("InstanceNorm3d", 2, affine=True),
         lambda: nn.InstanceNorm3d(2, affine=True).double(),
         lambda: [randn(2, 2, 3, 4, 5, dtype=torch.float64)],
         dtype=torch.float64),
    # Activations with arguments, and PReLU's learnable slope.
    Case("PReLU()", spec("PReLU"), lambda: nn.PReLU(),
         lambda: [randn(3, 4, 5)]),
    Case("PReLU(4) per channel", spec("PReLU", 4), lambda: nn.PReLU(4),
         lambda: [randn(2, 4, 3, 3)]),
    Case("PReLU(6) 2-D input", spec("PReLU", 6), lambda: nn.PReLU(6),
         lambda: [randn(3, 6)]),
    Case("PReLU() 1-D input", spec("PReLU"), lambda: nn.PReLU(),
         lambda: [randn(6)]),
    Case("LeakyReLU(0.2)", spec("LeakyReLU", 0.2), lambda: nn.LeakyReLU(0.2),
         lambda: [randn(4, 5)]),
    Case("ELU(alpha=0.7)", spec("ELU", alpha=0.7), lambda: nn.ELU(alpha=0.7),
         lambda: [randn(4, 5) * 3]),
    Case("Hardswish", spec("Hardswish"), lambda: nn.Hardswish(),
         lambda: [torch.linspace(-5, 5, 101)]),
    Case("Hardsigmoid", spec("Hardsigmoid"), lambda: nn.Hardsigmoid(),
         lambda: [torch.linspace(-5, 5, 101)]),
    Case("Mish", spec("Mish"), lambda: nn.Mish(),
         lambda: [torch.linspace(-20, 20, 401)]),
    Case("Softplus(beta=2,threshold=5)", spec("Softplus", beta=2, threshold=5),
         lambda: nn.Softplus(beta=2, threshold=5),
         lambda: [torch.linspace(-10, 10, 201)]),
    Case("LogSoftmax(dim=1)", spec("LogSoftmax", dim=1),
         lambda: nn.LogSoftmax(dim=1), lambda: [randn(3, 4, 5) * 5]),
    Case("LogSoftmax(dim=-1) float64", spec("LogSoftmax", dim=-1),
         lambda: nn.LogSoftmax(dim=-1),
         lambda: [randn(3, 7, dtype=torch.float64)], dtype=torch.float64),
    # LPPool: (sum of x^p over each window)^(1/p).
    Case("LPPool1d(2,3)", spec("LPPool1d", 2, 3), lambda: nn.LPPool1d(2, 3),
         lambda: [randn(2, 3, 10)]),
    Case("LPPool1d(3,2,stride=1,ceil_mode) on positives",
         spec("LPPool1d", 3, 2, stride=1, ceil_mode=True),
         lambda: nn.LPPool1d(3, 2, stride=1, ceil_mode=True),
         lambda: [randn(3, 7).abs() + 0.1]),
    Case("LPPool2d(2,(2,3))", spec("LPPool2d", 2, [2, 3]),
         lambda: nn.LPPool2d(2, (2, 3)), lambda: [randn(2, 3, 6, 7)]),
    Case("LPPool2d(1.5,3,stride=2,ceil_mode) float64",
         spec("LPPool2d", 1.5, 3, stride=2, ceil_mode=True),
         lambda: nn.LPPool2d(1.5, 3, stride=2, ceil_mode=True),
         lambda: [randn(1, 2, 8, 7, dtype=torch.float64).abs()],
         dtype=torch.float64),
    # Unfold (im2col) and Fold (col2im, overlaps summed).
    Case("Unfold(2)", spec("Unfold", 2), lambda: nn.Unfold(2),
         lambda: [randn(2, 3, 4, 5)]),
    Case("Unfold((2,3),dilation=2,padding=1,stride=(2,1)) unbatched",
         spec("Unfold", [2, 3], dilation=2, padding=1, stride=[2, 1]),
         lambda: nn.Unfold((2, 3), dilation=2, padding=1, stride=(2, 1)),
         lambda: [randn(3, 6, 7)]),
    Case("Fold((4,5),2)", spec("Fold", [4, 5], 2),
         lambda: nn.Fold((4, 5), 2), lambda: [randn(2, 12, 12)]),
    Case("Fold((6,5),(2,3),padding=1,stride=2) float64",
         spec("Fold", [6, 5], [2, 3], padding=1, stride=2),
         lambda: nn.Fold((6, 5), (2, 3), padding=1, stride=2),
         lambda: [randn(3, 12, 12, dtype=torch.float64)],
         dtype=torch.float64),
    Case("Fold(7,3,dilation=2) unbatched", spec("Fold", 7, 3, dilation=2),
         lambda: nn.Fold(7, 3, dilation=2), lambda: [randn(18, 9)]),
    # Issue 18's last activations.
    Case("ReLU6", spec("ReLU6"), lambda: nn.ReLU6(),
         lambda: [torch.linspace(-10, 10, 201)]),
    Case("Hardtanh(-2,3)", spec("Hardtanh", -2.0, 3.0),
         lambda: nn.Hardtanh(-2.0, 3.0), lambda: [randn(4, 5) * 4]),
    Case("Hardtanh(min_value=-0.5) float64", spec("Hardtanh", min_value=-0.5),
         lambda: nn.Hardtanh(min_value=-0.5),
         lambda: [randn(4, 5, dtype=torch.float64) * 2], dtype=torch.float64),
    Case("SELU", spec("SELU"), lambda: nn.SELU(),
         lambda: [randn(3, 4, 5) * 3]),
    Case("SELU float64", spec("SELU"), lambda: nn.SELU(),
         lambda: [randn(3, 7, dtype=torch.float64) * 3], dtype=torch.float64),
    Case("CELU(alpha=0.5)", spec("CELU", alpha=0.5), lambda: nn.CELU(0.5),
         lambda: [randn(4, 5) * 3]),
    Case("GLU()", spec("GLU"), lambda: nn.GLU(), lambda: [randn(3, 4, 6)]),
    Case("GLU(dim=1) float64", spec("GLU", dim=1), lambda: nn.GLU(dim=1),
         lambda: [randn(2, 4, 3, dtype=torch.float64)], dtype=torch.float64),
    Case("LogSigmoid", spec("LogSigmoid"), lambda: nn.LogSigmoid(),
         lambda: [torch.linspace(-30, 30, 241)]),
    Case("Softmin(dim=1)", spec("Softmin", dim=1), lambda: nn.Softmin(dim=1),
         lambda: [randn(3, 4, 5) * 3]),
    Case("Softmin() implicit dim 3-D", spec("Softmin"), lambda: nn.Softmin(),
         lambda: [randn(3, 4, 5)]),
    Case("Softsign", spec("Softsign"), lambda: nn.Softsign(),
         lambda: [randn(4, 5) * 5]),
    Case("Softshrink(0.3)", spec("Softshrink", 0.3), lambda: nn.Softshrink(0.3),
         lambda: [randn(4, 5)]),
    Case("Hardshrink(0.7) float64", spec("Hardshrink", 0.7),
         lambda: nn.Hardshrink(0.7),
         lambda: [randn(4, 5, dtype=torch.float64)], dtype=torch.float64),
    Case("Tanhshrink", spec("Tanhshrink"), lambda: nn.Tanhshrink(),
         lambda: [randn(4, 5) * 3]),
    Case("Threshold(0.1,20)", spec("Threshold", 0.1, 20),
         lambda: nn.Threshold(0.1, 20), lambda: [randn(4, 5)]),
    Case("Softmax2d 4-D", spec("Softmax2d"), lambda: nn.Softmax2d(),
         lambda: [randn(2, 3, 4, 5) * 3]),
    Case("Softmax2d 3-D", spec("Softmax2d"), lambda: nn.Softmax2d(),
         lambda: [randn(3, 4, 5)]),
    Case("FeatureAlphaDropout(0.5) eval", spec("FeatureAlphaDropout", 0.5),
         lambda: nn.FeatureAlphaDropout(0.5), lambda: [randn(2, 3, 4, 5)]),
    Case("FeatureAlphaDropout(0.0) train", spec("FeatureAlphaDropout", 0.0),
         lambda: nn.FeatureAlphaDropout(0.0), lambda: [randn(2, 3, 4)],
         train=True),
    Case("ChannelShuffle(3)", spec("ChannelShuffle", 3),
         lambda: nn.ChannelShuffle(3), lambda: [randn(2, 6, 4, 5)]),
    Case("ChannelShuffle(2) 3-D float64", spec("ChannelShuffle", 2),
         lambda: nn.ChannelShuffle(2),
         lambda: [randn(2, 8, 5, dtype=torch.float64)], dtype=torch.float64),
    Case("LocalResponseNorm(3)", spec("LocalResponseNorm", 3),
         lambda: nn.LocalResponseNorm(3), lambda: [randn(2, 6, 4, 5) * 10]),
    Case("LocalResponseNorm(4,alpha=0.1,beta=0.5,k=2) 3-D",
         spec("LocalResponseNorm", 4, alpha=0.1, beta=0.5, k=2.0),
         lambda: nn.LocalResponseNorm(4, alpha=0.1, beta=0.5, k=2.0),
         lambda: [randn(2, 5, 7) * 3]),
    Case("LocalResponseNorm(2) 5-D float64", spec("LocalResponseNorm", 2),
         lambda: nn.LocalResponseNorm(2),
         lambda: [randn(1, 4, 2, 3, 3, dtype=torch.float64)],
         dtype=torch.float64),
    Case("CosineSimilarity()", spec("CosineSimilarity"),
         lambda: nn.CosineSimilarity(), lambda: [randn(4, 6), randn(4, 6)]),
    Case("CosineSimilarity(dim=-1,eps=0.5) broadcast",
         spec("CosineSimilarity", dim=-1, eps=0.5),
         lambda: nn.CosineSimilarity(dim=-1, eps=0.5),
         lambda: [randn(3, 1, 5) * 0.1, randn(4, 5)]),
    Case("CosineSimilarity(dim=0) float64", spec("CosineSimilarity", dim=0),
         lambda: nn.CosineSimilarity(dim=0),
         lambda: [randn(5, 3, dtype=torch.float64),
                  randn(5, 3, dtype=torch.float64)], dtype=torch.float64),
    Case("PairwiseDistance()", spec("PairwiseDistance"),
         lambda: nn.PairwiseDistance(), lambda: [randn(4, 6), randn(4, 6)]),
    Case("PairwiseDistance(p=1,keepdim=True) broadcast",
         spec("PairwiseDistance", p=1.0, keepdim=True),
         lambda: nn.PairwiseDistance(p=1.0, keepdim=True),
         lambda: [randn(3, 2, 5), randn(5)]),
    Case("PairwiseDistance(p=3,eps=0.1) 1-D", spec("PairwiseDistance", p=3.0,
                                                    eps=0.1),
         lambda: nn.PairwiseDistance(p=3.0, eps=0.1),
         lambda: [randn(7), randn(7)]),
    Case("PairwiseDistance(p=0.5) float64",
         spec("PairwiseDistance", p=0.5),
         lambda: nn.PairwiseDistance(p=0.5),
         lambda: [randn(4, 6, dtype=torch.float64),
                  randn(4, 6, dtype=torch.float64)], dtype=torch.float64),
    # The padding layers.
    Case("ZeroPad2d((1,2,0,3))", spec("ZeroPad2d", [1, 2, 0, 3]),
         lambda: nn.ZeroPad2d((1, 2, 0, 3)), lambda: [randn(2, 3, 4, 5)]),
    Case("ConstantPad1d((2,-1),0.5)", spec("ConstantPad1d", [2, -1], 0.5),
         lambda: nn.ConstantPad1d((2, -1), 0.5), lambda: [randn(2, 3, 4)]),
    Case("ConstantPad2d(1,-2.0) unbatched", spec("ConstantPad2d", 1, -2.0),
         lambda: nn.ConstantPad2d(1, -2.0), lambda: [randn(3, 4, 5)]),
    Case("ConstantPad3d((1,0,2,1,0,1),3.0)",
         spec("ConstantPad3d", [1, 0, 2, 1, 0, 1], 3.0),
         lambda: nn.ConstantPad3d((1, 0, 2, 1, 0, 1), 3.0),
         lambda: [randn(1, 2, 3, 4, 5)]),
    Case("ReflectionPad1d((3,1))", spec("ReflectionPad1d", [3, 1]),
         lambda: nn.ReflectionPad1d((3, 1)), lambda: [randn(2, 3, 5)]),
    Case("ReflectionPad2d(2) unbatched", spec("ReflectionPad2d", 2),
         lambda: nn.ReflectionPad2d(2), lambda: [randn(3, 4, 5)]),
    Case("ReflectionPad3d((1,2,0,1,2,1))",
         spec("ReflectionPad3d", [1, 2, 0, 1, 2, 1]),
         lambda: nn.ReflectionPad3d((1, 2, 0, 1, 2, 1)),
         lambda: [randn(1, 2, 3, 4, 5)]),
    Case("ReplicationPad1d(3)", spec("ReplicationPad1d", 3),
         lambda: nn.ReplicationPad1d(3), lambda: [randn(2, 3, 4)]),
    Case("ReplicationPad2d((1,2,3,0)) float64",
         spec("ReplicationPad2d", [1, 2, 3, 0]),
         lambda: nn.ReplicationPad2d((1, 2, 3, 0)),
         lambda: [randn(2, 3, 4, 5, dtype=torch.float64)],
         dtype=torch.float64),
    Case("ReplicationPad3d(1)", spec("ReplicationPad3d", 1),
         lambda: nn.ReplicationPad3d(1), lambda: [randn(1, 2, 3, 4, 5)]),
    Case("MLP", seq(spec("Linear", 20, 64), spec("ReLU"),
                    spec("Linear", 64, 64), spec("GELU"),
                    spec("Linear", 64, 10)),
         lambda: nn.Sequential(nn.Linear(20, 64), nn.ReLU(),
                               nn.Linear(64, 64), nn.GELU(),
                               nn.Linear(64, 10)),
         lambda: [randn(16, 20)], random_params=False),
    Case("BatchNorm CNN train x3",
         seq(spec("Conv2d", 3, 8, 3, padding=1), spec("BatchNorm2d", 8),
             spec("ReLU"), spec("MaxPool2d", 2), spec("Conv2d", 8, 16, 3),
             spec("BatchNorm2d", 16), spec("ReLU"),
             spec("AdaptiveAvgPool2d", 1), spec("Flatten"),
             spec("Linear", 16, 10)),
         lambda: nn.Sequential(nn.Conv2d(3, 8, 3, padding=1),
                               nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Conv2d(8, 16, 3), nn.BatchNorm2d(16),
                               nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                               nn.Flatten(), nn.Linear(16, 10)),
         lambda: [randn(4, 3, 12, 12)], train=True, steps=3,
         random_params=False),
    Case("BatchNorm CNN eval",
         seq(spec("Conv2d", 3, 8, 3, padding=1), spec("BatchNorm2d", 8),
             spec("ReLU"), spec("MaxPool2d", 2), spec("Flatten"),
             spec("Linear", 8 * 36, 10)),
         lambda: bn_eval_stats(nn.Sequential(
             nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 36, 10))),
         lambda: [randn(4, 3, 12, 12)], random_params=False),
    Case("Sequential of 2 TransformerEncoderLayers = TransformerEncoder",
         seq(spec("TransformerEncoderLayer", 32, 4, dim_feedforward=64),
             spec("TransformerEncoderLayer", 32, 4, dim_feedforward=64)),
         lambda: nn.TransformerEncoder(
             nn.TransformerEncoderLayer(32, 4, dim_feedforward=64), 2,
             enable_nested_tensor=False),
         lambda: [randn(10, 3, 32)],
         rename=lambda k: k[len("layers."):]),
]


def relative_error(ours, ref):
    ours = ours.double()
    ref = ref.double()
    if ref.numel() == 0:
        return 0.0
    scale = ref.abs().max().item()
    diff = (ours - ref).abs().max().item()
    if scale == 0:
        return diff
    return diff / scale


def check_tensor(what, ours, ref, tol, failures):
    if ours is None:
        failures.append(f"{what}: missing")
        return
    if tuple(ours.shape) != tuple(ref.shape) or ours.dtype != ref.dtype:
        failures.append(f"{what}: {ours.dtype}{list(ours.shape)} vs torch "
                        f"{ref.dtype}{list(ref.shape)}")
        return
    if not ref.is_floating_point():
        if not torch.equal(ours, ref):
            failures.append(f"{what}: values differ")
        return
    # NaN compares false with everything, so a max over the difference would
    # let a NaN output pass: NaNs (and infinities) must sit where torch's are,
    # and the error is measured over the finite rest.
    ours_special = ~torch.isfinite(ours)
    ref_special = ~torch.isfinite(ref)
    if not torch.equal(ours_special, ref_special) or not torch.equal(
            ours[ours_special].nan_to_num(nan=0.0),
            ref[ref_special].nan_to_num(nan=0.0)):
        failures.append(f"{what}: NaN or infinity where torch has "
                        f"{int(ref_special.sum())} of them, "
                        f"ours {int(ours_special.sum())}")
        return
    finite = ~ref_special
    err = relative_error(ours[finite], ref[finite])
    if not err <= tol:
        failures.append(f"{what}: relative error {err:.3g} > {tol:g}")


def call_recurrent(m, inputs):
    """RNN / LSTM / GRU as modelstate flattens them: [input, h0, (c0,)
    lengths] in, [output, h_n(, c_n)] out; lengths mean a packed batch,
    padded back to the input's length."""
    lstm = isinstance(m, nn.LSTM)
    n_state = 2 if lstm else 1
    inputs = inputs + [None] * (2 + n_state - len(inputs))
    x, state, lengths = inputs[0], inputs[1:1 + n_state], inputs[1 + n_state]
    hx = None if state[0] is None else (tuple(state) if lstm else state[0])
    if lengths is None:
        out, hn = m(x, hx)
    else:
        steps = x.shape[1 if m.batch_first else 0]
        packed = pack_padded_sequence(x, lengths, batch_first=m.batch_first,
                                      enforce_sorted=False)
        out, hn = m(packed, hx)
        out, _ = pad_packed_sequence(out, batch_first=m.batch_first,
                                     total_length=steps)
    return (out, *hn) if lstm else (out, hn)


def call_torch(m, inputs):
    if isinstance(m, nn.MultiheadAttention):
        # forward(query, key, value, key_padding_mask, need_weights,
        # attn_mask): the tool's inputs are positional without need_weights.
        q, k, v, *masks = inputs + [None] * (5 - len(inputs))
        return m(q, k, v, key_padding_mask=masks[0], attn_mask=masks[1])
    if isinstance(m, nn.RNNBase):
        return call_recurrent(m, inputs)
    if isinstance(m, nn.LSTMCell):
        state = None if len(inputs) < 2 else (inputs[1], inputs[2])
        return m(inputs[0], state)
    return m(*inputs)


def run_case(tool, tmp, case, index):
    torch.manual_seed(index)
    m = case.ctor()
    if case.random_params:
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(torch.randn_like(p) * 0.5)
    m.train(case.train)
    rename = case.rename or (lambda k: k)
    state = [(rename(k), v.clone()) for k, v in m.state_dict().items()]
    inputs = case.inputs()
    tensors = [(f"input{i}", t) for i, t in enumerate(inputs) if t is not None]
    spec_path = os.path.join(tmp, "spec.json")
    state_path = os.path.join(tmp, "state.safetensors")
    inputs_path = os.path.join(tmp, "inputs.safetensors")
    out_path = os.path.join(tmp, "out.safetensors")
    state_out_path = os.path.join(tmp, "state_out.safetensors")
    with open(spec_path, "w") as f:
        json.dump(case.spec, f)
    write_safetensors(state_path, state)
    write_safetensors(inputs_path, tensors)
    with torch.no_grad():
        for _ in range(case.steps):
            out = call_torch(m, inputs)
    refs = list(out) if isinstance(out, tuple) else [out]
    dtype_name = {torch.float32: "float32", torch.float64: "float64",
                  torch.bfloat16: "bfloat16"}[case.dtype]
    cmd = [tool, "--spec", spec_path, "--state", state_path, "--inputs",
           inputs_path, "--out", out_path, "--state_out", state_out_path,
           "--steps", str(case.steps), "--dtype", dtype_name]
    if case.train:
        cmd.append("--train")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return [f"forward_tool failed: {proc.stderr.strip()}"]
    _, _, outputs = read_safetensors(out_path)
    outputs = dict(outputs)
    _, _, final_state = read_safetensors(state_out_path)
    final_state = dict(final_state)
    tol = TOLERANCE[case.dtype]
    failures = []
    for i, ref in enumerate(refs):
        if ref is None:
            continue
        check_tensor(f"output{i}", outputs.get(f"output{i}"), ref, tol,
                     failures)
    for k, v in m.state_dict().items():
        key = rename(k)
        check_tensor(f"state {key}", final_state.get(key), v, tol, failures)
    return failures


def main():
    tool = sys.argv[1]
    torch.set_num_threads(1)
    # torch warns about implicit softmax dims and even "same" kernels.
    warnings.filterwarnings("ignore")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for index, case in enumerate(CASES):
            failures = run_case(tool, tmp, case, index)
            if failures:
                failed += 1
                print(f"FAIL {case.label}")
                for f in failures:
                    print(f"    {f}")
            else:
                print(f"ok   {case.label}")
    print(f"{len(CASES) - failed} of {len(CASES)} cases match torch")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
