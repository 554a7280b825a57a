// File: forward_util.h
// Private to the layer families and the forward runner: what the layers'
// forward functions share. dtype handling (ATen's type names, float16 /
// bfloat16 widened to float32 for computing), output tensors, module
// attributes and entries with the errors forward reports for them, input
// checks, and the protocol of the layers that compute in float or double
// (FloatForward).
//
// Example (a layer that computes in float or double):
//   template <typename T>
//   absl::StatusOr<Tensor> ScaleForward(const LayerCall& call,
//                                       const Tensor& x, DType dtype) {
//     MODELSTATE_ASSIGN_OR_RETURN(double k, AttrDouble(call.module, "k"));
//     MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
//     for (int64_t i = 0; i < x.numel(); ++i) {
//       y.data[i] = Data<T>(x)[i] * static_cast<T>(k);
//     }
//     return y.tensor;
//   }
//   // In the family's table:
//   .forward = &FloatForward<&ScaleForward<float>, &ScaleForward<double>>
#ifndef MODELSTATE_NN_LAYERS_FORWARD_UTIL_H_
#define MODELSTATE_NN_LAYERS_FORWARD_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/status_macros.h"
#include "core/dtype.h"
#include "core/module.h"
#include "core/tensor.h"
#include "nn/forward_runner.h"

namespace modelstate::internal {

// ---------------------------------------------------------------------------
// Tensors and dtypes.

template <typename T>
constexpr DType DTypeOf() {
  return std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
}

// ATen's scalar type names, as its error texts print them ("Float").
std::string ScalarTypeName(DType dtype);

// float16 or bfloat16.
bool IsReduced(DType dtype);

// The dtype kernels compute in for tensors of `dtype`.
DType ComputeDType(DType dtype);

// `t` converted to `dtype` (itself when it has that dtype or is undefined).
absl::StatusOr<Tensor> ToDType(const Tensor& t, DType dtype);

// A floating `t` in its compute dtype; other tensors unchanged.
absl::StatusOr<Tensor> ToCompute(const Tensor& t);

// FAILED_PRECONDITION unless `t` is undefined or on the CPU.
absl::Status CheckCpu(const Tensor& t);

// A fresh output tensor and its writable data.
template <typename T>
struct Out {
  Tensor tensor;
  T* data = nullptr;
};

template <typename T>
absl::StatusOr<Out<T>> NewOut(Shape shape) {
  Out<T> out;
  MODELSTATE_ASSIGN_OR_RETURN(out.tensor,
                              Tensor::Empty(DTypeOf<T>(), std::move(shape)));
  MODELSTATE_ASSIGN_OR_RETURN(void* p, out.tensor.MutableDataForOverwrite());
  out.data = static_cast<T*>(p);
  return out;
}

// `t`'s elements, or nullptr for an undefined tensor (None).
template <typename T>
const T* Data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

// The product of shape[begin, end) (clipped to the shape).
int64_t Prod(const Shape& shape, size_t begin, size_t end);

// torch.norm(v, p) of v[0, n): the count of non-zeros for p = 0, the
// largest |v| for +inf, the smallest for -inf, (sum |v|^p)^(1/p) otherwise;
// 0 for an empty vector whatever p is, as ATen's reductions give.
double VectorNorm(const double* v, int64_t n, double p);

// "[2, 3]" as ATen prints sizes in most messages.
std::string Sizes(const Shape& shape);

// `dim` wrapped into [0, ndim) like ATen's maybe_wrap_dim, with its error.
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t ndim);

// ---------------------------------------------------------------------------
// Module attributes and entries. A missing attribute, or one of the wrong
// type, is FAILED_PRECONDITION: the module, not the input, is at fault.

absl::StatusOr<const AttrValue*> Attr(const Module& m, absl::string_view name);
// Whether `name` is None or absent.
bool AttrIsNone(const Module& m, absl::string_view name);
absl::StatusOr<int64_t> AttrInt(const Module& m, absl::string_view name);
// A float, or an int as a float.
absl::StatusOr<double> AttrDouble(const Module& m, absl::string_view name);
absl::StatusOr<bool> AttrBool(const Module& m, absl::string_view name);
absl::StatusOr<std::string> AttrStr(const Module& m, absl::string_view name);
// An int or a tuple of ints, as `n` values (an int or a 1-tuple repeats).
absl::StatusOr<std::vector<int64_t>> AttrInts(const Module& m,
                                              absl::string_view name, size_t n);

