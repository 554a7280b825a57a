#include "nn/layers/build_util.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace modelstate::internal {

std::vector<ArgDef> WithFactory(std::vector<ArgDef> args) {
  args.push_back({"device", kNone});
  args.push_back({"dtype", kNone});
  return args;
}

std::shared_ptr<Module> NewLayer(absl::string_view type,
                                 absl::string_view module_file) {
  std::shared_ptr<Module> m =
      Module::Create(std::string(type),
                     absl::StrCat("torch.nn.modules.", module_file, ".", type));
  m->set_fixed_shapes(true);
  return m;
}

std::shared_ptr<Module> NewStateless(absl::string_view type,
                                     absl::string_view module_file) {
  std::shared_ptr<Module> m = NewLayer(type, module_file);
  m->AddClassAttributes({"__constants__"});
  return m;
}

}  // namespace modelstate::internal
