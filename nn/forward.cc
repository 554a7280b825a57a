// Forward execution: the module-call protocol (hooks around every call) and
// one forward per built-in layer. Kernels are templates over the compute
// type (float or double); float16 / bfloat16 tensors are widened to float32
// at the layer boundary and the results rounded back, which is what
// PyTorch's CPU kernels do internally for most of these ops.
#include "nn/forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "nn/forward_kernels.h"
#include "nn/vector_math.h"

namespace modelstate {
namespace {

using internal::CheckBlasDims;
using internal::Gemm;
using internal::ParallelFor;

// ---------------------------------------------------------------------------
// Tensors and dtypes.

template <typename T>
constexpr DType DTypeOf() {
  return std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
}

// ATen's scalar type names, as its error texts print them.
std::string ScalarTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "Float";
    case DType::kFloat64:
      return "Double";
    case DType::kFloat16:
      return "Half";
    case DType::kBFloat16:
      return "BFloat16";
    case DType::kInt8:
      return "Char";
    case DType::kInt16:
      return "Short";
    case DType::kInt32:
      return "Int";
    case DType::kInt64:
      return "Long";
    case DType::kUInt8:
      return "Byte";
    case DType::kBool:
      return "Bool";
  }
  return "Unknown";
}

bool IsReduced(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

// The dtype kernels compute in for tensors of `dtype`.
DType ComputeDType(DType dtype) {
  return IsReduced(dtype) ? DType::kFloat32 : dtype;
}

absl::StatusOr<Tensor> ToDType(const Tensor& t, DType dtype) {
  if (!t.defined() || t.dtype() == dtype) return t;
  return t.To(Device::Cpu(), dtype);
}

absl::StatusOr<Tensor> ToCompute(const Tensor& t) {
  if (!t.defined() || !IsFloatingPoint(t.dtype())) return t;
  return ToDType(t, ComputeDType(t.dtype()));
}

absl::Status CheckCpu(const Tensor& t) {
  if (t.defined() && !t.device().has_storage()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Forward needs CPU tensors, got a tensor on ", t.device().ToString()));
  }
  if (t.defined() && t.device().type != DeviceType::kCpu) {
    return absl::FailedPreconditionError(
        absl::StrCat("Forward runs on the CPU only, got a tensor on ",
                     t.device().ToString()));
  }
  return absl::OkStatus();
}

// A fresh output tensor and its writable data.
template <typename T>
struct Out {
  Tensor tensor;
  T* data = nullptr;
};

template <typename T>
absl::StatusOr<Out<T>> NewOut(Shape shape) {
  Out<T> out;
  MODELSTATE_ASSIGN_OR_RETURN(out.tensor,
                              Tensor::Empty(DTypeOf<T>(), std::move(shape)));
  MODELSTATE_ASSIGN_OR_RETURN(void* p, out.tensor.MutableDataForOverwrite());
  out.data = static_cast<T*>(p);
  return out;
}

template <typename T>
const T* Data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

int64_t Prod(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

// "[2, 3]" as ATen prints sizes in most messages.
std::string Sizes(const Shape& shape) { return ShapeToString(shape); }

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t ndim) {
  int64_t n = std::max<int64_t>(ndim, 1);
  if (dim < -n || dim >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("Dimension out of range (expected to be in range of [", -n,
                     ", ", n - 1, "], but got ", dim, ")"));
  }
  return dim < 0 ? dim + n : dim;
}

// ---------------------------------------------------------------------------
// Module attributes and entries.

absl::StatusOr<const AttrValue*> Attr(const Module& m, absl::string_view name) {
  const AttrValue* v = m.attributes().Find(name);
  if (v == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", m.type_name(), "' object has no attribute '", name, "'"));
  }
  return v;
}

absl::Status WrongAttr(const Module& m, absl::string_view name,
                       absl::string_view want) {
  return absl::FailedPreconditionError(absl::StrCat(
      m.type_name(), ".", name, " must be ", want, " for forward"));
}

bool AttrIsNone(const Module& m, absl::string_view name) {
  const AttrValue* v = m.attributes().Find(name);
  return v == nullptr || std::holds_alternative<std::monostate>(*v);
}

absl::StatusOr<int64_t> AttrInt(const Module& m, absl::string_view name) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, name));
  if (const int64_t* i = std::get_if<int64_t>(v)) return *i;
  return WrongAttr(m, name, "an int");
}

absl::StatusOr<double> AttrDouble(const Module& m, absl::string_view name) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, name));
  if (const double* d = std::get_if<double>(v)) return *d;
  if (const int64_t* i = std::get_if<int64_t>(v)) {
    return static_cast<double>(*i);
  }
  return WrongAttr(m, name, "a float");
}

absl::StatusOr<bool> AttrBool(const Module& m, absl::string_view name) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, name));
  if (const bool* b = std::get_if<bool>(v)) return *b;
  return WrongAttr(m, name, "a bool");
}

absl::StatusOr<std::string> AttrStr(const Module& m, absl::string_view name) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, name));
  if (const std::string* s = std::get_if<std::string>(v)) return *s;
  return WrongAttr(m, name, "a str");
}

// An int or a tuple of ints, as `n` values (an int or a 1-tuple repeats).
absl::StatusOr<std::vector<int64_t>> AttrInts(const Module& m,
                                              absl::string_view name,
                                              size_t n) {
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* v, Attr(m, name));
  if (const int64_t* i = std::get_if<int64_t>(v)) {
    return std::vector<int64_t>(n, *i);
  }
  if (const auto* t = std::get_if<std::vector<int64_t>>(v)) {
    if (t->size() == n) return *t;
    if (t->size() == 1) return std::vector<int64_t>(n, (*t)[0]);
  }
  return WrongAttr(m, name, absl::StrCat("an int or ", n, " ints"));
}

// The parameter or buffer `name` (undefined for None or absent).
Tensor Entry(const Module& m, absl::string_view name) {
  if (const Tensor* t = m.parameters().Find(name)) return *t;
  if (const Tensor* t = m.buffers().Find(name)) return *t;
  return Tensor();
}

// Entry `name` ready for a kernel running on inputs of `dtype`: on the CPU,
// of the same dtype (PyTorch's `message` otherwise), widened like the input.
absl::StatusOr<Tensor> Param(const Module& m, absl::string_view name,
                             DType dtype) {
  Tensor t = Entry(m, name);
  if (!t.defined()) return t;
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(t));
  if (t.dtype() != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected scalar type ", ScalarTypeName(dtype), " but found ",
        ScalarTypeName(t.dtype()), " (", name, " of ", m.type_name(), ")"));
  }
  return ToCompute(t);
}

absl::Status CheckFloatingInput(const Tensor& x, absl::string_view op) {
  if (!x.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, "(): argument 'input' must be Tensor, not NoneType"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(x));
  if (!IsFloatingPoint(x.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", op, "\" not implemented for '", ScalarTypeName(x.dtype()), "'"));
  }
  return absl::OkStatus();
}

absl::Status CheckNumInputs(const Module& m, const std::vector<Tensor>& in,
                            size_t min, size_t max) {
  if (in.size() < min || in.size() > max) {
    std::string want =
        min == max ? absl::StrCat(min) : absl::StrCat(min, " to ", max);
    return absl::InvalidArgumentError(
        absl::StrCat(m.type_name(), ".forward() takes ", want,
                     " tensor arguments but ", in.size(), " were given"));
  }
  for (size_t i = 0; i < min; ++i) {
    if (!in[i].defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(m.type_name(), ".forward(): input ", i,
                       " must be a Tensor, not None"));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Elementwise kernels.

enum class Act { kReLU, kGELU, kGELUTanh, kSiLU, kTanh, kSigmoid };

template <typename T>
T ApplyAct(Act act, T x) {
  switch (act) {
    case Act::kReLU:
      // NaN stays NaN, as torch.relu keeps it.
      return x < T(0) ? T(0) : x;
    case Act::kGELU:
      return T(0.5) * x * (T(1) + std::erf(x * T(M_SQRT1_2)));
    case Act::kGELUTanh: {
      const T k = T(M_2_SQRTPI * M_SQRT1_2);  // sqrt(2 / pi)
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case Act::kSiLU:
      return x / (T(1) + std::exp(-x));
    case Act::kTanh:
      return std::tanh(x);
    case Act::kSigmoid:
      return T(1) / (T(1) + std::exp(-x));
  }
  return x;
}

// The vectorised float32 kernel for `act`, or nullptr (ReLU and tanh stay
// on the scalar path: ReLU vectorises as written, tanh is rarely hot).
using FloatActKernel = void (*)(float*, int64_t);
FloatActKernel VectorKernel(Act act) {
  switch (act) {
    case Act::kGELU:
      return internal::GeluErfInPlace;
    case Act::kGELUTanh:
      return internal::GeluTanhInPlace;
    case Act::kSiLU:
      return internal::SiluInPlace;
    case Act::kSigmoid:
      return internal::SigmoidInPlace;
    case Act::kReLU:
    case Act::kTanh:
      break;
  }
  return nullptr;
}

template <typename T>
void ActInPlace(Act act, T* data, int64_t n, int threads) {
  if constexpr (std::is_same_v<T, float>) {
    if (FloatActKernel kernel = VectorKernel(act)) {
      // About 1 ns an element, against 20 for the scalar libm calls.
      ParallelFor(n, threads, 1, [&](int64_t begin, int64_t end) {
        kernel(data + begin, end - begin);
      });
      return;
    }
  }
  ParallelFor(n, threads, 20, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) data[i] = ApplyAct(act, data[i]);
  });
}

template <typename T>
absl::StatusOr<Tensor> ActKernel(Act act, const Tensor& x, int threads) {
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  if (x.numel() > 0) std::memcpy(y.data, x.raw_data(), x.nbytes());
  ActInPlace(act, y.data, x.numel(), threads);
  return y.tensor;
}

// a + b for tensors of one shape (the residual connections).
template <typename T>
absl::StatusOr<Tensor> AddKernel(const Tensor& a, const Tensor& b) {
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(a.shape()));
  const T* pa = Data<T>(a);
  const T* pb = Data<T>(b);
  for (int64_t i = 0; i < a.numel(); ++i) y.data[i] = pa[i] + pb[i];
  return y.tensor;
}

// Softmax over row[0, n) in place (vectorised for float).
template <typename T>
void SoftmaxRow(T* row, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    internal::SoftmaxRowInPlace(row, n);
  } else {
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t i = 0; i < n; ++i) max = std::max(max, row[i]);
    // An all -inf row gives NaN, as in PyTorch (exp(-inf - -inf)).
    T sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      row[i] = std::exp(row[i] - max);
      sum += row[i];
    }
    T inv = T(1) / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

