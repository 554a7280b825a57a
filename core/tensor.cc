#include "core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "base/status_macros.h"

namespace modelstate {

// The tensor object. Everything a Python torch.Tensor object would hold.
struct TensorImpl {
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t numel = 0;
  Device device;
  std::shared_ptr<Storage> storage;  // null on meta
  bool requires_grad = false;
  bool is_parameter = false;
};

absl::StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Trying to create tensor with negative dimension ", d,
                       ": ", ShapeToString(shape)));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Shape ", ShapeToString(shape), " has more than 2^63-1 elements"));
    }
    n *= d;
  }
  return n;
}

absl::StatusOr<uint64_t> CheckedNumBytes(int64_t numel, DType dtype) {
  uint64_t size = ElementSize(dtype);
  if (numel < 0 || static_cast<uint64_t>(numel) >
                       std::numeric_limits<uint64_t>::max() / size) {
    return absl::InvalidArgumentError(
        absl::StrCat("A tensor of ", numel, " elements of ", DTypeName(dtype),
                     " is too large"));
  }
  return static_cast<uint64_t>(numel) * size;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string TorchSizeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("torch.Size(", ShapeToString(shape), ")");
}

namespace {
// ScopedTensorBytesLimit's; 0: none.
thread_local uint64_t max_new_tensor_bytes = 0;
}  // namespace

ScopedTensorBytesLimit::ScopedTensorBytesLimit(uint64_t max_bytes)
    : previous_(std::exchange(max_new_tensor_bytes, max_bytes)) {}

ScopedTensorBytesLimit::~ScopedTensorBytesLimit() {
  max_new_tensor_bytes = previous_;
}

uint64_t ScopedTensorBytesLimit::Current() { return max_new_tensor_bytes; }

absl::StatusOr<Tensor> Tensor::Make(DType dtype, Shape shape, Device device,
                                    std::shared_ptr<Storage> storage) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t numel, CheckedNumElements(shape));
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t nbytes, CheckedNumBytes(numel, dtype));
  if (device.has_storage() && storage == nullptr) {
    if (max_new_tensor_bytes != 0 && nbytes > max_new_tensor_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "A ", DTypeName(dtype), ShapeToString(shape), " tensor needs ",
          nbytes, " bytes, over the max_tensor_bytes limit of ",
          max_new_tensor_bytes));
    }
    if (nbytes > std::numeric_limits<size_t>::max()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("Cannot allocate ", nbytes, " bytes"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(storage, Storage::Allocate(nbytes, device));
  }
  if (storage != nullptr && storage->nbytes() != nbytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expected ", nbytes, " bytes for ", DTypeName(dtype),
                     ShapeToString(shape), " but got ", storage->nbytes()));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->dtype = dtype;
  impl->shape = std::move(shape);
  impl->numel = numel;
  impl->device = device;
  impl->storage = std::move(storage);
  return Tensor(std::move(impl));
}

absl::StatusOr<Tensor> Tensor::Empty(DType dtype, Shape shape, Device device) {
  if (!device.is_meta())
    MODELSTATE_RETURN_IF_ERROR(CheckDeviceAvailable(device));
  return Make(dtype, std::move(shape), device, nullptr);
}

absl::StatusOr<Tensor> Tensor::Full(DType dtype, Shape shape, double value,
                                    Device device) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape), device));
  if (!device.has_storage() || t.numel() == 0) return t;
  // Fill on the host, then move to the device if needed.
  std::vector<char> one(ElementSize(dtype));
  WriteElementFromDouble(one.data(), dtype, 0, value);
  if (device.is_cpu()) {
    char* out = static_cast<char*>(t.impl_->storage->data());
    size_t es = one.size();
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::memcpy(out + i * es, one.data(), es);
    }
    return t;
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor host, Full(dtype, t.shape(), value));
  MODELSTATE_RETURN_IF_ERROR(t.CopyFrom(host));
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(DType dtype, Shape shape, Device device) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape), device));
  if (device.is_cpu() && t.nbytes() > 0) {
    std::memset(t.impl_->storage->data(), 0, t.nbytes());
  } else if (device.has_storage() && t.nbytes() > 0) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor host, Zeros(dtype, t.shape()));
    MODELSTATE_RETURN_IF_ERROR(t.CopyFrom(host));
  }
  return t;
}

absl::StatusOr<Tensor> Tensor::FromBytes(DType dtype, Shape shape,
                                         std::string bytes) {
  return Make(dtype, std::move(shape), Device::Cpu(),
              Storage::AdoptString(std::move(bytes)));
}

