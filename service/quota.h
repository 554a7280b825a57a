// File: quota.h
// Per-namespace quotas: how many modules a namespace may hold and how many
// tensor bytes in all. ModelStore enforces them (RESOURCE_EXHAUSTED naming
// the limit) before a change that would exceed one is applied.
//
// Quota file (JSON; every field optional, 0 = unlimited):
//   {"default": {"max_modules": 100, "max_bytes": 68719476736},
//    "namespaces": {"team-a": {"max_modules": 10, "max_bytes": 1073741824}}}
// A namespace listed under "namespaces" takes its limits from there (a
// limit left out there is unlimited); every other namespace from "default".
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(QuotaPolicy quotas,
//                               QuotaPolicy::ReadFile("quotas.json"));
//   store.set_quotas(quotas);
#ifndef MODELSTATE_SERVICE_QUOTA_H_
#define MODELSTATE_SERVICE_QUOTA_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace modelstate {

struct NamespaceQuota {
  uint64_t max_modules = 0;  // 0: unlimited
  uint64_t max_bytes = 0;    // tensor bytes of all its modules; 0: unlimited
};

struct QuotaPolicy {
  NamespaceQuota defaults;
  std::map<std::string, NamespaceQuota, std::less<>> namespaces;

  const NamespaceQuota& For(absl::string_view ns) const;
  bool unlimited() const;

  // INVALID_ARGUMENT naming the field for anything malformed. `defaults`
  // holds what the file's "default" does not override.
  static absl::StatusOr<QuotaPolicy> Parse(absl::string_view json_text,
                                           NamespaceQuota defaults = {});
  static absl::StatusOr<QuotaPolicy> ReadFile(const std::string& path,
                                              NamespaceQuota defaults = {});
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_QUOTA_H_
