// The commands on what a module holds: get-state and load-state (its
// state_dict to and from safetensors files), to (dtype and device), forward
// (run it), train and eval (its mode).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "client/cli/command.h"
#include "client/cli/interrupt.h"
#include "client/cli/output.h"
#include "client/safetensors_stream.h"
#include "core/safetensors.h"
#include "core/state_stream.h"
#include "modelstate/v1/model_state_service.pb.h"
#include "proto/convert.h"

namespace modelstate::cli {
namespace {

// Chunk sizes are given in KiB; beyond 4 GiB they would not fit the wire's
// uint32. --chunk-kib's check refuses more when parsing (a usage error).
constexpr uint64_t kMaxChunkKib = uint64_t{UINT32_MAX} >> 10;

absl::StatusOr<uint32_t> ChunkBytes(std::optional<uint64_t> kib,
                                    uint32_t fallback) {
  if (!kib.has_value()) return fallback;
  if (*kib > kMaxChunkKib) {
    return UsageError(absl::StrCat("--chunk-kib: ", *kib, " is too large"));
  }
  return static_cast<uint32_t>(*kib << 10);
}

client::ProgressFn DrawOn(ProgressBar& bar) {
  return [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
}

// ----------------------------------------------------------------- get-state

struct GetStateArgs {
  std::string module;
  std::optional<std::string> output;
  std::optional<std::string> prefix;
  std::optional<std::string> glob;
  std::optional<std::string> dtype;
  std::optional<uint64_t> chunk_kib;
  bool sign = false;
};

// Remembers what went through, for the summary line.
class CountingSink : public client::StateDictSink {
 public:
  explicit CountingSink(client::StateDictSink* inner) : inner_(inner) {}
  absl::Status Begin(const StateDictLayout& layout) override {
    layout_ = layout;
    return inner_->Begin(layout);
  }
  absl::Status Append(absl::string_view bytes) override {
    bytes_ += bytes.size();
    return inner_->Append(bytes);
  }
  absl::Status Finish() override { return inner_->Finish(); }
  const StateDictLayout& layout() const { return layout_; }
  uint64_t bytes() const { return bytes_; }

 private:
  client::StateDictSink* inner_;
  StateDictLayout layout_;
  uint64_t bytes_ = 0;
};

// The file a transfer writes, each step run Uninterrupted. An interrupt
// between steps destroys the file's sink, which removes its temporary file
// (once renamed into place, the file is complete and stays).
class InterruptibleFileSink : public client::StateDictSink {
 public:
  InterruptibleFileSink(InterruptHandler& interrupts, std::string path)
      : sink_(std::make_shared<std::unique_ptr<client::SafetensorsSink>>(
            std::make_unique<client::SafetensorsSink>(std::move(path)))) {
    // The cleanup shares the sink, so that it never outlives it.
    interrupts.OnInterrupt([sink = sink_] { sink->reset(); });
  }
  absl::Status Begin(const StateDictLayout& layout) override {
    return Uninterrupted([&] { return (*sink_)->Begin(layout); });
  }
  absl::Status Append(absl::string_view bytes) override {
    return Uninterrupted([&] { return (*sink_)->Append(bytes); });
  }
  absl::Status Finish() override {
    return Uninterrupted([&] { return (*sink_)->Finish(); });
  }

 private:
  std::shared_ptr<std::unique_ptr<client::SafetensorsSink>> sink_;
};

absl::Status RunGetState(Context& c, const GetStateArgs& a) {
  if (!a.output.has_value()) return UsageError("missing option -o FILE");
  const std::string& file = *a.output;
  // Ctrl-C mid-transfer must not leave FILE.tmp.PID.N behind.
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
                              InterruptHandler::Install());
  client::GetStateDictOptions options;
  options.key_prefix = a.prefix.value_or("");
  options.key_glob = a.glob.value_or("");
  if (a.dtype.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        options.target_dtype,
        convert::ParseDTypeField(*a.dtype, "dtype", std::nullopt));
  }
  MODELSTATE_ASSIGN_OR_RETURN(options.chunk_bytes, ChunkBytes(a.chunk_kib, 0));
  ProgressBar bar(&c.err(), c.ProgressEnabled());
  options.progress = DrawOn(bar);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  InterruptibleFileSink file_sink(*interrupts, file);
  CountingSink sink(&file_sink);
  absl::Time start = absl::Now();
  absl::Status status = rpc->GetStateDict(a.module, options, sink);
  absl::Duration elapsed = absl::Now() - start;
  bar.Finish();
  MODELSTATE_RETURN_IF_ERROR(status);
  if (a.sign) {
    MODELSTATE_RETURN_IF_ERROR(
        SignWrittenStateFile(c, a.module, options, file));
  }
  if (c.json()) {
    v1::StateDictHeader header;
    convert::LayoutToHeader(sink.layout(), &header);
    return c.PrintJson(header);
  }
  c.out() << absl::StrFormat("wrote %s, %s bytes to %s %s\n",
                             Plural(sink.layout().entries.size(), "tensor"),
                             WithCommas(sink.bytes()), file,
                             TransferSummary(sink.bytes(), elapsed));
  return absl::OkStatus();
}

void AddGetState(CommandSet& commands) {
  auto args = std::make_shared<GetStateArgs>();
  CLI::App* get = commands.Add(
      {"get-state", "save a module's state_dict to a safetensors file",
       "Streams the module's state_dict into a safetensors file, chunk by "
       "chunk. The file appears complete or not at all.",
       "modelstatectl get-state team/mlp -o mlp.safetensors --dtype float16"},
      [args](Context& c) { return RunGetState(c, *args); });
  AddModuleArgument(get, args->module);
  AddValue(get, "-o,--output", args->output, "FILE",
           "the safetensors file to write (required)")
      ->check(NonEmpty("a file name"));
  AddValue(get, "--prefix", args->prefix, "P", "only keys starting with P");
  AddValue(get, "--glob", args->glob, "G", "only keys matching G (* and ?)");
  AddValue(get, "--dtype", args->dtype, "DT",
           "convert floating-point entries to DT on the fly");
  AddValue(get, "--chunk-kib", args->chunk_kib, "N",
           "bytes per message, in KiB (default: the server's, 1024)")
      ->check(NonNegativeInteger(kMaxChunkKib));
  get->add_flag("--sign", args->sign,
                "also write FILE.sig: an OpenSSF Model Signing bundle for "
                "the file, signed by the server's audit log key");
}

// ---------------------------------------------------------------- load-state

struct LoadStateArgs {
  std::string module;
  std::string file;
  bool strict = false;
  bool no_strict = false;
  bool no_atomic = false;
  bool assign = false;
  std::optional<uint64_t> chunk_kib;
};

absl::Status RunLoadState(Context& c, const LoadStateArgs& a) {
  if (a.strict && a.no_strict) {
    return UsageError("--strict and --no-strict exclude each other");
  }
  client::LoadStateDictOptions options;
  options.load.strict = !a.no_strict;
  options.load.atomic = !a.no_atomic;
  options.load.assign = a.assign;
  MODELSTATE_ASSIGN_OR_RETURN(options.chunk_bytes,
                              ChunkBytes(a.chunk_kib, options.chunk_bytes));
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<client::SafetensorsSource> source,
                              client::SafetensorsSource::Open(a.file));
  ProgressBar bar(&c.err(), c.ProgressEnabled());
  options.progress = DrawOn(bar);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  absl::Time start = absl::Now();
  absl::StatusOr<v1::LoadStateDictResponse> response =
      rpc->LoadStateDict(a.module, *source, options);
  absl::Duration elapsed = absl::Now() - start;
  bar.Finish();
  MODELSTATE_RETURN_IF_ERROR(response.status());
  if (c.json()) return c.PrintJson(*response);
  const StateDictLayout& layout = source->layout();
  c.out() << response->repr() << "\n";
  PrintNotableRegistrations(c.out(), response->registrations());
  c.out() << absl::StrFormat("streamed %s, %s bytes from %s %s\n",
                             Plural(layout.entries.size(), "tensor"),
                             WithCommas(layout.total_bytes), a.file,
                             TransferSummary(layout.total_bytes, elapsed));
  return absl::OkStatus();
}