absl::StatusOr<Tensor> Tensor::FromStorage(DType dtype, Shape shape,
                                           std::shared_ptr<Storage> storage) {
  if (storage == nullptr) {
    return absl::InvalidArgumentError("FromStorage needs a storage");
  }
  Device device = storage->device();
  return Make(dtype, std::move(shape), device, std::move(storage));
}

absl::StatusOr<Tensor> Tensor::FromDoubles(DType dtype, Shape shape,
                                           absl::Span<const double> values) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor t, Empty(dtype, std::move(shape)));
  if (static_cast<int64_t>(values.size()) != t.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Shape ", ShapeToString(t.shape()), " needs ", t.numel(),
                     " values, got ", values.size()));
  }
  void* out = t.impl_->storage->data();
  for (size_t i = 0; i < values.size(); ++i) {
    WriteElementFromDouble(out, dtype, static_cast<int64_t>(i), values[i]);
  }
  return t;
}

DType Tensor::dtype() const { return impl_->dtype; }
const Shape& Tensor::shape() const { return impl_->shape; }
const Device& Tensor::device() const { return impl_->device; }
int64_t Tensor::numel() const { return impl_->numel; }
size_t Tensor::nbytes() const {
  return static_cast<size_t>(impl_->numel) * ElementSize(impl_->dtype);
}
bool Tensor::requires_grad() const { return impl_->requires_grad; }
bool Tensor::is_parameter() const { return impl_->is_parameter; }

absl::Status Tensor::SetRequiresGrad(bool value) {
  if (value && !IsFloatingPoint(impl_->dtype)) {
    return absl::InvalidArgumentError(
        "Only Tensors of floating point and complex dtype can require "
        "gradients");
  }
  impl_->requires_grad = value;
  return absl::OkStatus();
}

const void* Tensor::raw_data() const {
  return impl_->storage == nullptr ? nullptr : impl_->storage->data();
}

const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl_->storage;
}

absl::StatusOr<void*> Tensor::MutableDataForOverwrite() {
  if (impl_->storage == nullptr) return nullptr;
  // Another tensor object (a detached snapshot, a state_dict being streamed)
  // still views these bytes: give this object fresh bytes instead of
  // changing what the other one sees. A file's mapped bytes are never
  // written either (Storage::MapFileBytes).
  if (impl_->storage.use_count() > 1 || impl_->storage->read_only()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        impl_->storage,
        Storage::Allocate(impl_->storage->nbytes(), impl_->device));
  } else {
    impl_->storage->MarkWritten();
  }
  return impl_->storage->data();
}

absl::Status Tensor::CopyFrom(const Tensor& src) {
  if (!src.defined()) {
    return absl::InvalidArgumentError("Cannot copy from an undefined tensor");
  }
  if (src.numel() != numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("The size of tensor a (", numel(),
                     ") must match the size of tensor b (", src.numel(), ")"));
  }
  if (device().is_meta()) return absl::OkStatus();
  if (src.device().is_meta()) {
    return absl::InvalidArgumentError(
        "Cannot copy out of meta tensor; no data!");
  }
  if (src.impl_->storage == impl_->storage && src.dtype() == dtype()) {
    return absl::OkStatus();  // Copying a tensor onto itself.
  }
  MODELSTATE_ASSIGN_OR_RETURN(void* dst, MutableDataForOverwrite());
  if (numel() == 0) return absl::OkStatus();
  return CopyElements(device(), dst, dtype(), src.device(), src.raw_data(),
                      src.dtype(), numel());
}

bool Tensor::SharesStorageWith(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage != nullptr &&
         impl_->storage == other.impl_->storage;
}

Tensor Tensor::Detach() const {
  auto impl = std::make_shared<TensorImpl>(*impl_);
  impl->requires_grad = false;
  impl->is_parameter = false;
  return Tensor(std::move(impl));
}

absl::StatusOr<Tensor> Tensor::Clone() const {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor copy, Empty(dtype(), shape(), device()));
  if (device().has_storage() && nbytes() > 0) {
    MODELSTATE_RETURN_IF_ERROR(CopyBytes(device(), copy.impl_->storage->data(),
                                         device(), raw_data(), nbytes()));
  }
  return copy;
}

