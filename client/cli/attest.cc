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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/attestation.h"
#include "base/attestation_predicate.h"
#include "base/checkpoint.h"
#include "base/dsse.h"
#include "base/file_util.h"
#include "base/merkle.h"
#include "base/sha256.h"
#include "base/signed_note.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "client/cli/interrupt.h"
#include "client/cli/options.h"
#include "client/cli/output.h"
#include "core/safetensors.h"
#include "core/state_digest.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "nlohmann/json.hpp"

namespace modelstate::cli {
namespace {

constexpr int kVerifyHashThreads = 2;
// --max-records' default: each cited record is one inclusion proof to
// fetch, so a statement citing millions (signed by a stolen key, or a
// module trained step by step on the server) would make --online issue
// millions of calls. 12005 took 7.9 s on loopback (0.66 ms each); at a
// 3 ms round trip, 10000 take half a minute.
constexpr uint64_t kDefaultMaxRecords = 10000;

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
  uint64_t max_records = kDefaultMaxRecords;  // 0: no limit
};

// Marks a verdict: a check that ran and found the attestation (or bundle)
// does not hold. Any other error of a verifying command means the check
// could not be completed (Verifying).
constexpr char kVerdictPayload[] = "modelstate.cli/verdict";

// A failed check: shown as "FAILED: <what>: <why>", exit status 1.
absl::Status CheckFailed(Context& c, absl::string_view what,
                         absl::string_view why) {
  c.out() << "FAILED: " << what << ": " << why << "\n";
  absl::Status failed = AlreadyShown(absl::InvalidArgumentError(what));
  failed.SetPayload(kVerdictPayload, absl::Cord());
  return failed;
}

// A check that could not be completed (the server refused or could not be
// reached): shown as "NOT CHECKED: <what>: <CODE>: <why>", exit status 3.
absl::Status CouldNotCheck(Context& c, absl::string_view what,
                           const absl::Status& why) {
  c.out() << "NOT CHECKED: " << what << ": "
          << absl::StatusCodeToString(why.code()) << ": " << why.message()
          << "\n";
  return NotChecked(AlreadyShown(why));
}

// What a verifying command returns: its verdicts (exit status 1) and
// usage errors (2) as they are; any other error, a file that cannot be
// read or a server that cannot be reached, is "could not check" (3), so
// that a script never takes it for "does not hold", nor for OK.
absl::Status Verifying(absl::Status status) {
  if (status.ok() || status.GetPayload(kVerdictPayload).has_value()) {
    return status;
  }
  return NotChecked(std::move(status));
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

// Whether a server's error answers what the check asked (no record at
// that seq, a tree size beyond the log, no module of that name) rather
// than keeps it from being asked (unreachable, refused, timed out,
// overloaded, failing).
bool Answers(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
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
    if (!proof.ok()) {
      if (!Answers(proof.status())) {
        return CouldNotCheck(c, what, proof.status());
      }
      return CheckFailed(c, what, proof.status().message());
    }
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

// What ends an attested life, and from which record on it counts: a
// delete or build after the life began starts another life. A move after
// the last cited record took the module to a replica whose log this one
// does not hold, where it may have been deleted and built again before it
// came back: not "the attested one" either.
struct LifeEnd {
  const char* type;  // the change's record type
  const char* what;
  bool after_last;  // counts after the last cited record, not the first
};
constexpr LifeEnd kLifeEnds[] = {
    {"delete", "was deleted", false},
    {"build", "was built again", false},
    {"move_out", "moved to another replica", true},
    {"move_in", "came from another replica", true},
};

// The FAILED line for `ended`, found in audit record `seq` (`how` says
// more of that record, or is "").
absl::Status LifeEnded(Context& c, const std::string& full,
                       const LifeEnd& ended, uint64_t seq, uint64_t after,
                       absl::string_view how) {
  return CheckFailed(
      c, "module",
      absl::StrCat(full, " ", ended.what, " (audit record ", seq, how,
                   ") after the attested ",
                   ended.after_last ? "records end" : "life began", " (record ",
                   after, "): the live module ",
                   ended.after_last ? "may be" : "is",
                   " a later one of that name, whatever its bytes"));
}

// That the live module `module` is the attested one, not a later module
// of the same name: no successful delete or build of it in the log after
// the record that began the attested life (nor a move after the last
// cited record). Neither the bytes nor the records can tell: a delete and
// a rebuild from the same spec and seed give the same bytes, and the
// records of the earlier life stay in the log, where they verify. Only
// records of this server's log are seen (in a cluster, a delete on
// another replica is in that replica's log).
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
  auto query = [&](const char* type, uint64_t after, int limit) {
    v1::QueryAuditRequest request;
    request.mutable_filter()->set_namespace_(name.first);
    request.mutable_filter()->set_module(name.second);
    request.mutable_filter()->set_type(type);
    request.mutable_filter()->set_outcome("ok");
    request.set_after_seq(after);
    request.set_limit(limit);
    return rpc->QueryAudit(request);
  };
  // Without the records nothing is known either way: not a verdict.
  auto unread = [&](const absl::Status& status) {
    return CouldNotCheck(
        c, "module",
        absl::Status(
            status.code(),
            absl::StrCat("cannot read its audit records: ", status.message())));
  };
  for (const LifeEnd& ended : kLifeEnds) {
    const uint64_t after = ended.after_last ? last : begun;
    absl::StatusOr<v1::QueryAuditResponse> later = query(ended.type, after, 1);
    if (!later.ok()) return unread(later.status());
    if (!later->records().empty()) {
      return LifeEnded(c, full, ended, later->records(0).seq(), after, "");
    }
  }
  // A change the server saved but stopped before recording is recorded at
  // its next start as "recovered", naming the change in details.change
  // (service/audit_events.h): a recovered delete or build ends the life
  // as a recorded one does. Few exist; they are read page by page.
  constexpr int kPage = 1000;
  for (uint64_t after = begun;;) {
    absl::StatusOr<v1::QueryAuditResponse> recovered =
        query("recovered", after, kPage);
    if (!recovered.ok()) return unread(recovered.status());
    for (const v1::AuditRecordProto& r : recovered->records()) {
      const nlohmann::json details =
          nlohmann::json::parse(r.details_json(), nullptr, false);
      if (!details.is_object()) continue;
      auto change = details.find("change");
      if (change == details.end() || !change->is_string()) continue;
      for (const LifeEnd& ended : kLifeEnds) {
        const uint64_t from = ended.after_last ? last : begun;
        if (change->get_ref<const std::string&>() == ended.type &&
            r.seq() > from) {
          return LifeEnded(c, full, ended, r.seq(), from,
                           ", recovered at a start: the server had stopped "
                           "before recording it");
        }
      }
    }
    if (recovered->records_size() < kPage || recovered->next_after_seq() == 0) {
      break;
    }
    after = recovered->next_after_seq();
  }
  c.out() << "module: " << full << " is the attested one (its life began "
          << "at audit record " << begun << ")\n";
  return absl::OkStatus();
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
    const std::string attested = AttestedModuleOf(statement->predicate_json);
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
    absl::StatusOr<StateDict> state = rpc->GetStateDict(*a.module);
    if (!state.ok()) {
      // No module of that name: it is not the attested one.
      if (state.status().code() == absl::StatusCode::kNotFound) {
        return CheckFailed(c, "module", state.status().message());
      }
      return CouldNotCheck(c, "module", state.status());
    }
    MODELSTATE_RETURN_IF_ERROR(CompareSubjects(
        c, *statement, *state, absl::StrCat("module ", *a.module)));
  }
  if (a.online) {
    absl::StatusOr<CitedRecords> cited =
        ReadCitedRecords(statement->predicate_json);
    if (!cited.ok()) {
      return CheckFailed(c, "predicate", cited.status().message());
    }
    // Refused before the first call: so many records may be a legitimate
    // history, so this says "not checked", not "does not hold".
    if (a.max_records != 0 && cited->records.size() > a.max_records) {
      return CouldNotCheck(
          c, "records",
          absl::ResourceExhaustedError(absl::StrCat(
              "the statement cites ", cited->records.size(),
              " audit records, more than --max-records ", a.max_records,
              " (each is one inclusion proof to fetch); raise it to check "
              "them all")));
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
      ->type_name("FILE")
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
       "under the cited checkpoint (at most --max-records of them). Exit "
       "status 1 names the first check that failed; 3 says a check could "
       "not be completed (the server unreachable or refusing, a file "
       "unreadable, too many records).",
       "modelstatectl verify-attestation mlp.dsse.json --key key.vkey "
       "--file mlp.safetensors"},
      [verify](Context& c) { return Verifying(RunVerify(c, *verify)); });
  v->add_option("envelope", verify->envelope, "the .dsse.json file")
      ->type_name("FILE")
      ->required();
  v->add_option("--key", verify->key, "the log's verifier key, or its file")
      ->type_name("KEY")
      ->required();
  v->add_option("--file", verify->file, "a safetensors file to compare")
      ->type_name("FILE");
  v->add_option("--module", verify->module, "a module to compare")
      ->type_name("MODULE");
  v->add_flag("--online", verify->online,
              "check the cited records' inclusion with the server");
  v->add_option("--max-records", verify->max_records,
                "with --online: check at most this many cited records, "
                "else exit 3 (0: no limit)")
      ->type_name("N")
      ->capture_default_str()
      ->check(NonNegativeInteger());

  auto bundle = std::make_shared<VerifyBundleArgs>();
  CLI::App* vb = commands.Add(
      {"verify-bundle", "check a signed file's OpenSSF Model Signing bundle",
       "Checks the bundle's signature with --key (the log's verifier key or "
       "a file holding it), that it is an OMS v1.0 statement whose subject "
       "is the digest of its resources, and that --file's SHA-256 is the "
       "one signed for its name. Exit status 1 names the first check that "
       "failed; 3 says the check could not be completed (a file that "
       "cannot be read).",
       "modelstatectl verify-bundle mlp.safetensors.sig --key key.vkey "
       "--file mlp.safetensors"},
      [bundle](Context& c) { return Verifying(RunVerifyBundle(c, *bundle)); });
  vb->add_option("bundle", bundle->bundle,
                 "the bundle (get-state --sign's .sig)")
      ->type_name("FILE")
      ->required();
  vb->add_option("--key", bundle->key, "the log's verifier key, or its file")
      ->type_name("KEY")
      ->required();
  vb->add_option("--file", bundle->file, "the signed file")
      ->type_name("FILE")
      ->required();
}

}  // namespace modelstate::cli