void AddLoadState(CommandSet& commands) {
  auto args = std::make_shared<LoadStateArgs>();
  CLI::App* load = commands.Add(
      {"load-state", "load a safetensors file into a module (load_state_dict)",
       "Streams a safetensors file into the module's load_state_dict and "
       "prints PyTorch's repr of the result. By default the load is strict "
       "and atomic: a failure (PyTorch's error text) changes nothing.",
       "modelstatectl load-state team/mlp mlp.safetensors --no-strict"},
      [args](Context& c) { return RunLoadState(c, *args); });
  AddModuleArgument(load, args->module);
  load->add_option("FILE.safetensors", args->file,
                   "the safetensors file to read")
      ->required();
  AddFlag(load, "--strict", args->strict,
          "missing or unexpected keys are errors (the default)");
  AddFlag(load, "--no-strict", args->no_strict,
          "report missing and unexpected keys instead of failing");
  AddFlag(load, "--no-atomic", args->no_atomic,
          "PyTorch's partial loads: entries before a failure stay loaded");
  AddFlag(load, "--assign", args->assign,
          "install the file's tensors instead of copying into the module's");
  AddValue(load, "--chunk-kib", args->chunk_kib, "N",
           "bytes per message, in KiB (default 1024)")
      ->check(PositiveInteger(kMaxChunkKib));
}

