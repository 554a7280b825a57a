#include "service/access_policy.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "nlohmann/json.hpp"
#include "service/module_name.h"

namespace modelstate {
namespace {

using Json = nlohmann::json;

constexpr std::pair<Role, absl::string_view> kRoleNames[] = {
    {Role::kAdmin, "admin"},       {Role::kBuilder, "builder"},
    {Role::kReviewer, "reviewer"}, {Role::kAuditor, "auditor"},
    {Role::kReader, "reader"},     {Role::kWitness, "witness"}};

bool Grants(Role role, Permission permission) {
  switch (role) {
    case Role::kAdmin:
      return true;
    case Role::kBuilder:
      return permission == Permission::kWrite ||
             permission == Permission::kRead;
    case Role::kReviewer:
      return permission == Permission::kSubscribe;
    case Role::kAuditor:
      return permission == Permission::kAudit;
    case Role::kReader:
      return permission == Permission::kRead;
    case Role::kWitness:
      return permission == Permission::kWitness;
  }
  return false;
}

absl::Status FieldError(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", problem));
}

absl::StatusOr<Principal> ParsePrincipal(const Json& j,
                                         const std::string& field) {
  if (!j.is_object()) return FieldError(field, "must be an object");
  Principal p;
  for (const auto& [key, value] : j.items()) {
    const std::string at = absl::StrCat(field, ".", key);
    if (key == "identity") {
      if (!value.is_string() || value.get<std::string>().empty()) {
        return FieldError(at, "must be a non-empty string");
      }
      p.identity = value.get<std::string>();
    } else if (key == "token_sha256") {
      if (!value.is_string() || !IsSha256Hex(value.get<std::string>())) {
        return FieldError(at,
                          "must be the token's SHA-256 as 64 lowercase hex "
                          "digits (modelstatectl hash-token prints it)");
      }
      p.token_sha256 = value.get<std::string>();
    } else if (key == "roles") {
      if (!value.is_object()) {
        return FieldError(at, "must map role names to namespace lists");
      }
      for (const auto& role_item : value.items()) {
        // Not a structured binding: clang 14 cannot capture one.
        const std::string role_name = role_item.key();
        const Json& namespaces = role_item.value();
        const std::string role_at = absl::StrCat(at, ".", role_name);
        auto known =
            std::find_if(std::begin(kRoleNames), std::end(kRoleNames),
                         [&](const auto& r) { return r.second == role_name; });
        if (known == std::end(kRoleNames)) {
          // Listed from kRoleNames, so that a role added there is named
          // here too (witness was once missing from a list kept by hand).
          return FieldError(
              role_at,
              absl::StrCat("unknown role (",
                           absl::StrJoin(kRoleNames, ", ",
                                         [](std::string* out, const auto& r) {
                                           absl::StrAppend(out, r.second);
                                         }),
                           ")"));
        }
        if (!namespaces.is_array()) {
          return FieldError(role_at, "must be a list of namespaces or \"*\"");
        }
        std::vector<std::string>& list = p.roles[known->first];
        for (size_t i = 0; i < namespaces.size(); ++i) {
          const Json& ns = namespaces[i];
          if (!ns.is_string() ||
              (ns.get<std::string>() != kAnyNamespace &&
               !IsValidModuleNamePart(ns.get<std::string>()))) {
            return FieldError(absl::StrCat(role_at, "[", i, "]"),
                              "must be a namespace name or \"*\"");
          }
          list.push_back(ns.get<std::string>());
        }
      }
    } else {
      return FieldError(at, "unknown field");
    }
  }
  if (p.identity.empty()) {
    return FieldError(absl::StrCat(field, ".identity"), "is required");
  }
  return p;
}

}  // namespace

absl::string_view RoleName(Role role) {
  for (const auto& [r, name] : kRoleNames) {
    if (r == role) return name;
  }
  return "unknown";
}

absl::string_view PermissionName(Permission permission) {
  switch (permission) {
    case Permission::kRead:
      return "read";
    case Permission::kWrite:
      return "write";
    case Permission::kSubscribe:
      return "subscribe";
    case Permission::kAudit:
      return "audit";
    case Permission::kWitness:
      return "witness";
  }
  return "unknown";
}

bool Principal::Allows(Permission permission, absl::string_view ns) const {
  for (const auto& [role, namespaces] : roles) {
    if (!Grants(role, permission)) continue;
    for (const std::string& granted : namespaces) {
      if (granted == kAnyNamespace || granted == ns) return true;
    }
  }
  return false;
}

bool Principal::AllowsAnywhere(Permission permission) const {
  return !NamespacesFor(permission).empty();
}

std::vector<std::string> Principal::NamespacesFor(Permission permission) const {
  std::set<std::string> found;
  for (const auto& [role, namespaces] : roles) {
    if (!Grants(role, permission)) continue;
    for (const std::string& ns : namespaces) {
      if (ns == kAnyNamespace) return {std::string(kAnyNamespace)};
      found.insert(ns);
    }
  }
  return {found.begin(), found.end()};
}

Principal AnonymousAdmin(std::string identity) {
  Principal p;
  p.identity = std::move(identity);
  p.roles[Role::kAdmin] = {std::string(kAnyNamespace)};
  return p;
}

absl::StatusOr<AccessPolicy> AccessPolicy::Parse(absl::string_view json_text) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return FieldError("token file", "is not valid JSON");
  if (!j.is_object()) return FieldError("token file", "must be an object");
  AccessPolicy policy;
  for (const auto& [key, value] : j.items()) {
    if (key != "principals") return FieldError(key, "unknown field");
  }
  if (!j.contains("principals") || !j["principals"].is_array()) {
    return FieldError("principals", "must be a list");
  }
  const Json& list = j["principals"];
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string field = absl::StrCat("principals[", i, "]");
    absl::StatusOr<Principal> p = ParsePrincipal(list[i], field);
    if (!p.ok()) return p.status();
    if (!policy.by_identity_.emplace(p->identity, i).second) {
      return FieldError(absl::StrCat(field, ".identity"),
                        absl::StrCat("duplicate identity '", p->identity, "'"));
    }
    if (!p->token_sha256.empty() &&
        !policy.by_token_hash_.emplace(p->token_sha256, i).second) {
      return FieldError(absl::StrCat(field, ".token_sha256"),
                        "the same token hash appears twice");
    }
    policy.principals_.push_back(*std::move(p));
  }
  return policy;
}

absl::StatusOr<AccessPolicy> AccessPolicy::ReadFile(const std::string& path) {
  // Whoever could write it could make themselves an admin (or lift their
  // quota): refused if group or others may.
  absl::StatusOr<std::string> text = modelstate::ReadGuardedFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<AccessPolicy> policy = Parse(*text);
  if (!policy.ok()) {
    return absl::Status(policy.status().code(),
                        absl::StrCat(path, ": ", policy.status().message()));
  }
  return policy;
}

const Principal* AccessPolicy::FindByToken(absl::string_view token) const {
  if (token.empty()) return nullptr;
  auto it = by_token_hash_.find(Sha256Hex(token));
  return it == by_token_hash_.end() ? nullptr : &principals_[it->second];
}

const Principal* AccessPolicy::FindByIdentity(
    absl::string_view identity) const {
  auto it = by_identity_.find(identity);
  return it == by_identity_.end() ? nullptr : &principals_[it->second];
}

}  // namespace modelstate