// Softmax over `dim` of a contiguous [outer, size, inner] view, in place.
template <typename T>
void SoftmaxInPlace(T* data, int64_t outer, int64_t size, int64_t inner,
                    int threads) {
  if (inner == 1) {
    const int64_t cost = std::is_same_v<T, float> ? size * 2 : size * 10;
    ParallelFor(outer, threads, cost, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) SoftmaxRow(data + row * size, size);
    });
    return;
  }
  ParallelFor(outer * inner, threads, size * 10, [&](int64_t b, int64_t e) {
    for (int64_t idx = b; idx < e; ++idx) {
      T* base = data + (idx / inner) * size * inner + idx % inner;
      T max = -std::numeric_limits<T>::infinity();
      for (int64_t i = 0; i < size; ++i) max = std::max(max, base[i * inner]);
      // An all -inf row gives NaN, as in PyTorch (exp(-inf - -inf)).
      T sum = 0;
      for (int64_t i = 0; i < size; ++i) {
        T v = std::exp(base[i * inner] - max);
        base[i * inner] = v;
        sum += v;
      }
      T inv = T(1) / sum;
      for (int64_t i = 0; i < size; ++i) base[i * inner] *= inv;
    }
  });
}

// ---------------------------------------------------------------------------
// The call protocol.

struct CallFlags {
  // MultiheadAttention: compute and return the averaged attention weights.
  bool need_weights = true;
};

class Runner {
 public:
  explicit Runner(const ForwardOptions& options)
      : options_(options),
        threads_(options.num_threads > 0 ? options.num_threads
                                         : internal::BlasThreads()) {
    if (options.generator == nullptr) local_gen_.emplace(options.seed);
  }

  // module(*inputs): hooks, then forward.
  absl::StatusOr<std::vector<Tensor>> Call(Module& m, std::vector<Tensor> in,
                                           CallFlags flags = {});

 private:
  Generator& gen() {
    return options_.generator != nullptr ? *options_.generator : *local_gen_;
  }

  absl::StatusOr<std::vector<Tensor>> Run(Module& m,
                                          const std::vector<Tensor>& in,
                                          CallFlags flags);
  // Leaf layers: widen reduced-precision inputs, run, round back.
  absl::StatusOr<std::vector<Tensor>> RunLeaf(Module& m,
                                              const std::vector<Tensor>& in,
                                              CallFlags flags);
  absl::StatusOr<std::vector<Tensor>> RunLeafCompute(
      Module& m, const std::vector<Tensor>& in, DType dtype, CallFlags flags);

  template <typename T>
  absl::StatusOr<Tensor> Linear(Module& m, const Tensor& x, DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> Bilinear(Module& m, const Tensor& x1, const Tensor& x2,
                                  DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> Conv(Module& m, const Tensor& x, DType dtype,
                              size_t dims);
  template <typename T>
  absl::StatusOr<Tensor> ConvTranspose2d(Module& m, const Tensor& x,
                                         DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> BatchNorm(Module& m, const Tensor& x, DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> LayerNorm(Module& m, const Tensor& x, DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> GroupNorm(Module& m, const Tensor& x, DType dtype);
  template <typename T>
  absl::StatusOr<Tensor> Dropout(const Tensor& x, double p, bool training);
  template <typename T>
  absl::StatusOr<Tensor> Softmax(Module& m, const Tensor& x);
  template <typename T>
  absl::StatusOr<std::vector<Tensor>> MaxPool2d(Module& m, const Tensor& x);
  template <typename T>
  absl::StatusOr<Tensor> AdaptiveAvgPool2d(Module& m, const Tensor& x);
  template <typename T>
  absl::StatusOr<std::vector<Tensor>> MultiheadAttention(
      Module& m, const std::vector<Tensor>& in, DType dtype, CallFlags flags);

  absl::StatusOr<Tensor> Embedding(Module& m, const Tensor& indices);
  absl::StatusOr<std::vector<Tensor>> Sequential(Module& m,
                                                 const std::vector<Tensor>& in);
  absl::StatusOr<std::vector<Tensor>> TransformerEncoderLayer(
      Module& m, const std::vector<Tensor>& in);
  absl::StatusOr<Tensor> CallChild(Module& m, absl::string_view name,
                                   std::vector<Tensor> in);

  const ForwardOptions& options_;
  const int threads_;
  std::optional<Generator> local_gen_;
};

absl::StatusOr<std::vector<Tensor>> Runner::Call(Module& m,
                                                 std::vector<Tensor> in,
                                                 CallFlags flags) {
  const ForwardHookList& global = ForwardHookList::Global();
  const ForwardHookList& own = m.forward_hooks();
  if (global.HasPreHooks() || own.HasPreHooks()) {
    std::vector<ForwardPreHook> hooks = global.PreHooks();
    for (ForwardPreHook& h : own.PreHooks()) hooks.push_back(std::move(h));
    for (const ForwardPreHook& hook : hooks) {
      ForwardHookResult r = hook(m, in);
      if (!r.ok()) return r.status();
      if (r->has_value()) in = std::move(**r);
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out, Run(m, in, flags));
  if (global.HasHooks() || own.HasHooks()) {
    std::vector<ForwardHook> hooks = global.Hooks();
    for (ForwardHook& h : own.Hooks()) hooks.push_back(std::move(h));
    for (const ForwardHook& hook : hooks) {
      ForwardHookResult r = hook(m, in, out);
      if (!r.ok()) return r.status();
      if (r->has_value()) out = std::move(**r);
    }
  }
  return out;
}

absl::StatusOr<Tensor> Runner::CallChild(Module& m, absl::string_view name,
                                         std::vector<Tensor> in) {
  const std::shared_ptr<Module>* child = m.children().Find(name);
  if (child == nullptr || *child == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", m.type_name(), "' object has no submodule '", name, "'"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                              Call(**child, std::move(in)));
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(m.type_name(), ".", name, " returned no outputs"));
  }
  return out[0];
}

absl::StatusOr<std::vector<Tensor>> Runner::Run(Module& m,
                                                const std::vector<Tensor>& in,
                                                CallFlags flags) {
  const std::string& type = m.type_name();
  for (const Tensor& t : in) MODELSTATE_RETURN_IF_ERROR(CheckCpu(t));
  if (type == "Sequential") return Sequential(m, in);
  if (type == "TransformerEncoderLayer") return TransformerEncoderLayer(m, in);
  if (type == "Identity") return in;
  if (type == "Flatten") {
    MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 1));
    const Tensor& x = in[0];
    int64_t nd = x.dim();
    MODELSTATE_ASSIGN_OR_RETURN(int64_t s, AttrInt(m, "start_dim"));
    MODELSTATE_ASSIGN_OR_RETURN(int64_t e, AttrInt(m, "end_dim"));
    MODELSTATE_ASSIGN_OR_RETURN(s, WrapDim(s, nd));
    MODELSTATE_ASSIGN_OR_RETURN(e, WrapDim(e, nd));
    if (s > e) {
      return absl::InvalidArgumentError(
          "flatten() has invalid args: start_dim cannot come after end_dim");
    }
    Shape shape;
    if (nd == 0) {
      shape = {1};
    } else {
      for (int64_t i = 0; i < s; ++i) shape.push_back(x.shape()[i]);
      shape.push_back(Prod(x.shape(), s, e + 1));
      for (int64_t i = e + 1; i < nd; ++i) shape.push_back(x.shape()[i]);
    }
    // A view sharing the input's bytes, as torch.flatten returns.
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor y, Tensor::FromStorage(x.dtype(), shape, x.storage()));
    return std::vector<Tensor>{y};
  }
  if (type == "Embedding") {
    MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 1));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Embedding(m, in[0]));
    return std::vector<Tensor>{y};
  }
  if (type == "Dropout" && !(m.is_training())) return in;
  static const absl::flat_hash_set<std::string>* const kLeaves =
      new absl::flat_hash_set<std::string>{"Linear",
                                           "NonDynamicallyQuantizableLinear",
                                           "Bilinear",
                                           "Conv1d",
                                           "Conv2d",
                                           "ConvTranspose2d",
                                           "BatchNorm1d",
                                           "BatchNorm2d",
                                           "LayerNorm",
                                           "GroupNorm",
                                           "Dropout",
                                           "ReLU",
                                           "GELU",
                                           "SiLU",
                                           "Tanh",
                                           "Sigmoid",
                                           "Softmax",
                                           "MaxPool2d",
                                           "AdaptiveAvgPool2d",
                                           "MultiheadAttention"};
  if (kLeaves->contains(type)) return RunLeaf(m, in, flags);
  return absl::UnimplementedError(absl::StrCat(
      "Module [", type, "] is missing the required \"forward\" function"));
}

