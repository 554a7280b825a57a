#include "server/cluster_service.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "proto/convert.h"
#include "proto/service_convert.h"
#include "server/model_state_service.h"
#include "service/data_dir.h"

namespace modelstate::server {
namespace {

absl::Status ClusterStatus(ClusterMember& member,
                           v1::GetClusterStatusResponse* response) {
  response->set_replica(member.replica());
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ClusterMemberInfo> members,
                              member.LiveMembers());
  int64_t revision = 0;
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<ModuleOwner> owners,
                              member.Owners(&revision));
  response->set_etcd_revision(revision);
  std::map<std::string, uint64_t> owned;
  for (const ModuleOwner& owner : owners) ++owned[owner.replica];
  std::set<std::string> live;
  for (const ClusterMemberInfo& info : members) {
    live.insert(info.replica);
    v1::ClusterMember* out = response->add_members();
    out->set_replica(info.replica);
    out->set_address(info.address);
    out->set_lease_id(info.lease);
    MODELSTATE_ASSIGN_OR_RETURN(int64_t ttl,
                                member.etcd().TimeToLive(info.lease));
    out->set_lease_ttl_seconds(ttl);
    out->set_modules(owned[info.replica]);
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<RecordedCheckpoint> checkpoints,
                              member.Checkpoints());
  for (RecordedCheckpoint& recorded : checkpoints) {
    v1::ReplicaCheckpoint* out = response->add_checkpoints();
    out->set_replica(std::move(recorded.replica));
    out->set_verifier_key(std::move(recorded.verifier_key));
    out->set_note(std::move(recorded.note));
  }
  for (const ModuleOwner& owner : owners) {
    v1::ModulePlacement* out = response->add_placements();
    out->set_module(owner.module);
    out->set_owner(owner.replica);
    out->set_owner_live(live.count(owner.replica) > 0);
  }
  return absl::OkStatus();
}

// The bytes of file a move sends per message.
constexpr size_t kMoveChunkBytes = 1 << 20;
// A manifest is held in memory while it is received: 1 KiB per tensor is
// generous, so this admits a million tensors.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

// Sends `files` (paths, manifest last) over an ImportModule stream to
// `target`, which then owns `module`; returns the bytes sent.
absl::StatusOr<uint64_t> SendModule(ClusterRouter& router,
                                    const grpc::ServerContext& context,
                                    const Peer& target,
                                    const std::string& module,
                                    const std::vector<std::string>& files) {
  v1::ImportModuleRequest header;
  header.mutable_header()->set_module(module);
  header.mutable_header()->set_from_replica(router.replica());
  uint64_t total = 0;
  for (const std::string& path : files) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return ErrnoStatus(ec.value(), path, "cannot read its size");
    auto* file = header.mutable_header()->add_files();
    file->set_name(std::filesystem::path(path).filename().string());
    file->set_bytes(size);
    total += size;
  }
  v1::ClusterService::Stub stub(target.channel);
  std::unique_ptr<grpc::ClientContext> call = router.ForwardingContext(context);
  v1::ImportModuleResponse reply;
  std::unique_ptr<grpc::ClientWriter<v1::ImportModuleRequest>> writer =
      stub.ImportModule(call.get(), &reply);
  absl::Status read = absl::OkStatus();
  bool sending = writer->Write(header);
  v1::ImportModuleRequest chunk;
  for (size_t i = 0; sending && read.ok() && i < files.size(); ++i) {
    const std::string& path = files[i];
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) {
      read = ErrnoStatus(errno, path, "cannot open");
      break;
    }
    uint64_t left = header.header().files(static_cast<int>(i)).bytes();
    for (uint64_t offset = 0; sending && left > 0;) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(left, kMoveChunkBytes));
      std::string* data = chunk.mutable_data();
      data->resize(n);
      read = PreadAll(fd.get(), data->data(), n, offset, path);
      if (!read.ok()) break;
      sending = writer->Write(chunk);
      offset += n;
      left -= n;
    }
  }
  if (!read.ok()) {
    call->TryCancel();
    (void)writer->Finish();
    return read;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  if (status.ok()) return total;
  // The answer may be lost after the target took over: etcd knows.
  std::shared_ptr<ClusterMember> member = router.member();
  if (member != nullptr) {
    absl::StatusOr<std::optional<std::string>> owner = member->OwnerOf(module);
    if (owner.ok() && *owner == target.replica) return total;
  }
  absl::Status failed = convert::FromGrpcStatus(status);
  return absl::Status(failed.code(), absl::StrCat("replica ", target.replica,
                                                  " did not take the module: ",
                                                  failed.message()));
}

// An ImportModule stream's files, as the header announced them: every data
// file goes to a reserved path of the module, the manifest into memory.
class ReceivedFiles {
 public:
  explicit ReceivedFiles(const v1::ImportModuleHeader& header)
      : header_(header) {}

