// The unknown-type error: the closest library type by edit distance, and
// for torch.nn's own names (torch 1.13's torch.nn.modules.__all__) why the
// library leaves the layer out.
#include "nn/unknown_type.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nn/module_spec.h"

namespace modelstate::internal {
namespace {

// torch.nn.modules.__all__ of torch 1.13 that the library does not build
// as such, each with the reason the error gives.
struct LeftOut {
  absl::string_view prefix_or_name;
  bool prefix;
  absl::string_view why;
};

constexpr LeftOut kLeftOut[] = {
    {"Lazy", true,
     "lazy modules have no shapes until their first call; build the layer "
     "they become (LazyLinear: Linear with in_features)"},
    {"Module", false,
     "it is the base class of every module; an empty module of your own "
     "class is a custom module"},
    {"Container", false, "it is a deprecated base class"},
    {"RNNBase", false, "it is the base class of RNN, LSTM and GRU"},
    {"RNNCellBase", false,
     "it is the base class of RNNCell, LSTMCell and GRUCell"},
    {"ParameterList", false,
     "it holds parameters only: host it as a custom module whose members "
     "are the parameters '0', '1', ..."},
    {"ParameterDict", false,
     "it holds parameters only: host it as a custom module whose members "
     "are its parameters"},
    {"AdaptiveLogSoftmaxWithLoss", false,
     "it is a loss: losses run where training runs"},
    {"NLLLoss2d", false, "it is a loss: losses run where training runs"},
    {"CrossMapLRN2d", false,
     "it is a legacy Lua-torch layer: LocalResponseNorm computes the same"},
    {"FractionalMaxPool", true,
     "its pooling regions are random per call and it has no state"},
    {"RReLU", false, "its slopes are random per call in training"},
    {"MaxUnpool", true, "it needs the indices of an earlier pooling"},
    {"SyncBatchNorm", false,
     "it is distributed-only: its training forward averages statistics "
     "across processes; BatchNorm1d/2d/3d hold the same state"},
};

constexpr absl::string_view kTorchNnNames[] = {
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveLogSoftmaxWithLoss",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AlphaDropout",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "BCELoss",
    "BCEWithLogitsLoss",
    "BatchNorm1d",
    "BatchNorm2d",
    "BatchNorm3d",
    "Bilinear",
    "CELU",
    "CTCLoss",
    "ChannelShuffle",
    "ConstantPad1d",
    "ConstantPad2d",
    "ConstantPad3d",
    "Container",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "CosineEmbeddingLoss",
    "CosineSimilarity",
    "CrossEntropyLoss",
    "CrossMapLRN2d",
    "Dropout",
    "Dropout1d",
    "Dropout2d",
    "Dropout3d",
    "ELU",
    "Embedding",
    "EmbeddingBag",
    "FeatureAlphaDropout",
    "Flatten",
    "Fold",
    "FractionalMaxPool2d",
    "FractionalMaxPool3d",
    "GELU",
    "GLU",
    "GRU",
    "GRUCell",
    "GaussianNLLLoss",
    "GroupNorm",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "HingeEmbeddingLoss",
    "HuberLoss",
    "Identity",
    "InstanceNorm1d",
    "InstanceNorm2d",
    "InstanceNorm3d",
    "KLDivLoss",
    "L1Loss",
    "LPPool1d",
    "LPPool2d",
    "LSTM",
    "LSTMCell",
    "LayerNorm",
    "LazyBatchNorm1d",
    "LazyBatchNorm2d",
    "LazyBatchNorm3d",
    "LazyConv1d",
    "LazyConv2d",
    "LazyConv3d",
    "LazyConvTranspose1d",
    "LazyConvTranspose2d",
    "LazyConvTranspose3d",
    "LazyInstanceNorm1d",
    "LazyInstanceNorm2d",
    "LazyInstanceNorm3d",
    "LazyLinear",
    "LeakyReLU",
    "Linear",
    "LocalResponseNorm",
    "LogSigmoid",
    "LogSoftmax",
    "MSELoss",
    "MarginRankingLoss",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MaxUnpool1d",
    "MaxUnpool2d",
    "MaxUnpool3d",
    "Mish",
    "Module",
    "ModuleDict",
    "ModuleList",
    "MultiLabelMarginLoss",
    "MultiLabelSoftMarginLoss",
    "MultiMarginLoss",
    "MultiheadAttention",
    "NLLLoss",
    "NLLLoss2d",
    "PReLU",
    "PairwiseDistance",
    "ParameterDict",
    "ParameterList",
    "PixelShuffle",
    "PixelUnshuffle",
    "PoissonNLLLoss",
    "RNN",
    "RNNBase",
    "RNNCell",
    "RNNCellBase",
    "RReLU",
    "ReLU",
    "ReLU6",
    "ReflectionPad1d",
    "ReflectionPad2d",
    "ReflectionPad3d",
    "ReplicationPad1d",
    "ReplicationPad2d",
    "ReplicationPad3d",
    "SELU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "SmoothL1Loss",
    "SoftMarginLoss",
    "Softmax",
    "Softmax2d",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "SyncBatchNorm",
    "Tanh",
    "Tanhshrink",
    "Threshold",
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "TripletMarginLoss",
    "TripletMarginWithDistanceLoss",
    "Unflatten",
    "Unfold",
    "Upsample",
    "UpsamplingBilinear2d",
    "UpsamplingNearest2d",
    "ZeroPad2d",
};

bool IsTorchNnName(absl::string_view type) {
  return std::find(std::begin(kTorchNnNames), std::end(kTorchNnNames), type) !=
         std::end(kTorchNnNames);
}

// Why torch.nn's `type` is not in the library.
std::string WhyLeftOut(absl::string_view type) {
  for (const LeftOut& l : kLeftOut) {
    if (l.prefix ? absl::StartsWith(type, l.prefix_or_name)
                 : type == l.prefix_or_name) {
      return std::string(l.why);
    }
  }
  if (absl::EndsWith(type, "Loss")) {
    return "it is a loss: losses run where training runs";
  }
  return "modelstate's library does not have it yet";
}

// Optimal-string-alignment distance (edits and adjacent transpositions)
// between the lower-cased `a` and `b`.
int EditDistance(absl::string_view a_in, absl::string_view b_in) {
  const std::string a = absl::AsciiStrToLower(a_in);
  const std::string b = absl::AsciiStrToLower(b_in);
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] =
          std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

}  // namespace

bool IsCustomSpec(const ModuleSpec& spec) {
  return spec.custom || !spec.members.empty() || !spec.ties.empty() ||
         spec.has_extra_state;
}

std::optional<std::string> ClosestLayerType(absl::string_view type) {
  // Names are at most a few dozen letters: the distance tables stay tiny.
  if (type.size() > 64) return std::nullopt;
  const int limit = std::max<int>(1, static_cast<int>(type.size()) / 3);
  std::optional<std::string> best;
  int best_distance = limit + 1;
  for (const std::string& candidate : LayerTypes()) {
    const int d = EditDistance(type, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best;
}

absl::Status UnknownTypeError(absl::string_view type,
                              const std::string& spec_path) {
  std::string message =
      absl::StrCat(spec_path, ".type: unknown layer type '", type, "'");
  if (IsTorchNnName(type)) {
    absl::StrAppend(&message, ": torch.nn.", type,
                    " is not in modelstate's library (", WhyLeftOut(type),
                    ").");
  } else if (std::optional<std::string> close = ClosestLayerType(type)) {
    absl::StrAppend(&message, "; did you mean '", *close, "'?");
  } else {
    absl::StrAppend(&message, ".");
  }
  absl::StrAppend(&message,
                  " A custom module lists its 'members', or sets 'custom': "
                  "true when it has none");
  return absl::InvalidArgumentError(message);
}

}  // namespace modelstate::internal
