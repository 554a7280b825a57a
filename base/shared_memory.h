// File: shared_memory.h
// State bytes between two processes on one host at memory speed: a ring of
// slots in a memfd (memory with no name in any file system, so only a
// process handed its descriptor can open it) that a client creates once,
// registers on the server's Unix-domain socket (SCM_RIGHTS), and reuses for
// every transfer while its registration's connection stays open, so that
// its pages are faulted in once and not per byte moved. The transfer protocol
// (which slot holds which chunk, the consumer counter) is SharedMemoryRing in
// proto/modelstate/v1/ model_state_service.proto; this file holds the ring, the
// memfd and socket primitives, and the client's half of the registration. The
// server's half is server/shared_memory_exchange.h.
//
// A GetStateDict may skip the ring's extra copy: the client lists, in the
// ring, where each entry's bytes go in its own memory (a direct table),
// and the server writes them there itself (process_vm_writev, through
// PeerMemory), the one copy a receive into new tensors needs.
//
// Example (a client):
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<SharedRing> ring,
//                               SharedRing::Create(4, 8 << 20));
//   MODELSTATE_ASSIGN_OR_RETURN(RingRegistration registration,
//                               RegisterRing(socket_path, *ring));
//   ring->set_consumed(0);
//   // ... name registration.token in a call; chunk i goes through
//   // ring->slot(i) ...
#ifndef MODELSTATE_BASE_SHARED_MEMORY_H_
#define MODELSTATE_BASE_SHARED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/file_util.h"

namespace modelstate {

// Registration tokens are this many random bytes.
inline constexpr size_t kRingTokenBytes = 16;
// The socket's one request: 'R', slots and slot bytes (4 bytes LE each),
// and the memfd; the answer is 0 and a token, or 1 and an error text.
inline constexpr char kRegisterRing = 'R';
// The slots start after a page that holds the consumer counter.
inline constexpr uint64_t kRingHeaderBytes = 4096;
inline constexpr uint32_t kMinRingSlots = 2;
inline constexpr uint32_t kMaxRingSlots = 64;
inline constexpr uint64_t kMaxRingSlotBytes = uint64_t{64} << 20;
inline constexpr uint64_t kMaxRingBytes = uint64_t{256} << 20;

// A direct table answer meaning "send through the ring slots instead".
inline constexpr uint64_t kDirectTableDeclined = ~uint64_t{0};

// One entry of a direct table: where the entry's bytes go in the client's
// memory, and how many there are (the header's byte_length).
struct DirectTarget {
  uint64_t address = 0;
  uint64_t length = 0;
};

// A mapping, unmapped on destruction. Movable.
class MappedRegion {
 public:
  MappedRegion() = default;
  MappedRegion(void* data, size_t size) : data_(data), size_(size) {}
  ~MappedRegion();
  MappedRegion(MappedRegion&& other) noexcept;
  MappedRegion& operator=(MappedRegion&& other) noexcept;
  MappedRegion(const MappedRegion&) = delete;
  MappedRegion& operator=(const MappedRegion&) = delete;