absl::StatusOr<std::vector<Tensor>> Runner::RunLeaf(
    Module& m, const std::vector<Tensor>& in, CallFlags flags) {
  if (in.empty() || !in[0].defined()) {
    MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, in.size() + 1));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  const DType dtype = in[0].dtype();
  std::vector<Tensor> widened;
  widened.reserve(in.size());
  for (const Tensor& t : in) {
    // Masks and indices keep their dtypes; floating inputs must match the
    // first one (checked by the layers against their parameters).
    if (t.defined() && IsFloatingPoint(t.dtype()) && t.dtype() != dtype &&
        m.type_name() != "MultiheadAttention") {
      return absl::InvalidArgumentError(
          absl::StrCat("expected scalar type ", ScalarTypeName(dtype),
                       " but found ", ScalarTypeName(t.dtype())));
    }
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w, ToCompute(t));
    widened.push_back(std::move(w));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out,
                              RunLeafCompute(m, widened, dtype, flags));
  if (IsReduced(dtype)) {
    for (Tensor& t : out) {
      if (t.defined() && IsFloatingPoint(t.dtype())) {
        MODELSTATE_ASSIGN_OR_RETURN(t, ToDType(t, dtype));
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> Runner::RunLeafCompute(
    Module& m, const std::vector<Tensor>& in, DType dtype, CallFlags flags) {
  const std::string& type = m.type_name();
  const bool f32 = ComputeDType(dtype) == DType::kFloat32;
  auto one =
      [](absl::StatusOr<Tensor> t) -> absl::StatusOr<std::vector<Tensor>> {
    if (!t.ok()) return t.status();
    return std::vector<Tensor>{*std::move(t)};
  };
  if (type == "MultiheadAttention") {
    MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 3, 5));
    return f32 ? MultiheadAttention<float>(m, in, dtype, flags)
               : MultiheadAttention<double>(m, in, dtype, flags);
  }
  if (type == "Bilinear") {
    MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 2, 2));
    return one(f32 ? Bilinear<float>(m, in[0], in[1], dtype)
                   : Bilinear<double>(m, in[0], in[1], dtype));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 1));
  const Tensor& x = in[0];
  if (type == "Linear" || type == "NonDynamicallyQuantizableLinear") {
    return one(f32 ? Linear<float>(m, x, dtype) : Linear<double>(m, x, dtype));
  }
  if (type == "Conv1d" || type == "Conv2d") {
    size_t dims = type == "Conv1d" ? 1 : 2;
    return one(f32 ? Conv<float>(m, x, dtype, dims)
                   : Conv<double>(m, x, dtype, dims));
  }
  if (type == "ConvTranspose2d") {
    return one(f32 ? ConvTranspose2d<float>(m, x, dtype)
                   : ConvTranspose2d<double>(m, x, dtype));
  }
  if (type == "BatchNorm1d" || type == "BatchNorm2d") {
    return one(f32 ? BatchNorm<float>(m, x, dtype)
                   : BatchNorm<double>(m, x, dtype));
  }
  if (type == "LayerNorm") {
    return one(f32 ? LayerNorm<float>(m, x, dtype)
                   : LayerNorm<double>(m, x, dtype));
  }
  if (type == "GroupNorm") {
    return one(f32 ? GroupNorm<float>(m, x, dtype)
                   : GroupNorm<double>(m, x, dtype));
  }
  if (type == "Dropout") {
    MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(m, "p"));
    return one(f32 ? Dropout<float>(x, p, m.is_training())
                   : Dropout<double>(x, p, m.is_training()));
  }
  if (type == "Softmax") {
    return one(f32 ? Softmax<float>(m, x) : Softmax<double>(m, x));
  }
  if (type == "MaxPool2d") {
    return f32 ? MaxPool2d<float>(m, x) : MaxPool2d<double>(m, x);
  }
  if (type == "AdaptiveAvgPool2d") {
    return one(f32 ? AdaptiveAvgPool2d<float>(m, x)
                   : AdaptiveAvgPool2d<double>(m, x));
  }
  Act act;
  if (type == "ReLU") {
    act = Act::kReLU;
  } else if (type == "GELU") {
    MODELSTATE_ASSIGN_OR_RETURN(std::string approximate,
                                AttrStr(m, "approximate"));
    act = approximate == "tanh" ? Act::kGELUTanh : Act::kGELU;
  } else if (type == "SiLU") {
    act = Act::kSiLU;
  } else if (type == "Tanh") {
    act = Act::kTanh;
  } else if (type == "Sigmoid") {
    act = Act::kSigmoid;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "Module [", type, "] is missing the required \"forward\" function"));
  }
  return one(f32 ? ActKernel<float>(act, x, threads_)
                 : ActKernel<double>(act, x, threads_));
}

// ---------------------------------------------------------------------------
// Linear and Bilinear.

// y[rows, out] = x[rows, in] * w[out, in]^T + b.
template <typename T>
void LinearRows(const T* x, int64_t rows, int64_t in, const T* w, int64_t out,
                const T* b, T* y) {
  if (b != nullptr) {
    for (int64_t r = 0; r < rows; ++r) std::copy(b, b + out, y + r * out);
  }
  if (in == 0) {
    if (b == nullptr) std::fill(y, y + rows * out, T(0));
    return;
  }
  Gemm(false, true, rows, out, in, T(1), x, in, w, in, b ? T(1) : T(0), y, out);
}

template <typename T>
absl::StatusOr<Tensor> Runner::Linear(Module& m, const Tensor& x, DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  if (!w.defined() || w.dim() != 2) {
    return absl::FailedPreconditionError(
        absl::StrCat(m.type_name(), ".weight must be a 2-D tensor"));
  }
  const int64_t out = w.shape()[0], in = w.shape()[1];
  if (x.dim() == 0) {
    return absl::InvalidArgumentError(
        "both arguments to linear need to have at least 1 dimension, but got "
        "0D and 2D");
  }
  const int64_t k = x.shape().back();
  const int64_t rows = k == 0 ? Prod(x.shape(), 0, x.dim() - 1) : x.numel() / k;
  if (k != in) {
    return absl::InvalidArgumentError(
        absl::StrCat("mat1 and mat2 shapes cannot be multiplied (", rows, "x",
                     k, " and ", in, "x", out, ")"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({rows, in, out}));
  Shape shape = x.shape();
  shape.back() = out;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  LinearRows(Data<T>(x), rows, in, Data<T>(w), out, Data<T>(b), y.data);
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> Runner::Bilinear(Module& m, const Tensor& x1,
                                        const Tensor& x2, DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  const int64_t out = w.shape()[0], in1 = w.shape()[1], in2 = w.shape()[2];
  if (x1.dim() == 0 || x2.dim() == 0 ||
      Shape(x1.shape().begin(), x1.shape().end() - 1) !=
          Shape(x2.shape().begin(), x2.shape().end() - 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input batch dimensions do not match: got ",
                     Sizes(x1.shape()), " and ", Sizes(x2.shape())));
  }
  if (x1.shape().back() != in1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input1 size does not match weight size: got ",
                     x1.shape().back(), " but expected ", in1));
  }
  if (x2.shape().back() != in2) {
    return absl::InvalidArgumentError(
        absl::StrCat("bilinear(): input2 size does not match weight size: got ",
                     x2.shape().back(), " but expected ", in2));
  }
  const int64_t rows = Prod(x1.shape(), 0, x1.dim() - 1);
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({rows, in1, in2, out}));
  Shape shape = x1.shape();
  shape.back() = out;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  // y[r, o] = sum_ij x1[r, i] W[o, i, j] x2[r, j]: per output feature, one
  // gemm (x1 * W[o]) and a row-wise dot with x2.
  std::vector<T> tmp(static_cast<size_t>(rows * in2));
  const T* p1 = Data<T>(x1);
  const T* p2 = Data<T>(x2);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  for (int64_t o = 0; o < out; ++o) {
    if (in1 > 0) {
      Gemm(false, false, rows, in2, in1, T(1), p1, in1, pw + o * in1 * in2, in2,
           T(0), tmp.data(), in2);
    } else {
      std::fill(tmp.begin(), tmp.end(), T(0));
    }
    for (int64_t r = 0; r < rows; ++r) {
      T acc = 0;
      for (int64_t j = 0; j < in2; ++j)
        acc += tmp[r * in2 + j] * p2[r * in2 + j];
      y.data[r * out + o] = acc + (pb ? pb[o] : T(0));
    }
  }
  return y.tensor;
}

// ---------------------------------------------------------------------------
// Convolutions.

