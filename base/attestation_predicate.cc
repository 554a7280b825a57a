#include "base/attestation_predicate.h"

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/attestation.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

// The member `key` of `j`, or null when `j` is no object or lacks it. The
// predicate is read through this and type checks alone: nlohmann's
// operator[] on a missing key of a const object is undefined, and get<>()
// and value() of the wrong type throw.
const nlohmann::json* Member(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

absl::Status Malformed(absl::string_view where, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(where, " ", why));
}

// An audit record's seq: an integer of at least 1 (seqs count from 1).
absl::StatusOr<uint64_t> SeqAt(const nlohmann::json* seq,
                               absl::string_view where) {
  if (seq == nullptr || !seq->is_number_unsigned() ||
      seq->get<uint64_t>() == 0) {
    return Malformed(where, "is not an audit record seq (an integer >= 1)");
  }
  return seq->get<uint64_t>();
}

bool IsLowerHex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char ch : s) {
    if (!absl::ascii_isdigit(ch) && !(ch >= 'a' && ch <= 'f')) return false;
  }
  return true;
}

absl::Status ReadCheckpoint(const nlohmann::json& b, absl::string_view where,
                            CitedRecords& out) {
  const nlohmann::json* content = Member(b, "content");
  if (content == nullptr || !content->is_string()) {
    return Malformed(where, "has no content (text)");
  }
  if (!absl::Base64Unescape(content->get_ref<const std::string&>(),
                            &out.checkpoint_note) ||
      out.checkpoint_note.empty()) {
    return Malformed(absl::StrCat(where, ".content"),
                     "is not a base64 checkpoint note");
  }
  return absl::OkStatus();
}

absl::Status ReadRecords(const nlohmann::json& b, absl::string_view where,
                         CitedRecords& out) {
  const nlohmann::json* annotations = Member(b, "annotations");
  const nlohmann::json* records =
      annotations == nullptr ? nullptr : Member(*annotations, "records");
  if (records == nullptr || !records->is_array()) {
    return Malformed(absl::StrCat(where, ".annotations.records"),
                     "is missing or not an array");
  }
  std::set<uint64_t> seen;
  for (size_t i = 0; i < records->size(); ++i) {
    const nlohmann::json& r = (*records)[i];
    const std::string at = absl::StrCat(where, ".annotations.records[", i, "]");
    if (!r.is_object()) return Malformed(at, "is not an object");
    MODELSTATE_ASSIGN_OR_RETURN(
        uint64_t seq, SeqAt(Member(r, "seq"), absl::StrCat(at, ".seq")));
    // Each seq is one inclusion proof to fetch: a repeated one proves
    // nothing more and would let a statement ask for any number of them.
    if (!seen.insert(seq).second) {
      return Malformed(at, absl::StrCat("repeats seq ", seq));
    }
    const nlohmann::json* leaf = Member(r, "leaf_hash");
    if (leaf == nullptr || !leaf->is_string() ||
        !IsLowerHex64(leaf->get_ref<const std::string&>())) {
      return Malformed(absl::StrCat(at, ".leaf_hash"),
                       "is not a SHA-256 in lowercase hex");
    }
    out.records.emplace_back(seq, leaf->get<std::string>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CitedRecords> ReadCitedRecords(
    absl::string_view predicate_json) {
  if (JsonNestedDeeperThan(predicate_json, kMaxStatementJsonDepth)) {
    return Malformed(
        "the predicate",
        absl::StrCat("nests deeper than ", kMaxStatementJsonDepth, " levels"));
  }
  const nlohmann::json predicate =
      nlohmann::json::parse(predicate_json, nullptr, false);
  const nlohmann::json* run = Member(predicate, "runDetails");
  const nlohmann::json* byproducts =
      run == nullptr ? nullptr : Member(*run, "byproducts");
  if (byproducts == nullptr || !byproducts->is_array()) {
    return Malformed("runDetails.byproducts", "is missing or not an array");
  }
  CitedRecords out;
  bool checkpoint = false;
  bool records = false;
  for (size_t i = 0; i < byproducts->size(); ++i) {
    const nlohmann::json& b = (*byproducts)[i];
    const std::string where = absl::StrCat("runDetails.byproducts[", i, "]");
    if (!b.is_object()) return Malformed(where, "is not an object");
    // Byproducts of other names (participants, any a later server adds)
    // are not checked here.
    const nlohmann::json* name = Member(b, "name");
    if (name == nullptr || !name->is_string()) continue;
    const std::string& n = name->get_ref<const std::string&>();
    bool* seen = n == kCheckpointByproductName ? &checkpoint
                 : n == kRecordsByproductName  ? &records
                                               : nullptr;
    if (seen == nullptr) continue;
    // Two would leave it to the verifier which one the statement means.
    if (*seen) return Malformed(where, absl::StrCat("repeats ", n));
    *seen = true;
    MODELSTATE_RETURN_IF_ERROR(n == kCheckpointByproductName
                                   ? ReadCheckpoint(b, where, out)
                                   : ReadRecords(b, where, out));
  }
  if (!checkpoint) {
    return Malformed("runDetails.byproducts",
                     absl::StrCat("has no ", kCheckpointByproductName));
  }
  // Every module's life begins with a record (its build, or the move that
  // brought it): a statement citing none ties its digests to no history,
  // and must not pass as checked against the log.
  if (out.records.empty()) {
    return Malformed(
        "runDetails.byproducts",
        absl::StrCat("cite no audit records (", kRecordsByproductName, ")"));
  }
  const nlohmann::json* definition = Member(predicate, "buildDefinition");
  const nlohmann::json* external =
      definition == nullptr ? nullptr
                            : Member(*definition, "externalParameters");
  const nlohmann::json* build =
      external == nullptr ? nullptr : Member(*external, "build");
  if (build != nullptr) {
    const std::string where = "buildDefinition.externalParameters.build.seq";
    MODELSTATE_ASSIGN_OR_RETURN(out.build_seq,
                                SeqAt(Member(*build, "seq"), where));
    bool cited = false;
    for (const auto& record : out.records)
      cited |= record.first == *out.build_seq;
    if (!cited) {
      return Malformed(where, absl::StrCat(*out.build_seq,
                                           " is not among the cited records"));
    }
  }
  return out;
}

std::string AttestedModuleOf(absl::string_view predicate_json) {
  const nlohmann::json predicate =
      nlohmann::json::parse(predicate_json, nullptr, false);
  const nlohmann::json* definition = Member(predicate, "buildDefinition");
  const nlohmann::json* external =
      definition == nullptr ? nullptr
                            : Member(*definition, "externalParameters");
  const nlohmann::json* module =
      external == nullptr ? nullptr : Member(*external, "module");
  if (module == nullptr || !module->is_string()) return "";
  return module->get<std::string>();
}

}  // namespace modelstate
