// File: cli/audit.h
// The audit command group's shared arguments, and the handlers of its
// verifiable-log commands (audit_proofs.cc: checkpoint, key, prove,
// consistency, verify against a checkpoint; audit_witness.cc: witness),
// which audit.cc dispatches to.
//
// Example:
//   AuditArgs a;
//   a.what = "prove";
//   a.operands = {"12"};
//   MODELSTATE_RETURN_IF_ERROR(RunProve(context, a));
#ifndef MODELSTATE_CLIENT_CLI_AUDIT_H_
#define MODELSTATE_CLIENT_CLI_AUDIT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "client/cli/command.h"

namespace modelstate::cli {

struct AuditArgs {
  std::string what;
  std::vector<std::string> operands;  // prove SEQ, consistency OLD NEW
  std::optional<std::string> since;
  std::optional<std::string> until;
  std::optional<std::string> ns;
  std::optional<std::string> module;
  std::optional<std::string> identity;
  std::optional<std::string> outcome;
  std::optional<std::string> type;
  std::optional<uint64_t> after;
  std::optional<uint64_t> limit;
  std::optional<std::string> file;
  // The log's verifier key (text or a file holding it); for witness, the
  // witness's private key file.
  std::optional<std::string> key;
  std::optional<std::string> checkpoint;  // a saved checkpoint note
  // consistency: the key --checkpoint was signed with, when the log's key
  // was rotated since (default: --key).
  std::optional<std::string> checkpoint_key;
  std::optional<std::string> hashes;  // a copy of audit.hashes
  std::optional<uint64_t> size;       // prove: the tree size
  bool fresh = false;                 // checkpoint: sign one now
  bool cluster = false;               // verify: every replica's log
  // witness
  std::optional<std::string> state;  // its state directory
  std::optional<std::string> name;   // its key name
  std::optional<std::string> log_key;
  std::optional<double> interval;  // seconds between polls
  bool once = false;
};

absl::Status RunCheckpoint(Context& c, const AuditArgs& a);
absl::Status RunKey(Context& c, const AuditArgs& a);
absl::Status RunProve(Context& c, const AuditArgs& a);
absl::Status RunConsistency(Context& c, const AuditArgs& a);
// audit verify --file with --key or --checkpoint: the chain, the signature
// and the tree against the checkpoint.
absl::Status VerifyFileTree(Context& c, const AuditArgs& a);
// audit verify --cluster: each replica's log against the checkpoint it
// recorded in etcd.
absl::Status VerifyCluster(Context& c, const AuditArgs& a);
absl::Status RunWitness(Context& c, const AuditArgs& a);

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_AUDIT_H_
