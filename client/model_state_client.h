// File: model_state_client.h
// A C++ client for modelstate-server: one typed call per RPC of
// ModelStateService, plus grpc.health.v1's Check. Every call has a deadline
// (the client's default unless given) and returns absl::Status / StatusOr
// with the server's code and message. State dicts stream chunk by chunk
// through a StateDictSink / StateDictSource, so a state of any size can go
// to or from a file without being held in memory twice. The audit log's
// live feed is an AuditWatch, read record by record. The Subscribe stream
// has its own class (client/subscriber.h).
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(
//       auto client, ModelStateClient::Connect("127.0.0.1:50051"));
//   v1::BuildModuleRequest build;
//   build.set_module("team/mlp");
//   // ... fill build.mutable_spec() ...
//   MODELSTATE_ASSIGN_OR_RETURN(v1::BuildModuleResponse built,
//                               client->BuildModule(build));
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict sd,
//                               client->GetStateDict("team/mlp"));
//   // Later: the same tensors refreshed in place from the server.
//   MODELSTATE_RETURN_IF_ERROR(client->GetStateDictInto("team/mlp", sd));
//
//   v1::WatchAuditRequest watch;
//   watch.mutable_filter()->set_type("build");
//   std::unique_ptr<AuditWatch> records = client->WatchAudit(watch);
//   v1::AuditRecordProto record;
//   while (records->Next(&record)) Show(record);  // Cancel() ends it
//   absl::Status ended = records->Finish();
#ifndef MODELSTATE_CLIENT_MODEL_STATE_CLIENT_H_
#define MODELSTATE_CLIENT_MODEL_STATE_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/shared_memory.h"
#include "base/sync.h"
#include "core/module.h"
#include "core/state_stream.h"
#include "grpcpp/grpcpp.h"
#include "modelstate/v1/cluster.grpc.pb.h"
#include "modelstate/v1/model_state_service.grpc.pb.h"

namespace modelstate::client {

struct ClientOptions {
  // Deadline of unary calls.
  absl::Duration timeout = absl::Seconds(30);
  // Deadline of state_dict transfers.
  absl::Duration transfer_timeout = absl::Minutes(30);
  int max_message_bytes = 64 << 20;
  // Insecure (plaintext) when null.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "authorization: Bearer <token>" when not empty.
  std::string bearer_token;
  // State_dicts travel through a shared-memory ring (base/shared_memory.h;
  // `ring_slots` x `ring_slot_bytes`, made on the first transfer) when the
  // server runs on this host and offers it (GetSharedMemoryInfo), as data
  // messages otherwise. The environment variable MODELSTATE_SHARED_MEMORY=0
  // turns it off as well. One transfer at a time uses the ring; others
  // that overlap it use data messages.
  bool shared_memory = true;
  // With the ring, a GetStateDict into memory (MemorySink) lets the server
  // write the bytes straight into the new tensors, one copy instead of the
  // ring's two; it falls back to the ring's slots where the kernel does not
  // let the server write this process's memory (another user, Yama's
  // ptrace_scope above 0 without PR_SET_PTRACER naming the server).
  bool shared_memory_direct = true;
  uint32_t ring_slots = 4;
  uint64_t ring_slot_bytes = 8 << 20;
};

// Called as bytes move: (bytes done, bytes in total).
using ProgressFn = std::function<void(uint64_t, uint64_t)>;

// Receives a streamed state_dict: Begin once, Append the bytes in order,
// then Finish. A sink that keeps the bytes in memory of its own may offer
// it (Destinations) to a server on this host, which then writes there
// itself and reports each stretch with Placed instead of Append.
class StateDictSink {
 public:
  virtual ~StateDictSink() = default;
  virtual absl::Status Begin(const StateDictLayout& layout) = 0;
  virtual absl::Status Append(absl::string_view bytes) = 0;
  virtual absl::Status Finish() = 0;
  // After Begin: where each entry's bytes go, in layout order; empty (the
  // default) when the sink has no such memory.
  virtual std::vector<absl::Span<char>> Destinations() { return {}; }
  // The next `n` bytes are in Destinations() already.
  virtual absl::Status Placed(uint64_t n);
  // The server may still write into Destinations() (it did not stop when
  // asked): the sink must keep that memory for the rest of the process.
  virtual void Abandon() {}
};

// Provides a state_dict to stream.
class StateDictSource {
 public:
  virtual ~StateDictSource() = default;
  virtual const StateDictLayout& layout() const = 0;
  // Appends up to `max_bytes` to `out`; returns how many (0 at the end).
  virtual absl::StatusOr<size_t> Read(size_t max_bytes, std::string* out) = 0;
  // Like Read, into `out`, which has room for `max_bytes` (a ring slot).
  virtual absl::StatusOr<size_t> ReadInto(size_t max_bytes, char* out);
};

// Collects a state_dict in memory: in new tensors, or written into the
// tensors of `into` in place (StateDictAssembler::CreateInto), which must
// outlive the sink.
class MemorySink : public StateDictSink {
 public:
  MemorySink() = default;
  explicit MemorySink(const StateDict* into) : into_(into) {}
  absl::Status Begin(const StateDictLayout& layout) override;
  absl::Status Append(absl::string_view bytes) override;
  absl::Status Finish() override;
  std::vector<absl::Span<char>> Destinations() override;
  absl::Status Placed(uint64_t n) override;
  void Abandon() override;
  // The result, after Finish.
  StateDict& state_dict() { return result_; }

 private:
  const StateDict* into_ = nullptr;
  std::unique_ptr<StateDictAssembler> assembler_;
  StateDict result_;
};

// Streams an in-memory state_dict.
class MemorySource : public StateDictSource {
 public:
  static absl::StatusOr<std::unique_ptr<MemorySource>> Create(
      const StateDict& state_dict);
  const StateDictLayout& layout() const override { return reader_->layout(); }
  absl::StatusOr<size_t> Read(size_t max_bytes, std::string* out) override {
    return reader_->Read(max_bytes, out);
  }
  absl::StatusOr<size_t> ReadInto(size_t max_bytes, char* out) override {
    return reader_->ReadInto(max_bytes, out);
  }

 private:
  std::unique_ptr<StateDictReader> reader_;
};

struct GetStateDictOptions {
  std::string key_prefix;
  std::string key_glob;
  std::optional<DType> target_dtype;
  uint32_t chunk_bytes = 0;  // 0: the server's default
  bool metadata_only = false;
  // The state_dict (default), every parameter, or every buffer.
  v1::GetStateDictRequest::Selection selection =
      v1::GetStateDictRequest::SELECTION_STATE_DICT;
  ProgressFn progress;
};

struct LoadStateDictOptions {
  LoadOptions load;
  uint32_t chunk_bytes = 1 << 20;
  ProgressFn progress;
};

// A WatchAudit stream: the records that match its filter, those already
// written after `after_seq` first, then each new one as the server writes
// it. The stream has no end of its own; it lasts until Cancel(), its
// deadline, or the server's shutdown.
//
// Next() and Finish() belong to one thread; Cancel() may be called from any
// thread, for example one that waits for SIGINT.
class AuditWatch {
 public:
  AuditWatch(const AuditWatch&) = delete;
  AuditWatch& operator=(const AuditWatch&) = delete;
  // Cancels the stream if it is still open.
  ~AuditWatch();

  // Blocks until the next record and stores it in `record`. Returns false
  // when the stream has ended; Finish() then says how.
  bool Next(v1::AuditRecordProto* record);
  // Ends the stream: a Next() blocked in another thread returns false.
  void Cancel();
  // Cancels the stream if Next() has not yet returned false, and returns
  // how it ended: CANCELLED after Cancel() (or an early Finish()),
  // DEADLINE_EXCEEDED past the deadline, PERMISSION_DENIED for a caller
  // without the auditor role, INVALID_ARGUMENT for a bad filter, or the
  // server's error. Returns the same status when called again.
  absl::Status Finish();

 private:
  friend class ModelStateClient;
  AuditWatch() = default;

  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReader<v1::AuditRecordProto>> reader_;
  bool ended_ = false;
  std::optional<absl::Status> finished_;
};

// Thread-safe: one client may serve many threads.
class ModelStateClient {
 public:
  // Connects to `target` ("host:port"). Does not wait for the server.
  static absl::StatusOr<std::unique_ptr<ModelStateClient>> Connect(
      const std::string& target, ClientOptions options = {});
  // Wraps an existing channel (e.g. an in-process one).
  ModelStateClient(std::shared_ptr<grpc::Channel> channel,
                   ClientOptions options);

  absl::StatusOr<v1::BuildModuleResponse> BuildModule(
      const v1::BuildModuleRequest& request);
  absl::StatusOr<v1::RegisterResponse> RegisterParameter(
      const v1::RegisterTensorRequest& request);
  absl::StatusOr<v1::RegisterResponse> RegisterBuffer(
      const v1::RegisterTensorRequest& request);
  absl::StatusOr<v1::RegisterResponse> RegisterSubmodule(
      const v1::RegisterSubmoduleRequest& request);
  absl::StatusOr<v1::RegisterResponse> RemoveEntry(
      const v1::RemoveEntryRequest& request);
  absl::StatusOr<v1::GetModuleResponse> GetModule(
      const v1::GetModuleRequest& request);
  absl::StatusOr<v1::ListModulesResponse> ListModules(
      const v1::ListModulesRequest& request);
  absl::StatusOr<v1::ListDevicesResponse> ListDevices(
      const v1::ListDevicesRequest& request = {});
  absl::StatusOr<v1::GetSharedMemoryInfoResponse> GetSharedMemoryInfo();
  absl::Status DeleteModule(absl::string_view module);
  // module.to(device, dtype): floating tensors change dtype, all move. With
  // request.convert_all(), module.type(dtype) instead (see TypeModule).
  absl::StatusOr<v1::MoveModuleResponse> MoveModule(
      const v1::MoveModuleRequest& request);
  // PyTorch's module.type(dtype): every parameter and buffer becomes
  // `dtype` (any dtype, "float64", "int32", ...), integer and bool ones
  // included, which to() leaves alone; a buffer tied into several modules
  // becomes one tensor per module, as in torch. MoveModule with
  // convert_all.
  absl::StatusOr<v1::MoveModuleResponse> TypeModule(absl::string_view module,
                                                    absl::string_view dtype);
  absl::Status SetTraining(absl::string_view module, bool training);
  absl::StatusOr<v1::ForwardResponse> Forward(
      const v1::ForwardRequest& request);
  // The subscribers the server holds, in the order they run.
  absl::StatusOr<v1::ListSubscribersResponse> ListSubscribers();
  // Frees subscriber name `name` for any identity (admin only); `force`
  // ends the stream of a subscriber connected under it.
  absl::StatusOr<v1::ReleaseSubscriberNameResponse> ReleaseSubscriberName(
      absl::string_view name, bool force = false);

  // One page of the audit records that match request.filter(): at most
  // request.limit() (0: the server's 100) after request.after_seq(); the
  // response's next_after_seq is the next page's after_seq (0 at the end).
  absl::StatusOr<v1::QueryAuditResponse> QueryAudit(
      const v1::QueryAuditRequest& request);
  // Follows the audit log (see AuditWatch). `timeout` is the deadline of the
  // whole stream; the default is none.
  std::unique_ptr<AuditWatch> WatchAudit(
      const v1::WatchAuditRequest& request,
      absl::Duration timeout = absl::InfiniteDuration());
  // Walks the server's audit hash chain. OK with response.ok() false when a
  // record is broken (the response names it).
  absl::StatusOr<v1::VerifyAuditResponse> VerifyAudit();
  // The verifiable log: the latest signed checkpoint (`fresh`: signed now
  // if records came since), an inclusion proof of record `seq` (tree_size
  // 0: the latest checkpoint's), a consistency proof, and a witness's
  // cosignature. The proofs are checked with base/merkle.h's verifiers.
  absl::StatusOr<v1::GetCheckpointResponse> GetCheckpoint(bool fresh = false);
  absl::StatusOr<v1::GetInclusionProofResponse> GetInclusionProof(
      uint64_t seq, uint64_t tree_size = 0);
  absl::StatusOr<v1::GetConsistencyProofResponse> GetConsistencyProof(
      uint64_t old_size, uint64_t new_size);
  absl::StatusOr<v1::AddCosignatureResponse> AddCosignature(
      std::string checkpoint);
  // A signed attestation of `module` (DSSE envelope JSON, the log's key,
  // the checkpoint it cites); client/cli/attest.cc checks them.
  absl::StatusOr<v1::AttestModuleResponse> AttestModule(
      absl::string_view module);
  // An OMS bundle for the safetensors file GetStateDict(module, options)
  // into a SafetensorsSink writes, named `file_name` in the bundle.
  absl::StatusOr<v1::SignStateFileResponse> SignStateFile(
      absl::string_view module, const GetStateDictOptions& options,
      absl::string_view file_name);

  // Streams the module's state_dict into `sink`.
  absl::Status GetStateDict(absl::string_view module,
                            const GetStateDictOptions& options,
                            StateDictSink& sink);
  // Convenience: the whole state_dict in memory.
  absl::StatusOr<StateDict> GetStateDict(
      absl::string_view module, const GetStateDictOptions& options = {});
  // Refreshes tensors the caller already has: every fetched entry's bytes
  // overwrite `into`'s tensor of that key in place (same dtype and shape,
  // on cpu; INVALID_ARGUMENT naming the key otherwise, before any byte
  // moves); `into`'s other keys are left alone. On this host the server
  // writes straight into that memory, already faulted in, so no page is
  // allocated or zeroed. After a failed fetch the targets' bytes are
  // unspecified.
  absl::Status GetStateDictInto(absl::string_view module, StateDict& into,
                                const GetStateDictOptions& options = {});

  // Streams `source` into the module's load_state_dict.
  absl::StatusOr<v1::LoadStateDictResponse> LoadStateDict(
      absl::string_view module, StateDictSource& source,
      const LoadStateDictOptions& options = {});
  absl::StatusOr<v1::LoadStateDictResponse> LoadStateDict(
      absl::string_view module, const StateDict& state_dict,
      const LoadStateDictOptions& options = {});

  // grpc.health.v1 Check: OK when the server reports SERVING.
  absl::Status Health();
  // ClusterService: members and placement (a cluster member only).
  absl::StatusOr<v1::GetClusterStatusResponse> GetClusterStatus();
  // ClusterService: moves `module` to the live replica `replica`.
  absl::StatusOr<v1::MoveModuleToReplicaResponse> MoveModuleToReplica(
      absl::string_view module, absl::string_view replica);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // The raw stub and a context with this client's credentials, for what the
  // typed calls above do not do: Subscriber's stream, and tests that send
  // malformed streams on purpose. An infinite `timeout` means no deadline.
  v1::ModelStateService::Stub& stub() { return *stub_; }
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Duration timeout) const;

  // The sequence numbers of the audit records the last unary call on this
  // client wrote (its response's "modelstate-audit-seqs" trailing
  // metadata), in order; empty when it wrote none. The trailer is bounded
  // (proto/convert.h AuditSeqsTrailer): for a call that wrote thousands of
  // interleaved records, the response's audit_seqs field has them all.
  std::vector<uint64_t> last_audit_seqs() const;
  // Takes them from a finished call's context (the unary calls do).
  void NoteAuditSeqs(const grpc::ClientContext& context) const;

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ModelStateService::Stub> stub_;
  const ClientOptions options_;
  // This client's ring, registered, while one transfer uses it; null when
  // the server is elsewhere, offers none, or another transfer has it.
  class RingUse;
  std::unique_ptr<RingUse> UseRing();
  // Writes the sink's Destinations into the ring as its direct table, or
  // declines there (false) when it has none or they do not fit.
  static bool OfferDestinations(SharedRing& ring, StateDictSink& sink);
  // GetStateDict, which registers the ring again and retries once when the
  // server no longer knows it and `may_register_again`.
  absl::Status Fetch(absl::string_view module,
                     const GetStateDictOptions& options, StateDictSink& sink,
                     bool may_register_again);
  // Set up by the first transfer (under ring_mu_); ring_busy_ while one
  // transfer uses the ring.
  Mutex ring_mu_;
  bool ring_asked_ ABSL_GUARDED_BY(ring_mu_) = false;
  bool ring_busy_ ABSL_GUARDED_BY(ring_mu_) = false;
  std::string ring_socket_ ABSL_GUARDED_BY(ring_mu_);
  std::unique_ptr<SharedRing> ring_ ABSL_GUARDED_BY(ring_mu_);
  // The process that made ring_: a child of fork makes a ring of its own
  // (the server would write the parent's memory through the parent's).
  int ring_pid_ ABSL_GUARDED_BY(ring_mu_) = 0;
  // Open while the server keeps the ring: closed with the client.
  RingRegistration ring_registration_ ABSL_GUARDED_BY(ring_mu_);
  mutable Mutex seqs_mu_;
  mutable std::vector<uint64_t> last_audit_seqs_ ABSL_GUARDED_BY(seqs_mu_);
};

}  // namespace modelstate::client

#endif  // MODELSTATE_CLIENT_MODEL_STATE_CLIENT_H_
