#include "server/model_state_service.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/shared_memory.h"
#include "base/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "proto/service_convert.h"
#include "server/cluster_audit_watch.h"
#include "server/cluster_pages.h"
#include "server/forwarding.h"
#include "server/subscription_reactor.h"

namespace modelstate::server {
namespace {

using ChunkWriter = grpc::ServerWriter<v1::StateDictChunk>;
using LoadReader = grpc::ServerReader<v1::LoadStateDictRequest>;
using AuditWriter = grpc::ServerWriter<v1::AuditRecordProto>;

absl::Status ClientWentAway() {
  return absl::CancelledError("client went away");
}

// The header, then (unless `metadata_only`) the bytes in chunks, until the
// client cancels.
absl::Status SendStateDict(grpc::ServerContext* context,
                           StateDictDownload& download, bool metadata_only,
                           ChunkWriter* writer) {
  StateDictReader& reader = *download.reader;
  v1::StateDictChunk message;
  convert::LayoutToHeader(reader.layout(), message.mutable_header());
  if (!writer->Write(message)) return ClientWentAway();
  if (metadata_only) return absl::OkStatus();
  while (reader.remaining() > 0) {
    if (context->IsCancelled()) return absl::CancelledError("client cancelled");
    MODELSTATE_RETURN_IF_ERROR(download.transfer->status());
    message.Clear();
    std::string* data = message.mutable_data();
    data->reserve(std::min<uint64_t>(download.chunk_bytes, reader.remaining()));
    MODELSTATE_ASSIGN_OR_RETURN(size_t n,
                                reader.Read(download.chunk_bytes, data));
    if (n == 0) break;
    if (!writer->Write(message)) return ClientWentAway();
  }
  return absl::OkStatus();
}

// How long one side of a ring transfer waits for the other to free a slot.
constexpr absl::Duration kRingWait = absl::Seconds(10);

absl::Status RingStalled() {
  return absl::DeadlineExceededError(
      absl::StrCat("shared_memory_ring: the client freed no slot within ",
                   absl::FormatDuration(kRingWait)));
}

// Each stretch of the stream written where the client's direct `table`
// says, in `peer`'s memory, and announced by a direct_bytes message.
absl::Status SendStateDictDirect(grpc::ServerContext* context,
                                 const Transfer& transfer,
                                 StateDictReader& reader, SharedRing& ring,
                                 const SharedRing::DirectTable& table,
                                 const PeerMemory& peer, ChunkWriter* writer) {
  // Big enough that announcing a stretch costs nothing, small enough that
  // progress and a cancelled call are seen within tens of milliseconds.
  constexpr size_t kStretchBytes = 64 << 20;
  // A client that stops the call waits for at most one piece's write.
  constexpr size_t kPieceBytes = 4 << 20;
  const std::vector<StateDictLayoutEntry>& entries = reader.layout().entries;
  auto write = [&](absl::string_view bytes, uint64_t address) {
    if (!ring.BeginDirectWrite(table.call)) {
      return absl::CancelledError(
          "shared_memory_direct: the client stopped the call");
    }
    absl::Status written = peer.Write(bytes, address);
    ring.EndDirectWrite();
    return written;
  };
  v1::StateDictChunk message;
  while (reader.remaining() > 0) {
    if (context->IsCancelled()) return ClientWentAway();
    MODELSTATE_RETURN_IF_ERROR(transfer.status());
    MODELSTATE_RETURN_IF_ERROR(peer.CheckAlive());
    MODELSTATE_ASSIGN_OR_RETURN(
        size_t n, reader.ReadTo(kStretchBytes, [&](absl::string_view piece) {
          const auto [entry, offset] = reader.NextByte();
          for (size_t done = 0; done < piece.size(); done += kPieceBytes) {
            absl::Status written =
                write(piece.substr(done, kPieceBytes),
                      table.targets[entry].address + offset + done);
            if (!written.ok()) {
              return absl::Status(written.code(),
                                  absl::StrCat(written.message(), " (entry '",
                                               entries[entry].key, "')"));
            }
          }
          return absl::OkStatus();
        }));
    message.set_direct_bytes(n);
    if (!writer->Write(message)) return ClientWentAway();
  }
  return absl::OkStatus();
}

// Whether the client's direct `table` may be written: each target as long
// as its entry, and the kernel lets this process write there
// (FAILED_PRECONDITION when it does not: the slots then).
absl::Status CheckDirectTable(const StateDictLayout& layout,
                              const std::vector<DirectTarget>& table,
                              const PeerMemory& peer) {
  const DirectTarget* first = nullptr;
  for (size_t i = 0; i < table.size(); ++i) {
    const DirectTarget& target = table[i];
    if (target.length != layout.entries[i].nbytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared_memory_direct: entry '", layout.entries[i].key,
                       "' has ", target.length, " bytes at ", target.address,
                       "; the header says ", layout.entries[i].nbytes));
    }
    if (target.address > ~uint64_t{0} - target.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("shared_memory_direct: entry '", layout.entries[i].key,
                       "' has ", target.length, " bytes at ", target.address,
                       ", which runs past the end of the address space"));
    }
    if (first == nullptr && target.length > 0) first = &target;
  }
  return first == nullptr ? absl::OkStatus() : peer.Probe(first->address);
}

