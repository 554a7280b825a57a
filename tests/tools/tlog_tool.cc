// tlog_tool: the C++ half of the transparency-log interop test
// (tests/go/src/tlogcheck drives it and checks it against Go's reference
// golang.org/x/mod/sumdb/{note,tlog}).
//
//   tlog_tool emit RECORDS
//     Prints JSON: deterministic records, the tree hash of every prefix,
//     inclusion and consistency proofs, a log verifier key and checkpoints
//     signed with it, and a witness cosignature.
//   tlog_tool check < items.json
//     Reads notes, cosigned checkpoints, proofs and trees made elsewhere,
//     each with the result it should have, checks each with base/, and
//     prints how many passed and failed; exits 1 on any unexpected result.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/checkpoint.h"
#include "base/merkle.h"
#include "base/signed_note.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace modelstate {
namespace {

using Json = nlohmann::json;

constexpr char kLogName[] = "modelstate.example/audit";
constexpr char kWitnessName[] = "witness.example/w1";
constexpr uint64_t kCosignTime = 1700000000;

std::string B64(const MerkleHash& h) {
  return absl::Base64Escape(
      absl::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
}

Json HashList(const std::vector<MerkleHash>& hashes) {
  Json out = Json::array();
  for (const MerkleHash& h : hashes) out.push_back(B64(h));
  return out;
}

template <typename T>
T OrDie(absl::StatusOr<T> value) {
  if (!value.ok()) {
    std::cerr << "tlog_tool: " << value.status() << "\n";
    std::exit(2);
  }
  return *std::move(value);
}

// Record i: some text and some binary bytes, lengths varying with i.
std::string Record(uint64_t i) {
  std::string r = absl::StrCat("record ", i, "\n");
  for (uint64_t j = 0; j < i % 7; ++j) r.push_back(static_cast<char>(i * j));
  return r;
}

// Tree sizes whose proofs are emitted: every size up to 70 (all shapes of
// small trees) and a few around powers of two.
std::vector<uint64_t> ProofSizes(uint64_t records) {
  std::vector<uint64_t> sizes;
  for (uint64_t n = 1; n <= records && n <= 70; ++n) sizes.push_back(n);
  for (uint64_t n : {127, 128, 129, 255, 256, 257, 300}) {
    if (n > 70 && n <= records) sizes.push_back(n);
  }
  return sizes;
}

Ed25519PrivateKey SeededKey(absl::string_view label) {
  const MerkleHash seed = HashLeaf(label);
  return OrDie(Ed25519PrivateKey::FromSeed(absl::string_view(
      reinterpret_cast<const char*>(seed.data()), seed.size())));
}

Json Proofs(const MemoryHashStore& store, const std::vector<uint64_t>& sizes) {
  Json inclusion = Json::array();
  Json consistency = Json::array();
  for (uint64_t n : sizes) {
    for (uint64_t m = 0; m < n; ++m) {
      inclusion.push_back(
          {{"index", m},
           {"size", n},
           {"proof", HashList(OrDie(InclusionProof(m, n, store)))}});
    }
    for (uint64_t m = 1; m <= n; ++m) {
      consistency.push_back(
          {{"old", m},
           {"new", n},
           {"proof", HashList(OrDie(ConsistencyProof(m, n, store)))}});
    }
  }
  return {{"inclusion", inclusion}, {"consistency", consistency}};
}

int Emit(uint64_t records) {
  MemoryHashStore store;
  Json out;
  out["records"] = Json::array();
  out["tree_hashes"] = Json::array();
  out["tree_hashes"].push_back(B64(EmptyTreeHash()));
  for (uint64_t i = 0; i < records; ++i) {
    const std::string record = Record(i);
    out["records"].push_back(absl::Base64Escape(record));
    OrDie(store.Append(HashLeaf(record)));
    out["tree_hashes"].push_back(B64(OrDie(RootHash(i + 1, store))));
  }
  const Json proofs = Proofs(store, ProofSizes(records));
  out["inclusion"] = proofs["inclusion"];
  out["consistency"] = proofs["consistency"];

  const Ed25519NoteSigner log =
      OrDie(Ed25519NoteSigner::Create(kLogName, SeededKey("log key")));
  const CosignatureSigner witness =
      OrDie(CosignatureSigner::Create(kWitnessName, SeededKey("witness key")));
  out["log_vkey"] = FormatVerifierKey(log.verifier_key());
  out["witness_vkey"] = FormatVerifierKey(witness.verifier_key());
  out["checkpoints"] = Json::array();
  for (uint64_t n : {uint64_t{0}, uint64_t{1}, records / 2, records}) {
    const Checkpoint c{kLogName, n, OrDie(RootHash(n, store)), {}};
    out["checkpoints"].push_back(OrDie(SignCheckpoint(c, log)));
  }
  // Extension lines, and the origin Go's tlog.ParseTree insists on.
  const Checkpoint extended{
      kLogName, records, OrDie(RootHash(records, store)), {"ext a", "ext b"}};
  out["checkpoints"].push_back(OrDie(SignCheckpoint(extended, log)));
  const Checkpoint gosum{
      "go.sum database tree", records, OrDie(RootHash(records, store)), {}};
  out["gosum_checkpoint"] = OrDie(SignCheckpoint(gosum, log));
  out["cosigned"] = OrDie(CosignCheckpoint(
      out["checkpoints"].back().get<std::string>(), witness, kCosignTime));
  out["cosign_time"] = kCosignTime;
  std::cout << out.dump(1) << "\n";
  return 0;
}

// ---------------------------------------------------------------- check --

MerkleHash HashFromB64(const Json& j) {
  std::string raw;
  if (!Base64DecodeCanonical(j.get<std::string>(), &raw)) {
    std::cerr << "tlog_tool: bad base64 " << j << "\n";
    std::exit(2);
  }
  return OrDie(MerkleHashFromBytes(raw, "hash"));
}

std::vector<MerkleHash> HashesFromB64(const Json& j) {
  std::vector<MerkleHash> out;
  for (const Json& h : j) out.push_back(HashFromB64(h));
  return out;
}

absl::Status CheckNote(const Json& item) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Ed25519NoteVerifier v,
      Ed25519NoteVerifier::Parse(item["vkey"].get<std::string>()));
  return OpenNote(item["note"].get<std::string>(), {&v}).status();
}