// Input padded on each side of each spatial dim ([top, bottom, left, right])
// with `mode`: "zeros", "reflect", "replicate" or "circular".
template <typename T>
absl::StatusOr<Tensor> Pad2d(const Tensor& x, const int64_t pad[4],
                             const std::string& mode) {
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2],
                w = x.shape()[3];
  if (pad[0] == 0 && pad[1] == 0 && pad[2] == 0 && pad[3] == 0) return x;
  const int64_t ho = h + pad[0] + pad[1], wo = w + pad[2] + pad[3];
  if (mode == "reflect") {
    if (pad[0] >= h || pad[1] >= h || pad[2] >= w || pad[3] >= w) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Padding size should be less than the corresponding input "
          "dimension, but got: padding (",
          pad[2], ", ", pad[3], ") at dimension 3 of input ",
          Sizes(x.shape())));
    }
  } else if (mode == "circular") {
    if (pad[0] > h || pad[1] > h || pad[2] > w || pad[3] > w) {
      return absl::InvalidArgumentError(
          "Padding value causes wrapping around more than once.");
    }
  } else if (mode == "replicate" && (h == 0 || w == 0)) {
    return absl::InvalidArgumentError(
        "padding mode 'replicate' needs a non-empty input");
  }
  auto index = [&mode](int64_t i, int64_t size) -> int64_t {
    if (i >= 0 && i < size) return i;
    if (mode == "reflect") return i < 0 ? -i : 2 * (size - 1) - i;
    if (mode == "replicate") return i < 0 ? 0 : size - 1;
    if (mode == "circular") return ((i % size) + size) % size;
    return -1;  // zeros
  };
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, c, ho, wo}));
  const T* px = Data<T>(x);
  for (int64_t p = 0; p < n * c; ++p) {
    const T* src = px + p * h * w;
    T* dst = y.data + p * ho * wo;
    for (int64_t i = 0; i < ho; ++i) {
      int64_t si = index(i - pad[0], h);
      for (int64_t j = 0; j < wo; ++j) {
        int64_t sj = index(j - pad[2], w);
        dst[i * wo + j] = (si < 0 || sj < 0) ? T(0) : src[si * w + sj];
      }
    }
  }
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> Runner::Conv(Module& m, const Tensor& x_in, DType dtype,
                                    size_t dims) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> stride,
                              AttrInts(m, "stride", dims));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dilation,
                              AttrInts(m, "dilation", dims));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "groups"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string mode, AttrStr(m, "padding_mode"));
  const std::string op = dims == 1 ? "conv1d" : "conv2d";
  const int64_t batched_dim = static_cast<int64_t>(dims) + 2;
  if (x_in.dim() != batched_dim && x_in.dim() != batched_dim - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Expected ", batched_dim - 1, "D (unbatched) or ",
                     batched_dim, "D (batched) input to ", op,
                     ", but got input of size: ", Sizes(x_in.shape())));
  }
  const bool unbatched = x_in.dim() == batched_dim - 1;
  // Work on [N, C, H, W]; conv1d is conv2d with H = 1.
  Shape s4 = x_in.shape();
  if (unbatched) s4.insert(s4.begin(), 1);
  if (dims == 1) s4.insert(s4.begin() + 2, 1);
  const int64_t n = s4[0], c = s4[1];
  Shape ws = w.shape();
  if (dims == 1) ws.insert(ws.begin() + 2, 1);
  const int64_t o = ws[0], cg = ws[1], kh = ws[2], kw = ws[3];
  if (c != cg * groups) {
    Shape shown = x_in.shape();
    if (unbatched) shown.insert(shown.begin(), 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "Given groups=", groups, ", weight of size ", Sizes(w.shape()),
        ", expected input", Sizes(shown), " to have ", cg * groups,
        " channels, but got ", c, " channels instead"));
  }
  std::vector<int64_t> st = stride, dl = dilation;
  if (dims == 1) {
    st.insert(st.begin(), 1);
    dl.insert(dl.begin(), 1);
  }
  // Padding [top, bottom, left, right]; "same" puts the odd one at the end.
  int64_t pad[4] = {0, 0, 0, 0};
  const AttrValue* pv = m.attributes().Find("padding");
  const int64_t ks[2] = {kh, kw};
  if (pv != nullptr && std::holds_alternative<std::string>(*pv)) {
    if (std::get<std::string>(*pv) == "same") {
      for (int d = 0; d < 2; ++d) {
        int64_t total = dl[d] * (ks[d] - 1);
        pad[2 * d] = total / 2;
        pad[2 * d + 1] = total - total / 2;
      }
    }
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> p,
                                AttrInts(m, "padding", dims));
    if (dims == 1) p.insert(p.begin(), 0);
    pad[0] = pad[1] = p[0];
    pad[2] = pad[3] = p[1];
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      Tensor x4, Tensor::FromStorage(x_in.dtype(), s4, x_in.storage()));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor xp, Pad2d<T>(x4, pad, mode));
  const int64_t h = xp.shape()[2], wd = xp.shape()[3];
  const int64_t ho = (h - dl[0] * (kh - 1) - 1) / st[0] + 1;
  const int64_t wo = (wd - dl[1] * (kw - 1) - 1) / st[1] + 1;
  if (h < dl[0] * (kh - 1) + 1 || wd < dl[1] * (kw - 1) + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Calculated padded input size per channel: (",
        dims == 1 ? absl::StrCat(wd) : absl::StrCat(h, " x ", wd),
        "). Kernel size: (",
        dims == 1
            ? absl::StrCat(dl[1] * (kw - 1) + 1)
            : absl::StrCat(dl[0] * (kh - 1) + 1, " x ", dl[1] * (kw - 1) + 1),
        "). Kernel size can't be greater than actual input size"));
  }
  const int64_t og = o / groups, kk = cg * kh * kw, pix = ho * wo;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({og, kk, pix}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, o, ho, wo}));
  const T* px = Data<T>(xp);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  const bool direct =
      kh == 1 && kw == 1 && st[0] == 1 && st[1] == 1;  // col == input
  std::vector<T> col(direct ? 0 : static_cast<size_t>(kk * pix));
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t g = 0; g < groups; ++g) {
      const T* xg = px + (ni * c + g * cg) * h * wd;
      const T* cols = xg;
      if (!direct) {
        for (int64_t ci = 0; ci < cg; ++ci) {
          for (int64_t i = 0; i < kh; ++i) {
            for (int64_t j = 0; j < kw; ++j) {
              T* row = col.data() + ((ci * kh + i) * kw + j) * pix;
              const T* src = xg + ci * h * wd + i * dl[0] * wd + j * dl[1];
              for (int64_t oi = 0; oi < ho; ++oi) {
                const T* s = src + oi * st[0] * wd;
                T* d = row + oi * wo;
                for (int64_t oj = 0; oj < wo; ++oj) d[oj] = s[oj * st[1]];
              }
            }
          }
        }
        cols = col.data();
      }
      T* yg = y.data + (ni * o + g * og) * pix;
      if (pb != nullptr) {
        for (int64_t oc = 0; oc < og; ++oc) {
          std::fill(yg + oc * pix, yg + (oc + 1) * pix, pb[g * og + oc]);
        }
      }
      if (kk > 0) {
        Gemm(false, false, og, pix, kk, T(1), pw + g * og * kk, kk, cols, pix,
             pb ? T(1) : T(0), yg, pix);
      } else if (pb == nullptr) {
        std::fill(yg, yg + og * pix, T(0));
      }
    }
  }
  Shape out_shape = {n, o, ho, wo};
  if (dims == 1) out_shape.erase(out_shape.begin() + 2);
  if (unbatched) out_shape.erase(out_shape.begin());
  return Tensor::FromStorage(y.tensor.dtype(), out_shape, y.tensor.storage());
}

template <typename T>
absl::StatusOr<Tensor> Runner::ConvTranspose2d(Module& m, const Tensor& x_in,
                                               DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> st,
                              AttrInts(m, "stride", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dl,
                              AttrInts(m, "dilation", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> pd,
                              AttrInts(m, "padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> op,
                              AttrInts(m, "output_padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "groups"));
  if (x_in.dim() != 4 && x_in.dim() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected 3D (unbatched) or 4D (batched) input to conv_transpose2d, "
        "but got input of size: ",
        Sizes(x_in.shape())));
  }
  const bool unbatched = x_in.dim() == 3;
  Shape s4 = x_in.shape();
  if (unbatched) s4.insert(s4.begin(), 1);
  const int64_t n = s4[0], c = s4[1], h = s4[2], wd = s4[3];
  const int64_t cg = w.shape()[0] / groups, og = w.shape()[1],
                kh = w.shape()[2], kw = w.shape()[3], o = og * groups;
  if (c != w.shape()[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat("Given transposed=1, weight of size ", Sizes(w.shape()),
                     ", expected input", Sizes(s4), " to have ", w.shape()[0],
                     " channels, but got ", c, " channels instead"));
  }
  for (int d = 0; d < 2; ++d) {
    if (op[d] >= st[d] && op[d] >= dl[d]) {
      return absl::InvalidArgumentError(
          "output padding must be smaller than either stride or dilation");
    }
  }
  const int64_t ho = (h - 1) * st[0] - 2 * pd[0] + dl[0] * (kh - 1) + op[0] + 1;
  const int64_t wo =
      (wd - 1) * st[1] - 2 * pd[1] + dl[1] * (kw - 1) + op[1] + 1;
  if (ho <= 0 || wo <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Given input size per channel: (", h, " x ", wd,
                     "). Calculated output size per channel: (", ho, " x ", wo,
                     "). Output size is too small"));
  }
  const int64_t kk = og * kh * kw, pix = h * wd;
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({kk, pix, cg}));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>({n, o, ho, wo}));
  std::fill(y.data, y.data + n * o * ho * wo, T(0));
  std::vector<T> col(static_cast<size_t>(kk * pix));
  const T* px = Data<T>(x_in);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t g = 0; g < groups; ++g) {
      // col[og*kh*kw, h*w] = W_g^T * x_g.
      if (cg > 0) {
        Gemm(true, false, kk, pix, cg, T(1), pw + g * cg * kk, kk,
             px + (ni * c + g * cg) * pix, pix, T(0), col.data(), pix);
      } else {
        std::fill(col.begin(), col.end(), T(0));
      }
      T* yg = y.data + (ni * o + g * og) * ho * wo;
      for (int64_t oc = 0; oc < og; ++oc) {
        for (int64_t i = 0; i < kh; ++i) {
          for (int64_t j = 0; j < kw; ++j) {
            const T* row = col.data() + ((oc * kh + i) * kw + j) * pix;
            T* dst = yg + oc * ho * wo;
            for (int64_t hi = 0; hi < h; ++hi) {
              int64_t yi = hi * st[0] - pd[0] + i * dl[0];
              if (yi < 0 || yi >= ho) continue;
              for (int64_t wi = 0; wi < wd; ++wi) {
                int64_t yj = wi * st[1] - pd[1] + j * dl[1];
                if (yj < 0 || yj >= wo) continue;
                dst[yi * wo + yj] += row[hi * wd + wi];
              }
            }
          }
        }
      }
    }
  }
  if (pb != nullptr) {
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t oc = 0; oc < o; ++oc) {
        T* dst = y.data + (ni * o + oc) * ho * wo;
        for (int64_t i = 0; i < ho * wo; ++i) dst[i] += pb[oc];
      }
    }
  }
  Shape out_shape = {n, o, ho, wo};
  if (unbatched) out_shape.erase(out_shape.begin());
  return Tensor::FromStorage(y.tensor.dtype(), out_shape, y.tensor.storage());
}

// ---------------------------------------------------------------------------
// Normalisation.

// y = (x - mean[c]) * invstd[c] * w[c] + b[c] over [n, c, inner].
template <typename T>
void Normalize(const T* x, int64_t n, int64_t c, int64_t inner,
               const std::vector<double>& mean,
               const std::vector<double>& invstd, const T* w, const T* b,
               T* y) {
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t ci = 0; ci < c; ++ci) {
      const double scale = invstd[ci] * (w ? static_cast<double>(w[ci]) : 1.0);
      const double shift =
          (b ? static_cast<double>(b[ci]) : 0.0) - mean[ci] * scale;
      const T* src = x + (ni * c + ci) * inner;
      T* dst = y + (ni * c + ci) * inner;
      const T s = static_cast<T>(scale), t = static_cast<T>(shift);
      for (int64_t i = 0; i < inner; ++i) dst[i] = src[i] * s + t;
    }
  }
}