// The header, then the bytes: straight into the client's memory when it
// offered a direct table (`direct`) and may be written, otherwise through
// `ring`, a slot at a time, each announced by a ring_bytes message once it
// is written.
absl::Status SendStateDictThroughRing(grpc::ServerContext* context,
                                      StateDictDownload& download,
                                      const SharedMemoryExchange::Lease& lease,
                                      bool direct, ChunkWriter* writer) {
  StateDictReader& reader = *download.reader;
  SharedRing& ring = lease.ring();
  v1::StateDictChunk message;
  convert::LayoutToHeader(reader.layout(), message.mutable_header());
  if (!writer->Write(message)) return ClientWentAway();
  if (direct) {
    MODELSTATE_ASSIGN_OR_RETURN(
        std::optional<SharedRing::DirectTable> table,
        ring.AwaitDirectTable(
            reader.layout().entries.size(), kRingWait,
            [&] { return context->IsCancelled(); }, "shared_memory_direct"));
    if (table.has_value() && lease.peer() != nullptr) {
      absl::Status writable =
          CheckDirectTable(reader.layout(), table->targets, *lease.peer());
      if (writable.ok()) {
        return SendStateDictDirect(context, *download.transfer, reader, ring,
                                   *table, *lease.peer(), writer);
      }
      if (!absl::IsFailedPrecondition(writable)) return writable;
    }
  }
  for (uint64_t chunk = 0; reader.remaining() > 0; ++chunk) {
    if (!ring.WaitForSlot(chunk, kRingWait,
                          [&] { return context->IsCancelled(); })) {
      return context->IsCancelled() ? ClientWentAway() : RingStalled();
    }
    MODELSTATE_RETURN_IF_ERROR(download.transfer->status());
    MODELSTATE_ASSIGN_OR_RETURN(
        size_t n, reader.ReadInto(ring.slot_bytes(), ring.slot(chunk)));
    if (n == 0) break;
    message.Clear();
    message.set_ring_bytes(static_cast<uint32_t>(n));
    if (!writer->Write(message)) return ClientWentAway();
  }
  return absl::OkStatus();
}

// The ring_bytes messages that follow the start: each chunk copied out of
// `ring` into `session`, then its slot freed.
absl::Status ReceiveLoadThroughRing(grpc::ServerContext* context,
                                    LoadReader* reader, SharedRing& ring,
                                    LoadSession& session) {
  v1::LoadStateDictRequest message;
  for (uint64_t chunk = 0; reader->Read(&message); ++chunk) {
    if (message.payload_case() != v1::LoadStateDictRequest::kRingBytes) {
      return absl::InvalidArgumentError(
          "data: only ring_bytes messages may follow a start with a "
          "shared_memory_ring");
    }
    const uint64_t n = message.ring_bytes();
    if (n == 0 || n > ring.slot_bytes()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring_bytes: ", n, "; from 1 to the slot size (",
                       ring.slot_bytes(), ") may be announced"));
    }
    // Copied before use, so that a client writing the slot meanwhile
    // changes only what it loads, never what the audit digest says of it;
    // the slot is free for the client's next chunk as soon as it is copied.
    std::string bytes(ring.slot(chunk), n);
    ring.set_consumed(chunk + 1);
    MODELSTATE_RETURN_IF_ERROR(session.Append(std::move(bytes)));
  }
  if (context->IsCancelled()) {
    return absl::CancelledError("client cancelled; nothing loaded");
  }
  return absl::OkStatus();
}

// A load stream's first message, which must be its start.
absl::StatusOr<v1::LoadStart> ReadLoadStart(LoadReader* reader) {
  v1::LoadStateDictRequest message;
  if (!reader->Read(&message)) {
    // gRPC's reader does not say which of the two it was.
    return absl::InvalidArgumentError(
        "start: no start message could be read: the stream ended before it, "
        "or its first message is not a LoadStateDictRequest");
  }
  if (message.payload_case() != v1::LoadStateDictRequest::kStart) {
    return absl::InvalidArgumentError(
        "start: the first message must be a start message");
  }
  return std::move(*message.mutable_start());
}

// The data messages that follow the start, into `session`.
absl::Status ReceiveLoadData(grpc::ServerContext* context, LoadReader* reader,
                             LoadSession& session) {
  v1::LoadStateDictRequest message;
  while (reader->Read(&message)) {
    if (message.payload_case() == v1::LoadStateDictRequest::kRingBytes) {
      return absl::InvalidArgumentError(
          "ring_bytes: the start named no shared_memory_ring");
    }
    if (message.payload_case() != v1::LoadStateDictRequest::kData) {
      return absl::InvalidArgumentError(
          "data: only data messages may follow the start message");
    }
    MODELSTATE_RETURN_IF_ERROR(
        session.Append(std::move(*message.mutable_data())));
  }
  if (context->IsCancelled()) {
    return absl::CancelledError("client cancelled; nothing loaded");
  }
  return absl::OkStatus();
}

