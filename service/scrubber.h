// File: scrubber.h
// The background scrub of hosted bytes: every `interval`, a thread of its
// own reads every byte the hosted modules map from their data files and
// checks it against its CRC-32C (ModelStore::Scrub), so that damage on
// disk is found, reported and kept from being served before a client
// meets it. The first pass starts one interval after the scrubber (a
// restart must not read what it hosts).
//
// Example:
//   Scrubber scrubber(&store, absl::Hours(24),
//                     [](const ModelStore::ScrubReport& report) {
//                       for (const absl::Status& s : report.damaged) {
//                         LOG(ERROR) << s;
//                       }
//                     });
//   ...  // the destructor stops it, ending a pass early
#ifndef MODELSTATE_SERVICE_SCRUBBER_H_
#define MODELSTATE_SERVICE_SCRUBBER_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "base/sync.h"
#include "service/model_store.h"

namespace modelstate {

class Scrubber {
 public:
  using OnPass = std::function<void(const ModelStore::ScrubReport&)>;

  // `store` must outlive the scrubber; `interval` > 0. `on_pass` runs on
  // the scrubber's thread after each whole pass.
  Scrubber(const ModelStore* store, absl::Duration interval, OnPass on_pass);
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;
  ~Scrubber();

 private:
  void Run();
  bool stopping() const;

  const ModelStore* const store_;
  const absl::Duration interval_;
  const OnPass on_pass_;
  mutable Mutex mu_;
  CondVar stop_changed_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace modelstate

#endif  // MODELSTATE_SERVICE_SCRUBBER_H_
