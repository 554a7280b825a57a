// File: storage.h
// Contiguous bytes on one device, shared by the tensors that view them, and
// the per-device memory backends (CPU built in; CUDA registers itself when
// the project is built with it).
//
// Example:
//   absl::StatusOr<std::shared_ptr<Storage>> s =
//       Storage::Allocate(1024, Device::Cpu());
//   std::memset((*s)->data(), 0, (*s)->nbytes());
#ifndef MODELSTATE_CORE_STORAGE_H_
#define MODELSTATE_CORE_STORAGE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/mapped_file.h"
#include "core/device.h"
#include "core/dtype.h"

namespace modelstate {

// Fills `length` bytes at `staging` with bytes [offset, offset + length) of
// what is being uploaded.
using StagingFill =
    absl::FunctionRef<void(void* staging, size_t offset, size_t length)>;
// Consumes `length` downloaded bytes at `staging`: bytes [offset, offset +
// length) of what is being downloaded.
using StagingDrain =
    absl::FunctionRef<void(const void* staging, size_t offset, size_t length)>;

// Memory operations for the devices of one type other than cpu and meta.
// Implementations are thread-safe.
class DeviceBackend {
 public:
  // Host <-> device transfers go through staging buffers of a multiple of
  // this many bytes (except the last piece), so every piece holds whole
  // elements of any dtype.
  static constexpr size_t kStagingGranule = 8;

  virtual ~DeviceBackend() = default;
  virtual DeviceType type() const = 0;
  // Number of devices of this type present (indices 0..count-1).
  virtual int DeviceCount() const = 0;
  // Why DeviceCount() is 0 (e.g. "no CUDA-capable device is detected"), or
  // empty.
  virtual std::string UnavailableReason() const = 0;
  // Total and free memory of device `index`, in bytes.
  virtual absl::StatusOr<uint64_t> TotalMemory(int32_t index) const = 0;
  virtual absl::StatusOr<uint64_t> FreeMemory(int32_t index) const = 0;
  // A human-readable name of device `index` (e.g. the GPU model).
  virtual std::string DeviceName(int32_t index) const = 0;
  // Allocates `nbytes` uninitialised bytes on device `index`.
  // RESOURCE_EXHAUSTED when the device is out of memory.
  virtual absl::StatusOr<void*> Allocate(int32_t index,
                                         size_t nbytes) const = 0;
  virtual void Free(int32_t index, void* ptr) const = 0;
  // Writes `nbytes` at device address `dst`, piece by piece: `fill` writes
  // each piece into a (pinned) staging buffer, which is then copied to the
  // device while the next piece is filled. Each piece but the last is a
  // multiple of kStagingGranule bytes. Pieces may come in any order and
  // from several threads at once, so `fill` must write only its own piece.
  // Synchronous: returns once the bytes are on the device.
  virtual absl::Status Upload(int32_t index, void* dst, size_t nbytes,
                              StagingFill fill) const = 0;
  // Reads `nbytes` at device address `src` piece by piece into staging
  // buffers and hands each to `drain` while the next pieces are copied. Same
  // piece sizes, and like Upload's, in any order from several threads at
  // once. Synchronous.
  virtual absl::Status Download(int32_t index, const void* src, size_t nbytes,
                                StagingDrain drain) const = 0;
  // Copies `nbytes` within or between devices of this type. Synchronous.
  virtual absl::Status CopyOnDevice(int32_t dst_index, void* dst,
                                    int32_t src_index, const void* src,
                                    size_t nbytes) const = 0;
  // Converts `count` elements on device `index` from `src` (src_dtype) into
  // `dst` (dst_dtype) with exactly ConvertElements' results. Synchronous.
  virtual absl::Status ConvertOnDevice(int32_t index, const void* src,
                                       DType src_dtype, void* dst,
                                       DType dst_dtype,
                                       int64_t count) const = 0;
};

// Installs `backend` for its device type; later calls for the same type
// replace it. Called once at start-up by backends that are built in.
void RegisterDeviceBackend(std::unique_ptr<DeviceBackend> backend);
// Removes the backend of `type`, if any. Storages on its devices must be
// gone (tests only).
void RemoveDeviceBackend(DeviceType type);

// The backend for `type`, or nullptr when none is built in (always nullptr
// for cpu and meta, which Storage handles itself).
const DeviceBackend* FindDeviceBackend(DeviceType type);

// Bytes on one device (never meta). Immutable size; the bytes themselves are
// written by whoever holds the only reference (see Tensor's copy-on-write
// rule). Thread-compatible.
class Storage {
 public:
  // Allocates `nbytes` uninitialised bytes on `device`, 64-byte aligned on
  // cpu. Returns FAILED_PRECONDITION for an unavailable device or meta, and
  // RESOURCE_EXHAUSTED when the memory cannot be had.
  static absl::StatusOr<std::shared_ptr<Storage>> Allocate(size_t nbytes,
                                                           Device device);