// Matching records as they are appended, until the client cancels; wakes
// up at least once a second to notice.
// Until the call is cancelled, or `stop` (when given) is set.
absl::Status SendAuditRecords(grpc::ServerContext* context, AuditWatch& watch,
                              const AuditSink& write,
                              const std::atomic<bool>* stop) {
  while (!context->IsCancelled() && (stop == nullptr || !stop->load())) {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> records,
                                watch.Next(absl::Seconds(1)));
    for (const AuditRecord& r : records) {
      v1::AuditRecordProto out;
      convert::AuditRecordToProto(r, &out);
      if (!write(out)) return absl::CancelledError();
    }
  }
  return absl::CancelledError();
}

}  // namespace

Credentials CredentialsOf(const grpc::ServerContextBase& context) {
  Credentials credentials;
  credentials.peer = context.peer();
  const auto& metadata = context.client_metadata();
  if (auto it = metadata.find("x-request-id"); it != metadata.end()) {
    credentials.request_id.assign(it->second.data(), it->second.size());
  }
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    credentials.authorization.emplace(it->second.data(), it->second.size());
  }
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr) {
    std::vector<grpc::string_ref> names =
        auth->FindPropertyValues("x509_common_name");
    if (!names.empty()) {
      credentials.certificate_cn.emplace(names.front().data(),
                                         names.front().size());
    }
  }
  return credentials;
}

namespace {

// Every mutating RPC's response has `repeated uint64 audit_seqs`.
void AddAuditSeqs(absl::Span<const uint64_t> seqs,
                  google::protobuf::Message* response) {
  const google::protobuf::FieldDescriptor* field =
      response->GetDescriptor()->FindFieldByName("audit_seqs");
  if (field == nullptr) return;
  for (uint64_t seq : seqs) {
    response->GetReflection()->AddUInt64(response, field, seq);
  }
}

// `call` served by the owner of `module` when that is another replica (its
// status); nullopt when it is served here, or in a server on its own.
//
// `authenticate` comes first: a caller without valid credentials learns
// nothing of where a module is, and makes no claim in etcd.
template <typename Request, typename Response>
std::optional<grpc::Status> ToOwner(
    ClusterRouter* router, absl::FunctionRef<absl::Status()> authenticate,
    grpc::ServerContext* context, absl::string_view module, Access access,
    grpc::Status (Stub::*call)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, Response* response) {
  if (router == nullptr) return std::nullopt;
  if (absl::Status known = authenticate(); !known.ok()) {
    return convert::ToGrpcStatus(known);
  }
  absl::StatusOr<std::optional<Peer>> owner =
      router->Route(*context, module, access);
  if (!owner.ok()) return convert::ToGrpcStatus(owner.status());
  if (!owner->has_value()) return std::nullopt;
  return ForwardUnary(*router, **owner, context, call, request, response);
}

// ToOwner for a call whose answer is a stream.
template <typename Request, typename Message>
std::optional<grpc::Status> DownloadFromOwner(
    ClusterRouter* router, absl::FunctionRef<absl::Status()> authenticate,
    grpc::ServerContext* context, absl::string_view module,
    std::unique_ptr<grpc::ClientReader<Message>> (Stub::*call)(
        grpc::ClientContext*, const Request&),
    const Request& request, grpc::ServerWriter<Message>* writer) {
  if (router == nullptr) return std::nullopt;
  if (absl::Status known = authenticate(); !known.ok()) {
    return convert::ToGrpcStatus(known);
  }
  absl::StatusOr<std::optional<Peer>> owner =
      router->Route(*context, module, Access::kRead);
  if (!owner.ok()) return convert::ToGrpcStatus(owner.status());
  if (!owner->has_value()) return std::nullopt;
  return ForwardDownload(*router, **owner, context, call, request, writer);
}

}  // namespace

std::function<absl::Status()> ModelStateServiceImpl::AuthenticatesAs(
    grpc::ServerContextBase* context, absl::string_view rpc) {
  return [this, context, rpc] { return Authenticate(*context, rpc).status(); };
}

absl::StatusOr<Caller> ModelStateServiceImpl::Authenticate(
    const grpc::ServerContextBase& context, absl::string_view rpc) {
  Credentials credentials = CredentialsOf(context);
  if (router_ != nullptr) {
    MODELSTATE_ASSIGN_OR_RETURN(
        credentials,
        router_->CallerCredentials(context, std::move(credentials)));
  }
  return service_->Authenticate(credentials, rpc);
}

grpc::Status ModelStateServiceImpl::ListClusterModules(
    grpc::ServerContext* context, const v1::ListModulesRequest* request,
    v1::ListModulesResponse* response) {
  std::vector<v1::ListModulesResponse> pages(1);
  grpc::Status status = ListLocalModules(context, request, &pages[0]);
  if (!status.ok()) return status;
  absl::StatusOr<std::vector<Peer>> others = router_->OtherMembers();
  if (!others.ok()) return convert::ToGrpcStatus(others.status());
  for (const Peer& peer : *others) {
    status = ForwardUnary(*router_, peer, context, &Stub::ListModules, *request,
                          &pages.emplace_back());
    if (!status.ok()) return FromReplica(peer.replica, status);
  }
  *response = MergeModulePages(std::move(pages), request->page_size());
  return grpc::Status::OK;
}

