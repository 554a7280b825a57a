// File: tensor.h
// `Tensor`: a handle to a contiguous, row-major n-d array with a dtype, a
// shape and a device. Copying a Tensor copies the handle: both copies are the
// same tensor object, as two Python references to one torch.Tensor are (this
// is what makes tied parameters possible). `Detach()` makes a new tensor
// object that shares the bytes; `Clone()` copies the bytes.
//
// A parameter is a tensor created by MakeParameter (PyTorch's
// `nn.Parameter(data, requires_grad)`).
//
// Copy-on-write: writing through `MutableDataForOverwrite()` or `CopyFrom()`
// never changes bytes another tensor object still shares (for example a
// state_dict snapshot being streamed to a client); the tensor gets fresh
// storage instead. Readers therefore always see a consistent snapshot.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Tensor::Zeros(DType::kFloat32, {2,
//   3})); MODELSTATE_ASSIGN_OR_RETURN(Tensor p, MakeParameter(w));
//   MODELSTATE_ASSIGN_OR_RETURN(Tensor h, p.To(Device::Cpu(),
//   DType::kFloat16));
#ifndef MODELSTATE_CORE_TENSOR_H_
#define MODELSTATE_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/log.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/storage.h"

namespace modelstate {

using Shape = std::vector<int64_t>;

// Number of elements of `shape`. INVALID_ARGUMENT for a negative dimension
// (PyTorch's text: "Trying to create tensor with negative dimension -1:
// [2, -1]") or when the product overflows int64.
absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape);

// Bytes of `numel` elements of `dtype`; INVALID_ARGUMENT on overflow.
absl::StatusOr<uint64_t> CheckedNumBytes(int64_t numel, DType dtype);

// "[2, 3]" and PyTorch's "torch.Size([2, 3])".
std::string ShapeToString(absl::Span<const int64_t> shape);
std::string TorchSizeString(absl::Span<const int64_t> shape);

struct TensorImpl;

// A tensor handle. Cheap to copy; copies alias the same tensor object.
// Thread-compatible: a tensor object must not be mutated while another thread
// uses it (the server serialises writers per module tree).
class Tensor {
 public:
  // An undefined (null) tensor: PyTorch's None in a parameter or buffer slot.
  Tensor() = default;

  // Creates a tensor with uninitialised contents (no storage on meta).
  // INVALID_ARGUMENT for a bad shape; FAILED_PRECONDITION for an unavailable
  // device; RESOURCE_EXHAUSTED when memory runs out.
  static absl::StatusOr<Tensor> Empty(DType dtype, Shape shape,
                                      Device device = Device::Cpu());
  // Like Empty, every element set to `value` (converted like
  // WriteElementFromDouble).
  static absl::StatusOr<Tensor> Full(DType dtype, Shape shape, double value,
                                     Device device = Device::Cpu());
  static absl::StatusOr<Tensor> Zeros(DType dtype, Shape shape,
                                      Device device = Device::Cpu());
  // A CPU tensor whose storage takes over `bytes` without copying them.
  // INVALID_ARGUMENT if the size is not numel * ElementSize(dtype).
  static absl::StatusOr<Tensor> FromBytes(DType dtype, Shape shape,
                                          std::string bytes);
  // A tensor viewing `storage` (whose size must match exactly).
  static absl::StatusOr<Tensor> FromStorage(DType dtype, Shape shape,
                                            std::shared_ptr<Storage> storage);
  // A CPU tensor holding `values` converted to `dtype`.
  static absl::StatusOr<Tensor> FromDoubles(DType dtype, Shape shape,
                                            absl::Span<const double> values);

  bool defined() const { return impl_ != nullptr; }

  // Accessors. REQUIRES: defined().
  DType dtype() const;
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  const Device& device() const;
  int64_t numel() const;
  size_t nbytes() const;
  bool requires_grad() const;
  bool is_parameter() const;

  // Sets requires_grad. INVALID_ARGUMENT with PyTorch's text ("Only Tensors
  // of floating point and complex dtype can require gradients") when `value`
  // is true and the dtype is not floating point.
  absl::Status SetRequiresGrad(bool value);

