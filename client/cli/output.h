// File: cli/output.h
// How modelstatectl shows things to people: numbers with thousands
// separators, byte sizes and rates, attribute values as PyTorch's repr
// writes them, aligned tables, and a progress bar for long transfers.
//
// Example:
//   for (const std::string& line :
//        AlignRows({{"MODULE", "BYTES"}, {"team/mlp", HumanBytes(818224)}},
//                  {false, true})) {
//     out << line << "\n";
//   }
#ifndef MODELSTATE_CLIENT_CLI_OUTPUT_H_
#define MODELSTATE_CLIENT_CLI_OUTPUT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::cli {

// 203530 -> "203,530": element and byte counts are read by people.
std::string WithCommas(uint64_t n);
// Binary units, as sizes of tensors are powers of two more often than not:
// "8 B", "784.0 KiB", "3.1 MiB".
std::string HumanBytes(uint64_t n);
// Rates in decimal units, as network and disk throughput usually are.
std::string HumanRate(double bytes_per_second);
// "3 tensors", "1 tensor".
std::string Plural(uint64_t n, absl::string_view singular);
// "in 0.012 s (68.1 MB/s)".
std::string TransferSummary(uint64_t bytes, absl::Duration elapsed);

// Attribute values as PyTorch's module repr shows them: True, None, 0.1,
// 'gelu', (3, 3).
std::string PyValue(const google::protobuf::Value& v);
// "float32"; the enum's name for a dtype the client does not know.
std::string DTypeText(v1::DType dtype);
// "float32[256, 784]"; a 0-dim tensor is "int64[]".
std::string TensorType(const v1::TensorInfo& t);
// "parameter", "buffer", "module".
std::string KindText(v1::EntryKind kind);
// Names without a namespace live in "default" (the service's rule); human
// output always shows the full name so that it can be pasted back.
std::string FullName(const std::string& module);

// Left-aligned columns separated by two spaces; columns listed in
// `right_aligned` (numbers) are right-aligned. The last column is never
// padded, so lines carry no trailing blanks.
std::vector<std::string> AlignRows(
    const std::vector<std::vector<std::string>>& rows,
    const std::vector<bool>& right_aligned = {});

// Lines for the registrations that hooks blocked or replaced (the kept ones
// are the normal case and would drown them), and a count line.
void PrintNotableRegistrations(
    std::ostream& out,
    const google::protobuf::RepeatedPtrField<v1::RegistrationReport>& reports);

// A one-line bar on stderr for transfers that last more than a second, so
// quick transfers stay quiet and long ones show they are alive.
//
// Thread-compatible.
class ProgressBar {
 public:
  ProgressBar(std::ostream* err, bool enabled)
      : err_(err), enabled_(enabled), start_(absl::Now()) {}
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar() { Finish(); }

  void Update(uint64_t done, uint64_t total);
  // Ends the bar's line, if one was drawn.
  void Finish();

 private:
  std::ostream* err_;
  bool enabled_;
  absl::Time start_;
  absl::Time last_draw_;
  bool drawn_ = false;
  bool finished_ = false;
  size_t last_length_ = 0;
};

}  // namespace modelstate::cli

#endif  // MODELSTATE_CLIENT_CLI_OUTPUT_H_
