#include "core/storage.h"

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/crc32c.h"
#include "base/mapped_file.h"
#include "base/status_macros.h"
#include "base/sync.h"
#if MODELSTATE_WITH_CUDA
#include "core/cuda/cuda_backend.h"
#endif

namespace modelstate {
namespace {

// Allocations at least this large are mapped directly, so that freeing them
// returns the pages to the system at once (malloc may keep them in its heap,
// which would make the server's RSS grow with every load).
constexpr size_t kMmapThreshold = size_t{1} << 20;
constexpr size_t kCpuAlignment = 64;

Mutex& BackendsMutex() {
  static auto* mu = new Mutex();
  return *mu;
}
std::array<std::unique_ptr<DeviceBackend>, 3>& Backends() {
  static auto* backends = [] {
    auto* built_in = new std::array<std::unique_ptr<DeviceBackend>, 3>();
#if MODELSTATE_WITH_CUDA
    (*built_in)[static_cast<size_t>(DeviceType::kCuda)] =
        cuda::MakeCudaBackend();
#endif
    return built_in;
  }();
  return *backends;
}

// Mappings at least this large are aligned to a huge page and offered to
// the kernel's transparent huge pages: filling a tensor then takes 512 times
// fewer page faults (a large share of building a model from scratch).
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kHugePageThreshold = size_t{4} << 20;
constexpr size_t kPage = 4096;

// Faults in fresh huge-page mappings on a thread of its own, one huge page
// at a time, ahead of the code that fills them. The kernel zeroes every new
// page when it is first touched, and on a model built from scratch that
// zeroing is about half the work: done here, it runs beside the
// initialisation (random numbers, conversions, copies) on another core
// instead of inside its page faults. Populating never changes a page's
// contents, so racing with the filling code is harmless; a mapping is
// forgotten (and its population stopped) before it is unmapped or shrunk.
class Prefaulter {
 public:
  void Add(void* data, size_t nbytes) {
    MutexLock lock(&mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { Run(); }).detach();
    }
    queue_.push_back({static_cast<char*>(data), nbytes});
    changed_.SignalAll();
  }

  // Returns once nobody populates `data` any more.
  void Forget(void* data) {
    MutexLock lock(&mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->data == data) {
        queue_.erase(it);
        break;
      }
    }
    while (busy_ == data) {
      cancel_ = true;
      changed_.Wait(&mu_);
    }
  }

 private:
  struct Range {
    char* data;
    size_t nbytes;
  };

  void Run() {
    MutexLock lock(&mu_);
    while (true) {
      while (queue_.empty()) changed_.Wait(&mu_);
      Range r = queue_.front();
      queue_.pop_front();
      busy_ = r.data;
      cancel_ = false;
      for (size_t done = 0; done < r.nbytes && !cancel_;) {
        const size_t n = std::min(kHugePage, r.nbytes - done);
        mu_.Unlock();
        madvise(r.data + done, n, MADV_POPULATE_WRITE);
        mu_.Lock();
        done += n;
      }
      busy_ = nullptr;
      changed_.SignalAll();
    }
  }

  Mutex mu_;
  CondVar changed_;
  std::deque<Range> queue_ ABSL_GUARDED_BY(mu_);
  void* busy_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancel_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

Prefaulter& Prefaults() {
  static auto* prefaulter = new Prefaulter();
  return *prefaulter;
}

// Gives page ranges back to the system on a thread of its own. Unmapping
// frees every page and flushes the TLB: for the half of a large float32
// storage that an in-place float16 conversion no longer needs, a fifth of
// the conversion's time, which its caller need not wait for (nothing
// touches the range again).
class Unmapper {
 public:
  void Add(void* data, size_t nbytes) {
    MutexLock lock(&mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { Run(); }).detach();
    }
    queue_.push_back({data, nbytes});
    changed_.SignalAll();
  }

 private:
  void Run() {
    MutexLock lock(&mu_);
    while (true) {
      while (queue_.empty()) changed_.Wait(&mu_);
      const auto [data, nbytes] = queue_.front();
      queue_.pop_front();
      mu_.Unlock();
      munmap(data, nbytes);
      mu_.Lock();
    }
  }

  Mutex mu_;
  CondVar changed_;
  std::deque<std::pair<void*, size_t>> queue_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
};

Unmapper& Unmaps() {
  static auto* unmapper = new Unmapper();
  return *unmapper;
}