template <typename T>
absl::StatusOr<Tensor> Runner::BatchNorm(Module& m, const Tensor& x,
                                         DType dtype) {
  const bool is_1d = m.type_name() == "BatchNorm1d";
  if (is_1d ? (x.dim() != 2 && x.dim() != 3) : x.dim() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected ", is_1d ? "2D or 3D" : "4D", " input (got ",
                     x.dim(), "D input)"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  Tensor running_mean = Entry(m, "running_mean");
  Tensor running_var = Entry(m, "running_var");
  Tensor count = Entry(m, "num_batches_tracked");
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  MODELSTATE_ASSIGN_OR_RETURN(bool track, AttrBool(m, "track_running_stats"));
  const int64_t n = x.shape()[0], c = x.shape()[1];
  const int64_t inner = Prod(x.shape(), 2, x.shape().size());
  auto check_size = [&](const Tensor& t, const char* name) -> absl::Status {
    if (t.defined() && t.numel() != c) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " should contain ", c, " elements not ", t.numel()));
    }
    return absl::OkStatus();
  };
  MODELSTATE_RETURN_IF_ERROR(check_size(running_mean, "running_mean"));
  MODELSTATE_RETURN_IF_ERROR(check_size(running_var, "running_var"));
  MODELSTATE_RETURN_IF_ERROR(check_size(w, "weight"));
  MODELSTATE_RETURN_IF_ERROR(check_size(b, "bias"));

  // PyTorch's _BatchNorm.forward: batch statistics in training, or when
  // there are no running statistics to use.
  const bool use_batch_stats =
      m.is_training() || (!running_mean.defined() && !running_var.defined());
  const bool update = m.is_training() && track && running_mean.defined() &&
                      running_var.defined();
  const int64_t per_channel = n * inner;
  if (use_batch_stats && per_channel <= 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected more than 1 value per channel when training, got input "
        "size ",
        TorchSizeString(x.shape())));
  }
  std::vector<double> mean(c), invstd(c);
  const T* px = Data<T>(x);
  if (use_batch_stats) {
    std::vector<double> var(c);
    for (int64_t ci = 0; ci < c; ++ci) {
      double sum = 0;
      for (int64_t ni = 0; ni < n; ++ni) {
        const T* src = px + (ni * c + ci) * inner;
        for (int64_t i = 0; i < inner; ++i) sum += src[i];
      }
      double mu = sum / static_cast<double>(per_channel);
      double sq = 0;
      for (int64_t ni = 0; ni < n; ++ni) {
        const T* src = px + (ni * c + ci) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          double d = src[i] - mu;
          sq += d * d;
        }
      }
      mean[ci] = mu;
      var[ci] = sq / static_cast<double>(per_channel);
      invstd[ci] = 1.0 / std::sqrt(var[ci] + eps);
    }
    if (update) {
      double factor = 0.0;
      if (count.defined()) {
        // num_batches_tracked += 1 (int64, in place).
        MODELSTATE_ASSIGN_OR_RETURN(
            Tensor next,
            Tensor::FromDoubles(
                count.dtype(), count.shape(),
                {ReadElementAsDouble(count.raw_data(), count.dtype(), 0) + 1}));
        MODELSTATE_RETURN_IF_ERROR(count.CopyFrom(next));
      }
      if (AttrIsNone(m, "momentum")) {
        // Cumulative moving average.
        double tracked = count.defined() ? ReadElementAsDouble(count.raw_data(),
                                                               count.dtype(), 0)
                                         : 1.0;
        factor = 1.0 / tracked;
      } else {
        MODELSTATE_ASSIGN_OR_RETURN(factor, AttrDouble(m, "momentum"));
      }
      MODELSTATE_ASSIGN_OR_RETURN(Tensor rm,
                                  ToDType(running_mean, DType::kFloat64));
      MODELSTATE_ASSIGN_OR_RETURN(Tensor rv,
                                  ToDType(running_var, DType::kFloat64));
      std::vector<double> new_mean(c), new_var(c);
      const double unbias = static_cast<double>(per_channel) /
                            static_cast<double>(per_channel - 1);
      for (int64_t ci = 0; ci < c; ++ci) {
        new_mean[ci] = (1 - factor) * rm.data<double>()[ci] + factor * mean[ci];
        new_var[ci] =
            (1 - factor) * rv.data<double>()[ci] + factor * var[ci] * unbias;
      }
      MODELSTATE_ASSIGN_OR_RETURN(
          Tensor nm, Tensor::FromDoubles(DType::kFloat64, {c}, new_mean));
      MODELSTATE_ASSIGN_OR_RETURN(
          Tensor nv, Tensor::FromDoubles(DType::kFloat64, {c}, new_var));
      MODELSTATE_RETURN_IF_ERROR(running_mean.CopyFrom(nm));
      MODELSTATE_RETURN_IF_ERROR(running_var.CopyFrom(nv));
    }
  } else {
    if (running_mean.dtype() != dtype || running_var.dtype() != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected scalar type ", ScalarTypeName(dtype),
                       " but found ", ScalarTypeName(running_mean.dtype()),
                       " (running_mean of ", m.type_name(), ")"));
    }
    for (int64_t ci = 0; ci < c; ++ci) {
      mean[ci] = ReadElementAsDouble(running_mean.raw_data(),
                                     running_mean.dtype(), ci);
      double v =
          ReadElementAsDouble(running_var.raw_data(), running_var.dtype(), ci);
      invstd[ci] = 1.0 / std::sqrt(v + eps);
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  Normalize(px, n, c, inner, mean, invstd, Data<T>(w), Data<T>(b), y.data);
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> Runner::LayerNorm(Module& m, const Tensor& x,
                                         DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(const AttrValue* shape_attr,
                              Attr(m, "normalized_shape"));
  std::vector<int64_t> norm_shape;
  if (const auto* v = std::get_if<std::vector<int64_t>>(shape_attr)) {
    norm_shape = *v;
  } else if (const auto* i = std::get_if<int64_t>(shape_attr)) {
    norm_shape = {*i};
  }
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  const size_t k = norm_shape.size();
  bool ok = x.shape().size() >= k;
  for (size_t i = 0; ok && i < k; ++i) {
    ok = x.shape()[x.shape().size() - k + i] == norm_shape[i];
  }
  if (!ok) {
    Shape star = norm_shape;
    return absl::InvalidArgumentError(
        absl::StrCat("Given normalized_shape=", Sizes(norm_shape),
                     ", expected input with shape [*", k == 0 ? "" : ", ",
                     absl::StrJoin(norm_shape, ", "),
                     "], but got input of size", Sizes(x.shape())));
  }
  const int64_t inner = Prod(norm_shape, 0, k);
  const int64_t rows = inner == 0 ? 0 : x.numel() / inner;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const T* pw = Data<T>(w);
  const T* pb = Data<T>(b);
  ParallelFor(rows, threads_, inner * 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* src = px + r * inner;
      T* dst = y.data + r * inner;
      double sum = 0;
      for (int64_t i = 0; i < inner; ++i) sum += src[i];
      const double mu = sum / static_cast<double>(inner);
      double sq = 0;
      for (int64_t i = 0; i < inner; ++i) {
        double d = src[i] - mu;
        sq += d * d;
      }
      const T rstd = static_cast<T>(1.0 / std::sqrt(sq / inner + eps));
      const T tmu = static_cast<T>(mu);
      for (int64_t i = 0; i < inner; ++i) {
        T v = (src[i] - tmu) * rstd;
        if (pw) v *= pw[i];
        if (pb) v += pb[i];
        dst[i] = v;
      }
    }
  });
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> Runner::GroupNorm(Module& m, const Tensor& x,
                                         DType dtype) {
  MODELSTATE_ASSIGN_OR_RETURN(Tensor w, Param(m, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor b, Param(m, "bias", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t groups, AttrInt(m, "num_groups"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t channels, AttrInt(m, "num_channels"));
  MODELSTATE_ASSIGN_OR_RETURN(double eps, AttrDouble(m, "eps"));
  if (x.dim() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected at least 2 dimensions for input tensor but received ",
        x.dim()));
  }
  const int64_t n = x.shape()[0], c = x.shape()[1];
  if (c % groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected number of channels in input to be divisible by num_groups, "
        "but got input of shape ",
        Sizes(x.shape()), " and num_groups=", groups));
  }
  if (c != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected weight to be a vector of size equal to the number of "
        "channels in input, but got weight of shape [",
        channels, "] and input of shape ", Sizes(x.shape())));
  }
  const int64_t inner = Prod(x.shape(), 2, x.shape().size());
  const int64_t cpg = c / groups, span = cpg * inner;
  std::vector<double> mean(c), invstd(c);
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t g = 0; g < groups; ++g) {
      const T* src = px + (ni * c + g * cpg) * inner;
      double sum = 0;
      for (int64_t i = 0; i < span; ++i) sum += src[i];
      const double mu = span > 0 ? sum / static_cast<double>(span) : 0.0;
      double sq = 0;
      for (int64_t i = 0; i < span; ++i) {
        double d = src[i] - mu;
        sq += d * d;
      }
      const double rstd =
          1.0 /
          std::sqrt((span > 0 ? sq / static_cast<double>(span) : 0.0) + eps);
      for (int64_t ci = g * cpg; ci < (g + 1) * cpg; ++ci) {
        mean[ci] = mu;
        invstd[ci] = rstd;
      }
    }
    Normalize(px + ni * c * inner, 1, c, inner, mean, invstd, Data<T>(w),
              Data<T>(b), y.data + ni * c * inner);
  }
  return y.tensor;
}

// ---------------------------------------------------------------------------
// Embedding, Dropout, Softmax, pooling.

absl::StatusOr<Tensor> Runner::Embedding(Module& m, const Tensor& indices) {
  Tensor weight = Entry(m, "weight");
  MODELSTATE_RETURN_IF_ERROR(CheckCpu(weight));
  if (indices.dtype() != DType::kInt64 && indices.dtype() != DType::kInt32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Expected tensor for argument #1 'indices' to have one of the "
        "following scalar types: Long, Int; but got ",
        indices.TypeName(),
        " instead (while checking arguments for "
        "embedding)"));
  }
  const int64_t num = weight.shape()[0], dim = weight.shape()[1];
  const int64_t count = indices.numel();
  std::vector<int64_t> idx(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    idx[i] = indices.dtype() == DType::kInt64
                 ? indices.data<int64_t>()[i]
                 : static_cast<int64_t>(indices.data<int32_t>()[i]);
    if (idx[i] < 0 || idx[i] >= num) {
      return absl::InvalidArgumentError("index out of range in self");
    }
  }
  if (!AttrIsNone(m, "max_norm")) {
    // embedding_renorm_: rows looked up whose norm exceeds max_norm are
    // scaled down in the weight itself, before the lookup.
    MODELSTATE_ASSIGN_OR_RETURN(double max_norm, AttrDouble(m, "max_norm"));
    MODELSTATE_ASSIGN_OR_RETURN(double p, AttrDouble(m, "norm_type"));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w64,
                                weight.To(Device::Cpu(), DType::kFloat64));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w64_own, w64.Clone());
    MODELSTATE_ASSIGN_OR_RETURN(void* raw, w64_own.MutableDataForOverwrite());
    double* pw = static_cast<double*>(raw);
    bool changed = false;
    absl::flat_hash_set<int64_t> seen;
    for (int64_t row : idx) {
      if (!seen.insert(row).second) continue;
      double norm = 0;
      double* r = pw + row * dim;
      if (p == 1) {
        for (int64_t j = 0; j < dim; ++j) norm += std::abs(r[j]);
      } else if (p == 2) {
        for (int64_t j = 0; j < dim; ++j) norm += r[j] * r[j];
        norm = std::sqrt(norm);
      } else {
        for (int64_t j = 0; j < dim; ++j) norm += std::pow(std::abs(r[j]), p);
        norm = std::pow(norm, 1.0 / p);
      }
      if (norm > max_norm) {
        double scale = max_norm / (norm + 1e-7);
        for (int64_t j = 0; j < dim; ++j) r[j] *= scale;
        changed = true;
      }
    }
    if (changed) MODELSTATE_RETURN_IF_ERROR(weight.CopyFrom(w64_own));
  }
  Shape shape = indices.shape();
  shape.push_back(dim);
  MODELSTATE_ASSIGN_OR_RETURN(Tensor y, Tensor::Empty(weight.dtype(), shape));
  MODELSTATE_ASSIGN_OR_RETURN(void* out, y.MutableDataForOverwrite());
  const size_t row_bytes =
      static_cast<size_t>(dim) * ElementSize(weight.dtype());
  const char* src = static_cast<const char*>(weight.raw_data());
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(static_cast<char*>(out) + i * row_bytes,
                src + idx[i] * row_bytes, row_bytes);
  }
  return y;
}

