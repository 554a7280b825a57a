// dsse_tool: the C++ half of the DSSE interop test
// (tests/python/dsse_interop.py checks it against Python's `cryptography`).
//
//   dsse_tool sign SEED_HEX PAYLOAD_TYPE < payload > envelope.json
//     Signs stdin with the Ed25519 key of that 32-byte seed.
//   dsse_tool verify PUBLIC_KEY_HEX < envelope.json
//     Exits 0 if the envelope verifies under the key, 1 (with the reason on
//     stderr) if it does not.
#include <iostream>
#include <iterator>
#include <string>

#include "absl/strings/escaping.h"
#include "base/dsse.h"
#include "base/signed_note.h"

namespace {

std::string ReadStdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin),
                     std::istreambuf_iterator<char>());
}

int Fail(const absl::Status& status) {
  std::cerr << status << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace modelstate;
  std::string command = argc > 1 ? argv[1] : "";
  if (command == "sign" && argc == 4) {
    absl::StatusOr<Ed25519PrivateKey> key =
        Ed25519PrivateKey::FromSeed(absl::HexStringToBytes(argv[2]));
    if (!key.ok()) return Fail(key.status());
    absl::StatusOr<DsseEnvelope> envelope =
        SignDsse(argv[3], ReadStdin(), *key);
    if (!envelope.ok()) return Fail(envelope.status());
    std::cout << DsseToJson(*envelope);
    return 0;
  }
  if (command == "verify" && argc == 3) {
    absl::StatusOr<DsseEnvelope> envelope = DsseFromJson(ReadStdin());
    if (!envelope.ok()) return Fail(envelope.status());
    absl::Status verified =
        VerifyDsse(*envelope, absl::HexStringToBytes(argv[2]));
    if (!verified.ok()) return Fail(verified);
    return 0;
  }
  std::cerr << "usage: dsse_tool sign SEED_HEX PAYLOAD_TYPE < payload\n"
               "       dsse_tool verify PUBLIC_KEY_HEX < envelope.json\n";
  return 2;
}