// Page ranges a scope on this thread holds back from a background worker
// until its outermost instance ends (ScopedBatchedPrefault,
// ScopedDeferredUnmap).
class HeldRanges {
 public:
  void Enter() { ++depth_; }
  // The ranges to hand over: all of them when the outermost scope ends.
  std::vector<std::pair<void*, size_t>> Leave() {
    if (--depth_ > 0) return {};
    return std::exchange(ranges_, {});
  }
  // Whether a scope is open (the range is held then).
  bool Hold(void* data, size_t nbytes) {
    if (depth_ == 0) return false;
    ranges_.push_back({data, nbytes});
    return true;
  }
  void Drop(void* data) {
    std::erase_if(ranges_,
                  [data](const auto& range) { return range.first == data; });
  }

 private:
  int depth_ = 0;
  std::vector<std::pair<void*, size_t>> ranges_;
};

// Mappings to fault in, and storage tails to give back.
thread_local HeldRanges held_prefaults;
thread_local HeldRanges held_unmaps;

// `nbytes` of fresh zero pages, or nullptr.

void* MapAnonymous(size_t nbytes) {
  const bool huge = nbytes >= kHugePageThreshold;
  const size_t length = huge ? nbytes + kHugePage : nbytes;
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (!huge) return p;
  // Keep the huge-page aligned part; give back the head and the tail.
  const uintptr_t start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = aligned + (nbytes + kPage - 1) / kPage * kPage;
  if (aligned > start) munmap(p, aligned - start);
  if (start + length > end)
    munmap(reinterpret_cast<void*>(end), start + length - end);
  madvise(reinterpret_cast<void*>(aligned), nbytes, MADV_HUGEPAGE);
  if (!held_prefaults.Hold(reinterpret_cast<void*>(aligned), nbytes)) {
    Prefaults().Add(reinterpret_cast<void*>(aligned), nbytes);
  }
  return reinterpret_cast<void*>(aligned);
}

std::atomic<uint64_t> next_storage_version{1};

size_t PageRound(size_t nbytes) { return (nbytes + kPage - 1) / kPage * kPage; }

// Freed mappings kept for reuse (see ScopedStorageReuse), keyed by their
// page-rounded length; the oldest goes first when a new one does not fit.
constexpr size_t kReuseMaxMappings = 8;
constexpr size_t kReuseMaxBytes = size_t{64} << 20;

class MappingCache {
 public:
  // A cached mapping of exactly `length` bytes, or nullptr.
  void* Take(size_t length) {
    MutexLock lock(&mu_);
    for (size_t i = entries_.size(); i-- > 0;) {
      if (entries_[i].length == length) {
        void* p = entries_[i].data;
        bytes_ -= length;
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
        return p;
      }
    }
    return nullptr;
  }

  // Keeps the mapping, unmapping older ones to make room; unmaps it at once
  // when it alone is over the limit.
  void Put(void* data, size_t length) {
    if (length > kReuseMaxBytes) {
      munmap(data, length);
      return;
    }
    std::vector<Entry> evicted;
    {
      MutexLock lock(&mu_);
      while (entries_.size() >= kReuseMaxMappings ||
             bytes_ + length > kReuseMaxBytes) {
        evicted.push_back(entries_.front());
        bytes_ -= entries_.front().length;
        entries_.erase(entries_.begin());
      }
      entries_.push_back({data, length});
      bytes_ += length;
    }
    // The system calls happen outside the lock.
    for (const Entry& e : evicted) munmap(e.data, e.length);
  }

  void Clear() {
    std::vector<Entry> all;
    {
      MutexLock lock(&mu_);
      all.swap(entries_);
      bytes_ = 0;
    }
    for (const Entry& e : all) munmap(e.data, e.length);
  }

  size_t bytes() {
    MutexLock lock(&mu_);
    return bytes_;
  }

 private:
  struct Entry {
    void* data;
    size_t length;
  };
  Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // Oldest first.
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

MappingCache& Cache() {
  static auto* cache = new MappingCache();
  return *cache;
}

thread_local int reuse_scopes = 0;

}  // namespace

Storage::Storage(void* data, size_t nbytes, Device device, Owner owner)
    : data_(data),
      nbytes_(nbytes),
      device_(device),
      owner_(owner),
      version_(next_storage_version.fetch_add(1)) {}

void Storage::MarkWritten() { version_ = next_storage_version.fetch_add(1); }

