// File: staged_state_dict.h
// A state_dict that arrives as a stream (StateDictLayout, then its bytes in
// order) and is staged in a file instead of memory, so that loading it into
// a module never holds the state twice in RAM: the bytes go to a file as
// they arrive, and the load reads each entry back straight into the
// module's tensor (LoadSource), converting dtypes in small pieces when they
// differ.
//
// Two kinds of file:
// - anonymous: an unlinked temporary file that vanishes with the object
//   (also if the process dies);
// - a safetensors file at a given path, written with a CRC-32C per entry
//   and made durable by Finish(). A durable store adopts it as the module's
//   data file, so the bytes are written to disk once, while they arrive.
//   Unless Keep() is called, the object deletes the file when destroyed.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(auto staged,
//       StagedStateDict::CreateAnonymous(layout, limits, "data/staging"));
//   for (...) MODELSTATE_RETURN_IF_ERROR(staged->Append(chunk));
//   MODELSTATE_ASSIGN_OR_RETURN(StateDict described, staged->Finish());
//   LoadOptions options;
//   options.source = staged.get();
//   MODELSTATE_ASSIGN_OR_RETURN(LoadResult r,
//                               module->LoadStateDict(described, options));
#ifndef MODELSTATE_CORE_STAGED_STATE_DICT_H_
#define MODELSTATE_CORE_STAGED_STATE_DICT_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/sync.h"
#include "core/module.h"
#include "core/safetensors.h"
#include "core/state_stream.h"

namespace modelstate {

// Thread-compatible. Appended bytes are written by a thread of the
// object's own, so that receiving the next bytes and writing the last ones
// overlap; at most a few MiB wait between the two. An observer (Observe)
// sees the same bytes on a third thread, beside the writer.
class StagedStateDict : public LoadSource {
 public:
  // Both validate `layout` (ValidateLayout). An anonymous file in `dir`
  // (which must exist):
  static absl::StatusOr<std::unique_ptr<StagedStateDict>> CreateAnonymous(
      StateDictLayout layout, const StreamLimits& limits,
      const std::string& dir);
  // A safetensors file at `path` (complete, durable and there only once
  // Finish() succeeded); `on_close` runs when the object is destroyed,
  // after it deleted the file if nobody kept it.
  static absl::StatusOr<std::unique_ptr<StagedStateDict>> CreateFile(
      StateDictLayout layout, const StreamLimits& limits,
      const std::string& path, std::function<void()> on_close = nullptr);
  ~StagedStateDict() override;

  // Consumes the next bytes of the stream (taking the string's buffer).
  // INVALID_ARGUMENT when more bytes arrive than the layout declares; an
  // earlier write's error otherwise.
  absl::Status Append(std::string bytes);

  // Also hands every appended piece, in order, to `observe` on a thread of
  // its own, beside the writer: hashing the stream (LoadStateDict's audit
  // digest) then costs the receiving thread nothing. Once, before the
  // first Append (FAILED_PRECONDITION otherwise). `observe` must stay
  // valid until Drain() returned or this object is destroyed.
  absl::Status Observe(std::function<void(absl::string_view)> observe);

  // Waits until every appended piece is written and observed and stops the
  // threads (no Append after it); the first write error, if any. Finish()
  // drains too.
  absl::Status Drain();

  // Once exactly total_bytes arrived (and, for a file, once it is durable):
  // Describe(). INVALID_ARGUMENT saying how many bytes are missing
  // otherwise.
  absl::StatusOr<StateDict> Finish();

  // A StateDict of meta tensors (each entry's dtype and shape, with the
  // layout's metadata) for Module::LoadStateDict with this object as
  // LoadOptions::source. Available from the start, to check a load before
  // its bytes arrive.
  StateDict Describe() const;

  // LoadSource.
  absl::Status CopyInto(const std::string& key, Tensor& target) override;
  absl::StatusOr<Tensor> Read(const std::string& key) override;

  // A file's entries that CopyInto copied unchanged and whole: the tensor
  // storage now holds exactly the entry's bytes in the file.
  struct CopiedEntry {
    std::shared_ptr<Storage> storage;
    DType dtype;
    std::string key;
    uint32_t crc32c;
  };
  const std::vector<CopiedEntry>& copied() const { return copied_; }
  // The safetensors file ("" when anonymous); Keep() leaves it in place.
  const std::string& path() const { return path_; }
  void Keep() { keep_ = true; }

  uint64_t received() const { return received_; }

 private:
  explicit StagedStateDict(StateDictLayout layout);
  // Who works through the queue, each at its own pace.
  enum Consumer { kWriter = 0, kObserver = 1 };
  void StartWriter();
  // A consumer's thread: takes each queued piece in order until the queue
  // is drained and stopping, a write failed, or the object is abandoned.
  void ConsumeQueued(Consumer who);
  // Writes one piece to the file (and its entries' CRCs).
  absl::Status WritePiece(absl::string_view bytes);
  // Frees the pieces at the queue's front that every consumer is done with.
  void DropConsumedPieces() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const StateDictLayoutEntry* Find(const std::string& key, size_t* index,
                                   uint64_t* offset) const;
  // Reads `n` bytes of the data section at `offset` into `out`.
  absl::Status ReadData(char* out, uint64_t n, uint64_t offset);

  const StateDictLayout layout_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::vector<uint64_t> offsets_;  // in the data section
  int fd_ = -1;                    // for reading (and anonymous writing)
  std::string path_;               // the safetensors file, if any
  std::unique_ptr<SafetensorsFileWriter> writer_;
  std::function<void()> on_close_;
  uint64_t data_start_ = 0;  // where the data section begins in the file
  // Written by the writer thread only, read after it stopped.
  std::vector<uint32_t> crcs_;
  size_t entry_ = 0;         // the entry the next written byte belongs to
  uint64_t entry_done_ = 0;  // its bytes already written
  uint64_t received_ = 0;
  bool finished_ = false;
  bool keep_ = false;
  std::vector<CopiedEntry> copied_;

  Mutex mu_;
  CondVar changed_;
  // Pieces some consumer still needs. References to them stay valid while
  // others are pushed and popped (a deque's), so each consumer reads its
  // piece without the lock; none is popped before every consumer passed it.
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // How many of queue_'s pieces each consumer is done with.
  size_t consumed_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  bool has_observer_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;  // destroyed unfinished
  absl::Status write_status_ ABSL_GUARDED_BY(mu_);
  std::function<void(absl::string_view)> observe_;  // its thread's only
  std::thread writer_thread_;
  std::thread observer_thread_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_STAGED_STATE_DICT_H_
