#include "client/model_state_client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/shared_memory.h"
#include "base/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/convert.h"

namespace modelstate::client {

using convert::FromGrpcStatus;

absl::Status MemorySink::Begin(const StateDictLayout& layout) {
  MODELSTATE_ASSIGN_OR_RETURN(
      assembler_,
      into_ == nullptr
          ? StateDictAssembler::Create(layout, StreamLimits{})
          : StateDictAssembler::CreateInto(layout, StreamLimits{}, *into_));
  return absl::OkStatus();
}

absl::Status MemorySink::Append(absl::string_view bytes) {
  return assembler_->Append(bytes);
}

std::vector<absl::Span<char>> MemorySink::Destinations() {
  if (assembler_ == nullptr) return {};
  absl::StatusOr<std::vector<absl::Span<char>>> where = assembler_->PlaceAll();
  return where.ok() ? *std::move(where) : std::vector<absl::Span<char>>();
}

absl::Status MemorySink::Placed(uint64_t n) { return assembler_->Placed(n); }

void MemorySink::Abandon() {
  // Leaked on purpose: a late write lands in memory nobody frees (for a
  // sink writing into the caller's tensors, in those tensors, whose bytes a
  // failed fetch leaves unspecified anyway).
  new std::unique_ptr<StateDictAssembler>(std::move(assembler_));
}

absl::Status StateDictSink::Placed(uint64_t) {
  return absl::InternalError(
      "server wrote into memory this sink did not offer");
}

absl::Status MemorySink::Finish() {
  MODELSTATE_ASSIGN_OR_RETURN(result_, assembler_->Finish());
  return absl::OkStatus();
}

absl::StatusOr<size_t> StateDictSource::ReadInto(size_t max_bytes, char* out) {
  std::string piece;
  MODELSTATE_ASSIGN_OR_RETURN(size_t n, Read(max_bytes, &piece));
  std::memcpy(out, piece.data(), n);
  return n;
}

absl::StatusOr<std::unique_ptr<MemorySource>> MemorySource::Create(
    const StateDict& state_dict) {
  auto source = std::unique_ptr<MemorySource>(new MemorySource());
  MODELSTATE_ASSIGN_OR_RETURN(
      source->reader_, StateDictReader::Create(state_dict, std::nullopt));
  return source;
}

absl::StatusOr<std::unique_ptr<ModelStateClient>> ModelStateClient::Connect(
    const std::string& target, ClientOptions options) {
  if (target.empty()) {
    return absl::InvalidArgumentError(
        "server: an address (host:port) is required");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  auto credentials = options.credentials != nullptr
                         ? options.credentials
                         : grpc::InsecureChannelCredentials();
  return std::make_unique<ModelStateClient>(
      grpc::CreateCustomChannel(target, credentials, args), std::move(options));
}

ModelStateClient::ModelStateClient(std::shared_ptr<grpc::Channel> channel,
                                   ClientOptions options)
    : channel_(std::move(channel)),
      stub_(v1::ModelStateService::NewStub(channel_)),
      options_(std::move(options)) {}

std::unique_ptr<grpc::ClientContext> ModelStateClient::NewContext(
    absl::Duration timeout) const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (timeout == absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::time_point::max());
  } else {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization",
                         absl::StrCat("Bearer ", options_.bearer_token));
  }
  return context;
}