namespace {

// A call that asks for the cluster's view of a server on its own.
grpc::Status NotAClusterMember() {
  return convert::ToGrpcStatus(absl::InvalidArgumentError(
      "cluster: this server is not a cluster member (--etcd_endpoints)"));
}

}  // namespace

grpc::Status ModelStateServiceImpl::QueryClusterAudit(
    grpc::ServerContext* context, const v1::QueryAuditRequest* request,
    v1::QueryAuditResponse* response) {
  // Each replica's first `limit` records after its own after_seq.
  absl::StatusOr<std::vector<Peer>> others = router_->OtherMembers();
  if (!others.ok()) return convert::ToGrpcStatus(others.status());
  std::vector<ReplicaAuditPage> pages(others->size() + 1);
  for (size_t i = 0; i < pages.size(); ++i) {
    ReplicaAuditPage& page = pages[i];
    page.replica = i == 0 ? router_->replica() : (*others)[i - 1].replica;
    auto after = request->after_seqs().find(page.replica);
    if (after != request->after_seqs().end()) page.after_seq = after->second;
    v1::QueryAuditRequest own = *request;
    own.set_cluster(false);
    own.clear_after_seqs();
    own.set_after_seq(page.after_seq);
    grpc::Status status =
        i == 0 ? QueryAudit(context, &own, &page.records)
               : ForwardUnary(*router_, (*others)[i - 1], context,
                              &Stub::QueryAudit, own, &page.records);
    if (!status.ok()) return FromReplica(page.replica, status);
  }
  // The replicas that have a log (they recorded its checkpoint in etcd):
  // those without a live lease have no page here.
  std::shared_ptr<ClusterMember> member = router_->member();
  absl::StatusOr<std::vector<RecordedCheckpoint>> known =
      member == nullptr
          ? absl::StatusOr<std::vector<RecordedCheckpoint>>(
                absl::UnavailableError("this replica is still joining"))
          : member->Checkpoints();
  if (!known.ok()) return convert::ToGrpcStatus(known.status());
  std::vector<std::string> logged;
  for (const RecordedCheckpoint& checkpoint : *known) {
    logged.push_back(checkpoint.replica);
  }
  *response = MergeAuditPages(std::move(pages), request->limit(), logged);
  return grpc::Status::OK;
}

template <typename Body>
grpc::Status ModelStateServiceImpl::Serve(grpc::ServerContextBase* context,
                                          absl::string_view rpc, Body body,
                                          google::protobuf::Message* response) {
  absl::StatusOr<Caller> caller = Authenticate(*context, rpc);
  if (!caller.ok()) return convert::ToGrpcStatus(caller.status());
  service_->BeginAuditCall(*caller);
  absl::Status status = body(*caller);
  std::vector<uint64_t> seqs = service_->EndAuditCall(*caller);
  if (!seqs.empty()) {
    context->AddTrailingMetadata(convert::kAuditSeqsKey,
                                 convert::AuditSeqsTrailer(seqs));
    if (response != nullptr) AddAuditSeqs(seqs, response);
  }
  return convert::ToGrpcStatus(status);
}

grpc::Status ModelStateServiceImpl::BuildModule(
    grpc::ServerContext* context, const v1::BuildModuleRequest* request,
    v1::BuildModuleResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "BuildModule"),
                               context, request->module(), Access::kBuild,
                               &Stub::BuildModule, *request, response)) {
    return *forwarded;
  }
  grpc::Status status = Serve(
      context, "BuildModule",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            BuildModuleArgs args, convert::BuildModuleArgsFromProto(*request));
        // A build of a name another build holds waits for that one's
        // outcome, as long as this call lasts.
        Caller waiting = caller;
        waiting.ctx.deadline = absl::FromChrono(context->deadline());
        waiting.ctx.cancelled = [context] { return context->IsCancelled(); };
        MODELSTATE_ASSIGN_OR_RETURN(
            BuildOutcome outcome,
            service_->BuildModule(waiting, args, [&](const Module& root) {
              convert::ModuleInfoToProto(root, false, response->mutable_info());
            }));
        convert::BuildOutcomeToProto(args.module, outcome, response);
        return absl::OkStatus();
      },
      response);
  if (router_ != nullptr) {
    absl::StatusOr<ModuleName> name = ParseModuleName(request->module());
    router_->BuildDone(request->module(), name.ok() && service_->Hosts(*name));
  }
  return status;
}