// ------------------------------------------------------------------------ to

struct ToArgs {
  std::string module;
  std::optional<std::string> device;
  std::optional<std::string> dtype;
  bool convert_all = false;
};

void CountTensors(const v1::ModuleInfo& info,
                  std::map<std::string, int>* dtypes,
                  std::map<std::string, int>* devices) {
  auto count = [&](const v1::EntryInfo& e) {
    if (!e.has_tensor()) return;
    ++(*dtypes)[DTypeText(e.tensor().dtype())];
    ++(*devices)[e.tensor().device()];
  };
  for (const v1::EntryInfo& e : info.parameters()) count(e);
  for (const v1::EntryInfo& e : info.buffers()) count(e);
  for (const v1::ChildInfo& child : info.children()) {
    if (child.has_module()) CountTensors(child.module(), dtypes, devices);
  }
}

std::string CountList(const std::map<std::string, int>& counts) {
  std::vector<std::string> items;
  for (const auto& [name, n] : counts) {
    items.push_back(absl::StrCat(name, " (", Plural(n, "tensor"), ")"));
  }
  return items.empty() ? "none" : absl::StrJoin(items, ", ");
}

absl::Status RunTo(Context& c, const ToArgs& a) {
  if (!a.device.has_value() && !a.dtype.has_value()) {
    return UsageError("give --device, --dtype or both");
  }
  if (a.convert_all && !a.dtype.has_value()) {
    return UsageError("--convert-all needs --dtype, every tensor's new dtype");
  }
  v1::MoveModuleRequest request;
  request.set_module(a.module);
  request.set_device(a.device.value_or(""));
  request.set_dtype(a.dtype.value_or(""));
  request.set_convert_all(a.convert_all);
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::MoveModuleResponse response,
                              rpc->MoveModule(request));
  if (c.json()) return c.PrintJson(response);
  std::map<std::string, int> dtypes;
  std::map<std::string, int> devices;
  CountTensors(response.info(), &dtypes, &devices);
  c.out() << (a.convert_all ? "converted " : "moved ") << FullName(a.module)
          << "\n"
          << "dtypes: " << CountList(dtypes) << "\n"
          << "devices: " << CountList(devices) << "\n";
  return absl::OkStatus();
}

