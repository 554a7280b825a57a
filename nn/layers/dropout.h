// File: dropout.h
// Private to the layer families: a Dropout module, which
// TransformerEncoderLayer holds three of, and training-mode dropout applied
// as a function (between the layers of a multi-layer RNN).
//
// Example:
//   std::shared_ptr<Module> d = NewDropout(0.1, /*inplace=*/false);
//   DropoutInPlace(data, n, 0.2, call.runner.gen());
#ifndef MODELSTATE_NN_LAYERS_DROPOUT_H_
#define MODELSTATE_NN_LAYERS_DROPOUT_H_

#include <cstdint>
#include <memory>

#include "core/generator.h"
#include "core/module.h"

namespace modelstate::internal {

// Dropout(p, inplace), `p` unchecked.
std::shared_ptr<Module> NewDropout(double p, bool inplace);

// Training-mode dropout of data[0, n) in place: each element is zeroed with
// probability p, drawing from `gen`, and the others are scaled by
// 1 / (1 - p). T is float or double.
template <typename T>
void DropoutInPlace(T* data, int64_t n, double p, Generator& gen);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_DROPOUT_H_
