// File: cluster_pages.cc
#include "server/cluster_pages.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/time/time.h"

namespace modelstate::server {
namespace {

constexpr size_t kDefaultPage = 100;

size_t PageLength(int32_t requested) {
  return requested > 0 ? static_cast<size_t>(requested) : kDefaultPage;
}

// Time order across replicas; a record whose time does not parse sorts
// first rather than being lost.
absl::Time RecordTime(const v1::AuditRecordProto& record) {
  absl::Time time = absl::InfinitePast();
  std::string error;
  absl::ParseTime(absl::RFC3339_full, record.time(), &time, &error);
  return time;
}

}  // namespace

v1::ListModulesResponse MergeModulePages(
    std::vector<v1::ListModulesResponse> pages, int32_t page_size) {
  std::vector<v1::ModuleSummary> merged;
  bool more = false;
  // The last name of the first replica page to stop short: names after it
  // wait for the next page, or that replica's next names would be skipped.
  std::optional<std::string> horizon;
  for (v1::ListModulesResponse& page : pages) {
    if (!page.next_page_token().empty() && page.modules_size() > 0) {
      const std::string& last = page.modules().rbegin()->module();
      if (!horizon.has_value() || last < *horizon) horizon = last;
    }
    more = more || !page.next_page_token().empty();
    for (v1::ModuleSummary& summary : *page.mutable_modules()) {
      merged.push_back(std::move(summary));
    }
  }
  std::sort(merged.begin(), merged.end(), [](const auto& a, const auto& b) {
    return a.module() < b.module();
  });
  if (horizon.has_value()) {
    auto past = std::upper_bound(
        merged.begin(), merged.end(), *horizon,
        [](const std::string& name, const v1::ModuleSummary& summary) {
          return name < summary.module();
        });
    merged.erase(past, merged.end());
  }
  const size_t length = PageLength(page_size);
  if (merged.size() > length) {
    merged.resize(length);
    more = true;
  }
  v1::ListModulesResponse response;
  for (v1::ModuleSummary& summary : merged) {
    *response.add_modules() = std::move(summary);
  }
  if (more && !merged.empty()) {
    response.set_next_page_token(response.modules().rbegin()->module());
  }
  return response;
}

v1::QueryAuditResponse MergeAuditPages(
    std::vector<ReplicaAuditPage> pages, int32_t limit,
    const std::vector<std::string>& known_replicas) {
  struct Entry {
    absl::Time time;
    size_t page;
    v1::AuditRecordProto* record;
  };
  std::vector<Entry> merged;
  bool more = false;
  for (size_t i = 0; i < pages.size(); ++i) {
    for (v1::AuditRecordProto& record : *pages[i].records.mutable_records()) {
      merged.push_back({RecordTime(record), i, &record});
    }
    more = more || pages[i].records.next_after_seq() != 0;
  }
  std::stable_sort(
      merged.begin(), merged.end(), [](const Entry& a, const Entry& b) {
        return a.time != b.time ? a.time < b.time : a.page < b.page;
      });
  const size_t length = PageLength(limit);
  if (merged.size() > length) {
    merged.resize(length);
    more = true;
  }
  v1::QueryAuditResponse response;
  for (Entry& entry : merged) {
    ReplicaAuditPage& page = pages[entry.page];
    page.after_seq = entry.record->seq();
    entry.record->set_replica(page.replica);
    *response.add_records() = std::move(*entry.record);
  }
  std::set<std::string> paged;
  for (const ReplicaAuditPage& page : pages) {
    paged.insert(page.replica);
    response.add_replicas(page.replica);
    if (more)
      (*response.mutable_next_after_seqs())[page.replica] = page.after_seq;
  }
  for (const std::string& replica : known_replicas) {
    if (paged.count(replica) == 0) response.add_missing_replicas(replica);
  }
  return response;
}

}  // namespace modelstate::server
