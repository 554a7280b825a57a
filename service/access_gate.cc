#include "service/access_gate.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

std::atomic<uint64_t> next_request_id{1};
std::atomic<uint64_t> next_call_id{1};

// Request ids this process makes up are unique across restarts too: the
// audit log and the saved modules' change notes match on them.
const std::string& RequestIdPrefix() {
  static const std::string* prefix = [] {
    std::random_device random;
    return new std::string(absl::StrFormat("req-%08x-", random()));
  }();
  return *prefix;
}

}  // namespace

absl::StatusOr<Caller> AccessGate::Authenticate(const Credentials& credentials,
                                                absl::string_view rpc) {
  Caller caller;
  caller.peer = credentials.peer;
  caller.credentials = credentials;
  caller.policy_generation = policy_generation();
  caller.ctx.correlation_id =
      !credentials.request_id.empty()
          ? CappedRequestId(credentials.request_id)
          : absl::StrCat(RequestIdPrefix(), next_request_id.fetch_add(1));
  caller.ctx.call_id = next_call_id.fetch_add(1);
  absl::StatusOr<Principal> principal = auth_ != nullptr
                                            ? auth_->Authenticate(credentials)
                                            : AnonymousAdmin(credentials.peer);
  if (!principal.ok()) {
    denials_.Record(caller.ctx, caller.peer, rpc, ModuleName{},
                    principal.status());
    return principal.status();
  }
  caller.principal = *std::move(principal);
  caller.ctx.identity = caller.principal.identity;
  return caller;
}

absl::Status AccessGate::Allow(const Caller& caller, absl::string_view rpc,
                               Permission permission,
                               const ModuleName& module) {
  if (caller.principal.Allows(permission, module.ns)) {
    return permission == Permission::kWrite ? AuditWritable()
                                            : absl::OkStatus();
  }
  return Deny(
      caller, rpc, module,
      absl::PermissionDeniedError(absl::StrCat(
          "'", caller.principal.identity, "' may not ", rpc, " in namespace '",
          module.ns, "' (needs ", PermissionName(permission), " permission)")));
}

absl::Status AccessGate::AllowIn(const Caller& caller, absl::string_view rpc,
                                 Permission permission, const std::string& ns) {
  if (ns.empty()) return AllowSomewhere(caller, rpc, permission);
  ModuleName in_namespace;
  in_namespace.ns = ns;
  return Allow(caller, rpc, permission, in_namespace);
}

absl::Status AccessGate::AllowSomewhere(const Caller& caller,
                                        absl::string_view rpc,
                                        Permission permission) {
  if (caller.principal.AllowsAnywhere(permission)) return absl::OkStatus();
  return Deny(
      caller, rpc, ModuleName{},
      absl::PermissionDeniedError(absl::StrCat(
          "'", caller.principal.identity, "' may not ", rpc, " (needs ",
          PermissionName(permission), " permission in some namespace)")));
}

absl::Status AccessGate::AllowAdmin(const Caller& caller,
                                    absl::string_view rpc) {
  auto admin = caller.principal.roles.find(Role::kAdmin);
  if (admin != caller.principal.roles.end() &&
      std::find(admin->second.begin(), admin->second.end(), kAnyNamespace) !=
          admin->second.end()) {
    return absl::OkStatus();
  }
  return Deny(caller, rpc, ModuleName{},
              absl::PermissionDeniedError(absl::StrCat(
                  "'", caller.principal.identity, "' may not ", rpc,
                  " (needs the admin role in every namespace)")));
}

absl::StatusOr<Principal> AccessGate::NamedNow(const Caller& caller) const {
  if (!authenticates()) return caller.principal;
  const std::string& identity = caller.principal.identity;
  absl::StatusOr<Principal> now = auth_->Authenticate(caller.credentials);
  if (!now.ok() || now->identity != identity) {
    return absl::UnauthenticatedError(absl::StrCat(
        "the reloaded token file no longer names '", identity,
        "' by the credentials this call was made with",
        now.ok() ? "" : absl::StrCat(" (", now.status().message(), ")")));
  }
  return now;
}

absl::StatusOr<Principal> AccessGate::StillNamed(const Caller& caller,
                                                 absl::string_view rpc) {
  absl::StatusOr<Principal> now = NamedNow(caller);
  if (!now.ok())
    return Refuse(caller, rpc, Refusal{ModuleName{}, now.status()});
  return now;
}