template <typename T>
absl::StatusOr<Tensor> Runner::Dropout(const Tensor& x, double p,
                                       bool training) {
  if (!training || p == 0) return x;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  const T* px = Data<T>(x);
  const int64_t n = x.numel();
  if (p >= 1) {
    std::fill(y.data, y.data + n, T(0));
    return y.tensor;
  }
  // Keep each element with probability 1 - p and scale by 1 / (1 - p).
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  const double keep = 1.0 - p;
  Generator& g = gen();
  for (int64_t i = 0; i < n; ++i) {
    double u = static_cast<double>(g.Random()) * (1.0 / 4294967296.0);
    y.data[i] = u < keep ? px[i] * scale : T(0);
  }
  return y.tensor;
}

template <typename T>
absl::StatusOr<Tensor> Runner::Softmax(Module& m, const Tensor& x) {
  int64_t dim;
  if (AttrIsNone(m, "dim")) {
    // PyTorch's _get_softmax_dim (legacy implicit dim).
    int64_t nd = x.dim();
    dim = (nd == 0 || nd == 1 || nd == 3) ? 0 : 1;
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(dim, AttrInt(m, "dim"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(dim, WrapDim(dim, x.dim()));
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(x.shape()));
  if (x.numel() == 0) return y.tensor;
  std::memcpy(y.data, x.raw_data(), x.nbytes());
  const int64_t size = x.dim() == 0 ? 1 : x.shape()[dim];
  const int64_t inner = Prod(x.shape(), dim + 1, x.shape().size());
  SoftmaxInPlace(y.data, x.numel() / (size * inner), size, inner, threads_);
  return y.tensor;
}

template <typename T>
absl::StatusOr<std::vector<Tensor>> Runner::MaxPool2d(Module& m,
                                                      const Tensor& x) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> k,
                              AttrInts(m, "kernel_size", 2));
  std::vector<int64_t> st = k;
  const AttrValue* sv = m.attributes().Find("stride");
  bool stride_empty = sv == nullptr ||
                      std::holds_alternative<std::monostate>(*sv) ||
                      (std::holds_alternative<std::vector<int64_t>>(*sv) &&
                       std::get<std::vector<int64_t>>(*sv).empty());
  if (!stride_empty) {
    MODELSTATE_ASSIGN_OR_RETURN(st, AttrInts(m, "stride", 2));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> pd,
                              AttrInts(m, "padding", 2));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> dl,
                              AttrInts(m, "dilation", 2));
  MODELSTATE_ASSIGN_OR_RETURN(bool ceil_mode, AttrBool(m, "ceil_mode"));
  MODELSTATE_ASSIGN_OR_RETURN(bool return_indices,
                              AttrBool(m, "return_indices"));
  if (x.dim() != 3 && x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "non-empty 3D or 4D (batch mode) tensor expected for input, but got: ",
        Sizes(x.shape())));
  }
  for (int d = 0; d < 2; ++d) {
    if (k[d] <= 0 || st[d] <= 0 || dl[d] <= 0) {
      return absl::InvalidArgumentError(
          "max_pool2d: kernel_size, stride and dilation must be greater than "
          "zero");
    }
    if (pd[d] > k[d] / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pad should be at most half of effective kernel size, but got pad=",
          pd[d], ", kernel_size=", k[d], " and dilation=", dl[d]));
    }
  }
  const int64_t planes = Prod(x.shape(), 0, x.dim() - 2);
  const int64_t h = x.shape()[x.dim() - 2], w = x.shape()[x.dim() - 1];
  auto out_size = [&](int64_t in, int d) {
    int64_t num = in + 2 * pd[d] - dl[d] * (k[d] - 1) - 1;
    int64_t o = (ceil_mode ? (num + st[d] - 1) / st[d] : num / st[d]) + 1;
    if (num < 0)
      o = ceil_mode ? -((-num) / st[d]) + 1 : -((-num + st[d] - 1) / st[d]) + 1;
    if (ceil_mode && (o - 1) * st[d] >= in + pd[d]) --o;
    return o;
  };
  const int64_t ho = out_size(h, 0), wo = out_size(w, 1);
  if (ho < 1 || wo < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Given input size: (", x.dim() == 4 ? x.shape()[1] : x.shape()[0], "x",
        h, "x", w, "). Calculated output size: (",
        x.dim() == 4 ? x.shape()[1] : x.shape()[0], "x", ho, "x", wo,
        "). Output size is too small"));
  }
  Shape shape = x.shape();
  shape[shape.size() - 2] = ho;
  shape[shape.size() - 1] = wo;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  Tensor indices;
  int64_t* pi = nullptr;
  if (return_indices) {
    MODELSTATE_ASSIGN_OR_RETURN(indices, Tensor::Empty(DType::kInt64, shape));
    MODELSTATE_ASSIGN_OR_RETURN(void* raw, indices.MutableDataForOverwrite());
    pi = static_cast<int64_t*>(raw);
  }
  const T* px = Data<T>(x);
  for (int64_t p = 0; p < planes; ++p) {
    const T* src = px + p * h * w;
    for (int64_t i = 0; i < ho; ++i) {
      for (int64_t j = 0; j < wo; ++j) {
        T best = -std::numeric_limits<T>::infinity();
        int64_t best_at = -1;
        for (int64_t a = 0; a < k[0]; ++a) {
          int64_t hi = i * st[0] - pd[0] + a * dl[0];
          if (hi < 0 || hi >= h) continue;
          for (int64_t c = 0; c < k[1]; ++c) {
            int64_t wi = j * st[1] - pd[1] + c * dl[1];
            if (wi < 0 || wi >= w) continue;
            T v = src[hi * w + wi];
            if (best_at < 0 || v > best || std::isnan(v)) {
              if (!(best_at >= 0 && std::isnan(best))) {
                best = v;
                best_at = hi * w + wi;
              }
            }
          }
        }
        y.data[(p * ho + i) * wo + j] = best;
        if (pi) pi[(p * ho + i) * wo + j] = best_at;
      }
    }
  }
  std::vector<Tensor> out = {y.tensor};
  if (return_indices) out.push_back(indices);
  return out;
}

template <typename T>
absl::StatusOr<Tensor> Runner::AdaptiveAvgPool2d(Module& m, const Tensor& x) {
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<int64_t> size,
                              AttrInts(m, "output_size", 2));
  if (x.dim() != 3 && x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got ",
        Sizes(x.shape())));
  }
  const int64_t planes = Prod(x.shape(), 0, x.dim() - 2);
  const int64_t h = x.shape()[x.dim() - 2], w = x.shape()[x.dim() - 1];
  const int64_t ho = size[0], wo = size[1];
  Shape shape = x.shape();
  shape[shape.size() - 2] = ho;
  shape[shape.size() - 1] = wo;
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(shape));
  const T* px = Data<T>(x);
  for (int64_t p = 0; p < planes; ++p) {
    const T* src = px + p * h * w;
    for (int64_t i = 0; i < ho; ++i) {
      const int64_t h0 = (i * h) / ho, h1 = ((i + 1) * h + ho - 1) / ho;
      for (int64_t j = 0; j < wo; ++j) {
        const int64_t w0 = (j * w) / wo, w1 = ((j + 1) * w + wo - 1) / wo;
        T sum = 0;
        for (int64_t a = h0; a < h1; ++a) {
          for (int64_t c = w0; c < w1; ++c) sum += src[a * w + c];
        }
        y.data[(p * ho + i) * wo + j] =
            sum / static_cast<T>((h1 - h0) * (w1 - w0));
      }
    }
  }
  return y.tensor;
}

// ---------------------------------------------------------------------------
// Attention.

// x [rows, in] * w[out, in]^T + b as a new [rows, out] buffer.
template <typename T>
std::vector<T> Project(const T* x, int64_t rows, int64_t in, const T* w,
                       int64_t out, const T* b) {
  std::vector<T> y(static_cast<size_t>(rows * out));
  LinearRows(x, rows, in, w, out, b, y.data());
  return y;
}

// A [L, N, E] (sequence first) tensor's data in [N, L, E] order: copied
// into `buffer`, or the data itself when it is in that order already
// (batch first, or a batch of one).
template <typename T>
const T* BatchMajor(const T* x, int64_t l, int64_t n, int64_t e,
                    bool batch_first, std::vector<T>& buffer) {
  if (batch_first || n == 1) return x;
  buffer.resize(static_cast<size_t>(l * n * e));
  for (int64_t li = 0; li < l; ++li) {
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(x + (li * n + ni) * e, x + (li * n + ni + 1) * e,
                buffer.begin() + (ni * l + li) * e);
    }
  }
  return buffer.data();
}

// Turns a mask into the additive float mask PyTorch merges: a bool mask
// gives -inf where true, a float mask is used as is.
template <typename T>
absl::StatusOr<std::vector<T>> AdditiveMask(const Tensor& mask,
                                            absl::string_view name) {
  std::vector<T> out(static_cast<size_t>(mask.numel()));
  if (mask.dtype() == DType::kBool) {
    const uint8_t* p = mask.data<uint8_t>();
    for (int64_t i = 0; i < mask.numel(); ++i) {
      out[i] = p[i] ? -std::numeric_limits<T>::infinity() : T(0);
    }
  } else if (IsFloatingPoint(mask.dtype())) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor m, ToDType(mask, DTypeOf<T>()));
    std::copy(m.data<T>(), m.data<T>() + m.numel(), out.begin());
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "only bool and floating types of ", name, " are supported"));
  }
  return out;
}

