"""Every library layer, built by modelstate and by real PyTorch, must agree.

For each case the same constructor arguments, seed and factory dtype are
given to modelstate's builder (through tests/tools/dump_state_dict) and to
PyTorch (torch.manual_seed(seed), then the constructor). The state_dict keys
and their order, shapes, dtypes and the values bit for bit, the _metadata
versions, named_modules() types and requires_grad must all be equal.

Run by ctest with Debian's /usr/bin/python3 (which has torch):
    layers_match_torch.py PATH/TO/dump_state_dict
"""
import json
import subprocess
import sys

import torch
import torch.nn as nn


def spec(type_, *args, **kwargs):
    s = {"type": type_}
    if args:
        s["args"] = list(args)
    if kwargs:
        s["kwargs"] = kwargs
    return s


def container(type_, *children, names=None):
    kids = []
    for i, c in enumerate(children):
        kid = {"spec": c}
        if names:
            kid["name"] = names[i]
        kids.append(kid)
    return {"type": type_, "children": kids}


def stack(type_, layer, num_layers, norm=None, **kwargs):
    """TransformerEncoder / TransformerDecoder: module arguments are named
    children."""
    arg = "encoder_layer" if type_ == "TransformerEncoder" else "decoder_layer"
    kids = [{"name": arg, "spec": layer}]
    if norm is not None:
        kids.append({"name": "norm", "spec": norm})
    s = {"type": type_, "args": [num_layers], "children": kids}
    if kwargs:
        s["kwargs"] = kwargs
    return s