// The parameter or buffer `name` (undefined for None or absent).
Tensor Entry(const Module& m, absl::string_view name);

// Entry `name` ready for a kernel running on inputs of `dtype`: on the CPU,
// of the same dtype (PyTorch's message otherwise), widened like the input.
absl::StatusOr<Tensor> Param(const Module& m, absl::string_view name,
                             DType dtype);

// ---------------------------------------------------------------------------
// Input checks.

// INVALID_ARGUMENT unless `x` is a floating tensor (`op` names the
// operation in the message); FAILED_PRECONDITION off the CPU.
absl::Status CheckFloatingInput(const Tensor& x, absl::string_view op);

// INVALID_ARGUMENT unless there are `min` to `max` inputs and the first
// `min` are defined.
absl::Status CheckNumInputs(const Module& m, const std::vector<Tensor>& in,
                            size_t min, size_t max);

// ---------------------------------------------------------------------------
// Layers that compute in float or double.

// The inputs such a layer takes.
struct FloatInputs {
  size_t min = 1;
  size_t max = 1;
  // Floating inputs may differ from the first input's dtype (the layer
  // checks them itself).
  bool mixed_dtypes = false;
};

// The protocol of these layers: the first input must be a floating tensor;
// every floating input must have its dtype (unless mixed_dtypes); float16
// and bfloat16 inputs are widened to float32; the input count is checked;
// `compute` runs on the widened inputs with the first input's dtype; its
// floating outputs are rounded back to a reduced dtype.
absl::StatusOr<std::vector<Tensor>> RunFloatLayer(
    const LayerCall& call, const std::vector<Tensor>& in, FloatInputs inputs,
    absl::FunctionRef<
        absl::StatusOr<std::vector<Tensor>>(const std::vector<Tensor>&, DType)>
        compute);

// A compute function's result as the list of outputs a forward returns.
inline absl::StatusOr<std::vector<Tensor>> Outputs(
    absl::StatusOr<std::vector<Tensor>> outputs) {
  return outputs;
}
inline absl::StatusOr<std::vector<Tensor>> Outputs(
    absl::StatusOr<Tensor> output) {
  if (!output.ok()) return output.status();
  return std::vector<Tensor>{*std::move(output)};
}

// kFn's outputs for the widened inputs: kFn takes (const LayerCall&, const
// Tensor& input, DType) for layers of one input, or (const LayerCall&, const
// std::vector<Tensor>& inputs, DType), and returns absl::StatusOr<Tensor> or
// absl::StatusOr<std::vector<Tensor>>.
template <auto kFn>
absl::StatusOr<std::vector<Tensor>> CallFloatFn(
    const LayerCall& call, const std::vector<Tensor>& widened, DType dtype) {
  if constexpr (std::is_invocable_v<decltype(kFn), const LayerCall&,
                                    const Tensor&, DType>) {
    return Outputs(kFn(call, widened[0], dtype));
  } else {
    return Outputs(kFn(call, widened, dtype));
  }
}

// A layer forward (LayerForwardFn) running RunFloatLayer's protocol with
// kFloat for float32 compute and kDouble for float64 (see CallFloatFn): the
// first input's dtype is passed on, for the layers' checks of their
// parameters.
template <auto kFloat, auto kDouble, FloatInputs kInputs = FloatInputs{}>
absl::StatusOr<std::vector<Tensor>> FloatForward(
    const LayerCall& call, const std::vector<Tensor>& in) {
  return RunFloatLayer(
      call, in, kInputs,
      [&call](const std::vector<Tensor>& widened,
              DType dtype) -> absl::StatusOr<std::vector<Tensor>> {
        if (ComputeDType(dtype) == DType::kFloat32) {
          return CallFloatFn<kFloat>(call, widened, dtype);
        }
        return CallFloatFn<kDouble>(call, widened, dtype);
      });
}

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_FORWARD_UTIL_H_