// Attention under a mask that ends every query row in a run of -inf (a
// causal mask hides all keys after the query) need not score those keys:
// their weights are exp(-inf) = 0 exactly. For each of the `l` query rows of
// the [l, s] additive `mask`, the number of keys before that tail, or an
// empty vector when nothing can be skipped. A row masked entirely keeps all
// its keys (it must come out NaN, as in PyTorch). Skipping is exact only if
// no skipped score is +inf or NaN (inf + -inf is NaN), which holds when q
// and k are finite and no |q . k| * scale can overflow (the bound
// hd * max|q| * max|k| * scale below a float's range guarantees it), and if
// no skipped value row holds inf or NaN (0 * inf is NaN in the full
// product).
template <typename T>
std::vector<int64_t> KeysBeforeMaskedTail(const std::vector<T>& mask, int64_t l,
                                          int64_t s, const std::vector<T>& q,
                                          const std::vector<T>& k,
                                          const std::vector<T>& v, int64_t hd,
                                          T scale) {
  if (mask.empty() || l == 0 || s == 0) return {};
  std::vector<int64_t> keys(static_cast<size_t>(l));
  bool any_tail = false;
  for (int64_t li = 0; li < l; ++li) {
    const T* row = mask.data() + li * s;
    int64_t end = s;
    while (end > 0 && row[end - 1] == -std::numeric_limits<T>::infinity()) {
      --end;
    }
    if (end == 0) end = s;
    any_tail |= end < s;
    keys[li] = end;
  }
  if (!any_tail) return {};
  auto max_abs = [](const std::vector<T>& v) -> T {
    if constexpr (std::is_same_v<T, float>) {
      return internal::MaxAbs(v.data(), static_cast<int64_t>(v.size()));
    } else {
      T m = 0;
      for (T x : v) {
        if (std::isnan(x)) return std::numeric_limits<T>::infinity();
        m = std::max(m, std::abs(x));
      }
      return m;
    }
  };
  const double bound = static_cast<double>(hd) * max_abs(q) * max_abs(k) *
                       static_cast<double>(scale);
  if (!(bound < 1e30) || !(max_abs(v) < std::numeric_limits<T>::max())) {
    return {};
  }
  return keys;
}

template <typename T>
absl::StatusOr<std::vector<Tensor>> Runner::MultiheadAttention(
    Module& m, const std::vector<Tensor>& in, DType dtype, CallFlags flags) {
  MODELSTATE_ASSIGN_OR_RETURN(int64_t e, AttrInt(m, "embed_dim"));
  MODELSTATE_ASSIGN_OR_RETURN(int64_t heads, AttrInt(m, "num_heads"));
  MODELSTATE_ASSIGN_OR_RETURN(double dropout_p, AttrDouble(m, "dropout"));
  MODELSTATE_ASSIGN_OR_RETURN(bool batch_first, AttrBool(m, "batch_first"));
  MODELSTATE_ASSIGN_OR_RETURN(bool zero_attn, AttrBool(m, "add_zero_attn"));
  for (size_t i = 0; i < 3; ++i) {
    if (in[i].dtype() != in[0].dtype()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected query, key and value to have the same dtype, but got ",
          ScalarTypeName(in[0].dtype()), ", ", ScalarTypeName(in[1].dtype()),
          " and ", ScalarTypeName(in[2].dtype())));
    }
  }
  const Tensor& query = in[0];
  const Tensor& key = in[1];
  const Tensor& value = in[2];
  const Tensor kpm = in.size() > 3 ? in[3] : Tensor();
  const Tensor attn_mask = in.size() > 4 ? in[4] : Tensor();
  const int64_t hd = e / heads;

  // Unbatched inputs are [L, E]; work on [N=1, L, E] either way.
  const bool batched = query.dim() == 3;
  if (query.dim() != 3 && query.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "query should be unbatched 2D or batched 3D tensor but received ",
        query.dim(), "-D query tensor"));
  }
  if (key.dim() != query.dim() || value.dim() != query.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("For ", batched ? "batched (3-D)" : "unbatched (2-D)",
                     " `query`, expected `key` and `value` to be ",
                     batched ? "3-D" : "2-D", " but found ", key.dim(),
                     "-D and ", value.dim(), "-D tensors respectively"));
  }
  auto dims = [&](const Tensor& t, int64_t& len, int64_t& n, int64_t& feat) {
    if (!batched) {
      len = t.shape()[0];
      n = 1;
    } else if (batch_first) {
      n = t.shape()[0];
      len = t.shape()[1];
    } else {
      len = t.shape()[0];
      n = t.shape()[1];
    }
    feat = t.shape().back();
  };
  int64_t l, n, qe, s, nk, ke, sv, nv, ve;
  dims(query, l, n, qe);
  dims(key, s, nk, ke);
  dims(value, sv, nv, ve);
  if (qe != e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "was expecting embedding dimension of ", e, ", but got ", qe));
  }
  if (nk != n || nv != n || s != sv) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key shape ", TorchSizeString(key.shape()),
        " does not match value shape ", TorchSizeString(value.shape())));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckBlasDims({n * l, n * s, e, ke, ve}));
  const bool seq_first = batched && !batch_first;
  std::vector<T> q_buffer, k_buffer, v_buffer;
  const T* q_in = BatchMajor(Data<T>(query), l, n, e, !seq_first, q_buffer);
  const T* k_in = BatchMajor(Data<T>(key), s, n, ke, !seq_first, k_buffer);
  const T* v_in = BatchMajor(Data<T>(value), s, n, ve, !seq_first, v_buffer);

  MODELSTATE_ASSIGN_OR_RETURN(Tensor in_w, Param(m, "in_proj_weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor in_b, Param(m, "in_proj_bias", dtype));
  const T* bias = Data<T>(in_b);
  std::vector<T> q, k, v;
  if (in_w.defined()) {
    if (ke != e || ve != e) {
      return absl::InvalidArgumentError(
          absl::StrCat("key and value must have embedding dimension ", e,
                       ", got ", ke, " and ", ve));
    }
    const T* w = Data<T>(in_w);
    q = Project(q_in, n * l, e, w, e, bias);
    k = Project(k_in, n * s, e, w + e * e, e, bias ? bias + e : nullptr);
    v = Project(v_in, n * s, e, w + 2 * e * e, e,
                bias ? bias + 2 * e : nullptr);
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor qw, Param(m, "q_proj_weight", dtype));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor kw, Param(m, "k_proj_weight", dtype));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor vw, Param(m, "v_proj_weight", dtype));
    if (ke != kw.shape()[1] || ve != vw.shape()[1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key and value must have embedding dimensions ", kw.shape()[1],
          " and ", vw.shape()[1], ", got ", ke, " and ", ve));
    }
    q = Project(q_in, n * l, e, Data<T>(qw), e, bias);
    k = Project(k_in, n * s, ke, Data<T>(kw), e, bias ? bias + e : nullptr);
    v = Project(v_in, n * s, ve, Data<T>(vw), e, bias ? bias + 2 * e : nullptr);
  }

  // Masks, as [N or 1, L or 1, S] additive floats before the extra keys.
  std::vector<T> mask;  // [N * heads or 1, L, S] after merging, or empty
  int64_t mask_batches = 0;
  if (attn_mask.defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(mask, AdditiveMask<T>(attn_mask, "attn_mask"));
    if (attn_mask.dim() == 2) {
      if (attn_mask.shape() != Shape{l, s}) {
        return absl::InvalidArgumentError(
            absl::StrCat("The shape of the 2D attn_mask is ",
                         TorchSizeString(attn_mask.shape()),
                         ", but should be (", l, ", ", s, ")."));
      }
      mask_batches = 1;
    } else if (attn_mask.dim() == 3) {
      if (attn_mask.shape() != Shape{n * heads, l, s}) {
        return absl::InvalidArgumentError(absl::StrCat(
            "The shape of the 3D attn_mask is ",
            TorchSizeString(attn_mask.shape()), ", but should be (", n * heads,
            ", ", l, ", ", s, ")."));
      }
      mask_batches = n * heads;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "attn_mask's dimension ", attn_mask.dim(), " is not supported"));
    }
  }
  std::vector<T> pad_mask;  // [N, S]
  if (kpm.defined()) {
    Shape want = batched ? Shape{n, s} : Shape{s};
    if (kpm.shape() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected shape of key_padding_mask to be ", Sizes(want),
                       ", but got ", Sizes(kpm.shape())));
    }
    MODELSTATE_ASSIGN_OR_RETURN(pad_mask,
                                AdditiveMask<T>(kpm, "key_padding_mask"));
  }
  // bias_k / bias_v and add_zero_attn append keys (and zero mask columns).
  Tensor bias_k = Entry(m, "bias_k"), bias_v = Entry(m, "bias_v");
  int64_t s_total = s;
  if (bias_k.defined()) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor bk, Param(m, "bias_k", dtype));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor bv, Param(m, "bias_v", dtype));
    std::vector<T> k2(static_cast<size_t>(n * (s + 1) * e));
    std::vector<T> v2(k2.size());
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(k.begin() + ni * s * e, k.begin() + (ni + 1) * s * e,
                k2.begin() + ni * (s + 1) * e);
      std::copy(v.begin() + ni * s * e, v.begin() + (ni + 1) * s * e,
                v2.begin() + ni * (s + 1) * e);
      std::copy(Data<T>(bk), Data<T>(bk) + e,
                k2.begin() + (ni * (s + 1) + s) * e);
      std::copy(Data<T>(bv), Data<T>(bv) + e,
                v2.begin() + (ni * (s + 1) + s) * e);
    }
    k.swap(k2);
    v.swap(v2);
    s_total = s + 1;
  }
  if (zero_attn) {
    int64_t s2 = s_total + 1;
    std::vector<T> k2(static_cast<size_t>(n * s2 * e), T(0));
    std::vector<T> v2(k2.size(), T(0));
    for (int64_t ni = 0; ni < n; ++ni) {
      std::copy(k.begin() + ni * s_total * e,
                k.begin() + (ni + 1) * s_total * e, k2.begin() + ni * s2 * e);
      std::copy(v.begin() + ni * s_total * e,
                v.begin() + (ni + 1) * s_total * e, v2.begin() + ni * s2 * e);
    }
    k.swap(k2);
    v.swap(v2);
    s_total = s2;
  }

  // Per (batch, head): scores = q k^T / sqrt(hd) + mask, softmax, dropout,
  // times v. Heads are column blocks of the [N, L, E] buffers.
  std::vector<T> attn_out(static_cast<size_t>(n * l * e));
  std::vector<T> weights_sum;
  if (flags.need_weights)
    weights_sum.assign(static_cast<size_t>(n * l * s_total), T(0));
  const bool drop = m.is_training() && dropout_p > 0;
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(hd)));
  const std::vector<int64_t> row_keys =
      flags.need_weights || drop || !pad_mask.empty() || mask_batches != 1 ||
              s_total != s
          ? std::vector<int64_t>()
          : KeysBeforeMaskedTail(mask, l, s, q, k, v, hd, scale);
  // Query rows go in blocks that each multiply only the keys some row of
  // theirs can see; one block of every key when no tail is masked off.
  struct RowBlock {
    int64_t begin, end, keys;
  };
  std::vector<RowBlock> blocks;
  if (row_keys.empty()) {
    blocks.push_back({0, l, s_total});
  } else {
    constexpr int64_t kRowsPerBlock = 128;
    for (int64_t b = 0; b < l; b += kRowsPerBlock) {
      const int64_t end = std::min(l, b + kRowsPerBlock);
      blocks.push_back(
          {b, end,
           *std::max_element(row_keys.begin() + b, row_keys.begin() + end)});
    }
  }
  std::vector<int64_t> block_of_row(static_cast<size_t>(l));
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    std::fill(block_of_row.begin() + blocks[bi].begin,
              block_of_row.begin() + blocks[bi].end, static_cast<int64_t>(bi));
  }
  std::vector<T> scores(static_cast<size_t>(l * s_total));
  for (int64_t ni = 0; ni < n; ++ni) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = q.data() + ni * l * e + h * hd;
      const T* kh = k.data() + ni * s_total * e + h * hd;
      const T* vh = v.data() + ni * s_total * e + h * hd;
      for (const RowBlock& b : blocks) {
        Gemm(false, true, b.end - b.begin, b.keys, hd, scale, qh + b.begin * e,
             e, kh, e, T(0), scores.data() + b.begin * s_total, s_total);
      }
      const T* mask_rows =
          mask.empty()
              ? nullptr
              : mask.data() + (mask_batches == 1 ? 0 : ni * heads + h) * l * s;
      const T* pad_row = pad_mask.empty() ? nullptr : pad_mask.data() + ni * s;
      ParallelFor(l, threads_, s_total * 3, [&](int64_t begin, int64_t end) {
        for (int64_t li = begin; li < end; ++li) {
          const int64_t keys = blocks[block_of_row[li]].keys;
          T* row = scores.data() + li * s_total;
          // The extra keys of bias_k / add_zero_attn get no mask.
          const int64_t masked = std::min(keys, s);
          if (mask_rows != nullptr) {
            const T* mask_row = mask_rows + li * s;
            for (int64_t si = 0; si < masked; ++si) row[si] += mask_row[si];
          }
          if (pad_row != nullptr) {
            for (int64_t si = 0; si < masked; ++si) row[si] += pad_row[si];
          }
          SoftmaxRow(row, keys);
        }
      });
      if (flags.need_weights) {
        T* ws = weights_sum.data() + ni * l * s_total;
        for (int64_t i = 0; i < l * s_total; ++i) ws[i] += scores[i];
      }
      if (drop) {
        const double keep = 1.0 - dropout_p;
        const T inv = dropout_p >= 1 ? T(0) : static_cast<T>(1.0 / keep);
        Generator& g = gen();
        for (int64_t i = 0; i < l * s_total; ++i) {
          double u = static_cast<double>(g.Random()) * (1.0 / 4294967296.0);
          scores[i] = u < keep ? scores[i] * inv : T(0);
        }
      }
      for (const RowBlock& b : blocks) {
        Gemm(false, false, b.end - b.begin, hd, b.keys, T(1),
             scores.data() + b.begin * s_total, s_total, vh, e, T(0),
             attn_out.data() + (ni * l + b.begin) * e + h * hd, e);
      }
    }
  }
  // out_proj is applied through its tensors, not called as a module (as in
  // F.multi_head_attention_forward: its hooks do not fire).
  const std::shared_ptr<Module>* out_proj = m.children().Find("out_proj");
  if (out_proj == nullptr || *out_proj == nullptr) {
    return absl::FailedPreconditionError(
        "'MultiheadAttention' object has no submodule 'out_proj'");
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor ow, Param(**out_proj, "weight", dtype));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor ob, Param(**out_proj, "bias", dtype));
  Shape out_shape = !batched      ? Shape{l, e}
                    : batch_first ? Shape{n, l, e}
                                  : Shape{l, n, e};
  MODELSTATE_ASSIGN_OR_RETURN(Out<T> y, NewOut<T>(out_shape));
  if (seq_first && n > 1) {
    std::vector<T> proj =
        Project(attn_out.data(), n * l, e, Data<T>(ow), e, Data<T>(ob));
    for (int64_t ni = 0; ni < n; ++ni) {
      for (int64_t li = 0; li < l; ++li) {
        std::copy(proj.begin() + (ni * l + li) * e,
                  proj.begin() + (ni * l + li + 1) * e,
                  y.data + (li * n + ni) * e);
      }
    }
  } else {
    LinearRows(attn_out.data(), n * l, e, Data<T>(ow), e, Data<T>(ob), y.data);
  }
  std::vector<Tensor> out = {y.tensor, Tensor()};
  if (flags.need_weights) {
    Shape ws = batched ? Shape{n, l, s_total} : Shape{l, s_total};
    MODELSTATE_ASSIGN_OR_RETURN(Out<T> wt, NewOut<T>(ws));
    const T inv_heads = T(1) / static_cast<T>(heads);
    for (size_t i = 0; i < weights_sum.size(); ++i) {
      wt.data[i] = weights_sum[i] * inv_heads;
    }
    out[1] = wt.tensor;
  }
  return out;
}