  // Takes ownership of `bytes` as CPU storage without copying them.
  static std::shared_ptr<Storage> AdoptString(std::string bytes);

  // CPU storage that views `nbytes` bytes of `file` at `offset` (REQUIRES:
  // within the file) without reading them: the bytes a durable module
  // saved, hosted from the page cache rather than from this process's
  // memory. Read-only: a writer gets fresh storage instead (see
  // Tensor::MutableDataForOverwrite). The bytes are trusted only once
  // CheckIntegrity found their CRC-32C to be `crc32c`; `origin` says where
  // they are, for its error ("module 'a/b', data-1.safetensors entry 's0'").
  static std::shared_ptr<Storage> MapFileBytes(
      std::shared_ptr<const MappedFile> file, size_t offset, size_t nbytes,
      uint32_t crc32c, std::string origin);

  // A file view standing in for `saved` (CPU, same size): its bytes were
  // just written at `offset` in `file` and synced (a durable save), so the
  // view keeps `saved`'s version and is trusted intact until a scrub reads
  // it again. Whoever still holds `saved` keeps its memory; the module's
  // tensors switch to the view, and their memory goes back to the system.
  static std::shared_ptr<Storage> MapSavedBytes(
      const Storage& saved, std::shared_ptr<const MappedFile> file,
      size_t offset, uint32_t crc32c, std::string origin);

  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();

  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }

  // A process-wide unique number that changes whenever the bytes may have
  // been written (see Tensor::MutableDataForOverwrite): two observations
  // with the same version saw the same bytes. Durable storage uses it to
  // rewrite only what changed.
  uint64_t version() const { return version_; }
  void MarkWritten();

  // Whether the bytes are a file's, mapped read-only (MapFileBytes).
  bool read_only() const { return owner_ == Owner::kFile; }

  // For file bytes: checks them against their CRC-32C the first time they
  // are needed (every time when `again`, as a scrub does), so that damage
  // on disk is found before any byte is served. DATA_LOSS naming the origin
  // once the bytes do not match, or cannot be read at all (the read faulted:
  // the process lives on); from then on the storage stays damaged.
  // OK for every other storage, and thread-safe.
  absl::Status CheckIntegrity(bool again = false) const;
  // Whether CheckIntegrity has ever found these bytes damaged.
  bool damaged() const;
  // How many storages CheckIntegrity has found damaged in this process.
  static uint64_t DamagedCount();

  // Keeps only the first `nbytes` bytes (REQUIRES: nbytes <= nbytes()),
  // giving the rest of a mapped storage back to the system on a thread of
  // its own, so that the caller does not wait for the pages to be freed.
  // Only the storage's sole owner may call it (an in-place narrowing
  // conversion).
  void ShrinkTo(size_t nbytes);

 private:
  friend class ScopedStorageReuse;
  enum class Owner { kMalloc, kMmap, kString, kBackend, kFile };
  // What CheckIntegrity knows of file bytes. kUnreadable: reading them
  // faulted (the file cut short, a page the disk could not read); damaged
  // as kDamaged is, with its own message.
  enum Integrity : uint8_t { kUnchecked, kIntact, kDamaged, kUnreadable };
  Storage(void* data, size_t nbytes, Device device, Owner owner);