void Storage::ShrinkTo(size_t nbytes) {
  if (nbytes >= nbytes_) return;
  nbytes_ = nbytes;
  if (owner_ != Owner::kMmap || nbytes == 0) return;
  // The mapping stays where it is; the pages past the new end go back to
  // the system, soon.
  held_prefaults.Drop(data_);
  Prefaults().Forget(data_);
  const size_t keep = PageRound(nbytes);
  if (keep < mapped_bytes_) {
    char* tail = static_cast<char*>(data_) + keep;
    if (!held_unmaps.Hold(tail, mapped_bytes_ - keep)) {
      Unmaps().Add(tail, mapped_bytes_ - keep);
    }
    mapped_bytes_ = keep;
  }
}

ScopedStorageReuse::ScopedStorageReuse() { ++reuse_scopes; }
ScopedStorageReuse::~ScopedStorageReuse() { --reuse_scopes; }

ScopedBatchedPrefault::ScopedBatchedPrefault() { held_prefaults.Enter(); }

ScopedBatchedPrefault::~ScopedBatchedPrefault() {
  for (const auto& [data, nbytes] : held_prefaults.Leave()) {
    Prefaults().Add(data, nbytes);
  }
}

ScopedDeferredUnmap::ScopedDeferredUnmap() { held_unmaps.Enter(); }

ScopedDeferredUnmap::~ScopedDeferredUnmap() {
  for (const auto& [data, nbytes] : held_unmaps.Leave()) {
    Unmaps().Add(data, nbytes);
  }
}

void ScopedStorageReuse::ReleaseCached() { Cache().Clear(); }
size_t ScopedStorageReuse::CachedBytes() { return Cache().bytes(); }

void RegisterDeviceBackend(std::unique_ptr<DeviceBackend> backend) {
  MutexLock lock(&BackendsMutex());
  size_t slot = static_cast<size_t>(backend->type());
  Backends()[slot] = std::move(backend);
}

void RemoveDeviceBackend(DeviceType type) {
  MutexLock lock(&BackendsMutex());
  Backends()[static_cast<size_t>(type)].reset();
}

const DeviceBackend* FindDeviceBackend(DeviceType type) {
  if (type == DeviceType::kCpu || type == DeviceType::kMeta) return nullptr;
  MutexLock lock(&BackendsMutex());
  return Backends()[static_cast<size_t>(type)].get();
}

absl::StatusOr<std::shared_ptr<Storage>> Storage::Allocate(size_t nbytes,
                                                           Device device) {
  if (device.is_meta()) {
    return absl::InternalError("Storage::Allocate called for the meta device");
  }
  if (device.is_cpu()) {
    if (nbytes >= kMmapThreshold) {
      const size_t length = PageRound(nbytes);
      void* p = Cache().Take(length);
      if (p == nullptr) p = MapAnonymous(nbytes);
      if (p == nullptr) {
        return absl::ResourceExhaustedError(
            absl::StrCat("Cannot allocate ", nbytes, " bytes on cpu"));
      }
      std::shared_ptr<Storage> storage(
          new Storage(p, nbytes, device, Owner::kMmap));
      storage->mapped_bytes_ = length;
      storage->reusable_ = reuse_scopes > 0;
      return storage;
    }
    size_t rounded =
        (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment,
                                 rounded == 0 ? kCpuAlignment : rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Cannot allocate ", nbytes, " bytes on cpu"));
    }
    return std::shared_ptr<Storage>(
        new Storage(p, nbytes, device, Owner::kMalloc));
  }
  const DeviceBackend* backend = FindDeviceBackend(device.type);
  if (backend == nullptr) return CheckDeviceAvailable(device);
  absl::StatusOr<void*> p = backend->Allocate(device.index, nbytes);
  if (!p.ok()) return p.status();
  return std::shared_ptr<Storage>(
      new Storage(*p, nbytes, device, Owner::kBackend));
}

std::shared_ptr<Storage> Storage::MapFileBytes(
    std::shared_ptr<const MappedFile> file, size_t offset, size_t nbytes,
    uint32_t crc32c, std::string origin) {
  const char* data = file->bytes().data() + offset;
  std::shared_ptr<Storage> storage(new Storage(const_cast<char*>(data), nbytes,
                                               Device::Cpu(), Owner::kFile));
  storage->file_ = std::move(file);
  storage->crc32c_ = crc32c;
  storage->origin_ = std::move(origin);
  return storage;
}