// ---------------------------------------------------------------------------
// Composite modules.

absl::StatusOr<std::vector<Tensor>> Runner::Sequential(
    Module& m, const std::vector<Tensor>& in) {
  std::vector<Tensor> x = in;
  for (const auto& item : m.children()) {
    if (item.value == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Sequential child '", item.key, "' is None and cannot be called"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(x, Call(*item.value, std::move(x)));
  }
  return x;
}

absl::StatusOr<Tensor> Add(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("The size of tensor a ", Sizes(a.shape()),
                     " must match the size of tensor b ", Sizes(b.shape())));
  }
  MODELSTATE_ASSIGN_OR_RETURN(Tensor wa, ToCompute(a));
  MODELSTATE_ASSIGN_OR_RETURN(Tensor wb, ToCompute(b));
  absl::StatusOr<Tensor> sum = wa.dtype() == DType::kFloat32
                                   ? AddKernel<float>(wa, wb)
                                   : AddKernel<double>(wa, wb);
  if (!sum.ok()) return sum.status();
  return ToDType(*sum, a.dtype());
}

absl::StatusOr<std::vector<Tensor>> Runner::TransformerEncoderLayer(
    Module& m, const std::vector<Tensor>& in) {
  MODELSTATE_RETURN_IF_ERROR(CheckNumInputs(m, in, 1, 3));
  MODELSTATE_RETURN_IF_ERROR(CheckFloatingInput(in[0], m.type_name()));
  MODELSTATE_ASSIGN_OR_RETURN(bool norm_first, AttrBool(m, "norm_first"));
  MODELSTATE_ASSIGN_OR_RETURN(std::string activation, AttrStr(m, "activation"));
  const Tensor src_mask = in.size() > 1 ? in[1] : Tensor();
  const Tensor kpm = in.size() > 2 ? in[2] : Tensor();
  const std::shared_ptr<Module>* sa = m.children().Find("self_attn");
  if (sa == nullptr || *sa == nullptr) {
    return absl::FailedPreconditionError(
        "'TransformerEncoderLayer' object has no submodule 'self_attn'");
  }
  auto sa_block = [&](const Tensor& x) -> absl::StatusOr<Tensor> {
    CallFlags no_weights;
    no_weights.need_weights = false;
    MODELSTATE_ASSIGN_OR_RETURN(
        std::vector<Tensor> r,
        Call(**sa, {x, x, x, kpm, src_mask}, no_weights));
    return CallChild(m, "dropout1", {r[0]});
  };
  auto ff_block = [&](const Tensor& x) -> absl::StatusOr<Tensor> {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor h, CallChild(m, "linear1", {x}));
    // The activation is a function here, not a module: no hooks.
    MODELSTATE_ASSIGN_OR_RETURN(Tensor hw, ToCompute(h));
    Act act = activation == "gelu" ? Act::kGELU : Act::kReLU;
    absl::StatusOr<Tensor> a = hw.dtype() == DType::kFloat32
                                   ? ActKernel<float>(act, hw, threads_)
                                   : ActKernel<double>(act, hw, threads_);
    if (!a.ok()) return a.status();
    MODELSTATE_ASSIGN_OR_RETURN(h, ToDType(*a, h.dtype()));
    MODELSTATE_ASSIGN_OR_RETURN(h, CallChild(m, "dropout", {h}));
    MODELSTATE_ASSIGN_OR_RETURN(h, CallChild(m, "linear2", {h}));
    return CallChild(m, "dropout2", {h});
  };
  Tensor x = in[0];
  if (norm_first) {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor n1, CallChild(m, "norm1", {x}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, sa_block(n1));
    MODELSTATE_ASSIGN_OR_RETURN(x, Add(x, a));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor n2, CallChild(m, "norm2", {x}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor f, ff_block(n2));
    MODELSTATE_ASSIGN_OR_RETURN(x, Add(x, f));
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(Tensor a, sa_block(x));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor r1, Add(x, a));
    MODELSTATE_ASSIGN_OR_RETURN(x, CallChild(m, "norm1", {r1}));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor f, ff_block(x));
    MODELSTATE_ASSIGN_OR_RETURN(Tensor r2, Add(x, f));
    MODELSTATE_ASSIGN_OR_RETURN(x, CallChild(m, "norm2", {r2}));
  }
  return std::vector<Tensor>{x};
}

}  // namespace

absl::StatusOr<std::vector<Tensor>> Forward(Module& module,
                                            std::vector<Tensor> inputs,
                                            const ForwardOptions& options) {
  if (options.num_threads > 0) internal::SetBlasThreads(options.num_threads);
  // Outputs and intermediates of one call come in the same few sizes on
  // every call: recycle their mappings rather than fault in fresh pages.
  ScopedStorageReuse reuse;
  Runner runner(options);
  return runner.Call(module, std::move(inputs));
}

RemovableHandle RegisterGlobalForwardPreHook(ForwardPreHook hook,
                                             bool prepend) {
  return ForwardHookList::Global().AddPreHook(std::move(hook), prepend);
}

RemovableHandle RegisterGlobalForwardHook(ForwardHook hook, bool prepend) {
  return ForwardHookList::Global().AddHook(std::move(hook), prepend);
}

}  // namespace modelstate
