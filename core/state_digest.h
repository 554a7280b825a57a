// File: state_digest.h
// What attestations say about a state_dict's tensors: for each entry, the
// SHA-256 of its raw bytes exactly as a safetensors file stores them
// (little-endian, row-major), with its dtype and shape. The server signs
// these (service/attestation.h) and a verifier recomputes them from a
// safetensors file or a module it downloads (client/cli/attest.cc).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict sd, ReadSafetensorsFile(path));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<AttestedResource> digests,
//                               StateDictSubjects(sd, /*threads=*/2));
//   // digests[i].name == key, .sha256 == hex, .annotations_json ==
//   // {"dtype":"float32","shape":[256,784]}
#ifndef MODELSTATE_CORE_STATE_DIGEST_H_
#define MODELSTATE_CORE_STATE_DIGEST_H_

#include <vector>

#include "absl/status/statusor.h"
#include "base/attestation.h"
#include "core/module.h"

namespace modelstate {

// Each entry's name, SHA-256 of its raw bytes (a CPU copy for tensors on
// another device), dtype and shape, in the state_dict's order, hashed on
// `threads` threads. FAILED_PRECONDITION naming the entry for a tensor
// without bytes (meta).
absl::StatusOr<std::vector<AttestedResource>> StateDictSubjects(
    const StateDict& state, int threads);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STATE_DIGEST_H_