std::shared_ptr<Storage> Storage::MapSavedBytes(
    const Storage& saved, std::shared_ptr<const MappedFile> file, size_t offset,
    uint32_t crc32c, std::string origin) {
  std::shared_ptr<Storage> view = MapFileBytes(
      std::move(file), offset, saved.nbytes(), crc32c, std::move(origin));
  view->version_ = saved.version_;
  view->integrity_.store(kIntact, std::memory_order_release);
  return view;
}

namespace {
std::atomic<uint64_t> damaged_storages{0};
}  // namespace

absl::Status Storage::CheckIntegrity(bool again) const {
  if (owner_ != Owner::kFile) return absl::OkStatus();
  uint8_t known = integrity_.load(std::memory_order_acquire);
  if (known == kUnchecked || (again && known == kIntact)) {
    const absl::string_view bytes(static_cast<const char*>(data_), nbytes_);
    uint32_t crc = 0;
    const bool read =
        MappedFile::ReadCatchingBusErrors(bytes, [&] { crc = Crc32c(bytes); });
    if (read && crc == crc32c_) {
      // Two checks may race; a damaged verdict is never undone.
      uint8_t expected = known;
      integrity_.compare_exchange_strong(expected, kIntact);
    } else {
      uint8_t before = integrity_.load(std::memory_order_acquire);
      const uint8_t verdict = read ? kDamaged : kUnreadable;
      while (before != kDamaged && before != kUnreadable &&
             !integrity_.compare_exchange_weak(before, verdict)) {
      }
      if (before != kDamaged && before != kUnreadable) {
        damaged_storages.fetch_add(1);
      }
    }
    known = integrity_.load(std::memory_order_acquire);
  }
  if (known == kDamaged) {
    return absl::DataLossError(absl::StrFormat(
        "%s is damaged on disk: its %d bytes do not match their CRC-32C "
        "0x%08x; they are not served",
        origin_, nbytes_, crc32c_));
  }
  if (known == kUnreadable) {
    return absl::DataLossError(absl::StrFormat(
        "%s cannot be read from disk: reading its %d bytes faulted (the "
        "file is shorter than when it was mapped, or the disk failed to "
        "read a page); they are not served",
        origin_, nbytes_));
  }
  return absl::OkStatus();
}

bool Storage::damaged() const {
  const uint8_t known = integrity_.load(std::memory_order_acquire);
  return known == kDamaged || known == kUnreadable;
}

uint64_t Storage::DamagedCount() { return damaged_storages.load(); }

std::shared_ptr<Storage> Storage::AdoptString(std::string bytes) {
  std::shared_ptr<Storage> storage(
      new Storage(nullptr, bytes.size(), Device::Cpu(), Owner::kString));
  storage->owned_string_ = std::move(bytes);
  storage->data_ = storage->owned_string_.data();
  return storage;
}

Storage::~Storage() {
  switch (owner_) {
    case Owner::kMalloc:
      std::free(data_);
      break;
    case Owner::kMmap:
      // Not to be faulted in once unmapped (the range could be another
      // mapping's by then).
      held_prefaults.Drop(data_);
      Prefaults().Forget(data_);
      if (reusable_) {
        Cache().Put(data_, mapped_bytes_);
      } else {
        munmap(data_, mapped_bytes_);
      }
      break;
    case Owner::kString:
    case Owner::kFile:
      break;
    case Owner::kBackend:
      if (const DeviceBackend* backend = FindDeviceBackend(device_.type)) {
        backend->Free(device_.index, data_);
      }
      break;
  }
}

namespace {

absl::StatusOr<const DeviceBackend*> BackendOf(const Device& device) {
  const DeviceBackend* backend = FindDeviceBackend(device.type);
  if (backend == nullptr) {
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(device));
    return absl::InternalError(
        absl::StrCat("no memory backend for ", device.ToString()));
  }
  return backend;
}

}  // namespace

