// File: device_reader.h
// Reads the bytes of tensors on an accelerator into host memory one window
// at a time, downloading the next window on a helper thread while the
// current one is used, so that streaming a GPU-resident state_dict overlaps
// the device -> host copies with sending the chunks.
//
// Example:
//   DeviceReader reader;
//   uint64_t offset = 0;
//   while (offset < t.nbytes()) {
//     MODELSTATE_ASSIGN_OR_RETURN(absl::string_view bytes,
//                                 reader.Read(t, offset, 1 << 20));
//     Send(bytes);
//     offset += bytes.size();
//   }
#ifndef MODELSTATE_CORE_DEVICE_READER_H_
#define MODELSTATE_CORE_DEVICE_READER_H_

#include <cstddef>
#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace modelstate {

// Thread-compatible. Tensors passed in must stay unchanged while read.
class DeviceReader {
 public:
  // Large enough for a transfer to use several staging threads; a reader
  // holds two windows.
  static constexpr size_t kDefaultWindowBytes = size_t{16} << 20;

  // `window_bytes` is rounded up to a multiple of 8, so windows hold whole
  // elements of any dtype.
  explicit DeviceReader(size_t window_bytes = kDefaultWindowBytes);
  DeviceReader(const DeviceReader&) = delete;
  DeviceReader& operator=(const DeviceReader&) = delete;
  ~DeviceReader();  // Waits for a download in flight.

  // Host copies of bytes [offset, offset + size) of `tensor` (on a device
  // with storage other than cpu), 0 < size <= wanted: the view stops at the
  // end of the window holding `offset`. Valid until the next call.
  // REQUIRES: offset < tensor.nbytes(), wanted > 0.
  absl::StatusOr<absl::string_view> Read(const Tensor& tensor, uint64_t offset,
                                         size_t wanted);

  // Starts downloading the window at `offset` of `tensor` in the
  // background unless a download is already in flight.
  void Prefetch(const Tensor& tensor, uint64_t offset);

 private:
  // The buffers are window_bytes_ long and reused from window to window,
  // so that a stream's host memory is allocated and faulted in once.
  struct Window {
    const void* data = nullptr;  // The tensor's device address.
    uint64_t begin = 0;
    size_t size = 0;
    std::unique_ptr<char[]> bytes;
  };

  uint64_t WindowBegin(uint64_t offset) const;
  // Downloads the window at `begin` of `tensor` into `window`'s buffer
  // (allocated if it has none).
  absl::Status Download(const Tensor& tensor, uint64_t begin,
                        Window& window) const;

  size_t window_bytes_;
  Window current_;
  std::unique_ptr<char[]> spare_;  // For the next prefetch.
  // The download in flight, if valid().
  std::future<absl::StatusOr<Window>> next_;
  const void* next_data_ = nullptr;
  uint64_t next_begin_ = 0;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_DEVICE_READER_H_
