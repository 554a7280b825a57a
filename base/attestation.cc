#include "base/attestation.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

using OrderedJson = nlohmann::ordered_json;

absl::Status StatementError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("in-toto statement: ", field, " ", what));
}

// Whether `j` is an object whose member `key` is the text `text`. Unlike
// nlohmann's value(key, default), a member of another type (a number where
// text belongs, in a file or a signed statement) is a mismatch, not an
// exception.
bool HasText(const OrderedJson& j, const char* key, absl::string_view text) {
  if (!j.is_object()) return false;
  auto it = j.find(key);
  return it != j.end() && it->is_string() &&
         it->get_ref<const std::string&>() == text;
}

// `text` parsed as a JSON object, or INVALID_ARGUMENT naming `field`.
absl::StatusOr<OrderedJson> ObjectOf(absl::string_view text,
                                     absl::string_view field) {
  if (JsonNestedDeeperThan(text, kMaxStatementJsonDepth)) {
    return StatementError(
        field,
        absl::StrCat("nests deeper than ", kMaxStatementJsonDepth, " levels"));
  }
  OrderedJson value = OrderedJson::parse(text, nullptr, false);
  if (value.is_discarded() || !value.is_object()) {
    return StatementError(field, "is not a JSON object");
  }
  return value;
}

absl::StatusOr<OrderedJson> ResourceJson(const AttestedResource& r,
                                         absl::string_view field) {
  if (!IsSha256Hex(r.sha256)) {
    return StatementError(field, "has a digest that is not SHA-256 hex");
  }
  OrderedJson out = {{"name", r.name}, {"digest", {{"sha256", r.sha256}}}};
  if (!r.annotations_json.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        out["annotations"],
        ObjectOf(r.annotations_json, absl::StrCat(field, ".annotations")));
  }
  return out;
}

absl::StatusOr<AttestedResource> ResourceFromJson(const OrderedJson& j,
                                                  absl::string_view field) {
  if (!j.is_object()) return StatementError(field, "is not an object");
  AttestedResource r;
  auto name = j.find("name");
  if (name != j.end()) {
    if (!name->is_string()) return StatementError(field, "name is not text");
    r.name = name->get<std::string>();
  }
  auto digest = j.find("digest");
  if (digest == j.end() || !digest->is_object() ||
      !digest->contains("sha256") || !(*digest)["sha256"].is_string() ||
      !IsSha256Hex((*digest)["sha256"].get<std::string>())) {
    return StatementError(field, "has no SHA-256 digest (digest.sha256)");
  }
  r.sha256 = (*digest)["sha256"].get<std::string>();
  auto annotations = j.find("annotations");
  if (annotations != j.end()) {
    if (!annotations->is_object()) {
      return StatementError(field, "annotations is not an object");
    }
    r.annotations_json = annotations->dump();
  }
  return r;
}

// OMS's predicate for `files` (sorted), whose digests `subject` covers.
OrderedJson OmsPredicate(absl::Span<const AttestedResource> files) {
  OrderedJson resources = OrderedJson::array();
  for (const AttestedResource& f : files) {
    resources.push_back(
        {{"algorithm", "sha256"}, {"digest", f.sha256}, {"name", f.name}});
  }
  return {{"serialization",
           {{"method", "files"},
            {"hash_type", "sha256"},
            {"allow_symlinks", false},
            {"ignore_paths", OrderedJson::array()}}},
          {"resources", std::move(resources)}};
}

absl::Status BundleError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("OMS bundle: ", what));
}

// The resources an OMS predicate lists, in its order.
absl::StatusOr<std::vector<AttestedResource>> OmsResources(
    const OrderedJson& predicate) {
  if (!predicate.contains("serialization") ||
      !HasText(predicate["serialization"], "method", "files")) {
    return BundleError("predicate.serialization.method is not \"files\"");
  }
  if (!predicate.contains("resources") || !predicate["resources"].is_array()) {
    return BundleError("predicate.resources is missing");
  }
  std::vector<AttestedResource> files;
  for (const OrderedJson& r : predicate["resources"]) {
    if (!r.is_object() || !HasText(r, "algorithm", "sha256") ||
        !r.contains("digest") || !r["digest"].is_string() ||
        !IsSha256Hex(r["digest"].get<std::string>()) || !r.contains("name") ||
        !r["name"].is_string()) {
      return BundleError(absl::StrCat("predicate.resources[", files.size(),
                                      "] is not a sha256 resource"));
    }
    files.push_back(
        {r["name"].get<std::string>(), r["digest"].get<std::string>(), ""});
  }
  return files;
}

}  // namespace