grpc::Status ModelStateServiceImpl::RegisterTensor(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    EntryKind kind, v1::RegisterResponse* response) {
  const char* rpc =
      kind == EntryKind::kParameter ? "RegisterParameter" : "RegisterBuffer";
  if (auto forwarded =
          ToOwner(router_, AuthenticatesAs(context, rpc), context,
                  request->module(), Access::kWrite,
                  kind == EntryKind::kParameter ? &Stub::RegisterParameter
                                                : &Stub::RegisterBuffer,
                  *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, rpc,
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            RegisterTensorArgs args,
            convert::RegisterTensorArgsFromProto(
                *request, kind, service_->limits().max_tensor_bytes));
        MODELSTATE_ASSIGN_OR_RETURN(
            std::vector<RegistrationResult> results,
            service_->RegisterTensor(caller, std::move(args)));
        convert::ReportsToProto(results, response);
        return absl::OkStatus();
      },
      response);
}

grpc::Status ModelStateServiceImpl::RegisterParameter(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    v1::RegisterResponse* response) {
  return RegisterTensor(context, request, EntryKind::kParameter, response);
}

grpc::Status ModelStateServiceImpl::RegisterBuffer(
    grpc::ServerContext* context, const v1::RegisterTensorRequest* request,
    v1::RegisterResponse* response) {
  return RegisterTensor(context, request, EntryKind::kBuffer, response);
}

grpc::Status ModelStateServiceImpl::RegisterSubmodule(
    grpc::ServerContext* context, const v1::RegisterSubmoduleRequest* request,
    v1::RegisterResponse* response) {
  if (auto forwarded =
          ToOwner(router_, AuthenticatesAs(context, "RegisterSubmodule"),
                  context, request->module(), Access::kWrite,
                  &Stub::RegisterSubmodule, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "RegisterSubmodule",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            RegisterSubmoduleArgs args,
            convert::RegisterSubmoduleArgsFromProto(*request));
        MODELSTATE_ASSIGN_OR_RETURN(
            std::vector<RegistrationResult> results,
            service_->RegisterSubmodule(caller, std::move(args)));
        convert::ReportsToProto(results, response);
        return absl::OkStatus();
      },
      response);
}

grpc::Status ModelStateServiceImpl::RemoveEntry(
    grpc::ServerContext* context, const v1::RemoveEntryRequest* request,
    v1::RegisterResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "RemoveEntry"),
                               context, request->module(), Access::kWrite,
                               &Stub::RemoveEntry, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "RemoveEntry",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            RemoveEntryArgs args, convert::RemoveEntryArgsFromProto(*request));
        MODELSTATE_ASSIGN_OR_RETURN(std::vector<RegistrationResult> results,
                                    service_->RemoveEntry(caller, args));
        convert::ReportsToProto(results, response);
        return absl::OkStatus();
      },
      response);
}

grpc::Status ModelStateServiceImpl::GetModule(
    grpc::ServerContext* context, const v1::GetModuleRequest* request,
    v1::GetModuleResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "GetModule"),
                               context, request->module(), Access::kRead,
                               &Stub::GetModule, *request, response)) {
    return *forwarded;
  }
  return Serve(context, "GetModule", [&](const Caller& caller) -> absl::Status {
    MODELSTATE_ASSIGN_OR_RETURN(ModuleName name,
                                convert::ParseModuleField(request->module()));
    MODELSTATE_RETURN_IF_ERROR(service_->GetModule(
        caller, name, request->path(), request->with_hashes(),
        [&](const Module& module) {
          convert::ModuleInfoToProto(module, request->with_hashes(),
                                     response->mutable_info());
          response->set_total_bytes(module.TotalBytes());
        }));
    convert::ModuleLocationToProto(name, service_->ServerDevices(), response);
    return absl::OkStatus();
  });
}

grpc::Status ModelStateServiceImpl::ListModules(
    grpc::ServerContext* context, const v1::ListModulesRequest* request,
    v1::ListModulesResponse* response) {
  if (router_ != nullptr && !router_->IsForwarded(*context)) {
    return ListClusterModules(context, request, response);
  }
  return ListLocalModules(context, request, response);
}

grpc::Status ModelStateServiceImpl::ListLocalModules(
    grpc::ServerContext* context, const v1::ListModulesRequest* request,
    v1::ListModulesResponse* response) {
  return Serve(context, "ListModules",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(
                     ModulePage page,
                     service_->ListModules(
                         caller, convert::ListModulesArgsFromProto(*request)));
                 convert::ModulePageToProto(page, response);
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::DeleteModule(
    grpc::ServerContext* context, const v1::DeleteModuleRequest* request,
    v1::DeleteModuleResponse* response) {
  if (auto forwarded =
          ToOwner(router_, AuthenticatesAs(context, "DeleteModule"), context,
                  request->module(), Access::kWrite, &Stub::DeleteModule,
                  *request, response)) {
    return *forwarded;
  }
  grpc::Status status = Serve(
      context, "DeleteModule",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            ModuleName name, convert::ParseModuleField(request->module()));
        return service_->DeleteModule(caller, name);
      },
      response);
  if (router_ != nullptr && status.ok()) router_->Release(request->module());
  return status;
}

