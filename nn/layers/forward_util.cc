#include "nn/layers/forward_util.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"

namespace modelstate::internal {

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

int64_t Prod(const Shape& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= shape[i];
  return n;
}

double VectorNorm(const double* v, int64_t n, double p) {
  if (n == 0) return 0;
  if (std::isinf(p)) {
    double r = std::abs(v[0]);
    for (int64_t i = 1; i < n; ++i) {
      r = p > 0 ? std::max(r, std::abs(v[i])) : std::min(r, std::abs(v[i]));
    }
    return r;
  }
  double r = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double m = std::abs(v[i]);
    if (p == 0) {
      r += m != 0 ? 1 : 0;
    } else if (p == 1) {
      r += m;
    } else if (p == 2) {
      r += m * m;
    } else {
      r += std::pow(m, p);
    }
  }
  if (p == 0 || p == 1) return r;
  return p == 2 ? std::sqrt(r) : std::pow(r, 1 / p);
}

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

absl::StatusOr<const AttrValue*> Attr(const Module& m, absl::string_view name) {
  const AttrValue* v = m.attributes().Find(name);
  if (v == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "'", m.type_name(), "' object has no attribute '", name, "'"));
  }
  return v;
}

namespace {

absl::Status WrongAttr(const Module& m, absl::string_view name,
                       absl::string_view want) {
  return absl::FailedPreconditionError(absl::StrCat(
      m.type_name(), ".", name, " must be ", want, " for forward"));
}

}  // namespace

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

Tensor Entry(const Module& m, absl::string_view name) {
  if (const Tensor* t = m.parameters().Find(name)) return *t;
  if (const Tensor* t = m.buffers().Find(name)) return *t;
  return Tensor();
}

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

absl::StatusOr<std::vector<Tensor>> RunFloatLayer(
    const LayerCall& call, const std::vector<Tensor>& in, FloatInputs inputs,
    absl::FunctionRef<
        absl::StatusOr<std::vector<Tensor>>(const std::vector<Tensor>&, DType)>
        compute) {
  const Module& m = call.module;
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
        !inputs.mixed_dtypes) {
      return absl::InvalidArgumentError(
          absl::StrCat("expected scalar type ", ScalarTypeName(dtype),
                       " but found ", ScalarTypeName(t.dtype())));
    }
    MODELSTATE_ASSIGN_OR_RETURN(Tensor w, ToCompute(t));
    widened.push_back(std::move(w));
  }
  MODELSTATE_RETURN_IF_ERROR(
      CheckNumInputs(m, widened, inputs.min, inputs.max));
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<Tensor> out, compute(widened, dtype));
  if (IsReduced(dtype)) {
    for (Tensor& t : out) {
      if (t.defined() && IsFloatingPoint(t.dtype())) {
        MODELSTATE_ASSIGN_OR_RETURN(t, ToDType(t, dtype));
      }
    }
  }
  return out;
}

}  // namespace modelstate::internal
