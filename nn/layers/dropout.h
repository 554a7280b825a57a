// File: dropout.h
// Private to the layer families: a Dropout module, which
// TransformerEncoderLayer holds three of.
//
// Example:
//   std::shared_ptr<Module> d = NewDropout(0.1, /*inplace=*/false);
#ifndef MODELSTATE_NN_LAYERS_DROPOUT_H_
#define MODELSTATE_NN_LAYERS_DROPOUT_H_

#include <memory>

#include "core/module.h"

namespace modelstate::internal {

// Dropout(p, inplace), `p` unchecked.
std::shared_ptr<Module> NewDropout(double p, bool inplace);

}  // namespace modelstate::internal

#endif  // MODELSTATE_NN_LAYERS_DROPOUT_H_
