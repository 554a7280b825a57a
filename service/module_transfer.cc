#include "service/module_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/quote.h"
#include "base/status_macros.h"
#include "service/data_dir.h"

namespace modelstate {

namespace {

constexpr absl::string_view kManifest = "manifest.json";

bool IsDataFileName(const std::string& name) {
  const uint64_t number = data_dir::DataFileNumber(name);
  return number != 0 && data_dir::DataFileName(number) == name;
}

}  // namespace

absl::StatusOr<std::vector<TransferFile>> DescribeTransferFiles(
    const std::vector<std::string>& paths) {
  std::vector<TransferFile> files;
  for (const std::string& path : paths) {
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) return ErrnoStatus(ec.value(), path, "cannot read its size");
    files.push_back({std::filesystem::path(path).filename().string(), size});
  }
  return files;
}

absl::Status ReadTransferFiles(const std::vector<std::string>& paths,
                               size_t chunk_bytes,
                               absl::FunctionRef<bool(std::string&)> send) {
  std::string chunk;
  for (const std::string& path : paths) {
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return ErrnoStatus(errno, path, "cannot open");
    std::error_code ec;
    uint64_t left = std::filesystem::file_size(path, ec);
    if (ec) return ErrnoStatus(ec.value(), path, "cannot read its size");
    for (uint64_t offset = 0; left > 0;) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(left, chunk_bytes));
      chunk.resize(n);
      MODELSTATE_RETURN_IF_ERROR(
          PreadAll(fd.get(), chunk.data(), n, offset, path));
      if (!send(chunk)) return absl::OkStatus();
      offset += n;
      left -= n;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModuleImport>> ModuleImport::Begin(
    ModelService& service, const Caller& caller, ModuleName module,
    std::string from_replica, std::vector<TransferFile> files) {
  const size_t count = files.size();
  if (count == 0 || files.back().name != kManifest) {
    return absl::InvalidArgumentError("files: must end with manifest.json");
  }
  if (files.back().bytes > kMaxManifestBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("files: the manifest's ", files.back().bytes,
                     " bytes exceed ", kMaxManifestBytes));
  }
  std::unique_ptr<ModuleImport> import(
      new ModuleImport(service, caller, std::move(module),
                       std::move(from_replica), std::move(files)));
  for (size_t i = 0; i + 1 < count; ++i) {
    const std::string& name = import->files_[i].name;
    if (!IsDataFileName(name) || import->received_.count(name) > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("files[", i, "].name: ", Quote(name),
                       " is not a data file name, or it repeats"));
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        std::string path, service.ReserveImportFile(caller, import->module_));
    import->received_[name] = path;
    import->paths_.push_back(std::move(path));
  }
  // Empty files at the start end at once (no bytes mark them).
  MODELSTATE_RETURN_IF_ERROR(import->Append({}));
  return import;
}

ModuleImport::~ModuleImport() {
  fd_.reset();
  if (!received_.empty()) service_.AbandonImport(module_, received_);
}

absl::Status ModuleImport::Append(absl::string_view data) {
  do {
    // Files that are complete (empty ones included) end before more bytes.
    while (file_ < files_.size() && offset_ == files_[file_].bytes) {
      MODELSTATE_RETURN_IF_ERROR(NextFile());
    }
    if (data.empty()) return absl::OkStatus();
    if (file_ == files_.size()) {
      return absl::InvalidArgumentError(
          "data: more bytes than the files listed hold");
    }
    const size_t n = static_cast<size_t>(
        std::min<uint64_t>(data.size(), files_[file_].bytes - offset_));
    if (InManifest()) {
      manifest_.append(data.data(), n);
    } else {
      MODELSTATE_RETURN_IF_ERROR(Write(data.substr(0, n)));
    }
    data.remove_prefix(n);
    offset_ += n;
  } while (true);
}

absl::Status ModuleImport::Commit(
    absl::FunctionRef<absl::Status()> take_ownership) {
  if (file_ < files_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: the stream ended inside file '", files_[file_].name,
                     "' (", offset_, " of ", files_[file_].bytes, " bytes)"));
  }
  uint64_t bytes = 0;
  for (const TransferFile& file : files_) bytes += file.bytes;
  // MoveModuleIn ends the reservations whatever happens.
  return service_.MoveModuleIn(caller_, module_, from_replica_, manifest_,
                               std::exchange(received_, {}), bytes,
                               take_ownership);
}

absl::Status ModuleImport::Write(absl::string_view data) {
  const std::string& path = paths_[file_];
  if (fd_ == nullptr) {
    fd_ = std::make_unique<ScopedFd>(
        ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (fd_->get() < 0) return ErrnoStatus(errno, path, "cannot create");
  }
  return WriteAll(fd_->get(), data, path);
}

absl::Status ModuleImport::NextFile() {
  if (!InManifest()) {
    // Durable before the manifest names it.
    if (fd_ == nullptr) MODELSTATE_RETURN_IF_ERROR(Write({}));
    const std::string& path = paths_[file_];
    MODELSTATE_RETURN_IF_ERROR(Fdatasync(fd_->get(), path));
    MODELSTATE_RETURN_IF_ERROR(fd_->Close(path));
    fd_.reset();
  }
  ++file_;
  offset_ = 0;
  return absl::OkStatus();
}

}  // namespace modelstate