# (label, modelstate spec, torch constructor taking factory kwargs)
CASES = [
    ("Identity", spec("Identity"), lambda **f: nn.Identity()),
    ("Linear(5,3)", spec("Linear", 5, 3), lambda **f: nn.Linear(5, 3, **f)),
    ("Linear(5,3,bias=False)", spec("Linear", 5, 3, bias=False),
     lambda **f: nn.Linear(5, 3, bias=False, **f)),
    ("Linear(0,3)", spec("Linear", 0, 3), lambda **f: nn.Linear(0, 3, **f)),
    ("Linear(40,20)", spec("Linear", 40, 20), lambda **f: nn.Linear(40, 20, **f)),
    ("Bilinear(3,4,2)", spec("Bilinear", 3, 4, 2), lambda **f: nn.Bilinear(3, 4, 2, **f)),
    ("Bilinear(3,4,2,bias=False)", spec("Bilinear", 3, 4, 2, bias=False),
     lambda **f: nn.Bilinear(3, 4, 2, bias=False, **f)),
    ("Conv1d(2,4,3)", spec("Conv1d", 2, 4, 3), lambda **f: nn.Conv1d(2, 4, 3, **f)),
    ("Conv1d(4,4,3,stride=2,padding=1,groups=2)",
     spec("Conv1d", 4, 4, 3, stride=2, padding=1, groups=2),
     lambda **f: nn.Conv1d(4, 4, 3, stride=2, padding=1, groups=2, **f)),
    ("Conv2d(3,8,3)", spec("Conv2d", 3, 8, 3), lambda **f: nn.Conv2d(3, 8, 3, **f)),
    ("Conv2d(3,8,(3,5),bias=False)", spec("Conv2d", 3, 8, [3, 5], bias=False),
     lambda **f: nn.Conv2d(3, 8, (3, 5), bias=False, **f)),
    ("Conv2d(4,4,3,padding='same',padding_mode='reflect')",
     spec("Conv2d", 4, 4, 3, padding="same", padding_mode="reflect"),
     lambda **f: nn.Conv2d(4, 4, 3, padding="same", padding_mode="reflect", **f)),
    ("ConvTranspose2d(2,4,3)", spec("ConvTranspose2d", 2, 4, 3),
     lambda **f: nn.ConvTranspose2d(2, 4, 3, **f)),
    ("ConvTranspose2d(4,6,(2,3),groups=2)", spec("ConvTranspose2d", 4, 6, [2, 3], groups=2),
     lambda **f: nn.ConvTranspose2d(4, 6, (2, 3), groups=2, **f)),
    ("BatchNorm1d(4)", spec("BatchNorm1d", 4), lambda **f: nn.BatchNorm1d(4, **f)),
    ("BatchNorm1d(4,affine=False)", spec("BatchNorm1d", 4, affine=False),
     lambda **f: nn.BatchNorm1d(4, affine=False, **f)),
    ("BatchNorm2d(5,track_running_stats=False)",
     spec("BatchNorm2d", 5, track_running_stats=False),
     lambda **f: nn.BatchNorm2d(5, track_running_stats=False, **f)),
    ("BatchNorm2d(3,momentum=None)", spec("BatchNorm2d", 3, momentum=None),
     lambda **f: nn.BatchNorm2d(3, momentum=None, **f)),
    ("LayerNorm(6)", spec("LayerNorm", 6), lambda **f: nn.LayerNorm(6, **f)),
    ("LayerNorm([2,3])", spec("LayerNorm", [2, 3]), lambda **f: nn.LayerNorm([2, 3], **f)),
    ("LayerNorm(4,elementwise_affine=False)", spec("LayerNorm", 4, elementwise_affine=False),
     lambda **f: nn.LayerNorm(4, elementwise_affine=False, **f)),
    ("GroupNorm(2,4)", spec("GroupNorm", 2, 4), lambda **f: nn.GroupNorm(2, 4, **f)),
    ("GroupNorm(2,4,affine=False)", spec("GroupNorm", 2, 4, affine=False),
     lambda **f: nn.GroupNorm(2, 4, affine=False, **f)),
    ("Embedding(10,3)", spec("Embedding", 10, 3), lambda **f: nn.Embedding(10, 3, **f)),
    ("Embedding(10,3,padding_idx=2)", spec("Embedding", 10, 3, padding_idx=2),
     lambda **f: nn.Embedding(10, 3, padding_idx=2, **f)),
    ("Embedding(10,3,padding_idx=-1)", spec("Embedding", 10, 3, padding_idx=-1),
     lambda **f: nn.Embedding(10, 3, padding_idx=-1, **f)),
    ("Embedding(37,9)", spec("Embedding", 37, 9), lambda **f: nn.Embedding(37, 9, **f)),
    ("Dropout(0.2)", spec("Dropout", 0.2), lambda **f: nn.Dropout(0.2)),
    ("ReLU", spec("ReLU"), lambda **f: nn.ReLU()),
    ("GELU(approximate='tanh')", spec("GELU", approximate="tanh"),
     lambda **f: nn.GELU(approximate="tanh")),
    ("SiLU", spec("SiLU"), lambda **f: nn.SiLU()),
    ("Tanh", spec("Tanh"), lambda **f: nn.Tanh()),
    ("Sigmoid", spec("Sigmoid"), lambda **f: nn.Sigmoid()),
    ("Softmax(dim=1)", spec("Softmax", dim=1), lambda **f: nn.Softmax(dim=1)),
    ("Flatten", spec("Flatten"), lambda **f: nn.Flatten()),
    ("MaxPool2d(3,2,1)", spec("MaxPool2d", 3, 2, 1),
     lambda **f: nn.MaxPool2d(3, 2, 1)),
    ("AdaptiveAvgPool2d((1,1))", spec("AdaptiveAvgPool2d", [1, 1]),
     lambda **f: nn.AdaptiveAvgPool2d((1, 1))),
    ("MaxPool1d(3,2,1)", spec("MaxPool1d", 3, 2, 1), lambda **f: nn.MaxPool1d(3, 2, 1)),
    ("MaxPool3d((2,3,2),return_indices)", spec("MaxPool3d", [2, 3, 2], return_indices=True),
     lambda **f: nn.MaxPool3d((2, 3, 2), return_indices=True)),
    ("AvgPool1d(3)", spec("AvgPool1d", 3), lambda **f: nn.AvgPool1d(3)),
    ("AvgPool2d(3,2,1,divisor_override=4)", spec("AvgPool2d", 3, 2, 1, divisor_override=4),
     lambda **f: nn.AvgPool2d(3, 2, 1, divisor_override=4)),
    ("AvgPool3d((2,2,1),ceil_mode)", spec("AvgPool3d", [2, 2, 1], ceil_mode=True),
     lambda **f: nn.AvgPool3d((2, 2, 1), ceil_mode=True)),
    ("AdaptiveAvgPool1d(5)", spec("AdaptiveAvgPool1d", 5), lambda **f: nn.AdaptiveAvgPool1d(5)),
    ("AdaptiveAvgPool3d(2)", spec("AdaptiveAvgPool3d", 2), lambda **f: nn.AdaptiveAvgPool3d(2)),
    ("AdaptiveMaxPool1d(3,True)", spec("AdaptiveMaxPool1d", 3, True),
     lambda **f: nn.AdaptiveMaxPool1d(3, True)),
    ("AdaptiveMaxPool2d((2,3))", spec("AdaptiveMaxPool2d", [2, 3]),
     lambda **f: nn.AdaptiveMaxPool2d((2, 3))),
    ("Dropout1d(0.1)", spec("Dropout1d", 0.1), lambda **f: nn.Dropout1d(0.1)),
    ("Dropout2d()", spec("Dropout2d"), lambda **f: nn.Dropout2d()),
    ("Dropout3d(0.2,True)", spec("Dropout3d", 0.2, True), lambda **f: nn.Dropout3d(0.2, True)),
    ("AlphaDropout(0.3)", spec("AlphaDropout", 0.3), lambda **f: nn.AlphaDropout(0.3)),
    ("Unflatten(1,(2,3))", spec("Unflatten", 1, [2, 3]), lambda **f: nn.Unflatten(1, (2, 3))),
    ("PixelShuffle(2)", spec("PixelShuffle", 2), lambda **f: nn.PixelShuffle(2)),
    ("PixelUnshuffle(3)", spec("PixelUnshuffle", 3), lambda **f: nn.PixelUnshuffle(3)),
    ("Upsample(scale_factor=2)", spec("Upsample", scale_factor=2),
     lambda **f: nn.Upsample(scale_factor=2)),
    ("Upsample((4,6),bilinear,align_corners)",
     spec("Upsample", [4, 6], mode="bilinear", align_corners=True),
     lambda **f: nn.Upsample((4, 6), mode="bilinear", align_corners=True)),
    ("Upsample(scale_factor=(1.5,2,2.5),trilinear)",
     spec("Upsample", None, [1.5, 2, 2.5], "trilinear", None, True),
     lambda **f: nn.Upsample(None, (1.5, 2, 2.5), "trilinear", None, True)),
    ("UpsamplingNearest2d(4)", spec("UpsamplingNearest2d", 4),
     lambda **f: nn.UpsamplingNearest2d(4)),
    ("UpsamplingBilinear2d(scale_factor=2)",
     spec("UpsamplingBilinear2d", scale_factor=2),
     lambda **f: nn.UpsamplingBilinear2d(scale_factor=2)),
    ("MultiheadAttention(8,2)", spec("MultiheadAttention", 8, 2),
     lambda **f: nn.MultiheadAttention(8, 2, **f)),
    ("MultiheadAttention(8,2,bias=False)", spec("MultiheadAttention", 8, 2, bias=False),
     lambda **f: nn.MultiheadAttention(8, 2, bias=False, **f)),
    ("MultiheadAttention(8,2,add_bias_kv=True)",
     spec("MultiheadAttention", 8, 2, add_bias_kv=True),
     lambda **f: nn.MultiheadAttention(8, 2, add_bias_kv=True, **f)),
    ("MultiheadAttention(8,2,kdim=4,vdim=6)", spec("MultiheadAttention", 8, 2, kdim=4, vdim=6),
     lambda **f: nn.MultiheadAttention(8, 2, kdim=4, vdim=6, **f)),
    ("TransformerEncoderLayer(8,2,16)", spec("TransformerEncoderLayer", 8, 2, 16),
     lambda **f: nn.TransformerEncoderLayer(8, 2, 16, **f)),
    ("TransformerEncoderLayer(8,2,16,gelu,norm_first,batch_first)",
     spec("TransformerEncoderLayer", 8, 2, 16, activation="gelu", norm_first=True,
          batch_first=True),
     lambda **f: nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", norm_first=True,
                                            batch_first=True, **f)),
    ("RNN(3,4)", spec("RNN", 3, 4), lambda **f: nn.RNN(3, 4, **f)),
    ("RNN(3,4,2,relu,bias=False,bidirectional)",
     spec("RNN", 3, 4, 2, nonlinearity="relu", bias=False, bidirectional=True),
     lambda **f: nn.RNN(3, 4, 2, nonlinearity="relu", bias=False, bidirectional=True,
                        **f)),
    ("LSTM(3,5)", spec("LSTM", 3, 5), lambda **f: nn.LSTM(3, 5, **f)),
    ("LSTM(3,5,2,batch_first,dropout=0.2)",
     spec("LSTM", 3, 5, 2, batch_first=True, dropout=0.2),
     lambda **f: nn.LSTM(3, 5, 2, batch_first=True, dropout=0.2, **f)),
    ("LSTM(3,5,2,bidirectional,proj_size=2)",
     spec("LSTM", 3, 5, 2, bidirectional=True, proj_size=2),
     lambda **f: nn.LSTM(3, 5, 2, bidirectional=True, proj_size=2, **f)),
    ("LSTM(3,5,bias=False,proj_size=3)", spec("LSTM", 3, 5, bias=False, proj_size=3),
     lambda **f: nn.LSTM(3, 5, bias=False, proj_size=3, **f)),
    ("LSTM(64,256) (positional args)", spec("LSTM", 64, 256, 1, True, False, 0.0, False),
     lambda **f: nn.LSTM(64, 256, 1, True, False, 0.0, False, **f)),
    ("GRU(3,4,3,bidirectional)", spec("GRU", 3, 4, 3, bidirectional=True),
     lambda **f: nn.GRU(3, 4, 3, bidirectional=True, **f)),
    ("GRU(3,4,bias=False)", spec("GRU", 3, 4, bias=False),
     lambda **f: nn.GRU(3, 4, bias=False, **f)),
    ("RNNCell(3,4,nonlinearity=relu)", spec("RNNCell", 3, 4, nonlinearity="relu"),
     lambda **f: nn.RNNCell(3, 4, nonlinearity="relu", **f)),
    ("RNNCell(3,4,bias=False)", spec("RNNCell", 3, 4, bias=False),
     lambda **f: nn.RNNCell(3, 4, bias=False, **f)),
    ("LSTMCell(3,7)", spec("LSTMCell", 3, 7), lambda **f: nn.LSTMCell(3, 7, **f)),
    ("GRUCell(3,7)", spec("GRUCell", 3, 7), lambda **f: nn.GRUCell(3, 7, **f)),
    ("GRUCell(3,4,bias=False)", spec("GRUCell", 3, 4, bias=False),
     lambda **f: nn.GRUCell(3, 4, bias=False, **f)),
    ("TransformerDecoderLayer(8,2,16)", spec("TransformerDecoderLayer", 8, 2, 16),
     lambda **f: nn.TransformerDecoderLayer(8, 2, 16, **f)),
    ("TransformerDecoderLayer(8,2,16,gelu,norm_first,batch_first,dropout=0)",
     spec("TransformerDecoderLayer", 8, 2, 16, activation="gelu", norm_first=True,
          batch_first=True, dropout=0.0),
     lambda **f: nn.TransformerDecoderLayer(8, 2, 16, activation="gelu", norm_first=True,
                                            batch_first=True, dropout=0.0, **f)),
    # A stack holds copies of one built layer: every copy has its values.
    ("TransformerEncoder(layer, 3)",
     stack("TransformerEncoder", spec("TransformerEncoderLayer", 8, 2, 16), 3),
     lambda **f: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, **f), 3)),
    ("TransformerEncoder(layer, 2, LayerNorm, enable_nested_tensor=False)",
     stack("TransformerEncoder", spec("TransformerEncoderLayer", 8, 2, 16), 2,
           spec("LayerNorm", 8), enable_nested_tensor=False),
     lambda **f: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, **f), 2,
                                       nn.LayerNorm(8, **f), enable_nested_tensor=False)),
    ("TransformerEncoder(layer, 0)",
     stack("TransformerEncoder", spec("TransformerEncoderLayer", 8, 2, 16), 0),
     lambda **f: nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, **f), 0)),
    ("TransformerDecoder(layer, 2, LayerNorm)",
     stack("TransformerDecoder", spec("TransformerDecoderLayer", 8, 2, 16), 2,
           spec("LayerNorm", 8)),
     lambda **f: nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, **f), 2,
                                       nn.LayerNorm(8, **f))),
    # _reset_parameters re-draws every matrix after the stacks are built.
    ("Transformer(8,2,2,1,16)", spec("Transformer", 8, 2, 2, 1, 16),
     lambda **f: nn.Transformer(8, 2, 2, 1, 16, **f)),
    ("Transformer(8,2,1,2,16,gelu,batch_first,norm_first)",
     spec("Transformer", 8, 2, 1, 2, 16, activation="gelu", batch_first=True,
          norm_first=True),
     lambda **f: nn.Transformer(8, 2, 1, 2, 16, activation="gelu", batch_first=True,
                                norm_first=True, **f)),
    # Issue 18: the 3-D and transposed convolutions, EmbeddingBag, the 3-D
    # and instance norms, PReLU, and the activations with arguments.
    ("Conv3d(2,4,3)", spec("Conv3d", 2, 4, 3), lambda **f: nn.Conv3d(2, 4, 3, **f)),
    ("Conv3d(4,6,(1,2,3),stride=2,groups=2,bias=False)",
     spec("Conv3d", 4, 6, [1, 2, 3], stride=2, groups=2, bias=False),
     lambda **f: nn.Conv3d(4, 6, (1, 2, 3), stride=2, groups=2, bias=False, **f)),
    ("ConvTranspose1d(3,5,4)", spec("ConvTranspose1d", 3, 5, 4),
     lambda **f: nn.ConvTranspose1d(3, 5, 4, **f)),
    ("ConvTranspose1d(4,6,3,groups=2,bias=False)",
     spec("ConvTranspose1d", 4, 6, 3, groups=2, bias=False),
     lambda **f: nn.ConvTranspose1d(4, 6, 3, groups=2, bias=False, **f)),
    ("ConvTranspose3d(2,3,(2,3,2))", spec("ConvTranspose3d", 2, 3, [2, 3, 2]),
     lambda **f: nn.ConvTranspose3d(2, 3, (2, 3, 2), **f)),
    ("EmbeddingBag(10,3)", spec("EmbeddingBag", 10, 3),
     lambda **f: nn.EmbeddingBag(10, 3, **f)),
    ("EmbeddingBag(10,3,mode='max',padding_idx=-2)",
     spec("EmbeddingBag", 10, 3, mode="max", padding_idx=-2),
     lambda **f: nn.EmbeddingBag(10, 3, mode="max", padding_idx=-2, **f)),
    ("BatchNorm3d(4)", spec("BatchNorm3d", 4), lambda **f: nn.BatchNorm3d(4, **f)),
    ("BatchNorm3d(3,affine=False,track_running_stats=False)",
     spec("BatchNorm3d", 3, affine=False, track_running_stats=False),
     lambda **f: nn.BatchNorm3d(3, affine=False, track_running_stats=False, **f)),
    ("InstanceNorm1d(4)", spec("InstanceNorm1d", 4), lambda **f: nn.InstanceNorm1d(4, **f)),
    ("InstanceNorm2d(4,affine=True,track_running_stats=True)",
     spec("InstanceNorm2d", 4, affine=True, track_running_stats=True),
     lambda **f: nn.InstanceNorm2d(4, affine=True, track_running_stats=True, **f)),
    ("InstanceNorm3d(3,affine=True)", spec("InstanceNorm3d", 3, affine=True),
     lambda **f: nn.InstanceNorm3d(3, affine=True, **f)),
    ("PReLU()", spec("PReLU"), lambda **f: nn.PReLU(**f)),
    ("PReLU(5,init=0.1)", spec("PReLU", 5, init=0.1), lambda **f: nn.PReLU(5, init=0.1, **f)),
    ("LeakyReLU(0.2)", spec("LeakyReLU", 0.2), lambda **f: nn.LeakyReLU(0.2)),
    ("ELU(alpha=0.5)", spec("ELU", alpha=0.5), lambda **f: nn.ELU(alpha=0.5)),
    ("Hardswish", spec("Hardswish"), lambda **f: nn.Hardswish()),
    ("Hardsigmoid", spec("Hardsigmoid"), lambda **f: nn.Hardsigmoid()),
    ("Mish", spec("Mish"), lambda **f: nn.Mish()),
    ("Softplus(beta=2)", spec("Softplus", beta=2), lambda **f: nn.Softplus(beta=2)),
    ("LogSoftmax(dim=1)", spec("LogSoftmax", dim=1), lambda **f: nn.LogSoftmax(dim=1)),
    # Issue 18's last layers: activations, FeatureAlphaDropout,
    # ChannelShuffle, LocalResponseNorm and the distances (no state: the
    # types, keys and metadata must still agree).
    ("ReLU6", spec("ReLU6"), lambda **f: nn.ReLU6()),
    ("Hardtanh(-2,3)", spec("Hardtanh", -2.0, 3.0), lambda **f: nn.Hardtanh(-2.0, 3.0)),
    ("SELU", spec("SELU"), lambda **f: nn.SELU()),
    ("CELU(alpha=0.5)", spec("CELU", alpha=0.5), lambda **f: nn.CELU(alpha=0.5)),
    ("GLU(dim=1)", spec("GLU", dim=1), lambda **f: nn.GLU(dim=1)),
    ("LogSigmoid", spec("LogSigmoid"), lambda **f: nn.LogSigmoid()),
    ("Softmin(dim=0)", spec("Softmin", dim=0), lambda **f: nn.Softmin(dim=0)),
    ("Softsign", spec("Softsign"), lambda **f: nn.Softsign()),
    ("Softshrink(0.3)", spec("Softshrink", 0.3), lambda **f: nn.Softshrink(0.3)),
    ("Hardshrink", spec("Hardshrink"), lambda **f: nn.Hardshrink()),
    ("Tanhshrink", spec("Tanhshrink"), lambda **f: nn.Tanhshrink()),
    ("Threshold(0.1,20)", spec("Threshold", 0.1, 20), lambda **f: nn.Threshold(0.1, 20)),
    ("Softmax2d", spec("Softmax2d"), lambda **f: nn.Softmax2d()),
    ("FeatureAlphaDropout(0.2)", spec("FeatureAlphaDropout", 0.2),
     lambda **f: nn.FeatureAlphaDropout(0.2)),
    ("ChannelShuffle(3)", spec("ChannelShuffle", 3), lambda **f: nn.ChannelShuffle(3)),
    ("LocalResponseNorm(3)", spec("LocalResponseNorm", 3), lambda **f: nn.LocalResponseNorm(3)),
    ("PairwiseDistance(p=1)", spec("PairwiseDistance", p=1.0),
     lambda **f: nn.PairwiseDistance(p=1.0)),
    ("CosineSimilarity(dim=0)", spec("CosineSimilarity", dim=0),
     lambda **f: nn.CosineSimilarity(dim=0)),
    ("LPPool1d(2,3)", spec("LPPool1d", 2, 3), lambda **f: nn.LPPool1d(2, 3)),
    ("LPPool2d(1.5,(2,3),stride=1)", spec("LPPool2d", 1.5, [2, 3], stride=1),
     lambda **f: nn.LPPool2d(1.5, (2, 3), stride=1)),
    ("Fold((4,5),2,stride=2)", spec("Fold", [4, 5], 2, stride=2),
     lambda **f: nn.Fold((4, 5), 2, stride=2)),
    ("Unfold(3,padding=1)", spec("Unfold", 3, padding=1), lambda **f: nn.Unfold(3, padding=1)),
    ("Sequential(Conv2d,SELU,LocalResponseNorm,ChannelShuffle,Softmax2d)",
     container("Sequential", spec("Conv2d", 2, 4, 3), spec("SELU"),
               spec("LocalResponseNorm", 2), spec("ChannelShuffle", 2), spec("Softmax2d")),
     lambda **f: nn.Sequential(nn.Conv2d(2, 4, 3, **f), nn.SELU(), nn.LocalResponseNorm(2),
                               nn.ChannelShuffle(2), nn.Softmax2d())),
    ("ZeroPad2d((1,2,0,3))", spec("ZeroPad2d", [1, 2, 0, 3]),
     lambda **f: nn.ZeroPad2d((1, 2, 0, 3))),
    ("ConstantPad3d(1,0.5)", spec("ConstantPad3d", 1, 0.5),
     lambda **f: nn.ConstantPad3d(1, 0.5)),
    ("ReflectionPad1d(2)", spec("ReflectionPad1d", 2), lambda **f: nn.ReflectionPad1d(2)),
    ("ReplicationPad3d((1,0,2,1,0,1))", spec("ReplicationPad3d", [1, 0, 2, 1, 0, 1]),
     lambda **f: nn.ReplicationPad3d((1, 0, 2, 1, 0, 1))),
    ("Sequential(Linear,ReLU,Linear,BatchNorm1d)",
     container("Sequential", spec("Linear", 6, 5), spec("ReLU"), spec("Linear", 5, 4),
               spec("BatchNorm1d", 4)),
     lambda **f: nn.Sequential(nn.Linear(6, 5, **f), nn.ReLU(), nn.Linear(5, 4, **f),
                               nn.BatchNorm1d(4, **f))),
    ("ModuleList(Conv2d,Embedding)",
     container("ModuleList", spec("Conv2d", 2, 3, 2), spec("Embedding", 20, 4)),
     lambda **f: nn.ModuleList([nn.Conv2d(2, 3, 2, **f), nn.Embedding(20, 4, **f)])),
    ("ModuleDict(enc,dec)",
     container("ModuleDict", spec("Linear", 3, 3), spec("LayerNorm", 3),
               names=["enc", "dec"]),
     lambda **f: nn.ModuleDict({"enc": nn.Linear(3, 3, **f), "dec": nn.LayerNorm(3, **f)})),
]

