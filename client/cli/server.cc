// The commands about the server itself: health, devices, cluster status
// and move, and hash-token (what its --token_file holds for a token).
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "client/cli/output.h"
#include "grpc/health/v1/health.pb.h"
#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::cli {
namespace {

absl::Status RunHealth(Context& c) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_RETURN_IF_ERROR(rpc->Health());
  if (c.json()) {
    grpc::health::v1::HealthCheckResponse response;
    response.set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return c.PrintJson(response);
  }
  c.out() << "SERVING\n";
  return absl::OkStatus();
}

absl::Status RunDevices(Context& c) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::ListDevicesResponse response,
                              rpc->ListDevices());
  if (c.json()) return c.PrintJson(response);
  std::vector<std::vector<std::string>> rows = {
      {"DEVICE", "TOTAL", "FREE", "DESCRIPTION"}};
  for (const v1::DeviceInfo& d : response.devices()) {
    const bool has_memory = d.total_bytes() > 0;
    rows.push_back({d.device(), has_memory ? HumanBytes(d.total_bytes()) : "-",
                    has_memory ? HumanBytes(d.free_bytes()) : "-",
                    d.description()});
  }
  for (const std::string& line : AlignRows(rows, {false, true, true, false})) {
    c.out() << line << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunClusterStatus(Context& c) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  absl::StatusOr<v1::GetClusterStatusResponse> response =
      rpc->GetClusterStatus();
  if (!response.ok()) return ClusterCallError(response.status());
  if (c.json()) return c.PrintJson(*response);
  std::vector<std::vector<std::string>> members = {
      {"REPLICA", "ADDRESS", "LEASE", "TTL", "MODULES"}};
  for (const v1::ClusterMember& m : response->members()) {
    members.push_back(
        {m.replica(), m.address(), absl::StrCat(absl::Hex(m.lease_id())),
         absl::StrCat(m.lease_ttl_seconds(), "s"), absl::StrCat(m.modules())});
  }
  for (const std::string& line :
       AlignRows(members, {false, false, false, true, true})) {
    c.out() << line << "\n";
  }
  c.out() << "\n";
  std::vector<std::vector<std::string>> placements = {{"MODULE", "OWNER"}};
  for (const v1::ModulePlacement& p : response->placements()) {
    placements.push_back(
        {p.module(),
         p.owner_live() ? p.owner() : absl::StrCat(p.owner(), " (no lease)")});
  }
  for (const std::string& line : AlignRows(placements, {false, false})) {
    c.out() << line << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunClusterMove(Context& c, const std::string& module,
                            const std::string& replica) {
  if (module.empty() || replica.empty()) {
    return UsageError("cluster move needs MODULE and REPLICA");
  }
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  absl::StatusOr<v1::MoveModuleToReplicaResponse> response =
      rpc->MoveModuleToReplica(module, replica);
  if (!response.ok()) return ClusterCallError(response.status());
  if (c.json()) return c.PrintJson(*response);
  c.out() << "moved " << response->module() << " from "
          << response->from_replica() << " to " << response->to_replica()
          << " (" << HumanBytes(response->bytes()) << ")\n";
  return absl::OkStatus();
}

absl::Status RunHashToken(Context& c, const std::string& file) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string token, ReadInputFile(file));
  absl::string_view stripped = absl::StripAsciiWhitespace(token);
  if (stripped.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": the token is empty"));
  }
  c.out() << Sha256Hex(stripped) << "\n";
  return absl::OkStatus();
}

}  // namespace

void AddServerCommands(CommandSet& commands) {
  commands.Add(
      {"health", "check that the server is serving",
       "Asks the server's grpc.health.v1 service; prints SERVING and exits 0, "
       "or prints the error and exits 1.",
       "modelstatectl --server 10.0.0.5:50051 health"},
      RunHealth);
  commands.Add(
      {"devices", "list the server's devices and their memory",
       "Lists the devices the server can place tensors on (cpu, meta and "
       "every cuda:N) with total and free memory; `to MODULE --device "
       "cuda:N` accepts these names.",
       "modelstatectl devices --json"},
      RunDevices);
  struct ClusterArgs {
    std::string action, module, replica;
  };
  auto args = std::make_shared<ClusterArgs>();
  CLI::App* cluster = commands.Add(
      {"cluster", "show a cluster's members and placement; move a module",
       "cluster status: the members of the server's cluster that hold a live "
       "etcd lease (address, lease and seconds left on it, modules owned) "
       "and the owner of every module; an owner without a lease is marked. "
       "cluster move MODULE REPLICA: the module's owner streams its files to "
       "REPLICA (a live member), which takes over its ownership in etcd; "
       "writes to it wait meanwhile, reads go on. Both need the admin role; "
       "on a server that is not a cluster member they fail with 'this "
       "server is not a cluster member (--etcd_endpoints)'.",
       "modelstatectl --server modelstate:50051 cluster move team/mlp "
       "modelstate-2"},
      [args](Context& c) -> absl::Status {
        if (args->action == "move") {
          return RunClusterMove(c, args->module, args->replica);
        }
        if (args->action != "status" || !args->module.empty()) {
          return UsageError(absl::StrCat("unknown cluster action '",
                                         args->action,
                                         "' (there are: status, move)"));
        }
        return RunClusterStatus(c);
      });
  cluster->add_option("ACTION", args->action, "status | move")->required();
  cluster->add_option("MODULE", args->module, "move: the module");
  cluster->add_option("REPLICA", args->replica, "move: the replica to own it");
  auto file = std::make_shared<std::string>();
  CLI::App* hash = commands.Add(
      {"hash-token", "print the SHA-256 a token file's entry holds for a token",
       "Reads the token from FILE (surrounding whitespace ignored) and "
       "prints its SHA-256 in hex: the token_sha256 of the server's "
       "--token_file. The token itself never goes into that file.",
       "head -c 32 /dev/urandom | base64 > alice.token && modelstatectl "
       "hash-token alice.token"},
      [file](Context& c) { return RunHashToken(c, *file); });
  hash->add_option("FILE", *file, "file holding the token")->required();
}

}  // namespace modelstate::cli
