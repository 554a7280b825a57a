#include "core/init.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

absl::Status RequireFloating(const Tensor& tensor, absl::string_view op) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": tensor is None"));
  }
  if (!IsFloatingPoint(tensor.dtype())) {
    // ATen's dispatch error text.
    return absl::InvalidArgumentError(
        absl::StrCat("\"", op, "_cpu\" not implemented for '",
                     TorchDTypeName(tensor.dtype()).substr(6), "'"));
  }
  return absl::OkStatus();
}

// Runs `fill(data, count)` on the tensor's bytes (in host memory; tensors
// on an accelerator are filled on the host and copied over).
template <typename Fill>
absl::Status FillHost(Tensor& tensor, Fill fill) {
  if (!tensor.device().has_storage() || tensor.numel() == 0) {
    return absl::OkStatus();
  }
  if (tensor.device().is_cpu()) {
    MODELSTATE_ASSIGN_OR_RETURN(void* data, tensor.MutableDataForOverwrite());
    fill(data, tensor.numel());
    return absl::OkStatus();
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor host,
                              Tensor::Empty(tensor.dtype(), tensor.shape()));
  MODELSTATE_ASSIGN_OR_RETURN(void* data, host.MutableDataForOverwrite());
  fill(data, host.numel());
  return tensor.CopyFrom(host);
}

}  // namespace

absl::Status UniformInit(Tensor& tensor, double a, double b, Generator& gen) {
  MODELSTATE_RETURN_IF_ERROR(RequireFloating(tensor, "uniform"));
  DType dtype = tensor.dtype();
  return FillHost(tensor, [&](void* data, int64_t n) {
    gen.FillUniform(dtype, data, n, a, b);
  });
}

absl::Status NormalInit(Tensor& tensor, double mean, double std,
                        Generator& gen) {
  MODELSTATE_RETURN_IF_ERROR(RequireFloating(tensor, "normal"));
  DType dtype = tensor.dtype();
  return FillHost(tensor, [&](void* data, int64_t n) {
    gen.FillNormal(dtype, data, n, mean, std);
  });
}

absl::Status ConstantInit(Tensor& tensor, double value) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError("fill_: tensor is None");
  }
  DType dtype = tensor.dtype();
  return FillHost(tensor, [&](void* data, int64_t n) {
    char one[8];
    WriteElementFromDouble(one, dtype, 0, value);
    size_t es = ElementSize(dtype);
    char* out = static_cast<char*>(data);
    for (int64_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < es; ++j) out[i * es + j] = one[j];
    }
  });
}

absl::StatusOr<std::pair<int64_t, int64_t>> FanInAndFanOut(
    const Tensor& tensor) {
  if (tensor.dim() < 2) {
    return absl::InvalidArgumentError(
        "Fan in and fan out can not be computed for tensor with fewer than 2 "
        "dimensions");
  }
  int64_t receptive = 1;
  for (int64_t i = 2; i < tensor.dim(); ++i) receptive *= tensor.shape()[i];
  return std::make_pair(tensor.shape()[1] * receptive,
                        tensor.shape()[0] * receptive);
}

namespace {

// torch 1.13's xavier_* compute sqrt(2.0 / float(fan_in + fan_out)) with
// no zero-element early return (kaiming_* have one), so a tensor with no
// fans raises ZeroDivisionError there instead of drawing nothing.
absl::StatusOr<double> XavierStd(const Tensor& tensor, double gain) {
  MODELSTATE_ASSIGN_OR_RETURN(auto fans, FanInAndFanOut(tensor));
  if (fans.first + fans.second == 0) {
    return absl::InvalidArgumentError(
        "ZeroDivisionError: float division by zero (fan_in + fan_out is 0)");
  }
  return gain * std::sqrt(2.0 / static_cast<double>(fans.first + fans.second));
}

}  // namespace

absl::Status KaimingUniform(Tensor& tensor, double a, Generator& gen) {
  MODELSTATE_RETURN_IF_ERROR(RequireFloating(tensor, "uniform"));
  // A zero-element tensor is left alone (PyTorch warns
  // "Initializing zero-element tensors is a no-op").
  if (tensor.numel() == 0) return absl::OkStatus();
  MODELSTATE_ASSIGN_OR_RETURN(auto fans, FanInAndFanOut(tensor));
  // The same double arithmetic as torch/nn/init.py: calculate_gain squares
  // the slope (sqrt(5)**2 is 5.000000000000001), then std and bound.
  double gain = std::sqrt(2.0 / (1.0 + a * a));
  double std = gain / std::sqrt(static_cast<double>(fans.first));
  double bound = std::sqrt(3.0) * std;
  return UniformInit(tensor, -bound, bound, gen);
}

absl::Status XavierUniform(Tensor& tensor, double gain, Generator& gen) {
  MODELSTATE_RETURN_IF_ERROR(RequireFloating(tensor, "uniform"));
  MODELSTATE_ASSIGN_OR_RETURN(double std, XavierStd(tensor, gain));
  double a = std::sqrt(3.0) * std;
  return UniformInit(tensor, -a, a, gen);
}

absl::Status XavierNormal(Tensor& tensor, double gain, Generator& gen) {
  MODELSTATE_RETURN_IF_ERROR(RequireFloating(tensor, "normal"));
  MODELSTATE_ASSIGN_OR_RETURN(double std, XavierStd(tensor, gain));
  return NormalInit(tensor, 0.0, std, gen);
}

}  // namespace modelstate
