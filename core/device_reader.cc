#include "core/device_reader.h"

#include <algorithm>
#include <future>
#include <string>
#include <utility>

#include "base/status_macros.h"
#include "core/storage.h"

namespace modelstate {

DeviceReader::DeviceReader(size_t window_bytes)
    : window_bytes_(std::max<size_t>(8, (window_bytes + 7) / 8 * 8)) {}

DeviceReader::~DeviceReader() {
  if (next_.valid()) next_.wait();
}

uint64_t DeviceReader::WindowBegin(uint64_t offset) const {
  return offset / window_bytes_ * window_bytes_;
}

absl::Status DeviceReader::Download(const Tensor& tensor, uint64_t begin,
                                    Window& window) const {
  window.data = nullptr;  // Matches no read until the bytes are in.
  if (window.bytes == nullptr) window.bytes.reset(new char[window_bytes_]);
  window.size = static_cast<size_t>(
      std::min<uint64_t>(window_bytes_, tensor.nbytes() - begin));
  MODELSTATE_RETURN_IF_ERROR(CopyBytes(
      Device::Cpu(), window.bytes.get(), tensor.device(),
      static_cast<const char*>(tensor.raw_data()) + begin, window.size));
  window.data = tensor.raw_data();
  window.begin = begin;
  return absl::OkStatus();
}

void DeviceReader::Prefetch(const Tensor& tensor, uint64_t offset) {
  if (next_.valid() || offset >= tensor.nbytes()) return;
  next_data_ = tensor.raw_data();
  next_begin_ = WindowBegin(offset);
  Window window;
  window.bytes = std::move(spare_);
  // The lambda holds its own reference to the tensor's storage.
  next_ = std::async(
      std::launch::async,
      [this, tensor, begin = next_begin_,
       window = std::move(window)]() mutable -> absl::StatusOr<Window> {
        MODELSTATE_RETURN_IF_ERROR(Download(tensor, begin, window));
        return std::move(window);
      });
}

absl::StatusOr<absl::string_view> DeviceReader::Read(const Tensor& tensor,
                                                     uint64_t offset,
                                                     size_t wanted) {
  const uint64_t begin = WindowBegin(offset);
  const bool have = current_.data == tensor.raw_data() &&
                    current_.begin == begin && current_.size > 0;
  if (!have) {
    if (next_.valid()) {
      absl::StatusOr<Window> next = next_.get();
      if (next_data_ == tensor.raw_data() && next_begin_ == begin) {
        if (!next.ok()) return next.status();
        spare_ = std::move(current_.bytes);
        current_ = *std::move(next);
      } else if (next.ok()) {
        spare_ = std::move(next->bytes);
      }
    }
    if (current_.data != tensor.raw_data() || current_.begin != begin) {
      MODELSTATE_RETURN_IF_ERROR(Download(tensor, begin, current_));
    }
    // Read-ahead: the rest of this tensor downloads while this window is
    // consumed.
    Prefetch(tensor, begin + window_bytes_);
  }
  const size_t skip = static_cast<size_t>(offset - begin);
  return absl::string_view(current_.bytes.get() + skip,
                           std::min(wanted, current_.size - skip));
}

}  // namespace modelstate