absl::Status CopyBytes(const Device& dst_device, void* dst,
                       const Device& src_device, const void* src,
                       size_t nbytes) {
  if (nbytes == 0 || dst_device.is_meta()) return absl::OkStatus();
  if (src_device.is_meta()) {
    return absl::InvalidArgumentError(
        "Cannot copy out of meta tensor; no data!");
  }
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return absl::OkStatus();
  }
  if (src_device.is_cpu()) {
    MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(dst_device));
    const auto* from = static_cast<const char*>(src);
    return b->Upload(dst_device.index, dst, nbytes,
                     [from](void* staging, size_t offset, size_t length) {
                       std::memcpy(staging, from + offset, length);
                     });
  }
  if (dst_device.is_cpu()) {
    MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(src_device));
    auto* to = static_cast<char*>(dst);
    return b->Download(src_device.index, src, nbytes,
                       [to](const void* staging, size_t offset, size_t length) {
                         std::memcpy(to + offset, staging, length);
                       });
  }
  if (src_device.type != dst_device.type) {
    return absl::UnimplementedError(
        absl::StrCat("Copies from ", src_device.ToString(), " to ",
                     dst_device.ToString(), " are not supported"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(dst_device));
  return b->CopyOnDevice(dst_device.index, dst, src_device.index, src, nbytes);
}

absl::Status CopyElements(const Device& dst_device, void* dst, DType dst_dtype,
                          const Device& src_device, const void* src,
                          DType src_dtype, int64_t count) {
  const size_t src_size = ElementSize(src_dtype);
  const size_t dst_size = ElementSize(dst_dtype);
  if (src_dtype == dst_dtype) {
    return CopyBytes(dst_device, dst, src_device, src,
                     static_cast<size_t>(count) * src_size);
  }
  if (count == 0 || dst_device.is_meta()) return absl::OkStatus();
  if (src_device.is_meta()) {
    return absl::InvalidArgumentError(
        "Cannot copy out of meta tensor; no data!");
  }
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    ConvertElements(src, src_dtype, dst, dst_dtype, count);
    return absl::OkStatus();
  }
  // Staging pieces are multiples of kStagingGranule bytes, so offsets
  // divide into whole elements on both sides.
  if (src_device.is_cpu()) {
    MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(dst_device));
    const auto* from = static_cast<const char*>(src);
    return b->Upload(dst_device.index, dst,
                     static_cast<size_t>(count) * dst_size,
                     [&](void* staging, size_t offset, size_t length) {
                       ConvertElements(from + offset / dst_size * src_size,
                                       src_dtype, staging, dst_dtype,
                                       static_cast<int64_t>(length / dst_size));
                     });
  }
  if (dst_device.is_cpu()) {
    MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(src_device));
    auto* to = static_cast<char*>(dst);
    return b->Download(
        src_device.index, src, static_cast<size_t>(count) * src_size,
        [&](const void* staging, size_t offset, size_t length) {
          ConvertElements(staging, src_dtype, to + offset / src_size * dst_size,
                          dst_dtype, static_cast<int64_t>(length / src_size));
        });
  }
  if (src_device.type != dst_device.type) {
    return absl::UnimplementedError(
        absl::StrCat("Copies from ", src_device.ToString(), " to ",
                     dst_device.ToString(), " are not supported"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(src_device));
  if (src_device == dst_device) {
    return b->ConvertOnDevice(src_device.index, src, src_dtype, dst, dst_dtype,
                              count);
  }
  // Between two devices: convert where the data is, then copy across.
  MODELSTATE_ASSIGN_OR_RETURN(
      std::shared_ptr<Storage> converted,
      Storage::Allocate(static_cast<size_t>(count) * dst_size, src_device));
  MODELSTATE_RETURN_IF_ERROR(b->ConvertOnDevice(
      src_device.index, src, src_dtype, converted->data(), dst_dtype, count));
  return b->CopyOnDevice(dst_device.index, dst, src_device.index,
                         converted->data(), converted->nbytes());
}

absl::Status FillBytes(
    const Device& device, void* dst, size_t nbytes,
    absl::FunctionRef<absl::Status(void* piece, size_t offset, size_t length)>
        fill) {
  if (nbytes == 0 || device.is_meta()) return absl::OkStatus();
  if (device.is_cpu()) return fill(dst, 0, nbytes);
  MODELSTATE_ASSIGN_OR_RETURN(const DeviceBackend* b, BackendOf(device));
  Mutex mu;
  absl::Status first_error;
  MODELSTATE_RETURN_IF_ERROR(
      b->Upload(device.index, dst, nbytes,
                [&](void* staging, size_t offset, size_t length) {
                  absl::Status status = fill(staging, offset, length);
                  if (status.ok()) return;
                  MutexLock lock(&mu);
                  if (first_error.ok()) first_error = std::move(status);
                }));
  MutexLock lock(&mu);
  return first_error;
}

}  // namespace modelstate
