// File: access_policy.h
// Who may do what, in which namespaces: the principals of a token file, their
// roles, and the permissions those roles grant. Pure logic (no gRPC); the
// server authenticates a call and asks the policy.
//
// Token file (JSON; tokens are never stored, only their SHA-256 in hex):
//   {"principals": [
//     {"identity": "alice", "token_sha256": "<64 hex>",
//      "roles": {"builder": ["team-a"], "reader": ["*"]}},
//     {"identity": "ci-bot", "roles": {"admin": ["*"]}}   // mTLS only: the
//   ]}                                                    // certificate's CN
//
// Roles and what they grant, per namespace ("*" = every namespace):
//   admin     everything
//   builder   build, register, remove, load, move, train/eval, delete; and
//             read what it builds
//   reviewer  subscribe (intercept or observe) to registration events
//   auditor   read and verify the audit log (records of its namespaces)
//   reader    describe, list, get state
//   witness   cosign the audit log's checkpoints (AddCosignature), and
//             read checkpoints and consistency proofs
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(AccessPolicy policy,
//                               AccessPolicy::ReadFile("tokens.json"));
//   const Principal* p = policy.FindByToken(presented_token);
//   if (p == nullptr || !p->Allows(Permission::kWrite, "team-a")) ...
#ifndef MODELSTATE_SERVICE_ACCESS_POLICY_H_
#define MODELSTATE_SERVICE_ACCESS_POLICY_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

enum class Role { kAdmin, kBuilder, kReviewer, kAuditor, kReader, kWitness };

// What a call needs.
enum class Permission {
  kRead,       // GetModule, ListModules, GetStateDict
  kWrite,      // every call that changes a module
  kSubscribe,  // Subscribe, ListSubscribers
  kAudit,      // QueryAudit, WatchAudit, VerifyAudit, the audit proofs
  kWitness,    // AddCosignature
};

absl::string_view RoleName(Role role);
absl::string_view PermissionName(Permission permission);

// Matches every namespace in a role's list.
inline constexpr absl::string_view kAnyNamespace = "*";

struct Principal {
  std::string identity;
  std::string token_sha256;  // "" for certificate-only principals
  std::map<Role, std::vector<std::string>> roles;

  bool Allows(Permission permission, absl::string_view ns) const;
  // Whether `permission` is granted in at least one namespace.
  bool AllowsAnywhere(Permission permission) const;
  // The namespaces where `permission` is granted, sorted, without
  // duplicates; {"*"} when it is granted everywhere.
  std::vector<std::string> NamespacesFor(Permission permission) const;
};

// A principal with every role in every namespace: the caller when the
// server runs without authentication (loopback only).
Principal AnonymousAdmin(std::string identity);

class AccessPolicy {
 public:
  AccessPolicy() = default;

  // INVALID_ARGUMENT naming the offending field (principals[2].roles...) for
  // anything malformed: unknown fields or roles, a token hash that is not
  // 64 lowercase hex digits, a duplicate identity or token, a bad namespace.
  static absl::StatusOr<AccessPolicy> Parse(absl::string_view json_text);
  static absl::StatusOr<AccessPolicy> ReadFile(const std::string& path);

  // The principal holding this bearer token, or nullptr.
  const Principal* FindByToken(absl::string_view token) const;
  // The principal with this identity (a client certificate's CN), or null.
  const Principal* FindByIdentity(absl::string_view identity) const;

  size_t size() const { return principals_.size(); }

 private:
  std::vector<Principal> principals_;
  std::map<std::string, size_t, std::less<>> by_token_hash_;
  std::map<std::string, size_t, std::less<>> by_identity_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_ACCESS_POLICY_H_