grpc::Status ModelStateServiceImpl::GetStateDict(
    grpc::ServerContext* context, const v1::GetStateDictRequest* request,
    ChunkWriter* writer) {
  if (auto forwarded = DownloadFromOwner(
          router_, AuthenticatesAs(context, "GetStateDict"), context,
          request->module(), &Stub::GetStateDict, *request, writer)) {
    return *forwarded;
  }
  return Serve(
      context, "GetStateDict", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            GetStateDictArgs args,
            convert::GetStateDictArgsFromProto(*request));
        MODELSTATE_ASSIGN_OR_RETURN(
            StateDictDownload download,
            service_->GetStateDict(caller, std::move(args)));
        // A revoked caller's stream ends at its next chunk; one that
        // stalls is cancelled (ModelService::RecheckTransfers).
        download.transfer->set_stop([context] { context->TryCancel(); });
        if (request->shared_memory_ring().empty() || request->metadata_only()) {
          return SendStateDict(context, download, request->metadata_only(),
                               writer);
        }
        MODELSTATE_ASSIGN_OR_RETURN(
            SharedMemoryExchange::Lease lease,
            LendRing(request->shared_memory_ring(), "shared_memory_ring"));
        MODELSTATE_RETURN_IF_ERROR(SendStateDictThroughRing(
            context, download, lease, request->shared_memory_direct(), writer));
        CountSharedBytes("get", download.reader->layout().total_bytes);
        return absl::OkStatus();
      });
}

grpc::Status ModelStateServiceImpl::LoadStateDict(
    grpc::ServerContext* context, LoadReader* reader,
    v1::LoadStateDictResponse* response) {
  return Serve(
      context, "LoadStateDict",
      [&](const Caller& caller) -> absl::Status {
        // Authorised and counted before it may stall on its start.
        MODELSTATE_ASSIGN_OR_RETURN(auto slot, service_->OpenLoad(caller));
        MODELSTATE_ASSIGN_OR_RETURN(v1::LoadStart start, ReadLoadStart(reader));
        if (router_ != nullptr) {
          // Held here while it is relayed, the slot counts the stream on
          // this replica as well as on the owner.
          MODELSTATE_ASSIGN_OR_RETURN(
              std::optional<Peer> owner,
              router_->Route(*context, start.module(), Access::kWrite));
          if (owner.has_value()) {
            v1::LoadStateDictRequest first;
            *first.mutable_start() = std::move(start);
            return convert::FromGrpcStatus(ForwardLoad(
                *router_, *owner, context, first, reader, response));
          }
        }
        MODELSTATE_ASSIGN_OR_RETURN(LoadStateDictArgs args,
                                    convert::LoadStateDictArgsFromProto(start));
        const uint64_t total_bytes = args.layout.total_bytes;
        MODELSTATE_ASSIGN_OR_RETURN(
            std::unique_ptr<LoadSession> session,
            service_->LoadStateDict(caller, std::move(args), std::move(slot)));
        session->transfer().set_stop([context] { context->TryCancel(); });
        absl::Status received;
        if (start.shared_memory_ring().empty()) {
          received = ReceiveLoadData(context, reader, *session);
        } else {
          absl::StatusOr<SharedMemoryExchange::Lease> lease =
              LendRing(start.shared_memory_ring(), "start.shared_memory_ring");
          received = lease.ok() ? ReceiveLoadThroughRing(
                                      context, reader, lease->ring(), *session)
                                : lease.status();
          if (received.ok()) CountSharedBytes("load", total_bytes);
        }
        if (!received.ok()) return session->Fail(std::move(received));
        MODELSTATE_ASSIGN_OR_RETURN(LoadResult result, session->Finish());
        convert::LoadResultToProto(result, response);
        return absl::OkStatus();
      },
      response);
}

grpc::Status ModelStateServiceImpl::MoveModule(
    grpc::ServerContext* context, const v1::MoveModuleRequest* request,
    v1::MoveModuleResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "MoveModule"),
                               context, request->module(), Access::kWrite,
                               &Stub::MoveModule, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "MoveModule",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(MoveModuleArgs args,
                                    convert::MoveModuleArgsFromProto(*request));
        return service_->MoveModule(caller, args, [&](const Module& root) {
          convert::ModuleInfoToProto(root, false, response->mutable_info());
        });
      },
      response);
}

grpc::Status ModelStateServiceImpl::SetTraining(
    grpc::ServerContext* context, const v1::SetTrainingRequest* request,
    v1::SetTrainingResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "SetTraining"),
                               context, request->module(), Access::kWrite,
                               &Stub::SetTraining, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "SetTraining",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            ModuleName name, convert::ParseModuleField(request->module()));
        return service_->SetTraining(caller, name, request->training());
      },
      response);
}

grpc::Status ModelStateServiceImpl::Forward(grpc::ServerContext* context,
                                            const v1::ForwardRequest* request,
                                            v1::ForwardResponse* response) {
  if (auto forwarded = ToOwner(router_, AuthenticatesAs(context, "Forward"),
                               context, request->module(), Access::kWrite,
                               &Stub::Forward, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "Forward",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            ForwardArgs args,
            convert::ForwardArgsFromProto(*request,
                                          service_->limits().max_tensor_bytes));
        MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> outputs,
                                    service_->Forward(caller, std::move(args)));
        return convert::ForwardOutputsToProto(outputs, response);
      },
      response);
}