bool JsonNestedDeeperThan(absl::string_view json, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char ch : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (ch == '\\') {
        escaped = true;
      } else if (ch == '"') {
        in_string = false;
      }
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      if (++depth > max_depth) return true;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return false;
}

std::vector<std::string> Sha256HexAll(
    absl::Span<const absl::string_view> buffers, int threads) {
  std::vector<std::string> out(buffers.size());
  const size_t workers =
      std::clamp<size_t>(threads < 1 ? 1 : threads, 1, buffers.size() + 1);
  // Largest first, each to the thread with the fewest bytes so far.
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return buffers[a].size() > buffers[b].size();
  });
  std::vector<std::vector<size_t>> work(workers);
  std::vector<uint64_t> load(workers, 0);
  for (size_t i : order) {
    const size_t w = std::min_element(load.begin(), load.end()) - load.begin();
    work[w].push_back(i);
    load[w] += buffers[i].size() + 1;
  }
  auto hash = [&](const std::vector<size_t>& mine) {
    for (size_t i : mine) out[i] = Sha256Hex(buffers[i]);
  };
  std::vector<std::thread> pool;
  for (size_t w = 1; w < workers; ++w) {
    if (!work[w].empty()) pool.emplace_back(hash, std::cref(work[w]));
  }
  hash(work[0]);
  for (std::thread& t : pool) t.join();
  return out;
}