std::optional<AccessGate::Refusal> AccessGate::StillAllowsInUnrecorded(
    const Caller& caller, absl::string_view rpc, Permission permission,
    const ModuleName& module) const {
  if (!authenticates()) return std::nullopt;
  absl::StatusOr<Principal> now = NamedNow(caller);
  if (!now.ok()) return Refusal{ModuleName{}, now.status()};
  if (now->Allows(permission, module.ns)) return std::nullopt;
  return Refusal{module, absl::PermissionDeniedError(absl::StrCat(
                             "'", caller.principal.identity, "' may no longer ",
                             rpc, " in namespace '", module.ns, "' (needs ",
                             PermissionName(permission),
                             " permission; the token file was "
                             "reloaded)"))};
}

absl::Status AccessGate::Refuse(const Caller& caller, absl::string_view rpc,
                                Refusal refusal) {
  Revoke(caller, rpc, refusal);
  return std::move(refusal.status);
}

void AccessGate::Revoke(const Caller& caller, absl::string_view rpc,
                        const Refusal& refusal) {
  denials_.RecordRevocation(caller.ctx, caller.peer, rpc, refusal.module,
                            refusal.status);
}

absl::Status AccessGate::StillAllowsIn(const Caller& caller,
                                       absl::string_view rpc,
                                       Permission permission,
                                       const ModuleName& module) {
  std::optional<Refusal> refusal =
      StillAllowsInUnrecorded(caller, rpc, permission, module);
  if (!refusal.has_value()) return absl::OkStatus();
  return Refuse(caller, rpc, *std::move(refusal));
}

absl::Status AccessGate::StillAllows(const Caller& caller,
                                     absl::string_view rpc,
                                     Permission permission) {
  return StillAllowed(caller, rpc, permission).status();
}

absl::StatusOr<Principal> AccessGate::StillAllowed(const Caller& caller,
                                                   absl::string_view rpc,
                                                   Permission permission) {
  if (!authenticates()) return caller.principal;
  const std::string& identity = caller.principal.identity;
  absl::StatusOr<Principal> now = StillNamed(caller, rpc);
  if (!now.ok()) return now.status();
  const std::vector<std::string> had =
      caller.principal.NamespacesFor(permission);
  const std::vector<std::string> has = now->NamespacesFor(permission);
  auto everywhere = [](const std::vector<std::string>& namespaces) {
    return !namespaces.empty() && namespaces.front() == kAnyNamespace;
  };
  std::vector<std::string> lost;
  if (!everywhere(has)) {
    for (const std::string& ns : had) {
      if (std::find(has.begin(), has.end(), ns) == has.end())
        lost.push_back(ns);
    }
  }
  if (lost.empty()) return now;
  const std::string where =
      everywhere(lost) ? "in every namespace"
                       : absl::StrCat(lost.size() == 1 ? "in namespace '"
                                                       : "in namespaces '",
                                      absl::StrJoin(lost, "', '"), "'");
  return Refuse(
      caller, rpc,
      Refusal{ModuleName{}, absl::PermissionDeniedError(absl::StrCat(
                                "'", identity, "' may no longer ", rpc, " ",
                                where, " (needs ", PermissionName(permission),
                                " permission; the token file was reloaded)"))});
}

absl::Status AccessGate::AuditWritable() const {
  if (audit_ == nullptr) return absl::OkStatus();
  absl::Status health = audit_->health();
  if (health.ok()) return health;
  // A change must not go unrecorded; UNAVAILABLE, since an operator can
  // fix the log (disk space, permissions) and restart.
  return absl::UnavailableError(health.message());
}

absl::Status AccessGate::Deny(const Caller& caller, absl::string_view rpc,
                              const ModuleName& module, absl::Status denied) {
  denials_.Record(caller.ctx, caller.peer, rpc, module, denied);
  return denied;
}

bool AuditRecordVisible(const std::vector<std::string>& namespaces,
                        const AuditRecord& record) {
  if (!namespaces.empty() && namespaces.front() == kAnyNamespace) return true;
  return !record.ns.empty() && std::find(namespaces.begin(), namespaces.end(),
                                         record.ns) != namespaces.end();
}

}  // namespace modelstate
