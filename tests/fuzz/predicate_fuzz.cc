// libFuzzer target for what verify-attestation reads from a signed
// statement before it trusts any of it: the in-toto statement
// (InTotoStatementFromJson) and the SLSA predicate's cited records
// (ReadCitedRecords, AttestedModuleOf). Each input is read both as a whole
// statement (its predicate then read in turn) and as a bare predicate. A
// signature does not make the predicate's shape trustworthy (a server bug,
// a stolen key), so no input may crash, throw or read out of bounds, and
// what the reader accepts must hold what --online relies on; anything
// else aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/attestation.h"
#include "base/attestation_predicate.h"
#include "tests/fuzz/fuzz_support.h"

namespace modelstate {
namespace {

using fuzz::Passed;

[[noreturn]] void Broken(const char* what) {
  std::fprintf(stderr, "predicate_fuzz: invariant broken: %s\n", what);
  std::abort();
}

bool IsLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char ch : s) {
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

// What CheckInclusions and CheckIncarnation take for granted: a
// checkpoint to open, at least one record, seqs from 1 and each once (one
// proof each), leaf hashes as 64 lowercase hex digits, and a build seq
// among the records.
void CheckAccepted(const CitedRecords& cited) {
  if (cited.checkpoint_note.empty()) Broken("an empty checkpoint note");
  if (cited.records.empty()) Broken("no cited record");
  std::set<uint64_t> seqs;
  for (const auto& [seq, leaf] : cited.records) {
    if (seq == 0) Broken("seq 0");
    if (!seqs.insert(seq).second) Broken("a seq cited twice");
    if (!IsLowerHex64(leaf)) Broken("a leaf hash that is not lowercase hex");
  }
  if (cited.build_seq.has_value() && !seqs.contains(*cited.build_seq)) {
    Broken("a build seq not among the records");
  }
}

void ReadPredicate(absl::string_view predicate) {
  absl::StatusOr<CitedRecords> cited = ReadCitedRecords(predicate);
  if (Passed("predicate", cited.status())) CheckAccepted(*cited);
  AttestedModuleOf(predicate);
}

void FuzzOne(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<InTotoStatement> statement = InTotoStatementFromJson(input);
  if (Passed("statement", statement.status())) {
    ReadPredicate(statement->predicate_json);
  }
  ReadPredicate(input);
}

}  // namespace
}  // namespace modelstate

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  modelstate::FuzzOne(data, size);
  return 0;
}