absl::StatusOr<std::string> Sha256OfDigests(
    absl::Span<const std::string> hex_digests) {
  Sha256 hash;
  for (size_t i = 0; i < hex_digests.size(); ++i) {
    if (!IsSha256Hex(hex_digests[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("digest ", i, " is not SHA-256 hex"));
    }
    hash.Update(absl::HexStringToBytes(hex_digests[i]));
  }
  return hash.FinishHex();
}

absl::StatusOr<std::string> InTotoStatementToJson(const InTotoStatement& s) {
  OrderedJson subjects = OrderedJson::array();
  for (size_t i = 0; i < s.subjects.size(); ++i) {
    MODELSTATE_ASSIGN_OR_RETURN(
        subjects.emplace_back(),
        ResourceJson(s.subjects[i], absl::StrCat("subject[", i, "]")));
  }
  MODELSTATE_ASSIGN_OR_RETURN(OrderedJson predicate,
                              ObjectOf(s.predicate_json, "predicate"));
  OrderedJson out = {{"_type", kInTotoStatementType},
                     {"subject", std::move(subjects)},
                     {"predicateType", s.predicate_type},
                     {"predicate", std::move(predicate)}};
  return out.dump();
}

absl::StatusOr<InTotoStatement> InTotoStatementFromJson(
    absl::string_view json) {
  MODELSTATE_ASSIGN_OR_RETURN(OrderedJson j, ObjectOf(json, "(the whole)"));
  if (!HasText(j, "_type", kInTotoStatementType)) {
    return StatementError(
        "_type", absl::StrCat("is not \"", kInTotoStatementType, "\""));
  }
  InTotoStatement s;
  if (!j.contains("subject") || !j["subject"].is_array() ||
      j["subject"].empty()) {
    return StatementError("subject", "is missing or empty");
  }
  for (const OrderedJson& subject : j["subject"]) {
    MODELSTATE_ASSIGN_OR_RETURN(
        s.subjects.emplace_back(),
        ResourceFromJson(subject,
                         absl::StrCat("subject[", s.subjects.size(), "]")));
  }
  if (!j.contains("predicateType") || !j["predicateType"].is_string()) {
    return StatementError("predicateType", "is missing or not text");
  }
  s.predicate_type = j["predicateType"].get<std::string>();
  if (!j.contains("predicate") || !j["predicate"].is_object()) {
    return StatementError("predicate", "is missing or not an object");
  }
  s.predicate_json = j["predicate"].dump();
  return s;
}

absl::StatusOr<InTotoStatement> OmsStatement(
    absl::string_view model_name, std::vector<AttestedResource> files) {
  std::sort(files.begin(), files.end(),
            [](const AttestedResource& a, const AttestedResource& b) {
              return a.name < b.name;
            });
  std::vector<std::string> digests;
  for (const AttestedResource& f : files) digests.push_back(f.sha256);
  InTotoStatement s;
  MODELSTATE_ASSIGN_OR_RETURN(std::string subject, Sha256OfDigests(digests));
  s.subjects.push_back({std::string(model_name), std::move(subject), ""});
  s.predicate_type = std::string(kOmsPredicateType);
  s.predicate_json = OmsPredicate(files).dump();
  return s;
}

absl::StatusOr<std::string> SignOmsBundle(absl::string_view model_name,
                                          std::vector<AttestedResource> files,
                                          const Ed25519PrivateKey& key) {
  MODELSTATE_ASSIGN_OR_RETURN(InTotoStatement statement,
                              OmsStatement(model_name, std::move(files)));
  MODELSTATE_ASSIGN_OR_RETURN(std::string payload,
                              InTotoStatementToJson(statement));
  MODELSTATE_ASSIGN_OR_RETURN(
      DsseEnvelope envelope,
      SignDsse(kInTotoPayloadType, std::move(payload), key));
  OrderedJson bundle = {
      {"mediaType", kSigstoreBundleMediaType},
      {"verificationMaterial",
       {{"publicKey", {{"hint", DsseKeyId(key.public_key())}}},
        {"tlogEntries", OrderedJson::array()}}},
      {"dsseEnvelope", OrderedJson::parse(DsseToJson(envelope))}};
  return bundle.dump(2) + "\n";
}

absl::StatusOr<std::vector<AttestedResource>> VerifyOmsBundle(
    absl::string_view bundle_json, absl::string_view public_key) {
  // Before the parse: the bundle is anyone's file until its signature is
  // checked, and its envelope is dumped (recursively) to be read.
  if (JsonNestedDeeperThan(bundle_json, kMaxStatementJsonDepth)) {
    return BundleError(
        absl::StrCat("nests deeper than ", kMaxStatementJsonDepth, " levels"));
  }
  OrderedJson bundle = OrderedJson::parse(bundle_json, nullptr, false);
  if (bundle.is_discarded() || !bundle.is_object()) {
    return BundleError("not a JSON object");
  }
  if (!HasText(bundle, "mediaType", kSigstoreBundleMediaType)) {
    return BundleError(
        absl::StrCat("mediaType is not \"", kSigstoreBundleMediaType, "\""));
  }
  if (!bundle.contains("dsseEnvelope")) {
    return BundleError("dsseEnvelope is missing");
  }
  MODELSTATE_ASSIGN_OR_RETURN(DsseEnvelope envelope,
                              DsseFromJson(bundle["dsseEnvelope"].dump()));
  MODELSTATE_RETURN_IF_ERROR(VerifyDsse(envelope, public_key));
  // DSSE: a payload type the verifier does not expect is rejected, even
  // under a good signature; OMS's statement is an in-toto one.
  if (envelope.payload_type != kInTotoPayloadType) {
    return BundleError(absl::StrCat("payloadType is \"", envelope.payload_type,
                                    "\", not \"", kInTotoPayloadType, "\""));
  }
  MODELSTATE_ASSIGN_OR_RETURN(InTotoStatement statement,
                              InTotoStatementFromJson(envelope.payload));
  if (statement.predicate_type != kOmsPredicateType) {
    return BundleError(
        absl::StrCat("predicateType is not \"", kOmsPredicateType, "\""));
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<AttestedResource> files,
      OmsResources(OrderedJson::parse(statement.predicate_json)));
  std::vector<std::string> digests;
  for (const AttestedResource& f : files) digests.push_back(f.sha256);
  MODELSTATE_ASSIGN_OR_RETURN(std::string expected, Sha256OfDigests(digests));
  if (statement.subjects.size() != 1 ||
      statement.subjects[0].sha256 != expected) {
    return BundleError("subject is not the SHA-256 of the resources' digests");
  }
  return files;
}

}  // namespace modelstate
