// attest (a module's signed attestation to a file) and verify-attestation:
// the envelope's signature under the log's key, the subject digests against
// a safetensors file or the live module, and (--online) each listed audit
// record's inclusion under the checkpoint the statement cites. Every check
// runs here, against the key the user holds. Also get-state --sign's half
// (SignWrittenStateFile) and verify-bundle, which checks such a bundle
// against a key and the file.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/attestation.h"
#include "base/checkpoint.h"
#include "base/dsse.h"
#include "base/file_util.h"
#include "base/merkle.h"
#include "base/sha256.h"
#include "base/signed_note.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "client/cli/interrupt.h"
#include "client/cli/output.h"
#include "core/safetensors.h"
#include "core/state_digest.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "nlohmann/json.hpp"

namespace modelstate::cli {
namespace {

constexpr int kVerifyHashThreads = 2;
// The byproducts that tie an attestation to the log (service/attestation.h
// names them on the server's side).
constexpr absl::string_view kCheckpointByproductName = "audit-checkpoint";
constexpr absl::string_view kRecordsByproductName = "audit-records";

struct AttestArgs {
  std::string module;
  std::string output;
};

// Through a temporary file renamed into place, and Uninterrupted: an
// interrupted or failed write leaves neither a truncated envelope or bundle
// nor the temporary file.
absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  return Uninterrupted([&] { return WriteFileAtomically(path, text); });
}

absl::Status RunAttest(Context& c, const AttestArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
                              InterruptHandler::Install());
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::AttestModuleResponse response,
                              rpc->AttestModule(a.module));
  if (c.json()) return c.PrintJson(response);
  MODELSTATE_RETURN_IF_ERROR(WriteTextFile(a.output, response.envelope()));
  c.out() << "wrote the attestation of " << a.module << " to " << a.output
          << "\nverify with: modelstatectl verify-attestation " << a.output
          << " --key '" << response.verifier_key() << "'\n";
  return absl::OkStatus();
}

// ------------------------------------------------------ verify-attestation

struct VerifyArgs {
  std::string envelope;
  std::string key;
  std::optional<std::string> file;
  std::optional<std::string> module;
  bool online = false;
};

// A failed check: shown as "FAILED: <what>: <why>", exit status 1.
absl::Status CheckFailed(Context& c, absl::string_view what,
                         absl::string_view why) {
  c.out() << "FAILED: " << what << ": " << why << "\n";
  return AlreadyShown(absl::InvalidArgumentError(what));
}

// --key: a verifier key, or a file holding one.
absl::StatusOr<VerifierKey> KeyArgument(const std::string& key_or_file) {
  std::string text(absl::StripAsciiWhitespace(key_or_file));
  if (!ParseVerifierKey(text).ok()) {
    MODELSTATE_ASSIGN_OR_RETURN(std::string file, ReadInputFile(key_or_file));
    text = std::string(absl::StripAsciiWhitespace(file));
  }
  absl::StatusOr<VerifierKey> key = ParseVerifierKey(text);
  if (!key.ok()) {
    return UsageError(absl::StrCat("--key: ", key.status().message()));
  }
  return key;
}

// The subject annotation `key` ("dtype", "shape") as compact JSON text, or
// "" when the annotations lack it.
std::string Annotation(const AttestedResource& r, const char* key) {
  const nlohmann::json annotations =
      nlohmann::json::parse(r.annotations_json, nullptr, false);
  if (!annotations.is_object() || !annotations.contains(key)) return "";
  return annotations[key].dump();
}