void AddTo(CommandSet& commands) {
  auto args = std::make_shared<ToArgs>();
  CLI::App* to = commands.Add(
      {"to", "convert a module's dtype or move it to a device",
       "PyTorch's module.to(device, dtype): floating-point tensors change "
       "dtype, all tensors move. At least one of --device and --dtype is "
       "needed. With --convert-all, module.type(dtype): every tensor, "
       "integer and bool ones included, becomes --dtype, which may be any "
       "dtype.",
       "modelstatectl to team/mlp --dtype float16"},
      [args](Context& c) { return RunTo(c, *args); });
  AddModuleArgument(to, args->module);
  AddValue(to, "--device", args->device, "D", "cpu, meta or cuda:N");
  AddValue(to, "--dtype", args->dtype, "DT",
           "a floating dtype, any spelling (float16, bfloat16, double, ...); "
           "any dtype with --convert-all");
  AddFlag(to, "--convert-all", args->convert_all,
          "module.type(dtype): convert integer and bool tensors too");
}

// ------------------------------------------------------------------- forward

struct ForwardArgs {
  std::string module;
  std::optional<std::string> input;
  std::optional<std::string> output;
  std::optional<std::string> path;
  bool train = false;
  bool eval = false;
  std::optional<uint64_t> seed;
};

// The tensors input0, input1, ... of `inputs` as the request's inputs; a
// gap is None.
absl::Status AddInputs(const StateDict& inputs, v1::ForwardRequest* request) {
  int count = 0;
  for (const auto& item : inputs.tensors) {
    int index = -1;
    absl::string_view key = item.key;
    if (!absl::ConsumePrefix(&key, "input") || !absl::SimpleAtoi(key, &index) ||
        index < 0 || index > 64) {
      return UsageError(absl::StrCat("--input: tensor '", item.key,
                                     "' is not named input0 .. input64"));
    }
    count = std::max(count, index + 1);
  }
  for (int i = 0; i < count; ++i) {
    v1::TensorProto* proto = request->add_inputs();
    const Tensor* t = inputs.tensors.Find(absl::StrCat("input", i));
    if (t == nullptr) continue;  // None
    MODELSTATE_RETURN_IF_ERROR(convert::TensorToProto(*t, proto));
  }
  return absl::OkStatus();
}

// The response's outputs as output0, output1, ...; None outputs are left
// out.
absl::StatusOr<StateDict> Outputs(const v1::ForwardResponse& response) {
  StateDict outputs;
  for (int i = 0; i < response.outputs_size(); ++i) {
    v1::TensorProto proto = response.outputs(i);
    if (proto.dtype() == v1::DTYPE_UNSPECIFIED) continue;  // None
    MODELSTATE_ASSIGN_OR_RETURN(
        Tensor t,
        convert::TensorFromProto(&proto, absl::StrCat("outputs[", i, "]"),
                                 std::numeric_limits<uint64_t>::max()));
    outputs.tensors.Set(absl::StrCat("output", i), std::move(t));
  }
  return outputs;
}