  // Checks the header's file list and reserves a path for each data file.
  absl::Status Open(ModelService& service, const Caller& caller,
                    const ModuleName& module) {
    const int count = header_.files_size();
    if (count == 0 || header_.files(count - 1).name() != "manifest.json") {
      return absl::InvalidArgumentError(
          "header.files: must end with manifest.json");
    }
    if (header_.files(count - 1).bytes() > kMaxManifestBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "header.files: the manifest's ", header_.files(count - 1).bytes(),
          " bytes exceed ", kMaxManifestBytes));
    }
    for (int i = 0; i + 1 < count; ++i) {
      const std::string& name = header_.files(i).name();
      if (data_dir::DataFileNumber(name) == 0 ||
          data_dir::DataFileName(data_dir::DataFileNumber(name)) != name ||
          received_.count(name) > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("header.files[", i, "].name: '", name,
                         "' is not a data file name, or it repeats"));
      }
      MODELSTATE_ASSIGN_OR_RETURN(std::string path,
                                  service.ReserveImportFile(caller, module));
      received_[name] = path;
      paths_.push_back(std::move(path));
    }
    return absl::OkStatus();
  }

  // The next bytes of the stream, in the header's file order.
  absl::Status Append(absl::string_view data) {
    while (!data.empty()) {
      if (file_ == header_.files_size()) {
        return absl::InvalidArgumentError(
            "data: more bytes than the header's files hold");
      }
      const uint64_t size = header_.files(file_).bytes();
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(data.size(), size - offset_));
      if (file_ + 1 == header_.files_size()) {
        manifest_.append(data.data(), n);
      } else {
        MODELSTATE_RETURN_IF_ERROR(Write(data.substr(0, n)));
      }
      data.remove_prefix(n);
      offset_ += n;
      if (offset_ == size) MODELSTATE_RETURN_IF_ERROR(NextFile());
    }
    return absl::OkStatus();
  }

  // OK when every announced byte came; the data files are durable then.
  absl::Status Finish() {
    // Empty files end here (no data message marks them).
    while (file_ < header_.files_size() &&
           header_.files(file_).bytes() == offset_) {
      MODELSTATE_RETURN_IF_ERROR(NextFile());
    }
    if (file_ < header_.files_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: the stream ended inside file '", header_.files(file_).name(),
          "' (", offset_, " of ", header_.files(file_).bytes(), " bytes)"));
    }
    return absl::OkStatus();
  }

  uint64_t bytes() const {
    uint64_t total = 0;
    for (const auto& file : header_.files()) total += file.bytes();
    return total;
  }
  const std::string& manifest() const { return manifest_; }
  // The sender's data file names -> the reserved paths. Taken by whoever
  // ends the import.
  std::map<std::string, std::string> Take() { return std::move(received_); }

 private:
  absl::Status Write(absl::string_view data) {
    const std::string& path = paths_[static_cast<size_t>(file_)];
    if (fd_ == nullptr) {
      fd_ = std::make_unique<ScopedFd>(
          ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (fd_->get() < 0) return ErrnoStatus(errno, path, "cannot create");
    }
    return WriteAll(fd_->get(), data, path);
  }
  // The current file is complete: durable before the manifest names it.
  absl::Status NextFile() {
    if (file_ + 1 < header_.files_size()) {
      if (fd_ == nullptr) MODELSTATE_RETURN_IF_ERROR(Write({}));
      const std::string& path = paths_[static_cast<size_t>(file_)];
      MODELSTATE_RETURN_IF_ERROR(Fdatasync(fd_->get(), path));
      MODELSTATE_RETURN_IF_ERROR(fd_->Close(path));
      fd_.reset();
    }
    ++file_;
    offset_ = 0;
    return absl::OkStatus();
  }

  const v1::ImportModuleHeader& header_;
  std::map<std::string, std::string> received_;
  std::vector<std::string> paths_;  // in header order
  std::string manifest_;
  int file_ = 0;
  uint64_t offset_ = 0;
  std::unique_ptr<ScopedFd> fd_;
};

}  // namespace