  char* data() const { return static_cast<char*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// A ring mapped in this process, made here or received from a peer.
// Thread-compatible; the counter is read and written atomically, since the
// peer process uses it at the same time.
class SharedRing {
 public:
  // A new ring: a memfd sealed against growing and shrinking, mapped and
  // faulted in. INVALID_ARGUMENT for a shape outside the limits above.
  static absl::StatusOr<std::unique_ptr<SharedRing>> Create(
      uint32_t slots, uint64_t slot_bytes);
  // A peer's ring: its memfd must be sealed against growing and shrinking
  // (so that it cannot be truncated under the mapping) and exactly the
  // shape's size. INVALID_ARGUMENT naming what is wrong.
  static absl::StatusOr<std::unique_ptr<SharedRing>> Adopt(ScopedFd fd,
                                                           uint32_t slots,
                                                           uint64_t slot_bytes);

  int fd() const { return fd_.get(); }
  uint32_t slots() const { return slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // Where chunk `chunk` of a transfer goes.
  char* slot(uint64_t chunk) const {
    return region_.data() + kRingHeaderBytes + (chunk % slots_) * slot_bytes_;
  }

  // How many chunks the consumer has finished with (acquire).
  uint64_t consumed() const;
  // Release: the chunks before `count` are free for the producer.
  void set_consumed(uint64_t count);
  // Until chunk `chunk`'s slot is free (consumed() + slots > chunk): true;
  // false once `timeout` passed or `cancelled` returned true. Polls.
  bool WaitForSlot(uint64_t chunk, absl::Duration timeout,
                   absl::FunctionRef<bool()> cancelled) const;

  // The direct table. The header page holds its words: the answer at 8
  // (0 while the client has not answered, kDirectTableDeclined, or the
  // number of DirectTargets written from the first slot on), the server's
  // "writing" flag at 16, the last call the client stopped at 24 and the
  // client's current call at 32; all little endian.
  uint64_t direct_table() const;  // the answer (acquire)

  // The client's side. Before a call that may use a table: no answer yet,
  // and the call's number (one more than the last).
  uint64_t BeginDirectCall();
  // Writes `targets` and answers with their number (release), or answers
  // kDirectTableDeclined when there are none or they do not fit in the
  // slots (false then).
  bool OfferDirectTable(const std::vector<DirectTarget>& targets);
  void DeclineDirectTable();
  // For a call that ends before the server said it wrote everything (an
  // error, a deadline, a cancellation): tells the server to write nothing
  // more for `call` and waits until no write is in progress. Only then may
  // the memory the table named be freed. False when the server was still
  // writing after `timeout` (that memory must then be kept forever).
  bool StopDirectWrites(uint64_t call, absl::Duration timeout);

  // The server's side. A table and the call it belongs to.
  struct DirectTable {
    std::vector<DirectTarget> targets;
    uint64_t call = 0;
  };
  // Waits for the answer as WaitForSlot does; the table (copied out of the
  // ring, so that the client cannot change it after it is checked), or
  // nullopt when the client declined. DEADLINE_EXCEEDED / CANCELLED when no
  // answer came; INVALID_ARGUMENT naming `field` for a table of other than
  // `entries` targets.
  absl::StatusOr<std::optional<DirectTable>> AwaitDirectTable(
      uint64_t entries, absl::Duration timeout,
      absl::FunctionRef<bool()> cancelled, absl::string_view field) const;
  // Around every write into the client's memory: false (and nothing may be
  // written) once the client stopped `call`.
  bool BeginDirectWrite(uint64_t call);
  void EndDirectWrite();

 private:
  SharedRing(ScopedFd fd, MappedRegion region, uint32_t slots,
             uint64_t slot_bytes)
      : fd_(std::move(fd)),
        region_(std::move(region)),
        slots_(slots),
        slot_bytes_(slot_bytes) {}

  // A word of the header page, read and written atomically.
  uint64_t* word(size_t offset) const;

  ScopedFd fd_;
  MappedRegion region_;
  uint32_t slots_;
  uint64_t slot_bytes_;
};

// A process on this host whose memory this one may write (the peer of a
// Unix-domain connection, pinned by a pidfd), as a debugger of the same
// user could: the kernel allows it for a dumpable process of this
// process's user that has not forbidden it (Yama's ptrace_scope 0, or a
// client that named this process with PR_SET_PTRACER), and refuses
// otherwise. Writes go without CAP_SYS_PTRACE even in a server that has
// it, so that a client that became privileged (exec of a setuid program)
// is never written. Thread-compatible.
class PeerMemory {
 public:
  // The connection's peer: UNAVAILABLE when the kernel does not name it
  // (a peer in a PID namespace this process cannot see) or it is gone.
  static absl::StatusOr<std::unique_ptr<PeerMemory>> OfConnection(int socket);

  // Whether this process may write the peer's memory at `address`: reads
  // one byte there. FAILED_PRECONDITION when the kernel refuses (the caller
  // then sends the bytes another way), UNAVAILABLE when the peer exited,
  // INVALID_ARGUMENT when the address is not the peer's memory.
  absl::Status Probe(uint64_t address) const;
  // Writes `bytes` at `address` in the peer; the same errors as Probe.
  absl::Status Write(absl::string_view bytes, uint64_t address) const;
  // UNAVAILABLE once the peer has exited (its pid could then name another
  // process).
  absl::Status CheckAlive() const;

 private:
  PeerMemory(int pid, ScopedFd pidfd) : pid_(pid), pidfd_(std::move(pidfd)) {}
  absl::Status Failure(int error) const;

  const int pid_;
  const ScopedFd pidfd_;  // readable once the peer exits
};

// A ring registered on the server's socket: the token calls name, and the
// connection, whose closing unregisters the ring.
struct RingRegistration {
  std::string token;
  ScopedFd connection;
};
absl::StatusOr<RingRegistration> RegisterRing(const std::string& socket_path,
                                              const SharedRing& ring);

// This host's boot id (/proc/sys/kernel/random/boot_id), or "" if unknown:
// two processes with the same one run on the same kernel.
std::string BootId();

// Sends all of `bytes` on a connected Unix socket, with `fd` attached to
// the first byte when it is not -1.
absl::Status SendWithFd(int socket, absl::string_view bytes, int fd);

// Reads up to `size` bytes into `out` (fewer only at the peer's end); the
// first descriptor that comes with them goes to `fd` (others are closed).
absl::StatusOr<size_t> ReceiveWithFd(int socket, char* out, size_t size,
                                     ScopedFd* fd);

// A stream socket connected to `path`, sends and receives bounded by
// `timeout`.
absl::StatusOr<ScopedFd> ConnectUnixSocket(const std::string& path,
                                           absl::Duration timeout);

// Little-endian 4-byte integers of the registration.
std::string EncodeU32(uint32_t value);
uint32_t DecodeU32(const char* bytes);

}  // namespace modelstate

#endif  // MODELSTATE_BASE_SHARED_MEMORY_H_
