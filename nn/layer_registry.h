// File: layer_registry.h
// Private to nn: the one table of the library's layer types. Each entry
// holds everything modelstate knows about a type: its name and torch's
// qualified name, its constructor signature, how to build it and how to run
// its forward. The builder (builder.cc) and the forward runner (forward.cc)
// both look types up here, so a type is known to both or to neither.
//
// Entries come from the layer families, one file each in nn/layers/ (the
// family of "Conv2d" is nn/layers/conv.cc). A family file defines its
// layers' build and forward functions and returns their entries from its
// `<Name>Family()` function. Adding a family: write nn/layers/<name>.cc
// (listed in nn/CMakeLists.txt) and add its function to kFamilies in
// layer_registry.cc, declared below.
//
// Example (a family file):
//   std::vector<LayerDef> FlattenFamily() {
//     return {{.type = "Flatten",
//              .qualified_name = "torch.nn.modules.flatten.Flatten",
//              .signature = {{"start_dim", I(1)}, {"end_dim", I(-1)}},
//              .build = &BuildFlatten,
//              .forward = &FlattenForward}};
//   }
#ifndef MODELSTATE_NN_LAYER_REGISTRY_H_
#define MODELSTATE_NN_LAYER_REGISTRY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/build_context.h"
#include "nn/forward_runner.h"
#include "nn/module_spec.h"

namespace modelstate::internal {

// Builds a layer from its bound constructor arguments, registering its
// entries through `ctx`; `path` is the layer's place in the module tree.
using LayerBuildFn = absl::StatusOr<std::shared_ptr<Module>> (*)(
    const BoundArgs& args, BuildContext& ctx, const std::string& path);

// Builds a container from its spec's children (spec_path: where the spec
// is, for error messages).
using ContainerBuildFn = absl::StatusOr<std::shared_ptr<Module>> (*)(
    const ModuleSpec& spec, const std::string& path,
    const std::string& spec_path, BuildContext& ctx);

// Runs a layer's forward on its inputs, as given to the module call (on
// the CPU; anything else is the forward's to check).
using LayerForwardFn = absl::StatusOr<std::vector<Tensor>> (*)(
    const LayerCall& call, const std::vector<Tensor>& in);

// One layer type.
struct LayerDef {
  absl::string_view type;            // "Linear"
  absl::string_view qualified_name;  // "torch.nn.modules.linear.Linear"
  // Constructor arguments after `self`, in order.
  std::vector<ArgDef> signature = {};
  // How specs build the type: from arguments (layers) or from children
  // (containers). Neither for types that only exist inside other layers
  // (MultiheadAttention's NonDynamicallyQuantizableLinear): specs cannot
  // name those, and a spec of that type is a custom module.
  LayerBuildFn build = nullptr;
  ContainerBuildFn build_container = nullptr;
  // nullptr: the type has no forward (PyTorch raises NotImplementedError;
  // Forward() returns UNIMPLEMENTED).
  LayerForwardFn forward = nullptr;
  // Identity(*args, **kwargs): any arguments, all ignored.
  bool accepts_anything = false;
};

// Every entry, family by family in kFamilies' order (the order
// LayerTypes() lists the types in).
const std::vector<LayerDef>& AllLayers();

// The entry of `type`, or nullptr. One hash lookup.
const LayerDef* FindLayer(absl::string_view type);

// Whether specs can build the type (it has `build` or `build_container`).
bool IsBuildable(const LayerDef& def);

// The families, one per file in nn/layers/.
std::vector<LayerDef> LinearFamily();         // linear.cc
std::vector<LayerDef> ConvFamily();           // conv.cc
std::vector<LayerDef> NormalizationFamily();  // normalization.cc
std::vector<LayerDef> EmbeddingFamily();      // embedding.cc
std::vector<LayerDef> DropoutFamily();        // dropout.cc
std::vector<LayerDef> ActivationFamily();     // activation.cc
std::vector<LayerDef> FlattenFamily();        // flatten.cc
std::vector<LayerDef> PoolingFamily();        // pooling.cc
std::vector<LayerDef> PixelShuffleFamily();   // pixel_shuffle.cc
std::vector<LayerDef> UpsamplingFamily();     // upsampling.cc
std::vector<LayerDef> PaddingFamily();        // padding.cc
std::vector<LayerDef> AttentionFamily();      // attention.cc
std::vector<LayerDef> TransformerFamily();    // transformer.cc
std::vector<LayerDef> RecurrentFamily();      // recurrent.cc
std::vector<LayerDef> DistanceFamily();       // distance.cc
std::vector<LayerDef> FoldFamily();           // fold.cc
std::vector<LayerDef> ContainerFamily();      // container.cc

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYER_REGISTRY_H_