# Every InitSpec kind a custom module's tensor can ask for, in one module:
# (member kind, name, shape, init, explicit dtype or None).
INIT_MEMBERS = [
    ("parameter", "zeros", [2, 3], {"kind": "zeros"}, None),
    ("parameter", "ones", [2, 3], {"kind": "ones"}, None),
    ("parameter", "constant", [3], {"kind": "constant", "a": 0.25}, None),
    ("parameter", "uniform", [4, 5], {"kind": "uniform", "a": -2.0, "b": 3.0}, None),
    ("parameter", "normal", [4, 5], {"kind": "normal", "a": 1.0, "b": 0.5}, None),
    ("parameter", "kaiming_uniform", [6, 4], {"kind": "kaiming_uniform", "a": 5 ** 0.5}, None),
    ("parameter", "xavier_uniform", [6, 4], {"kind": "xavier_uniform", "a": 1.5}, None),
    ("parameter", "xavier_normal", [6, 4], {"kind": "xavier_normal", "a": 0.8}, None),
    ("parameter", "empty", [2], {"kind": "empty"}, None),
    # Its own generator: the build's generator is not advanced by it.
    ("parameter", "seeded_normal", [3, 3], {"kind": "normal", "a": 0.0, "b": 2.0, "seed": 42},
     None),
    ("buffer", "buf_uniform", [5], {"kind": "uniform", "a": 0.0, "b": 1.0}, None),
    ("buffer", "buf_seeded_uniform", [5], {"kind": "uniform", "a": -1.0, "b": 1.0, "seed": 7},
     None),
    ("buffer", "buf_counts", [3], {"kind": "ones"}, "int64"),
]


