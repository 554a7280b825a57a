// File: forward.h
// Forward execution of modelstate's built-in layers on the CPU, following
// PyTorch's `Module.__call__`: the forward hooks (forward_hooks.h) run around
// every module call, submodule calls included, and layers compute what
// `torch.nn` computes (shared/SEMANTICS.md; PyTorch 2.x where 1.13 differs).
// Matrix products go through OpenBLAS (sgemm / dgemm); convolutions are
// im2col + gemm.
//
// Inputs and outputs are positional tensor lists; an undefined Tensor stands
// for None. Per module type (the type_name of a built-in layer):
//
//   Linear, Identity, activations (ReLU, GELU, SiLU, Tanh, Sigmoid),
//   Softmax, Flatten, Dropout, LayerNorm, GroupNorm, BatchNorm1d/2d,
//   Conv1d, Conv2d, ConvTranspose2d, AdaptiveAvgPool2d:
//                       [input]                   -> [output]
//   MaxPool2d:          [input]                   -> [output] or, with
//                                                    return_indices,
//                                                    [output, indices]
//   Embedding:          [indices (int64/int32)]   -> [embeddings]
//   Bilinear:           [input1, input2]          -> [output]
//   MultiheadAttention: [query, key, value, key_padding_mask?, attn_mask?]
//                       -> [attn_output, attn_weights] (need_weights=True and
//                          average_attn_weights=True, PyTorch's defaults)
//   TransformerEncoderLayer: [src, src_mask?, src_key_padding_mask?] -> [out]
//   Sequential:         inputs of the first child -> outputs of the last
//                       (each child gets the previous child's outputs)
//   ModuleList, ModuleDict and custom modules have no forward (PyTorch raises
//   NotImplementedError): UNIMPLEMENTED.
//
// dtypes: float32 and float64 compute natively; float16 and bfloat16 compute
// in float32 and round the results back (round to nearest even). Inputs must
// have the parameters' dtype, as in PyTorch.
//
// Training mode (Module::Train) matters to BatchNorm (batch statistics;
// running_mean, running_var and num_batches_tracked are updated in place as
// PyTorch does, momentum=None being the cumulative average), Dropout (and the
// dropout inside MultiheadAttention / TransformerEncoderLayer), which draws
// its mask from ForwardOptions' generator. Dropout masks are deterministic
// for a seed but are not the masks torch draws for the same seed.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(BuildResult built, BuildModule(spec, {}));
//   built.root->Eval();
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor x, Tensor::Zeros(DType::kFloat32,
//                                                       {8, 784}));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> y,
//                               Forward(*built.root, {x}));
//   // y[0]: float32[8, 10]
#ifndef MODELSTATE_NN_FORWARD_H_
#define MODELSTATE_NN_FORWARD_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/generator.h"
#include "core/module.h"
#include "core/tensor.h"

namespace modelstate {

struct ForwardOptions {
  // Where Dropout draws its masks in training mode. Not owned; may be null,
  // and then a Generator(seed) local to the call is used.
  Generator* generator = nullptr;
  uint64_t seed = 0;
  // Threads for OpenBLAS and for the kernels' own parallel loops. 0 keeps
  // OpenBLAS's current setting (all cores by default). OpenBLAS's thread
  // count is process-wide: concurrent forwards with different values race
  // for it (results are unaffected, only speed).
  int num_threads = 0;
};

// Runs `module` on `inputs` as `module(*inputs)` does in PyTorch, hooks
// included. Modifies the module only where PyTorch's forward does
// (BatchNorm's running statistics in training mode, Embedding's max_norm
// renormalisation of its weight).
//
// Errors (the module is unchanged by a failed call, except for changes made
// by submodules that ran before the failure, as in PyTorch):
//  - INVALID_ARGUMENT with PyTorch's message for inputs of the wrong number,
//    shape or dtype ("mat1 and mat2 shapes cannot be multiplied (2x5 and
//    4x3)", "expected 4D input (got 3D input)", ...) or an index out of range;
//  - UNIMPLEMENTED for modules without a forward (containers other than
//    Sequential, custom modules: 'Module [ModuleList] is missing the
//    required "forward" function') and for unsupported options;
//  - FAILED_PRECONDITION for tensors that are not on the CPU (meta);
//  - RESOURCE_EXHAUSTED when a size exceeds what OpenBLAS can index;
//  - whatever status a hook returns.
absl::StatusOr<std::vector<Tensor>> Forward(Module& module,
                                            std::vector<Tensor> inputs,
                                            const ForwardOptions& options = {});

// Registers a global forward pre-hook / forward hook, run for every module
// before the module's own hooks (PyTorch's
// register_module_forward_pre_hook / register_module_forward_hook).
RemovableHandle RegisterGlobalForwardPreHook(ForwardPreHook hook,
                                             bool prepend = false);
RemovableHandle RegisterGlobalForwardHook(ForwardHook hook,
                                          bool prepend = false);

}  // namespace modelstate

#endif  // MODELSTATE_NN_FORWARD_H_