  // Read access to the bytes; nullptr on meta or for zero bytes.
  const void* raw_data() const;
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(raw_data());
  }
  // Storage shared by this tensor (null on meta).
  const std::shared_ptr<Storage>& storage() const;

  // Write access for code that overwrites every byte: gives this tensor
  // object storage no other tensor object shares (fresh, uninitialised
  // storage if the current one is shared or read-only). nullptr on meta.
  absl::StatusOr<void*> MutableDataForOverwrite();

  // Copies `src`'s values into this tensor in place, converting the dtype
  // and moving across devices; dtype, shape, device and object identity are
  // kept. INVALID_ARGUMENT if the element counts differ; copying out of a
  // meta tensor fails with PyTorch's text; copying into meta is a no-op.
  absl::Status CopyFrom(const Tensor& src);

  // True if both handles are the same tensor object (PyTorch's `is`).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  // A key identifying the tensor object, for identity sets.
  const void* identity() const { return impl_.get(); }
  // True if both tensors view the same storage.
  bool SharesStorageWith(const Tensor& other) const;

  // A new tensor object sharing the storage, requires_grad false, not a
  // parameter (PyTorch's `detach()`).
  Tensor Detach() const;
  // A new tensor object with a copy of the bytes (same device and dtype), not
  // a parameter, requires_grad false.
  absl::StatusOr<Tensor> Clone() const;
  // This tensor converted to `device` and `dtype`. Returns *this (the same
  // object) when nothing changes, else a new plain tensor.
  absl::StatusOr<Tensor> To(const Device& device, DType dtype) const;

  // Whether no other handle shares this tensor object.
  bool IsSoleHandle() const { return impl_.use_count() == 1; }
  // Whether ConvertInPlace(dtype) can be used: a CPU tensor whose storage
  // no other tensor object shares and is not a file's (read-only), and a
  // dtype no wider than its own.
  bool CanConvertInPlace(DType dtype) const;
  // Converts to `dtype` within the tensor's own storage, which then shrinks
  // to the new size: no second buffer, no new pages to fault in. Every
  // handle of this tensor object sees the new dtype. FAILED_PRECONDITION
  // unless CanConvertInPlace(dtype).
  absl::Status ConvertInPlace(DType dtype);

  // Makes this tensor object take `other`'s dtype, shape, device and storage
  // while keeping its identity, requires_grad and parameter-ness (how
  // PyTorch's Module.to() updates parameters so that ties survive).
  void SetData(const Tensor& other);

  // PyTorch's torch.typename(): "torch.FloatTensor", "torch.cuda.HalfTensor",
  // "torch.nn.Parameter" never appears (a parameter prints as its tensor
  // type, as in PyTorch).
  std::string TypeName() const;

  // A short description: "float32[2, 3] on cpu".
  std::string DebugString() const;

 private:
  friend absl::StatusOr<Tensor> MakeParameter(const Tensor& data,
                                              bool requires_grad);
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  static absl::StatusOr<Tensor> Make(DType dtype, Shape shape, Device device,
                                     std::shared_ptr<Storage> storage);

  std::shared_ptr<TensorImpl> impl_;
};

// PyTorch's `nn.Parameter(data, requires_grad)`: a new parameter object
// sharing `data`'s storage. INVALID_ARGUMENT if `data` is undefined, or with
// PyTorch's text when requires_grad is true for a non-floating dtype.
absl::StatusOr<Tensor> MakeParameter(const Tensor& data,
                                     bool requires_grad = true);

// True if both tensors are defined, have equal dtype, shape and device, and
// equal bytes (meta tensors compare equal on metadata alone).
bool TensorsEqual(const Tensor& a, const Tensor& b);

// SHA-256 of the tensor's bytes as lowercase hex ("" on meta).
std::string ContentHash(const Tensor& tensor);

// Storage::CheckIntegrity of the tensor's bytes (OK when it has none), its
// DATA_LOSS naming the tensor as `key`: "'fc.weight': module 'a/b', ...".
absl::Status CheckTensorBytes(absl::string_view key, const Tensor& tensor);

// While it lives, every tensor with storage that this thread creates
// (Tensor::Empty and all that build on it) may hold at most `max_bytes`;
// a larger one is RESOURCE_EXHAUSTED before anything is allocated. For
// work whose sizes a remote caller chooses, such as a forward's outputs
// and intermediates. Scopes nest; the innermost limit applies.
//
//   ScopedTensorBytesLimit limit(limits.max_tensor_bytes);
//   absl::StatusOr<std::vector<Tensor>> out = Forward(module, inputs);
class ScopedTensorBytesLimit {
 public:
  // The innermost limit on this thread; 0 for none. For working memory
  // that grows like a tensor (a forward's lookup tables), checked before
  // it is built.
  static uint64_t Current();

  explicit ScopedTensorBytesLimit(uint64_t max_bytes);
  ~ScopedTensorBytesLimit();
  ScopedTensorBytesLimit(const ScopedTensorBytesLimit&) = delete;
  ScopedTensorBytesLimit& operator=(const ScopedTensorBytesLimit&) = delete;

 private:
  uint64_t previous_;
};

}  // namespace modelstate

#endif  // MODELSTATE_CORE_TENSOR_H_
