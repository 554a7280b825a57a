// File: fuzz_support.h
// What the fuzz targets share: quiet by default, verbose on request, and
// protobuf's logging silenced.
#ifndef MODELSTATE_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define MODELSTATE_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <errno.h>  // program_invocation_short_name

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/stubs/logging.h"

namespace modelstate::fuzz {

// MODELSTATE_FUZZ_VERBOSE=1 prints how far each input got, to check seeds
// and to triage (libFuzzer runs quietly otherwise).
inline bool Verbose() {
  static const bool verbose = std::getenv("MODELSTATE_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

// True when `status` is OK; otherwise says so in verbose mode.
inline bool Passed(absl::string_view stage, const absl::Status& status) {
  if (!status.ok() && Verbose()) {
    std::fprintf(stderr, "%s: %.*s: %s\n", program_invocation_short_name,
                 static_cast<int>(stage.size()), stage.data(),
                 status.ToString().c_str());
  }
  return status.ok();
}

// Protobuf logs every string field that is not UTF-8; the fuzzer makes
// millions, and the parse failure is all that matters.
inline void DiscardProtobufLog(google::protobuf::LogLevel, const char*, int,
                               const std::string&) {}

}  // namespace modelstate::fuzz

#endif  // MODELSTATE_TESTS_FUZZ_FUZZ_SUPPORT_H_