void ModelStateServiceImpl::ServeSubscriptions(AsyncCallQueue* queue) {
  using Reactor = AsyncBidiReactor<v1::SubscribeRequest, v1::SubscribeResponse>;
  ServeStreams<Reactor>(
      queue,
      [this](Reactor::Call* call, grpc::ServerCompletionQueue* cq, void* tag) {
        RequestSubscribe(call->context(), call->responder(), cq, cq, tag);
      },
      [this](Reactor::Call* call) -> Reactor* {
        grpc::ServerContext* context = call->context();
        absl::StatusOr<Caller> caller = Authenticate(*context, "Subscribe");
        absl::StatusOr<std::unique_ptr<SubscriberSession>> session =
            caller.ok() ? service_->OpenSubscription(*caller) : caller.status();
        if (router_ == nullptr) {
          return new SubscriptionReactor(call, std::move(session),
                                         service_->limits(), metrics_);
        }
        // At the subscriber's home replica, the other replicas' events are
        // relayed; a relayed subscription itself relays nothing.
        std::unique_ptr<SubscriptionRelay> relay;
        if (session.ok() && !router_->IsForwarded(*context)) {
          relay = std::make_unique<SubscriptionRelay>(router_, context,
                                                      router_->relay_refresh());
        }
        return new SubscriptionReactor(call, std::move(session),
                                       service_->limits(), metrics_,
                                       router_->replica(), std::move(relay));
      });
}

grpc::Status ModelStateServiceImpl::ListSubscribers(
    grpc::ServerContext* context, const v1::ListSubscribersRequest*,
    v1::ListSubscribersResponse* response) {
  return Serve(
      context, "ListSubscribers", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(std::vector<SubscriberInfo> subscribers,
                                    service_->ListSubscribers(caller));
        convert::SubscribersToProto(subscribers, response);
        return absl::OkStatus();
      });
}

grpc::Status ModelStateServiceImpl::QueryAudit(
    grpc::ServerContext* context, const v1::QueryAuditRequest* request,
    v1::QueryAuditResponse* response) {
  if (request->cluster()) {
    if (router_ == nullptr) return NotAClusterMember();
    return QueryClusterAudit(context, request, response);
  }
  return Serve(
      context, "QueryAudit", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            AuditQuery query,
            convert::AuditQueryFromProto(
                request->filter(), request->after_seq(), request->limit()));
        MODELSTATE_ASSIGN_OR_RETURN(
            AuditPage page, service_->QueryAudit(caller, std::move(query)));
        convert::AuditPageToProto(page, response);
        return absl::OkStatus();
      });
}

grpc::Status ModelStateServiceImpl::WatchAudit(
    grpc::ServerContext* context, const v1::WatchAuditRequest* request,
    AuditWriter* writer) {
  if (request->cluster()) {
    if (router_ == nullptr) return NotAClusterMember();
    return WatchClusterAudit(context, request, writer);
  }
  return WatchOwnAudit(
      context, *request,
      [writer](v1::AuditRecordProto& record) { return writer->Write(record); },
      nullptr);
}

grpc::Status ModelStateServiceImpl::WatchOwnAudit(
    grpc::ServerContext* context, const v1::WatchAuditRequest& request,
    const AuditSink& write, const std::atomic<bool>* stop) {
  return Serve(
      context, "WatchAudit", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            AuditQuery query, convert::AuditQueryFromProto(
                                  request.filter(), request.after_seq(), 0));
        MODELSTATE_ASSIGN_OR_RETURN(
            std::unique_ptr<AuditWatch> watch,
            service_->WatchAudit(caller, std::move(query)));
        return SendAuditRecords(context, *watch, write, stop);
      });
}

grpc::Status ModelStateServiceImpl::WatchClusterAudit(
    grpc::ServerContext* context, const v1::WatchAuditRequest* request,
    AuditWriter* writer) {
  return WatchEveryReplica(
      *router_, context, *request, writer,
      [&](const v1::WatchAuditRequest& own, const AuditSink& write,
          const std::atomic<bool>* stop) {
        return WatchOwnAudit(context, own, write, stop);
      });
}

