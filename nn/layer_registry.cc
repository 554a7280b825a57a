#include "nn/layer_registry.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace modelstate::internal {
namespace {

using FamilyFn = std::vector<LayerDef> (*)();

// The families in the order LayerTypes() lists their types: PyTorch's
// layers first, the containers last. One line per family.
constexpr FamilyFn kFamilies[] = {
    &LinearFamily,         // Identity, Linear, Bilinear, out_proj's type
    &ConvFamily,           // Conv1d, Conv2d, ConvTranspose2d
    &NormalizationFamily,  // BatchNorm1d/2d, LayerNorm, GroupNorm
    &EmbeddingFamily,      // Embedding
    &DropoutFamily,        // Dropout, Dropout1d/2d/3d, AlphaDropout
    &ActivationFamily,     // ReLU, GELU, SiLU, Tanh, Sigmoid, Softmax
    &FlattenFamily,        // Flatten, Unflatten
    &PoolingFamily,        // Max/Avg/AdaptiveAvg/AdaptiveMaxPool1d/2d/3d
    &PixelShuffleFamily,   // PixelShuffle, PixelUnshuffle, ChannelShuffle
    &UpsamplingFamily,     // Upsample, UpsamplingNearest2d/Bilinear2d
    &PaddingFamily,      // ZeroPad2d, ConstantPad/ReflectionPad/ReplicationPad
    &AttentionFamily,    // MultiheadAttention
    &TransformerFamily,  // TransformerEncoderLayer
    &RecurrentFamily,    // RNN, LSTM, GRU and their cells
    &DistanceFamily,     // PairwiseDistance, CosineSimilarity
    &FoldFamily,         // Fold, Unfold
    &ContainerFamily,    // Sequential, ModuleList, ModuleDict
};

using LayerIndex = absl::flat_hash_map<absl::string_view, const LayerDef*>;

const LayerIndex& Index() {
  static const LayerIndex* const index = [] {
    auto* index = new LayerIndex;
    // The keys view the entries' own type strings, which live as long as
    // AllLayers().
    for (const LayerDef& def : AllLayers()) index->emplace(def.type, &def);
    return index;
  }();
  return *index;
}

}  // namespace

const std::vector<LayerDef>& AllLayers() {
  static const std::vector<LayerDef>* const layers = [] {
    auto* layers = new std::vector<LayerDef>;
    for (FamilyFn family : kFamilies) {
      for (LayerDef& def : family()) layers->push_back(std::move(def));
    }
    return layers;
  }();
  return *layers;
}

const LayerDef* FindLayer(absl::string_view type) {
  const LayerIndex& index = Index();
  auto it = index.find(type);
  return it == index.end() ? nullptr : it->second;
}

bool IsBuildable(const LayerDef& def) {
  return def.build != nullptr || def.build_container != nullptr;
}

}  // namespace modelstate::internal