// Compares the statement's subjects with what `state` holds, by name: the
// digest, and the dtype and shape the statement annotates. The digest
// covers the raw bytes alone, so the same bytes read as another dtype or
// shape (a float32[2, 4] entry replaced by an int32[4, 2] one, zeros of
// float32[8] by zeros of float16[16]) match it: only the annotations,
// which the signature binds too, tell such an entry from the attested one.
absl::Status CompareSubjects(Context& c, const InTotoStatement& statement,
                             const StateDict& state, absl::string_view source) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AttestedResource> actual,
                              StateDictSubjects(state, kVerifyHashThreads));
  std::map<std::string, const AttestedResource*> by_name;
  for (const AttestedResource& r : actual) by_name[r.name] = &r;
  for (const AttestedResource& s : statement.subjects) {
    const std::string what = absl::StrCat("subject '", s.name, "'");
    auto it = by_name.find(s.name);
    if (it == by_name.end()) {
      return CheckFailed(c, what, absl::StrCat("not in ", source));
    }
    if (it->second->sha256 != s.sha256) {
      return CheckFailed(c, what,
                         absl::StrCat("digest ", it->second->sha256, " in ",
                                      source, ", attested ", s.sha256));
    }
    for (const char* key : {"dtype", "shape"}) {
      const std::string attested = Annotation(s, key);
      if (attested.empty()) {
        return CheckFailed(
            c, what,
            absl::StrCat("the attestation gives no ", key, " to check"));
      }
      const std::string found = Annotation(*it->second, key);
      if (found != attested) {
        return CheckFailed(c, what,
                           absl::StrCat(key, " ", found, " in ", source,
                                        ", attested ", attested));
      }
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return CheckFailed(c, absl::StrCat("entry '", by_name.begin()->first, "'"),
                       absl::StrCat("in ", source, " but not attested"));
  }
  c.out() << "digests: " << statement.subjects.size() << " entries match "
          << source << "\n";
  return absl::OkStatus();
}

// What --online reads from the predicate: the checkpoint note, the records
// (seq, leaf hash) it cites, and the record that began the attested life.
struct CitedRecords {
  std::string checkpoint_note;
  std::vector<std::pair<uint64_t, std::string>> records;
  // buildDefinition.externalParameters.build.seq: the build record, one of
  // `records`. Unset for a module that came by a cluster move and was never
  // built on this replica; its life then begins at the first cited record.
  std::optional<uint64_t> build_seq;
};

// The member `key` of `j`, or null when `j` is no object or lacks it. The
// predicate is read through this and type checks alone: it is signed by
// the log's key, yet a verifier must not trust its shape (nlohmann's
// operator[] on a missing key of a const object is undefined, and get<>()
// and value() of the wrong type throw).
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

