#include "service/quota.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "nlohmann/json.hpp"
#include "service/module_name.h"

namespace modelstate {
namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

// Overrides the limits `j` names.
absl::Status ParseQuota(const Json& j, const std::string& field,
                        NamespaceQuota* quota) {
  if (!j.is_object()) return FieldError(field, "must be an object");
  for (const auto& [key, value] : j.items()) {
    const std::string at = absl::StrCat(field, ".", key);
    if (key != "max_modules" && key != "max_bytes") {
      return FieldError(at, "unknown field (max_modules, max_bytes)");
    }
    if (!value.is_number_unsigned()) {
      return FieldError(at, "must be a non-negative integer (0: unlimited)");
    }
    (key == "max_modules" ? quota->max_modules : quota->max_bytes) =
        value.get<uint64_t>();
  }
  return absl::OkStatus();
}

}  // namespace

const NamespaceQuota& QuotaPolicy::For(absl::string_view ns) const {
  auto it = namespaces.find(ns);
  return it == namespaces.end() ? defaults : it->second;
}

bool QuotaPolicy::unlimited() const {
  if (defaults.max_modules != 0 || defaults.max_bytes != 0) return false;
  for (const auto& [ns, quota] : namespaces) {
    if (quota.max_modules != 0 || quota.max_bytes != 0) return false;
  }
  return true;
}

absl::StatusOr<QuotaPolicy> QuotaPolicy::Parse(absl::string_view json_text,
                                               NamespaceQuota defaults) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FieldError("quota file", "is not valid JSON");
  if (!j.is_object()) return FieldError("quota file", "must be an object");
  QuotaPolicy policy;
  policy.defaults = defaults;
  for (const auto& [key, value] : j.items()) {
    if (key == "default") {
      absl::Status s = ParseQuota(value, "default", &policy.defaults);
      if (!s.ok()) return s;
    } else if (key == "namespaces") {
      if (!value.is_object()) {
        return FieldError("namespaces", "must map namespaces to quotas");
      }
      for (const auto& [ns, quota] : value.items()) {
        const std::string at = absl::StrCat("namespaces.", ns);
        if (!IsValidModuleNamePart(ns)) {
          return FieldError(at, "is not a valid namespace name");
        }
        NamespaceQuota parsed;
        absl::Status s = ParseQuota(quota, at, &parsed);
        if (!s.ok()) return s;
        policy.namespaces.emplace(ns, parsed);
      }
    } else {
      return FieldError(key, "unknown field (default, namespaces)");
    }
  }
  return policy;
}

absl::StatusOr<QuotaPolicy> QuotaPolicy::ReadFile(const std::string& path,
                                                  NamespaceQuota defaults) {
  // Whoever could write it could make themselves an admin (or lift their
  // quota): refused if group or others may.
  absl::StatusOr<std::string> text = modelstate::ReadGuardedFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<QuotaPolicy> policy = Parse(*text, defaults);
  if (!policy.ok()) {
    return absl::Status(policy.status().code(),
                        absl::StrCat(path, ": ", policy.status().message()));
  }
  return policy;
}

}  // namespace modelstate
