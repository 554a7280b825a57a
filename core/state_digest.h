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
//   // A stream (LoadStateDict) hashed as it arrives:
//   StateDictStreamDigest stream(layout);
//   stream.Update(chunk);  // for each chunk, in order
//   MODELSTATE_ASSIGN_OR_RETURN(std::string loaded, stream.StateSha256());
//   // The file `modelstatectl get-state` would write from a reader:
//   MODELSTATE_ASSIGN_OR_RETURN(FileDigest file, StateFileSha256(*reader));
#ifndef MODELSTATE_CORE_STATE_DIGEST_H_
#define MODELSTATE_CORE_STATE_DIGEST_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/attestation.h"
#include "base/sha256.h"
#include "core/module.h"
#include "core/safetensors.h"
#include "core/state_stream.h"

namespace modelstate {

// Each entry's name, SHA-256 of its raw bytes (a CPU copy for tensors on
// another device), dtype and shape, in the state_dict's order, hashed on
// `threads` threads. FAILED_PRECONDITION naming the entry for a tensor
// without bytes (meta).
absl::StatusOr<std::vector<AttestedResource>> StateDictSubjects(
    const StateDict& state, int threads);

// One digest for a whole state_dict: the SHA-256 over the raw 32-byte
// SHA-256 digests of its entries, concatenated in key order (byte-wise, as
// std::string compares), the same rule as OMS's subject digest
// (base/attestation.h OmsStatement). Entry order does not change it.
// INVALID_ARGUMENT for a digest that is not SHA-256 hex.
absl::StatusOr<std::string> StateSha256(std::vector<AttestedResource> entries);

// Hashes a state_dict stream (a layout's entries' bytes back to back, as
// LoadStateDict receives them) chunk by chunk, each entry on its own,
// without keeping the bytes. Bytes past the layout's total are ignored (the
// stream's consumer refuses them). Thread-compatible.
class StateDictStreamDigest {
 public:
  explicit StateDictStreamDigest(const StateDictLayout& layout);

  void Update(absl::string_view bytes);
  // Whether every entry's bytes arrived.
  bool complete() const { return digests_.size() == sizes_.size(); }
  // Each entry's name and SHA-256, in layout order (annotations empty).
  // FAILED_PRECONDITION while bytes are missing.
  absl::StatusOr<std::vector<AttestedResource>> Entries() const;
  // StateSha256 of Entries().
  absl::StatusOr<std::string> StateSha256() const;

 private:
  // Finishes the entries that are complete (zero-byte ones included).
  void FinishCompleteEntries();

  std::vector<std::string> keys_;
  std::vector<uint64_t> sizes_;
  std::vector<std::string> digests_;  // of entries 0 .. digests_.size()-1
  std::unique_ptr<Sha256> current_;   // of entry digests_.size()
  uint64_t current_bytes_ = 0;
};

// A state file: the safetensors file `modelstatectl get-state` writes
// (client::SafetensorsSink): the stream's entries in stream order, with
// `__metadata__` {"format": "pt"} as PyTorch's safetensors writer puts it.
// Defined here so that the server can hash the very bytes the client
// writes without writing them (SignStateFile).
std::vector<SafetensorsEntry> StateFileEntries(const StateDictLayout& layout);
const std::vector<std::pair<std::string, std::string>>& StateFileMetadata();

struct FileDigest {
  std::string sha256;  // lowercase hex
  uint64_t bytes = 0;
};

// The SHA-256 and size of the state file of what `reader` serves, reading
// it to the end (not into memory). Errors: the header's (duplicate keys)
// and the reader's (a tensor on meta).
absl::StatusOr<FileDigest> StateFileSha256(StateDictReader& reader);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STATE_DIGEST_H_