def init_kinds_spec():
    members = []
    for member, name, shape, init, dtype in INIT_MEMBERS:
        body = {"name": name, "shape": shape, "init": init}
        if dtype:
            body["dtype"] = dtype
        members.append({member: body})
    return {"type": "InitKinds", "members": members}


class InitKinds(nn.Module):
    """The torch twin of init_kinds_spec(): each tensor created and then
    initialised by torch.nn.init (or Tensor.*_ with a seeded generator)."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        for member, name, shape, init, explicit in INIT_MEMBERS:
            dt = getattr(torch, explicit) if explicit else dtype
            # modelstate zero-fills "empty" (torch.empty leaves garbage).
            t = torch.zeros(shape, dtype=dt)
            a, b, kind = init.get("a", 0.0), init.get("b", 1.0), init["kind"]
            with torch.no_grad():
                if "seed" in init:
                    g = torch.Generator().manual_seed(init["seed"])
                    getattr(t, kind + "_")(a, b, generator=g)
                elif kind == "zeros" or kind == "empty":
                    nn.init.zeros_(t)
                elif kind == "ones":
                    nn.init.ones_(t)
                elif kind == "constant":
                    nn.init.constant_(t, a)
                elif kind == "uniform":
                    nn.init.uniform_(t, a, b)
                elif kind == "normal":
                    nn.init.normal_(t, a, b)
                elif kind == "kaiming_uniform":
                    nn.init.kaiming_uniform_(t, a=a)
                elif kind == "xavier_uniform":
                    nn.init.xavier_uniform_(t, gain=a)
                elif kind == "xavier_normal":
                    nn.init.xavier_normal_(t, gain=a)
                else:
                    raise ValueError(kind)
            if member == "parameter":
                self.register_parameter(name, nn.Parameter(t))
            else:
                self.register_buffer(name, t)


CASES.append(("InitKinds(every InitSpec kind)", init_kinds_spec(),
              lambda **f: InitKinds(**f)))

DTYPES = {"float32": torch.float32, "float64": torch.float64,
          "float16": torch.float16, "bfloat16": torch.bfloat16}


def torch_dump(make, seed, dtype):
    torch.manual_seed(seed)
    m = make(dtype=DTYPES[dtype])
    sd = m.state_dict()
    return {
        "state_dict": [{"key": k, "dtype": str(v.dtype).replace("torch.", ""),
                        "shape": list(v.shape),
                        "hex": v.reshape(-1).contiguous().view(torch.uint8)
                        .numpy().tobytes().hex() if v.numel() else ""}
                       for k, v in sd.items()],
        "metadata": {k: v["version"] for k, v in sd._metadata.items()},
        "named_modules": [[n, type(x).__name__] for n, x in m.named_modules()],
        "requires_grad": {n: p.requires_grad for n, p in m.named_parameters()},
    }


def main():
    dumper = sys.argv[1]
    runs = []
    for label, s, make in CASES:
        for seed in (0, 1234):
            runs.append((label, s, make, seed, "float32"))
        for dtype in ("float64", "float16", "bfloat16"):
            runs.append((label, s, make, 7, dtype))
    requests = [{"spec": s, "seed": seed, "dtype": dtype} for _, s, _, seed, dtype in runs]
    out = subprocess.run([dumper], input=json.dumps(requests), capture_output=True,
                         text=True, check=True)
    ours_all = json.loads(out.stdout)
    failures = 0
    for (label, _, make, seed, dtype), ours in zip(runs, ours_all):
        theirs = torch_dump(make, seed, dtype)
        where = f"{label} seed={seed} dtype={dtype}"
        if "error" in ours:
            print(f"FAIL {where}: modelstate error: {ours['error']}")
            failures += 1
            continue
        for field in ("metadata", "named_modules", "requires_grad"):
            if ours[field] != theirs[field]:
                print(f"FAIL {where}: {field}\n  ours:  {ours[field]}\n  torch: {theirs[field]}")
                failures += 1
        ok = [e["key"] for e in ours["state_dict"]] == [e["key"] for e in theirs["state_dict"]]
        if not ok:
            print(f"FAIL {where}: keys\n  ours:  {[e['key'] for e in ours['state_dict']]}"
                  f"\n  torch: {[e['key'] for e in theirs['state_dict']]}")
            failures += 1
            continue
        for a, b in zip(ours["state_dict"], theirs["state_dict"]):
            for field in ("dtype", "shape", "hex"):
                if a[field] != b[field]:
                    detail = "values differ" if field == "hex" else f"{a[field]} vs {b[field]}"
                    print(f"FAIL {where}: {a['key']} {field}: {detail}")
                    failures += 1
    print(f"{len(runs)} builds compared with torch {torch.__version__}, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