grpc::Status ModelStateServiceImpl::VerifyAudit(
    grpc::ServerContext* context, const v1::VerifyAuditRequest*,
    v1::VerifyAuditResponse* response) {
  return Serve(context, "VerifyAudit",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(AuditVerification verification,
                                             service_->VerifyAudit(caller));
                 convert::VerificationToProto(verification, response);
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::GetCheckpoint(
    grpc::ServerContext* context, const v1::GetCheckpointRequest* request,
    v1::GetCheckpointResponse* response) {
  return Serve(context, "GetCheckpoint",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(
                     AuditCheckpoint checkpoint,
                     service_->GetCheckpoint(caller, request->fresh()));
                 response->set_checkpoint(std::move(checkpoint.note));
                 response->set_verifier_key(std::move(checkpoint.verifier_key));
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::GetInclusionProof(
    grpc::ServerContext* context, const v1::GetInclusionProofRequest* request,
    v1::GetInclusionProofResponse* response) {
  return Serve(context, "GetInclusionProof",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(
                     AuditInclusion inclusion,
                     service_->GetInclusionProof(caller, request->seq(),
                                                 request->tree_size()));
                 convert::InclusionToProto(inclusion, response);
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::GetConsistencyProof(
    grpc::ServerContext* context, const v1::GetConsistencyProofRequest* request,
    v1::GetConsistencyProofResponse* response) {
  return Serve(context, "GetConsistencyProof",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(
                     std::vector<MerkleHash> proof,
                     service_->GetConsistencyProof(caller, request->old_size(),
                                                   request->new_size()));
                 convert::HashesToProto(proof, response->mutable_proof());
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::AddCosignature(
    grpc::ServerContext* context, const v1::AddCosignatureRequest* request,
    v1::AddCosignatureResponse* response) {
  return Serve(context, "AddCosignature",
               [&](const Caller& caller) -> absl::Status {
                 MODELSTATE_ASSIGN_OR_RETURN(
                     std::string latest,
                     service_->AddCosignature(caller, request->checkpoint()));
                 response->set_checkpoint(std::move(latest));
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::ListDevices(
    grpc::ServerContext* context, const v1::ListDevicesRequest*,
    v1::ListDevicesResponse* response) {
  return Serve(
      context, "ListDevices", [&](const Caller& caller) -> absl::Status {
        convert::DevicesToProto(service_->ListDevices(caller), response);
        return absl::OkStatus();
      });
}

absl::StatusOr<SharedMemoryExchange::Lease> ModelStateServiceImpl::LendRing(
    absl::string_view token, absl::string_view field) {
  if (shared_memory_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": this server offers no shared memory"));
  }
  return shared_memory_->Lend(token, field);
}

void ModelStateServiceImpl::CountSharedBytes(absl::string_view direction,
                                             uint64_t bytes) {
  if (metrics_ != nullptr) {
    metrics_->shared_memory_bytes(direction).Increment(bytes);
  }
}

grpc::Status ModelStateServiceImpl::GetSharedMemoryInfo(
    grpc::ServerContext* context, const v1::GetSharedMemoryInfoRequest*,
    v1::GetSharedMemoryInfoResponse* response) {
  return Serve(context, "GetSharedMemoryInfo",
               [&](const Caller&) -> absl::Status {
                 if (shared_memory_ != nullptr) {
                   response->set_socket_path(shared_memory_->socket_path());
                 }
                 response->set_boot_id(BootId());
                 return absl::OkStatus();
               });
}

grpc::Status ModelStateServiceImpl::ReleaseSubscriberName(
    grpc::ServerContext* context,
    const v1::ReleaseSubscriberNameRequest* request,
    v1::ReleaseSubscriberNameResponse* response) {
  return Serve(
      context, "ReleaseSubscriberName",
      [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            NameRelease release,
            service_->ReleaseSubscriberName(caller, request->name(),
                                            request->force()));
        response->set_owner(release.owner);
        response->set_disconnected(release.disconnected);
        return absl::OkStatus();
      },
      response);
}

grpc::Status ModelStateServiceImpl::AttestModule(
    grpc::ServerContext* context, const v1::AttestModuleRequest* request,
    v1::AttestModuleResponse* response) {
  if (auto forwarded =
          ToOwner(router_, AuthenticatesAs(context, "AttestModule"), context,
                  request->module(), Access::kRead, &Stub::AttestModule,
                  *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "AttestModule", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            ModuleName name, convert::ParseModuleField(request->module()));
        MODELSTATE_ASSIGN_OR_RETURN(ModuleAttestation attestation,
                                    service_->AttestModule(caller, name));
        response->set_envelope(std::move(attestation.envelope_json));
        response->set_verifier_key(std::move(attestation.verifier_key));
        response->set_checkpoint(std::move(attestation.checkpoint));
        return absl::OkStatus();
      });
}

grpc::Status ModelStateServiceImpl::SignStateFile(
    grpc::ServerContext* context, const v1::SignStateFileRequest* request,
    v1::SignStateFileResponse* response) {
  if (auto forwarded =
          ToOwner(router_, AuthenticatesAs(context, "SignStateFile"), context,
                  request->state().module(), Access::kRead,
                  &Stub::SignStateFile, *request, response)) {
    return *forwarded;
  }
  return Serve(
      context, "SignStateFile", [&](const Caller& caller) -> absl::Status {
        MODELSTATE_ASSIGN_OR_RETURN(
            GetStateDictArgs args,
            convert::GetStateDictArgsFromProto(request->state()));
        args.chunk_bytes = 0;  // does not change the file
        MODELSTATE_ASSIGN_OR_RETURN(
            SignedStateFile signed_file,
            service_->SignStateFile(caller, std::move(args),
                                    request->file_name()));
        response->set_bundle(std::move(signed_file.bundle_json));
        response->set_sha256(std::move(signed_file.file.sha256));
        response->set_file_bytes(signed_file.file.bytes);
        response->set_verifier_key(std::move(signed_file.verifier_key));
        return absl::OkStatus();
      });
}

}  // namespace modelstate::server