absl::StatusOr<Tensor> Tensor::To(const Device& device, DType dtype) const {
  if (device == this->device() && dtype == this->dtype()) return *this;
  MODELSTATE_ASSIGN_OR_RETURN(Tensor out, Empty(dtype, shape(), device));
  if (!device.has_storage() || numel() == 0) return out;
  if (this->device().is_meta()) {
    return absl::InvalidArgumentError(
        "Cannot copy out of meta tensor; no data!");
  }
  MODELSTATE_RETURN_IF_ERROR(CopyElements(device, out.impl_->storage->data(),
                                          dtype, this->device(), raw_data(),
                                          this->dtype(), numel()));
  return out;
}

bool Tensor::CanConvertInPlace(DType dtype) const {
  return defined() && device().is_cpu() && impl_->storage != nullptr &&
         impl_->storage.use_count() == 1 && !impl_->storage->read_only() &&
         ElementSize(dtype) <= ElementSize(this->dtype());
}

absl::Status Tensor::ConvertInPlace(DType dtype) {
  if (!CanConvertInPlace(dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot convert this ", DTypeName(this->dtype()),
                     " tensor to ", DTypeName(dtype), " in place"));
  }
  if (dtype == this->dtype()) return absl::OkStatus();
  const size_t out = ElementSize(dtype);
  char* data = static_cast<char*>(impl_->storage->data());
  impl_->storage->MarkWritten();
  // Straight over the input: every kernel walks forward and reads a block
  // before writing its results, and element i's result ends at
  // (i + 1) * out <= (i + 1) * in, so a write only lands on input that was
  // already read (tested for every narrowing pair in tensor_test).
  ConvertElements(data, this->dtype(), data, dtype, numel());
  impl_->storage->ShrinkTo(static_cast<size_t>(numel()) * out);
  impl_->dtype = dtype;
  return absl::OkStatus();
}

void Tensor::SetData(const Tensor& other) {
  impl_->dtype = other.impl_->dtype;
  impl_->shape = other.impl_->shape;
  impl_->numel = other.impl_->numel;
  impl_->device = other.impl_->device;
  impl_->storage = other.impl_->storage;
}

std::string Tensor::TypeName() const {
  absl::string_view legacy = LegacyTensorTypeName(dtype());
  if (device().is_cuda()) {
    // "torch.FloatTensor" -> "torch.cuda.FloatTensor"
    return absl::StrCat("torch.cuda.", legacy.substr(6));
  }
  return std::string(legacy);
}

std::string Tensor::DebugString() const {
  if (!defined()) return "None";
  return absl::StrCat(DTypeName(dtype()), ShapeToString(shape()), " on ",
                      device().ToString());
}

absl::StatusOr<Tensor> MakeParameter(const Tensor& data, bool requires_grad) {
  if (!data.defined()) {
    return absl::InvalidArgumentError("A parameter needs a tensor, got None");
  }
  auto impl = std::make_shared<TensorImpl>(*data.impl_);
  impl->is_parameter = true;
  impl->requires_grad = false;
  Tensor param(std::move(impl));
  MODELSTATE_RETURN_IF_ERROR(param.SetRequiresGrad(requires_grad));
  return param;
}

bool TensorsEqual(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return false;
  if (a.dtype() != b.dtype() || a.shape() != b.shape() ||
      a.device() != b.device()) {
    return false;
  }
  if (!a.device().has_storage() || a.nbytes() == 0) return true;
  if (!a.device().is_cpu()) {
    absl::StatusOr<Tensor> ha = a.To(Device::Cpu(), a.dtype());
    absl::StatusOr<Tensor> hb = b.To(Device::Cpu(), b.dtype());
    return ha.ok() && hb.ok() && TensorsEqual(*ha, *hb);
  }
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::string ContentHash(const Tensor& tensor) {
  if (!tensor.defined() || !tensor.device().has_storage()) return "";
  if (!tensor.device().is_cpu()) {
    absl::StatusOr<Tensor> host = tensor.To(Device::Cpu(), tensor.dtype());
    return host.ok() ? ContentHash(*host) : "";
  }
  return Sha256Hex(absl::string_view(
      static_cast<const char*>(tensor.raw_data()), tensor.nbytes()));
}

absl::Status CheckTensorBytes(absl::string_view key, const Tensor& tensor) {
  if (!tensor.defined() || tensor.storage() == nullptr) {
    return absl::OkStatus();
  }
  absl::Status intact = tensor.storage()->CheckIntegrity();
  if (intact.ok()) return intact;
  return absl::DataLossError(absl::StrCat("'", key, "': ", intact.message()));
}

}  // namespace modelstate