absl::Status CheckCosigned(const Json& item) {
  MODELSTATE_ASSIGN_OR_RETURN(
      Ed25519NoteVerifier log,
      Ed25519NoteVerifier::Parse(item["log_vkey"].get<std::string>()));
  MODELSTATE_ASSIGN_OR_RETURN(
      CosignatureVerifier witness,
      CosignatureVerifier::Parse(item["witness_vkey"].get<std::string>()));
  MODELSTATE_ASSIGN_OR_RETURN(
      OpenedCheckpoint opened,
      OpenCheckpoint(item["note"].get<std::string>(), {&log, &witness}));
  // Both must have signed, and the witness at the stated time.
  if (opened.note.verified.size() != 2) {
    return absl::UnauthenticatedError("not signed by both keys");
  }
  for (const NoteSignature& s : opened.note.verified) {
    if (s.name != witness.name()) continue;
    MODELSTATE_ASSIGN_OR_RETURN(uint64_t time, CosignatureTimestamp(s));
    if (time != item["time"].get<uint64_t>()) {
      return absl::InvalidArgumentError(absl::StrCat("time ", time));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckInclusion(const Json& item) {
  return VerifyInclusion(
      HashFromB64(item["leaf"]), item["index"].get<uint64_t>(),
      item["size"].get<uint64_t>(), HashFromB64(item["root"]),
      HashesFromB64(item["proof"]));
}

absl::Status CheckConsistency(const Json& item) {
  return VerifyConsistency(
      item["old"].get<uint64_t>(), item["new"].get<uint64_t>(),
      HashFromB64(item["old_root"]), HashFromB64(item["new_root"]),
      HashesFromB64(item["proof"]));
}

// Builds the tree of item["records"] and compares each prefix's root.
absl::Status CheckTree(const Json& item) {
  MemoryHashStore store;
  for (const Json& r : item["records"]) {
    std::string record;
    if (!Base64DecodeCanonical(r.get<std::string>(), &record)) {
      return absl::InvalidArgumentError("bad record base64");
    }
    MODELSTATE_RETURN_IF_ERROR(store.Append(HashLeaf(record)).status());
  }
  const std::vector<MerkleHash> roots = HashesFromB64(item["roots"]);
  for (size_t n = 0; n < roots.size(); ++n) {
    MODELSTATE_ASSIGN_OR_RETURN(MerkleHash root, RootHash(n, store));
    if (root != roots[n]) {
      return absl::InvalidArgumentError(absl::StrCat("root ", n, " differs"));
    }
  }
  return absl::OkStatus();
}

int Check() {
  const Json in = Json::parse(std::cin);
  using Checker = absl::Status (*)(const Json&);
  const std::vector<std::pair<std::string, Checker>> kinds = {
      {"notes", CheckNote},          {"cosigned", CheckCosigned},
      {"inclusion", CheckInclusion}, {"consistency", CheckConsistency},
      {"trees", CheckTree},
  };
  int unexpected = 0;
  for (const auto& [kind, checker] : kinds) {
    int passed = 0;
    int failed = 0;
    for (const Json& item : in.value(kind, Json::array())) {
      const absl::Status status = checker(item);
      (status.ok() ? passed : failed)++;
      if (status.ok() != item["expect"].get<bool>()) {
        ++unexpected;
        std::cerr << "unexpected: " << kind << " " << item.value("what", "")
                  << ": " << status << "\n";
      }
    }
    std::cout << kind << " passed " << passed << " failed " << failed << "\n";
  }
  return unexpected == 0 ? 0 : 1;
}

}  // namespace
}  // namespace modelstate

int main(int argc, char** argv) {
  const std::string usage = "usage: tlog_tool emit RECORDS | check < JSON\n";
  uint64_t records = 0;
  if (argc == 3 && std::string(argv[1]) == "emit" &&
      absl::SimpleAtoi(argv[2], &records)) {
    return modelstate::Emit(records);
  }
  if (argc == 2 && std::string(argv[1]) == "check") {
    return modelstate::Check();
  }
  std::cerr << usage;
  return 2;
}