absl::Status RunForward(Context& c, const ForwardArgs& a) {
  if (a.train && a.eval) return UsageError("give --train or --eval, not both");
  if (!a.input.has_value() || !a.output.has_value()) {
    return UsageError("--input and --output are required");
  }
  v1::ForwardRequest request;
  request.set_module(a.module);
  request.set_path(a.path.value_or(""));
  request.set_seed(a.seed.value_or(0));
  if (a.train) request.set_training(true);
  if (a.eval) request.set_training(false);
  MODELSTATE_ASSIGN_OR_RETURN(StateDict inputs, ReadSafetensorsFile(*a.input));
  MODELSTATE_RETURN_IF_ERROR(AddInputs(inputs, &request));
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_ASSIGN_OR_RETURN(v1::ForwardResponse response,
                              rpc->Forward(request));
  MODELSTATE_ASSIGN_OR_RETURN(StateDict outputs, Outputs(response));
  // Ctrl-C while the outputs are written waits for them to be complete, as
  // their temporary file would otherwise stay behind.
  MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<InterruptHandler> interrupts,
                              InterruptHandler::Install());
  MODELSTATE_RETURN_IF_ERROR(
      Uninterrupted([&] { return WriteSafetensorsFile(*a.output, outputs); }));
  if (c.json()) return c.PrintJson(response);
  c.out() << "wrote " << outputs.tensors.size()
          << (outputs.tensors.size() == 1 ? " output to " : " outputs to ")
          << *a.output << "\n";
  for (const auto& item : outputs.tensors) {
    c.out() << "  " << item.key << ": " << item.value.DebugString() << "\n";
  }
  return absl::OkStatus();
}

void AddForward(CommandSet& commands) {
  auto args = std::make_shared<ForwardArgs>();
  CLI::App* forward = commands.Add(
      {"forward", "run a module on tensors from a safetensors file",
       "module(*inputs) on the server, as PyTorch computes it. The inputs "
       "are the tensors input0, input1, ... of --input (a missing index is "
       "None); the outputs go to --output as output0, output1, ... In "
       "training mode BatchNorm's running statistics change (saved and "
       "audited). Without --train or --eval the module's own mode applies.",
       "modelstatectl forward team/mlp --eval -i x.safetensors -o "
       "y.safetensors"},
      [args](Context& c) { return RunForward(c, *args); });
  AddModuleArgument(forward, args->module);
  AddValue(forward, "-i,--input", args->input, "FILE",
           "safetensors file with input0, input1, ...")
      ->check(NonEmpty("a file name"));
  AddValue(forward, "-o,--output", args->output, "FILE", "where the outputs go")
      ->check(NonEmpty("a file name"));
  AddValue(forward, "--path", args->path, "P",
           "run the submodule at this dotted path");
  AddFlag(forward, "--train", args->train, "training mode for this call");
  AddFlag(forward, "--eval", args->eval, "eval mode for this call");
  AddValue(forward, "--seed", args->seed, "N",
           "seed of Dropout masks in training mode")
      ->check(NonNegativeInteger());
}

// --------------------------------------------------------------- train, eval

absl::Status SetTraining(Context& c, const std::string& module, bool training) {
  MODELSTATE_ASSIGN_OR_RETURN(auto* rpc, c.Client());
  MODELSTATE_RETURN_IF_ERROR(rpc->SetTraining(module, training));
  if (c.json()) return c.PrintJson(v1::SetTrainingResponse());
  c.out() << FullName(module) << ": " << (training ? "training" : "eval")
          << " mode\n";
  return absl::OkStatus();
}

void AddSetTraining(CommandSet& commands, bool training) {
  auto module = std::make_shared<std::string>();
  const char* name = training ? "train" : "eval";
  CLI::App* command = commands.Add(
      {name,
       absl::StrCat("put a module in ", name, training ? "ing" : "", " mode"),
       training ? "module.train(): sets training on the module and all its "
                  "submodules."
                : "module.eval(): clears training on the module and all its "
                  "submodules.",
       absl::StrCat("modelstatectl ", name, " team/mlp")},
      [module, training](Context& c) {
        return SetTraining(c, *module, training);
      });
  AddModuleArgument(command, *module);
}

}  // namespace

void AddStateCommands(CommandSet& commands) {
  AddGetState(commands);
  AddLoadState(commands);
  AddTo(commands);
  AddForward(commands);
  AddSetTraining(commands, /*training=*/true);
  AddSetTraining(commands, /*training=*/false);
}

}  // namespace modelstate::cli
