// File: init.h
// PyTorch's torch.nn.init on modelstate tensors, drawing from a Generator
// exactly as PyTorch's CPU kernels do, so that a build with seed s gives the
// values `torch.manual_seed(s)` gives. On meta tensors every function is a
// no-op that draws nothing (PyTorch's meta kernels do not touch the
// generator either).
//
// Example:
//   Generator gen(0);
//   MODELSTATE_RETURN_IF_ERROR(KaimingUniform(weight, std::sqrt(5.0), gen));
#ifndef MODELSTATE_CORE_INIT_H_
#define MODELSTATE_CORE_INIT_H_

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/generator.h"
#include "core/tensor.h"

namespace modelstate {

// tensor.uniform_(a, b). INVALID_ARGUMENT for a non-floating tensor.
absl::Status UniformInit(Tensor& tensor, double a, double b, Generator& gen);
// tensor.normal_(mean, std). INVALID_ARGUMENT for a non-floating tensor.
absl::Status NormalInit(Tensor& tensor, double mean, double std,
                        Generator& gen);
// tensor.fill_(value) (any dtype; value converted like PyTorch's fill_).
absl::Status ConstantInit(Tensor& tensor, double value);

// init._calculate_fan_in_and_fan_out: INVALID_ARGUMENT with PyTorch's text
// ("Fan in and fan out can not be computed for tensor with fewer than 2
// dimensions") below 2 dims.
absl::StatusOr<std::pair<int64_t, int64_t>> FanInAndFanOut(
    const Tensor& tensor);

// init.kaiming_uniform_(tensor, a, mode="fan_in", nonlinearity="leaky_relu").
absl::Status KaimingUniform(Tensor& tensor, double a, Generator& gen);
// init.xavier_uniform_(tensor, gain) and init.xavier_normal_(tensor, gain).
absl::Status XavierUniform(Tensor& tensor, double gain, Generator& gen);
absl::Status XavierNormal(Tensor& tensor, double gain, Generator& gen);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_INIT_H_