namespace {

v1::GetStateDictRequest GetStateDictRequestFor(
    absl::string_view module, const GetStateDictOptions& options) {
  v1::GetStateDictRequest request;
  request.set_module(std::string(module));
  request.set_key_prefix(options.key_prefix);
  request.set_key_glob(options.key_glob);
  request.set_metadata_only(options.metadata_only);
  request.set_selection(options.selection);
  request.set_chunk_bytes(options.chunk_bytes);
  if (options.target_dtype.has_value()) {
    request.set_target_dtype(convert::DTypeToProto(*options.target_dtype));
  }
  return request;
}

using Stub = v1::ModelStateService::Stub;
template <typename Request, typename Response>
using SyncMethod = grpc::Status (Stub::*)(grpc::ClientContext*, const Request&,
                                          Response*);

// Runs one unary call with the client's deadline.
template <typename Request, typename Response>
absl::StatusOr<Response> Unary(const ModelStateClient& client, Stub& stub,
                               SyncMethod<Request, Response> method,
                               const Request& request, absl::Duration timeout) {
  std::unique_ptr<grpc::ClientContext> context = client.NewContext(timeout);
  Response response;
  grpc::Status status = (stub.*method)(context.get(), request, &response);
  client.NoteAuditSeqs(*context);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

#define MODELSTATE_UNARY(Name, Request, Response)                        \
  absl::StatusOr<v1::Response> ModelStateClient::Name(                   \
      const v1::Request& request) {                                      \
    return Unary(*this, *stub_, &Stub::Name, request, options_.timeout); \
  }

MODELSTATE_UNARY(BuildModule, BuildModuleRequest, BuildModuleResponse)
MODELSTATE_UNARY(RegisterParameter, RegisterTensorRequest, RegisterResponse)
MODELSTATE_UNARY(RegisterBuffer, RegisterTensorRequest, RegisterResponse)
MODELSTATE_UNARY(RegisterSubmodule, RegisterSubmoduleRequest, RegisterResponse)
MODELSTATE_UNARY(RemoveEntry, RemoveEntryRequest, RegisterResponse)
MODELSTATE_UNARY(GetModule, GetModuleRequest, GetModuleResponse)
MODELSTATE_UNARY(ListModules, ListModulesRequest, ListModulesResponse)
MODELSTATE_UNARY(ListDevices, ListDevicesRequest, ListDevicesResponse)
MODELSTATE_UNARY(MoveModule, MoveModuleRequest, MoveModuleResponse)
MODELSTATE_UNARY(Forward, ForwardRequest, ForwardResponse)
MODELSTATE_UNARY(QueryAudit, QueryAuditRequest, QueryAuditResponse)
#undef MODELSTATE_UNARY

absl::StatusOr<v1::GetClusterStatusResponse>
ModelStateClient::GetClusterStatus() {
  v1::ClusterService::Stub cluster(channel_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(options_.timeout);
  v1::GetClusterStatusResponse response;
  grpc::Status status = cluster.GetClusterStatus(
      context.get(), v1::GetClusterStatusRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::MoveModuleToReplicaResponse>
ModelStateClient::MoveModuleToReplica(absl::string_view module,
                                      absl::string_view replica) {
  v1::ClusterService::Stub cluster(channel_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(options_.timeout);
  v1::MoveModuleToReplicaRequest request;
  request.set_module(std::string(module));
  request.set_replica(std::string(replica));
  v1::MoveModuleToReplicaResponse response;
  grpc::Status status =
      cluster.MoveModuleToReplica(context.get(), request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status ModelStateClient::DeleteModule(absl::string_view module) {
  v1::DeleteModuleRequest request;
  request.set_module(std::string(module));
  return Unary(*this, *stub_, &Stub::DeleteModule, request, options_.timeout)
      .status();
}

absl::StatusOr<v1::MoveModuleResponse> ModelStateClient::TypeModule(
    absl::string_view module, absl::string_view dtype) {
  v1::MoveModuleRequest request;
  request.set_module(std::string(module));
  request.set_dtype(std::string(dtype));
  request.set_convert_all(true);
  return MoveModule(request);
}

absl::Status ModelStateClient::SetTraining(absl::string_view module,
                                           bool training) {
  v1::SetTrainingRequest request;
  request.set_module(std::string(module));
  request.set_training(training);
  return Unary(*this, *stub_, &Stub::SetTraining, request, options_.timeout)
      .status();
}

absl::StatusOr<v1::ListSubscribersResponse>
ModelStateClient::ListSubscribers() {
  return Unary(*this, *stub_, &Stub::ListSubscribers,
               v1::ListSubscribersRequest(), options_.timeout);
}

absl::StatusOr<v1::ReleaseSubscriberNameResponse>
ModelStateClient::ReleaseSubscriberName(absl::string_view name, bool force) {
  v1::ReleaseSubscriberNameRequest request;
  request.set_name(std::string(name));
  request.set_force(force);
  return Unary(*this, *stub_, &Stub::ReleaseSubscriberName, request,
               options_.timeout);
}

absl::StatusOr<v1::VerifyAuditResponse> ModelStateClient::VerifyAudit() {
  return Unary(*this, *stub_, &Stub::VerifyAudit, v1::VerifyAuditRequest(),
               options_.timeout);
}

std::vector<uint64_t> ModelStateClient::last_audit_seqs() const {
  MutexLock lock(&seqs_mu_);
  return last_audit_seqs_;
}

void ModelStateClient::NoteAuditSeqs(const grpc::ClientContext& context) const {
  std::vector<uint64_t> seqs;
  const auto& trailers = context.GetServerTrailingMetadata();
  auto found = trailers.find(convert::kAuditSeqsKey);
  if (found != trailers.end()) {
    seqs = convert::ParseAuditSeqsTrailer(
        absl::string_view(found->second.data(), found->second.size()));
  }
  MutexLock lock(&seqs_mu_);
  last_audit_seqs_ = std::move(seqs);
}

absl::StatusOr<v1::AttestModuleResponse> ModelStateClient::AttestModule(
    absl::string_view module) {
  v1::AttestModuleRequest request;
  request.set_module(std::string(module));
  return Unary(*this, *stub_, &Stub::AttestModule, request, options_.timeout);
}

absl::StatusOr<v1::SignStateFileResponse> ModelStateClient::SignStateFile(
    absl::string_view module, const GetStateDictOptions& options,
    absl::string_view file_name) {
  v1::SignStateFileRequest request;
  *request.mutable_state() = GetStateDictRequestFor(module, options);
  request.set_file_name(std::string(file_name));
  // The server reads the whole state: a transfer's deadline.
  return Unary(*this, *stub_, &Stub::SignStateFile, request,
               options_.transfer_timeout);
}

absl::StatusOr<v1::GetCheckpointResponse> ModelStateClient::GetCheckpoint(
    bool fresh) {
  v1::GetCheckpointRequest request;
  request.set_fresh(fresh);
  return Unary(*this, *stub_, &Stub::GetCheckpoint, request, options_.timeout);
}

absl::StatusOr<v1::GetInclusionProofResponse>
ModelStateClient::GetInclusionProof(uint64_t seq, uint64_t tree_size) {
  v1::GetInclusionProofRequest request;
  request.set_seq(seq);
  request.set_tree_size(tree_size);
  return Unary(*this, *stub_, &Stub::GetInclusionProof, request,
               options_.timeout);
}

absl::StatusOr<v1::GetConsistencyProofResponse>
ModelStateClient::GetConsistencyProof(uint64_t old_size, uint64_t new_size) {
  v1::GetConsistencyProofRequest request;
  request.set_old_size(old_size);
  request.set_new_size(new_size);
  return Unary(*this, *stub_, &Stub::GetConsistencyProof, request,
               options_.timeout);
}

absl::StatusOr<v1::AddCosignatureResponse> ModelStateClient::AddCosignature(
    std::string checkpoint) {
  v1::AddCosignatureRequest request;
  request.set_checkpoint(std::move(checkpoint));
  return Unary(*this, *stub_, &Stub::AddCosignature, request, options_.timeout);
}

std::unique_ptr<AuditWatch> ModelStateClient::WatchAudit(
    const v1::WatchAuditRequest& request, absl::Duration timeout) {
  std::unique_ptr<AuditWatch> watch(new AuditWatch());
  watch->context_ = NewContext(timeout);
  watch->reader_ = stub_->WatchAudit(watch->context_.get(), request);
  return watch;
}

AuditWatch::~AuditWatch() { Finish().IgnoreError(); }

bool AuditWatch::Next(v1::AuditRecordProto* record) {
  if (ended_ || finished_.has_value()) return false;
  ended_ = !reader_->Read(record);
  return !ended_;
}

void AuditWatch::Cancel() { context_->TryCancel(); }

absl::Status AuditWatch::Finish() {
  if (!finished_.has_value()) {
    // Finish() waits for the server's status, which an open watch never
    // sends on its own.
    if (!ended_) context_->TryCancel();
    ended_ = true;
    finished_ = FromGrpcStatus(reader_->Finish());
  }
  return *finished_;
}

// One transfer's hold on the client's ring; frees it when destroyed.
class ModelStateClient::RingUse {
 public:
  RingUse(ModelStateClient& client, SharedRing& ring, std::string token)
      : client_(client), ring_(ring), token_(std::move(token)) {
    ring_.set_consumed(0);
    direct_call_ = ring_.BeginDirectCall();
  }
  ~RingUse() {
    MutexLock lock(&client_.ring_mu_);
    client_.ring_busy_ = false;
    // The server no longer knows the token (it restarted): the next
    // transfer registers the ring again.
    if (forgotten_) client_.ring_registration_ = RingRegistration();
  }
  SharedRing& ring() const { return ring_; }
  const std::string& token() const { return token_; }
  uint64_t direct_call() const { return direct_call_; }
  bool forgotten() const { return forgotten_; }
  // Notes a call's status, in case it says the token is unknown.
  const absl::Status& Note(const absl::Status& status) {
    forgotten_ = absl::IsInvalidArgument(status) &&
                 absl::StrContains(status.message(), "no ring is registered");
    return status;
  }

 private:
  ModelStateClient& client_;
  SharedRing& ring_;
  const std::string token_;
  uint64_t direct_call_ = 0;
  bool forgotten_ = false;
};

std::unique_ptr<ModelStateClient::RingUse> ModelStateClient::UseRing() {
  MutexLock lock(&ring_mu_);
  if (ring_busy_) return nullptr;
  if (!ring_asked_) {
    const char* env = std::getenv("MODELSTATE_SHARED_MEMORY");
    if (!options_.shared_memory ||
        (env != nullptr && std::string(env) == "0")) {
      ring_asked_ = true;
      return nullptr;
    }
    // Within the transfer's own deadline: a stalled server fails the
    // transfer as it would without the question.
    absl::StatusOr<v1::GetSharedMemoryInfoResponse> info =
        Unary(*this, *stub_, &Stub::GetSharedMemoryInfo,
              v1::GetSharedMemoryInfoRequest(),
              std::min(options_.timeout, options_.transfer_timeout));
    if (!info.ok()) return nullptr;  // asked again by the next transfer
    ring_asked_ = true;
    if (info->socket_path().empty() || info->boot_id().empty() ||
        info->boot_id() != BootId()) {
      return nullptr;
    }
    absl::StatusOr<std::unique_ptr<SharedRing>> ring =
        SharedRing::Create(options_.ring_slots, options_.ring_slot_bytes);
    if (!ring.ok()) return nullptr;
    ring_ = *std::move(ring);
    ring_pid_ = getpid();
    ring_socket_ = info->socket_path();
  }
  if (ring_ != nullptr && ring_pid_ != getpid()) {
    // A child of fork: the ring and its registration are the parent's.
    ring_registration_ = RingRegistration();
    absl::StatusOr<std::unique_ptr<SharedRing>> ring =
        SharedRing::Create(options_.ring_slots, options_.ring_slot_bytes);
    ring_ = ring.ok() ? *std::move(ring) : nullptr;
    ring_pid_ = getpid();
  }
  if (ring_ == nullptr) return nullptr;
  if (ring_registration_.token.empty()) {
    absl::StatusOr<RingRegistration> registration =
        RegisterRing(ring_socket_, *ring_);
    if (!registration.ok()) {
      // Not reachable from here (another container, another user), or the
      // server holds all the rings it will: data messages from now on.
      ring_.reset();
      return nullptr;
    }
    ring_registration_ = *std::move(registration);
  }
  ring_busy_ = true;
  return std::make_unique<RingUse>(*this, *ring_, ring_registration_.token);
}

absl::Status ModelStateClient::GetStateDict(absl::string_view module,
                                            const GetStateDictOptions& options,
                                            StateDictSink& sink) {
  return Fetch(module, options, sink, /*may_register_again=*/true);
}

absl::Status ModelStateClient::Fetch(absl::string_view module,
                                     const GetStateDictOptions& options,
                                     StateDictSink& sink,
                                     bool may_register_again) {
  v1::GetStateDictRequest request = GetStateDictRequestFor(module, options);
  std::unique_ptr<RingUse> ring = options.metadata_only ? nullptr : UseRing();
  if (ring != nullptr) request.set_shared_memory_ring(ring->token());
  const bool direct = ring != nullptr && options_.shared_memory_direct;
  request.set_shared_memory_direct(direct);
  bool offered = false;  // the server may write into sink.Destinations()
  std::unique_ptr<grpc::ClientContext> context =
      NewContext(options_.transfer_timeout);
  std::unique_ptr<grpc::ClientReader<v1::StateDictChunk>> reader =
      stub_->GetStateDict(context.get(), request);
  v1::StateDictChunk chunk;
  absl::Status failure;
  uint64_t done = 0;
  uint64_t total = 0;
  uint64_t ring_chunks = 0;
  bool began = false;
  while (failure.ok() && reader->Read(&chunk)) {
    if (chunk.payload_case() == v1::StateDictChunk::kHeader && !began) {
      absl::StatusOr<StateDictLayout> layout =
          convert::HeaderToLayout(chunk.header());
      failure = layout.ok() ? sink.Begin(*layout) : layout.status();
      total = layout.ok() ? layout->total_bytes : 0;
      began = true;
      if (direct && failure.ok())
        offered = OfferDestinations(ring->ring(), sink);
    } else if (chunk.payload_case() == v1::StateDictChunk::kData && began) {
      failure = sink.Append(chunk.data());
      done += chunk.data().size();
      if (options.progress) options.progress(done, total);
    } else if (chunk.payload_case() == v1::StateDictChunk::kRingBytes &&
               began && ring != nullptr && chunk.ring_bytes() > 0 &&
               chunk.ring_bytes() <= ring->ring().slot_bytes()) {
      failure = sink.Append(absl::string_view(ring->ring().slot(ring_chunks),
                                              chunk.ring_bytes()));
      ring->ring().set_consumed(++ring_chunks);
      done += chunk.ring_bytes();
      if (options.progress) options.progress(done, total);
    } else if (chunk.payload_case() == v1::StateDictChunk::kDirectBytes &&
               offered) {
      failure = sink.Placed(chunk.direct_bytes());
      done += chunk.direct_bytes();
      if (options.progress) options.progress(done, total);
    } else {
      failure =
          absl::InternalError("server sent a malformed state_dict stream");
    }
  }
  // A call that ends before the server said it wrote everything: the
  // server must be done writing into the sink's memory before the caller
  // may free it.
  auto stop_direct_writes = [&] {
    if (offered && !ring->ring().StopDirectWrites(ring->direct_call(),
                                                  absl::Seconds(10))) {
      sink.Abandon();
    }
  };
  if (!failure.ok()) {
    context->TryCancel();
    reader->Finish().IgnoreError();
    stop_direct_writes();
    return failure;
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!status.ok()) stop_direct_writes();
  if (ring != nullptr && !ring->Note(status).ok() && !began &&
      may_register_again && ring->forgotten()) {
    // A ring the server forgot (it restarted): once more, registering it
    // again.
    ring.reset();
    return Fetch(module, options, sink, /*may_register_again=*/false);
  }
  MODELSTATE_RETURN_IF_ERROR(status);
  if (!began) return absl::InternalError("server sent no state_dict header");
  if (options.metadata_only) return absl::OkStatus();
  return sink.Finish();
}

bool ModelStateClient::OfferDestinations(SharedRing& ring,
                                         StateDictSink& sink) {
  std::vector<DirectTarget> table;
  for (absl::Span<char> where : sink.Destinations()) {
    table.push_back({reinterpret_cast<uintptr_t>(where.data()), where.size()});
  }
  return ring.OfferDirectTable(table);
}

absl::StatusOr<StateDict> ModelStateClient::GetStateDict(
    absl::string_view module, const GetStateDictOptions& options) {
  MemorySink sink;
  MODELSTATE_RETURN_IF_ERROR(GetStateDict(module, options, sink));
  return std::move(sink.state_dict());
}

absl::Status ModelStateClient::GetStateDictInto(
    absl::string_view module, StateDict& into,
    const GetStateDictOptions& options) {
  MemorySink sink(&into);
  return GetStateDict(module, options, sink);
}

absl::StatusOr<v1::LoadStateDictResponse> ModelStateClient::LoadStateDict(
    absl::string_view module, StateDictSource& source,
    const LoadStateDictOptions& options) {
  std::unique_ptr<grpc::ClientContext> context =
      NewContext(options_.transfer_timeout);
  v1::LoadStateDictResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::LoadStateDictRequest>> writer =
      stub_->LoadStateDict(context.get(), &response);
  v1::LoadStateDictRequest message;
  v1::LoadStart* start = message.mutable_start();
  start->set_module(std::string(module));
  start->mutable_options()->set_strict(options.load.strict);
  start->mutable_options()->set_atomic(options.load.atomic);
  start->mutable_options()->set_assign(options.load.assign);
  convert::LayoutToHeader(source.layout(), start->mutable_header());
  uint64_t total = source.layout().total_bytes;
  std::unique_ptr<RingUse> ring = total > 0 ? UseRing() : nullptr;
  if (ring != nullptr) start->set_shared_memory_ring(ring->token());
  uint64_t done = 0;
  bool open = writer->Write(message);
  absl::Status failure;
  // One buffer for every chunk, lent to the message for its Write (which
  // has serialised it when it returns): a fresh one each time would be
  // fresh pages, and faulting them in cost more than reading the file.
  std::string chunk;
  for (uint64_t index = 0; open; ++index) {
    message.Clear();
    absl::StatusOr<size_t> n;
    if (ring != nullptr) {
      SharedRing& r = ring->ring();
      if (!r.WaitForSlot(index, absl::Seconds(10), [] { return false; })) {
        failure = absl::DeadlineExceededError(
            "shared memory: the server freed no ring slot within 10s");
        break;
      }
      n = source.ReadInto(std::min(r.slot_bytes(), total - done),
                          r.slot(index));
      if (n.ok()) message.set_ring_bytes(static_cast<uint32_t>(*n));
    } else {
      chunk.clear();
      n = source.Read(options.chunk_bytes, &chunk);
      if (n.ok()) message.mutable_data()->swap(chunk);
    }
    if (!n.ok()) {
      failure = n.status();
      break;
    }
    if (*n == 0) break;
    open = writer->Write(message);
    if (ring == nullptr) chunk.swap(*message.mutable_data());
    done += *n;
    if (options.progress) options.progress(done, total);
  }
  if (!failure.ok()) {
    // Abandon the call: the server sees a cancelled, incomplete stream and
    // changes nothing.
    context->TryCancel();
    writer->Finish().IgnoreError();
    return failure;
  }
  writer->WritesDone();
  absl::Status status = FromGrpcStatus(writer->Finish());
  if (ring != nullptr) ring->Note(status);
  MODELSTATE_RETURN_IF_ERROR(status);
  return response;
}

absl::StatusOr<v1::LoadStateDictResponse> ModelStateClient::LoadStateDict(
    absl::string_view module, const StateDict& state_dict,
    const LoadStateDictOptions& options) {
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<MemorySource> source,
                              MemorySource::Create(state_dict));
  return LoadStateDict(module, *source, options);
}

absl::StatusOr<v1::GetSharedMemoryInfoResponse>
ModelStateClient::GetSharedMemoryInfo() {
  return Unary(*this, *stub_, &Stub::GetSharedMemoryInfo,
               v1::GetSharedMemoryInfoRequest(), options_.timeout);
}

absl::Status ModelStateClient::Health() {
  auto stub = grpc::health::v1::Health::NewStub(channel_);
  std::unique_ptr<grpc::ClientContext> context = NewContext(options_.timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  MODELSTATE_RETURN_IF_ERROR(
      FromGrpcStatus(stub->Check(context.get(), request, &response)));
  if (response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return absl::UnavailableError(absl::StrCat(
        "server is ", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                          response.status())));
  }
  return absl::OkStatus();
}

}  // namespace modelstate::client