  void* data_;
  size_t nbytes_;
  size_t mapped_bytes_ = 0;  // Owner::kMmap: the length to unmap.
  Device device_;
  Owner owner_;
  std::string owned_string_;  // Holds the bytes when owner_ == kString.
  uint64_t version_;
  // Owner::kFile: the mapping viewed, what the bytes' CRC-32C must be, where
  // they came from, and what the check found.
  std::shared_ptr<const MappedFile> file_;
  uint32_t crc32c_ = 0;
  std::string origin_;
  mutable std::atomic<uint8_t> integrity_{kUnchecked};
  // Owner::kMmap: on release, offer the mapping to the reuse cache instead of
  // unmapping it (set for storages allocated under ScopedStorageReuse).
  bool reusable_ = false;
};

// While one is alive on a thread, the large CPU storages that thread
// allocates are handed, when released, to a small process-wide cache of
// mappings (at most 8 and 64 MiB in all) instead of straight back to the
// system; any later allocation of the same page-rounded size takes one from
// there. Forward passes use it: they allocate and drop outputs of the same
// few sizes on every call, and a fresh mapping costs a page fault and the
// kernel's zeroing for every page, which for a 3 MiB Linear output is a
// tenth of the matrix product itself. Storages allocated outside any scope
// (state loads, downloads) are never cached, so the cache cannot add to the
// server's peak memory while it moves state. Nests.
class ScopedStorageReuse {
 public:
  ScopedStorageReuse();
  ~ScopedStorageReuse();
  ScopedStorageReuse(const ScopedStorageReuse&) = delete;
  ScopedStorageReuse& operator=(const ScopedStorageReuse&) = delete;

  // Unmaps every cached mapping (tests, and memory pressure).
  static void ReleaseCached();
  // Bytes held by the cache now.
  static size_t CachedBytes();
};

// While one is alive on a thread, the large CPU storages that thread
// allocates are faulted in (on the background thread that does it) only
// when the last one ends, all together. Making many mappings while the
// first ones are being faulted in waits for the faulting at every mapping
// (both need the process's memory map); a receive that makes every
// entry's tensor at once (StateDictAssembler::PlaceAll) uses it. Nests.
// A storage made in the scope may be freed on this thread at any time, but
// on another thread only after the scope ends (the held ranges are this
// thread's).
class ScopedBatchedPrefault {
 public:
  ScopedBatchedPrefault();
  ~ScopedBatchedPrefault();
  ScopedBatchedPrefault(const ScopedBatchedPrefault&) = delete;
  ScopedBatchedPrefault& operator=(const ScopedBatchedPrefault&) = delete;
};

// While one is alive on a thread, the tails that ShrinkTo gives up on that
// thread go back to the system only when the last one ends. Unmapping
// flushes every core's TLB for the process, which slows whatever runs
// meanwhile: a whole module's in-place conversion (Module::To) gives its
// tails back once it is done, so that its conversions are not interrupted
// (to(float16) of GPT-2's 124M parameters: 36.8 -> 30.6 ms here). The
// process keeps no more memory than it had when the scope began. Nests.
class ScopedDeferredUnmap {
 public:
  ScopedDeferredUnmap();
  ~ScopedDeferredUnmap();
  ScopedDeferredUnmap(const ScopedDeferredUnmap&) = delete;
  ScopedDeferredUnmap& operator=(const ScopedDeferredUnmap&) = delete;
};

// Copies `nbytes` between two storages' memory on any devices.
absl::Status CopyBytes(const Device& dst_device, void* dst,
                       const Device& src_device, const void* src,
                       size_t nbytes);

// Converts `count` elements from `src` (src_dtype, on src_device) into `dst`
// (dst_dtype, on dst_device) with ConvertElements' results, in one pass:
// host -> device converts into the staging buffers as it uploads, device ->
// host converts out of them as it downloads, and on one device a kernel
// converts. INVALID_ARGUMENT for a meta source; a meta destination is a
// no-op.
absl::Status CopyElements(const Device& dst_device, void* dst, DType dst_dtype,
                          const Device& src_device, const void* src,
                          DType src_dtype, int64_t count);

// Writes `nbytes` at `dst` on `device` (cpu too) with bytes that `fill`
// produces piece by piece straight into the staging buffers, e.g. read from
// a file, so that they need no host copy of their own first. `fill` may run
// for several pieces at once on several threads (each writes only its own
// piece); the first error it returns is returned.
absl::Status FillBytes(
    const Device& device, void* dst, size_t nbytes,
    absl::FunctionRef<absl::Status(void* piece, size_t offset, size_t length)>
        fill);

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STORAGE_H_