grpc::Status ClusterServiceImpl::MoveModuleToReplica(
    grpc::ServerContext* context, const v1::MoveModuleToReplicaRequest* request,
    v1::MoveModuleToReplicaResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        Credentials credentials,
        router_->CallerCredentials(*context, CredentialsOf(*context)));
    MODELSTATE_ASSIGN_OR_RETURN(
        Caller caller,
        service_->Authenticate(credentials, "MoveModuleToReplica"));
    MODELSTATE_RETURN_IF_ERROR(
        service_->AllowAdmin(caller, "MoveModuleToReplica"));
    MODELSTATE_ASSIGN_OR_RETURN(ModuleName name,
                                convert::ParseModuleField(request->module()));
    const std::string& target = request->replica();
    if (target.empty()) {
      return absl::InvalidArgumentError("replica: empty");
    }
    std::shared_ptr<ClusterMember> member = router_->member();
    if (member == nullptr) {
      return absl::UnavailableError("this replica is still joining");
    }
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<std::string> owner,
                                member->OwnerOf(name.full()));
    if (!owner.has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "module '", name.full(), "' is not placed in the cluster"));
    }
    if (*owner == target) {
      return absl::FailedPreconditionError(absl::StrCat(
          "module '", name.full(), "' is already on replica ", target));
    }
    // The owner moves it: any other replica passes the call on.
    MODELSTATE_ASSIGN_OR_RETURN(
        std::optional<Peer> forward_to,
        router_->Route(*context, name.full(), Access::kWrite));
    if (forward_to.has_value()) {
      v1::ClusterService::Stub stub(forward_to->channel);
      std::unique_ptr<grpc::ClientContext> call =
          router_->ForwardingContext(*context);
      return convert::FromGrpcStatus(
          stub.MoveModuleToReplica(call.get(), *request, response));
    }
    MODELSTATE_ASSIGN_OR_RETURN(Peer peer, router_->MemberPeer(target));
    uint64_t sent = 0;
    MODELSTATE_RETURN_IF_ERROR(service_->MoveModuleOut(
        caller, name, target,
        [&](const std::vector<std::string>& files) -> absl::StatusOr<uint64_t> {
          MODELSTATE_ASSIGN_OR_RETURN(
              sent, SendModule(*router_, *context, peer, name.full(), files));
          return sent;
        }));
    response->set_module(name.full());
    response->set_from_replica(router_->replica());
    response->set_to_replica(target);
    response->set_bytes(sent);
    return absl::OkStatus();
  }();
  return convert::ToGrpcStatus(status);
}

grpc::Status ClusterServiceImpl::ImportModule(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::ImportModuleRequest>* reader,
    v1::ImportModuleResponse* response) {
  std::optional<ModuleName> name;
  std::map<std::string, std::string> abandoned;
  absl::Status status = [&]() -> absl::Status {
    if (!router_->IsForwarded(*context)) {
      return absl::UnauthenticatedError(
          "ImportModule: only the replicas of this cluster call it (the "
          "cluster secret is missing)");
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        Credentials credentials,
        router_->CallerCredentials(*context, CredentialsOf(*context)));
    MODELSTATE_ASSIGN_OR_RETURN(
        Caller caller, service_->Authenticate(credentials, "ImportModule"));
    std::shared_ptr<ClusterMember> member = router_->member();
    if (member == nullptr) {
      return absl::UnavailableError("this replica is still joining");
    }
    v1::ImportModuleRequest message;
    if (!reader->Read(&message) || !message.has_header()) {
      return absl::InvalidArgumentError(
          "header: the stream must open with an ImportModuleHeader");
    }
    const v1::ImportModuleHeader header = message.header();
    MODELSTATE_ASSIGN_OR_RETURN(name,
                                convert::ParseModuleField(header.module()));
    ReceivedFiles files(header);
    absl::Status received = files.Open(*service_, caller, *name);
    while (received.ok() && reader->Read(&message)) {
      if (!message.has_data()) {
        received = absl::InvalidArgumentError(
            "header: sent twice; the stream carries one");
        break;
      }
      received = files.Append(message.data());
    }
    if (received.ok()) received = files.Finish();
    if (!received.ok()) {
      abandoned = files.Take();
      return received;
    }
    MODELSTATE_RETURN_IF_ERROR(service_->MoveModuleIn(
        caller, *name, header.from_replica(), files.manifest(), files.Take(),
        files.bytes(),
        [&] { return member->TakeOver(name->full(), header.from_replica()); }));
    response->set_replica(member->replica());
    return absl::OkStatus();
  }();
  if (!abandoned.empty()) service_->AbandonImport(*name, abandoned);
  return convert::ToGrpcStatus(status);
}

grpc::Status ClusterServiceImpl::GetClusterStatus(
    grpc::ServerContext* context, const v1::GetClusterStatusRequest*,
    v1::GetClusterStatusResponse* response) {
  absl::Status status = [&]() -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(
        Credentials credentials,
        router_->CallerCredentials(*context, CredentialsOf(*context)));
    MODELSTATE_ASSIGN_OR_RETURN(
        Caller caller, service_->Authenticate(credentials, "GetClusterStatus"));
    MODELSTATE_RETURN_IF_ERROR(
        service_->AllowAdmin(caller, "GetClusterStatus"));
    std::shared_ptr<ClusterMember> member = router_->member();
    if (member == nullptr) {
      return absl::UnavailableError("this replica is still joining");
    }
    return ClusterStatus(*member, response);
  }();
  return convert::ToGrpcStatus(status);
}

}  // namespace modelstate::server