// The byproducts' checkpoint and records, each given once, at least one
// record, and the build record among them. INVALID_ARGUMENT naming the
// field that is missing or malformed.
absl::StatusOr<CitedRecords> Cited(const InTotoStatement& statement) {
  const nlohmann::json predicate =
      nlohmann::json::parse(statement.predicate_json, nullptr, false);
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

// Each cited record's inclusion proof, from the server, checked against
// the cited checkpoint (whose signature is checked with `key` first).
absl::Status CheckInclusions(Context& c, const CitedRecords& cited,
                             const std::string& key) {
  MODELSTATE_ASSIGN_OR_RETURN(Ed25519NoteVerifier verifier,
                              Ed25519NoteVerifier::Parse(key));
  const NoteVerifier* verifiers[] = {&verifier};
  absl::StatusOr<OpenedCheckpoint> opened =
      OpenCheckpoint(cited.checkpoint_note, verifiers);
  if (!opened.ok()) {
    return CheckFailed(c, "checkpoint", opened.status().message());
  }
  const Checkpoint& checkpoint = opened->checkpoint;
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  for (const auto& [seq, leaf_hex] : cited.records) {
    const std::string what = absl::StrCat("record ", seq);
    absl::StatusOr<v1::GetInclusionProofResponse> proof =
        rpc->GetInclusionProof(seq, checkpoint.size);
    if (!proof.ok()) return CheckFailed(c, what, proof.status().message());
    if (absl::BytesToHexString(proof->leaf_hash()) != leaf_hex) {
      return CheckFailed(c, what, "the log holds another record at this seq");
    }
    std::vector<MerkleHash> path;
    for (const std::string& h : proof->proof()) {
      MODELSTATE_ASSIGN_OR_RETURN(path.emplace_back(),
                                  MerkleHashFromBytes(h, "proof"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(MerkleHash leaf,
                                MerkleHashFromBytes(proof->leaf_hash(), what));
    absl::Status included =
        VerifyInclusion(leaf, seq - 1, checkpoint.size, checkpoint.root, path);
    if (!included.ok()) return CheckFailed(c, what, included.message());
  }
  c.out() << "records: " << cited.records.size()
          << " included in the checkpoint of " << checkpoint.size
          << " records\n";
  return absl::OkStatus();
}

// That the live module `module` is the attested one, not a later module
// of the same name: no successful delete or build of it in the log after
// the record that began the attested life. Neither the bytes nor the
// records can tell: a delete and a rebuild from the same spec and seed
// give the same bytes, and the records of the earlier life stay in the
// log, where they verify. Only records of this server's log are seen (in
// a cluster, a delete on another replica is in that replica's log).
absl::Status CheckIncarnation(Context& c, const CitedRecords& cited,
                              const std::string& module) {
  const std::string full = FullName(module);
  const std::pair<std::string, std::string> name =
      absl::StrSplit(full, absl::MaxSplits('/', 1));
  // The first cited record begins the life when no build is cited: the
  // records are those after the module's last delete.
  uint64_t begun = cited.records.front().first;
  uint64_t last = begun;
  for (const auto& record : cited.records) {
    begun = std::min(begun, record.first);
    last = std::max(last, record.first);
  }
  begun = cited.build_seq.value_or(begun);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  // A delete or build after the life began starts another life. A move
  // after the last cited record took the module to a replica whose log
  // this one does not hold, where it may have been deleted and built
  // again before it came back: not "the attested one" either.
  struct Ended {
    const char* type;
    uint64_t after;
    const char* what;
  };
  for (const Ended& ended :
       {Ended{"delete", begun, "was deleted"},
        Ended{"build", begun, "was built again"},
        Ended{"move_out", last, "moved to another replica"},
        Ended{"move_in", last, "came from another replica"}}) {
    v1::QueryAuditRequest request;
    request.mutable_filter()->set_namespace_(name.first);
    request.mutable_filter()->set_module(name.second);
    request.mutable_filter()->set_type(ended.type);
    request.mutable_filter()->set_outcome("ok");
    request.set_after_seq(ended.after);
    request.set_limit(1);
    absl::StatusOr<v1::QueryAuditResponse> later = rpc->QueryAudit(request);
    if (!later.ok()) {
      return CheckFailed(c, "module",
                         absl::StrCat("cannot read its audit records: ",
                                      later.status().ToString()));
    }
    if (!later->records().empty()) {
      return CheckFailed(
          c, "module",
          absl::StrCat(full, " ", ended.what, " (audit record ",
                       later->records(0).seq(), ") after the attested ",
                       ended.after == begun ? "life began" : "records end",
                       " (record ", ended.after, "): the live module ",
                       ended.after == begun ? "is" : "may be",
                       " a later one of that name, whatever its bytes"));
    }
  }
  c.out() << "module: " << full << " is the attested one (its life began "
          << "at audit record " << begun << ")\n";
  return absl::OkStatus();
}

// The module the statement attests (its buildDefinition's
// externalParameters.module), or "" when it names none.
std::string AttestedModule(const InTotoStatement& statement) {
  const nlohmann::json predicate =
      nlohmann::json::parse(statement.predicate_json, nullptr, false);
  const nlohmann::json::json_pointer where(
      "/buildDefinition/externalParameters/module");
  if (!predicate.is_object() || !predicate.contains(where) ||
      !predicate[where].is_string()) {
    return "";
  }
  return predicate[where].get<std::string>();
}

absl::Status RunVerify(Context& c, const VerifyArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(VerifierKey key, KeyArgument(a.key));
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadInputFile(a.envelope));
  absl::StatusOr<DsseEnvelope> envelope = DsseFromJson(text);
  if (!envelope.ok()) {
    return CheckFailed(c, "envelope", envelope.status().message());
  }
  if (absl::Status s = VerifyDsse(*envelope, key.public_key); !s.ok()) {
    return CheckFailed(c, "signature", s.message());
  }
  // DSSE: a verifier rejects a payload type it does not expect, so that a
  // signature over another kind of payload never passes for a statement.
  if (envelope->payload_type != kInTotoPayloadType) {
    return CheckFailed(
        c, "payloadType",
        absl::StrCat(envelope->payload_type, ", not ", kInTotoPayloadType));
  }
  absl::StatusOr<InTotoStatement> statement =
      InTotoStatementFromJson(envelope->payload);
  if (!statement.ok()) {
    return CheckFailed(c, "statement", statement.status().message());
  }
  if (statement->predicate_type != kSlsaProvenanceV1) {
    return CheckFailed(c, "predicateType", statement->predicate_type);
  }
  if (a.module.has_value()) {
    // The digests alone would let one module's attestation vouch for
    // another that holds the same bytes (two builds of one spec and seed),
    // citing a history that is not the other's.
    const std::string attested = AttestedModule(*statement);
    const std::string wanted = FullName(*a.module);
    if (attested != wanted) {
      return CheckFailed(c, "module",
                         attested.empty()
                             ? std::string("the attestation names no module")
                             : absl::StrCat("the attestation is of ", attested,
                                            ", not ", wanted));
    }
  }
  c.out() << "signature: OK (" << key.name << ")\n";
  if (a.file.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(StateDict state, ReadSafetensorsFile(*a.file));
    MODELSTATE_RETURN_IF_ERROR(CompareSubjects(c, *statement, state, *a.file));
  }
  if (a.module.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
    MODELSTATE_ASSIGN_OR_RETURN(StateDict state, rpc->GetStateDict(*a.module));
    MODELSTATE_RETURN_IF_ERROR(CompareSubjects(
        c, *statement, state, absl::StrCat("module ", *a.module)));
  }
  if (a.online) {
    absl::StatusOr<CitedRecords> cited = Cited(*statement);
    if (!cited.ok()) {
      return CheckFailed(c, "predicate", cited.status().message());
    }
    MODELSTATE_RETURN_IF_ERROR(
        CheckInclusions(c, *cited, FormatVerifierKey(key)));
    if (a.module.has_value()) {
      MODELSTATE_RETURN_IF_ERROR(CheckIncarnation(c, *cited, *a.module));
    }
  } else if (a.module.has_value()) {
    c.out() << "module: not checked for a later module of the same name "
               "(--online checks it)\n";
  }
  c.out() << "OK\n";
  return absl::OkStatus();
}

// ----------------------------------------- get-state --sign, verify-bundle

absl::StatusOr<std::string> FileSha256Hex(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  Sha256 sha;
  std::string buffer(1 << 20, '\0');
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    sha.Update(absl::string_view(buffer.data(), in.gcount()));
  }
  if (in.bad()) {
    return absl::UnavailableError(absl::StrCat(path, ": read failed"));
  }
  return sha.FinishHex();
}

std::string FileNameOf(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

struct VerifyBundleArgs {
  std::string bundle;
  std::string key;
  std::string file;
};

absl::Status RunVerifyBundle(Context& c, const VerifyBundleArgs& a) {
  MODELSTATE_ASSIGN_OR_RETURN(VerifierKey key, KeyArgument(a.key));
  MODELSTATE_ASSIGN_OR_RETURN(std::string text, ReadInputFile(a.bundle));
  absl::StatusOr<std::vector<AttestedResource>> files =
      VerifyOmsBundle(text, key.public_key);
  if (!files.ok()) return CheckFailed(c, "bundle", files.status().message());
  c.out() << "signature: OK (" << key.name << ")\n";
  const std::string name = FileNameOf(a.file);
  const AttestedResource* signed_file = nullptr;
  for (const AttestedResource& f : *files) {
    if (f.name == name) signed_file = &f;
  }
  if (signed_file == nullptr) {
    return CheckFailed(c, absl::StrCat("file '", name, "'"),
                       "not among the bundle's resources");
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::string actual, FileSha256Hex(a.file));
  if (actual != signed_file->sha256) {
    return CheckFailed(
        c, absl::StrCat("file '", name, "'"),
        absl::StrCat("digest ", actual, ", signed ", signed_file->sha256));
  }
  c.out() << "file: " << a.file << " has the signed SHA-256 " << actual
          << "\nOK\n";
  return absl::OkStatus();
}

}  // namespace

absl::Status SignWrittenStateFile(Context& c, const std::string& module,
                                  const client::GetStateDictOptions& options,
                                  const std::string& file) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  const std::string name = FileNameOf(file);
  MODELSTATE_ASSIGN_OR_RETURN(v1::SignStateFileResponse response,
                              rpc->SignStateFile(module, options, name));
  MODELSTATE_ASSIGN_OR_RETURN(std::string actual, FileSha256Hex(file));
  if (actual != response.sha256()) {
    return absl::AbortedError(absl::StrCat(
        file, ": SHA-256 ", actual, " but the server signed ",
        response.sha256(),
        ": the module changed between the download and the signing; run "
        "get-state --sign again"));
  }
  // The bundle must verify as anyone will check it: the key, the name, the
  // digest.
  MODELSTATE_ASSIGN_OR_RETURN(VerifierKey key,
                              ParseVerifierKey(response.verifier_key()));
  MODELSTATE_ASSIGN_OR_RETURN(
      std::vector<AttestedResource> files,
      VerifyOmsBundle(response.bundle(), key.public_key));
  if (files.size() != 1 || files[0].name != name || files[0].sha256 != actual) {
    return absl::InternalError(
        "the server's bundle does not name this file with its digest");
  }
  const std::string sig = file + ".sig";
  MODELSTATE_RETURN_IF_ERROR(WriteTextFile(sig, response.bundle()));
  if (!c.json()) {
    c.out() << "signed " << file << " (SHA-256 " << actual << "): wrote " << sig
            << "\nverify with: modelstatectl verify-bundle " << sig
            << " --key '" << response.verifier_key() << "' --file " << file
            << "\n";
  }
  return absl::OkStatus();
}

void AddAttestCommands(CommandSet& commands) {
  auto attest = std::make_shared<AttestArgs>();
  CLI::App* a = commands.Add(
      {"attest", "sign what a module is and how it was built",
       "Writes a DSSE envelope (signed with the server's audit log key) over "
       "an in-toto Statement: each state_dict entry's SHA-256, dtype and "
       "shape, and a SLSA Provenance v1 predicate citing the audit records "
       "that shaped the module under a signed checkpoint.",
       "modelstatectl attest team/mlp -o mlp.dsse.json"},
      [attest](Context& c) { return RunAttest(c, *attest); });
  AddModuleArgument(a, attest->module);
  a->add_option("-o,--output", attest->output, "the envelope's file")
      ->required()
      ->check(NonEmpty("a file name"));

  auto verify = std::make_shared<VerifyArgs>();
  CLI::App* v = commands.Add(
      {"verify-attestation", "check an attestation",
       "Checks the envelope's signature with --key (the log's verifier key "
       "or a file holding it) and its in-toto payload type, then the "
       "attested digests, dtypes and shapes against a safetensors file "
       "(--file) or the live module (--module, which must be the attested "
       "module), and with --online each cited audit record's inclusion "
       "under the cited checkpoint. Exit status 1 names the first check "
       "that failed.",
       "modelstatectl verify-attestation mlp.dsse.json --key key.vkey "
       "--file mlp.safetensors"},
      [verify](Context& c) { return RunVerify(c, *verify); });
  v->add_option("envelope", verify->envelope, "the .dsse.json file")
      ->required();
  v->add_option("--key", verify->key, "the log's verifier key, or its file")
      ->required();
  v->add_option("--file", verify->file, "a safetensors file to compare");
  v->add_option("--module", verify->module, "a module to compare");
  v->add_flag("--online", verify->online,
              "check the cited records' inclusion with the server");

  auto bundle = std::make_shared<VerifyBundleArgs>();
  CLI::App* vb = commands.Add(
      {"verify-bundle", "check a signed file's OpenSSF Model Signing bundle",
       "Checks the bundle's signature with --key (the log's verifier key or "
       "a file holding it), that it is an OMS v1.0 statement whose subject "
       "is the digest of its resources, and that --file's SHA-256 is the "
       "one signed for its name. Exit status 1 names the first check that "
       "failed.",
       "modelstatectl verify-bundle mlp.safetensors.sig --key key.vkey "
       "--file mlp.safetensors"},
      [bundle](Context& c) { return RunVerifyBundle(c, *bundle); });
  vb->add_option("bundle", bundle->bundle,
                 "the bundle (get-state --sign's .sig)")
      ->required();
  vb->add_option("--key", bundle->key, "the log's verifier key, or its file")
      ->required();
  vb->add_option("--file", bundle->file, "the signed file")->required();
}

}  // namespace modelstate::cli
