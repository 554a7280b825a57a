// File: cluster_pages.h
// The cluster's page of a listing, merged from each replica's own page
// (ModelStateService ListModules and QueryAudit with `cluster`). Pure: the
// handlers fetch the pages (their own and each other replica's, forwarded),
// these functions merge them.
//
// Example:
//   std::vector<v1::ListModulesResponse> pages = {own, from_r1, from_r2};
//   v1::ListModulesResponse page =
//       MergeModulePages(std::move(pages), request.page_size());
//
//   std::vector<ReplicaAuditPage> audit = {{"r0", 12, own}, {"r1", 0, r1}};
//   v1::QueryAuditResponse records =
//       MergeAuditPages(std::move(audit), request.limit(), {"r0", "r1", "r2"});
#ifndef MODELSTATE_SERVER_CLUSTER_PAGES_H_
#define MODELSTATE_SERVER_CLUSTER_PAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "modelstate/v1/model_state_service.pb.h"

namespace modelstate::server {

// Each replica's page after the same token, merged by name. Module names
// are unique across the cluster and every page is sorted, so the first
// `page_size` names of the merge (100 when 0 or below) are the cluster's
// page; its token is the last name when any replica has more. No name past
// the last one of a replica page that has more is shown: that replica's
// next names, which may sort before it, come first on the next page (a
// replica that returns fewer names than asked, as one with another page
// size limit would, loses none).
v1::ListModulesResponse MergeModulePages(
    std::vector<v1::ListModulesResponse> pages, int32_t page_size);

// One replica's first records after its own `after_seq`.
struct ReplicaAuditPage {
  std::string replica;
  uint64_t after_seq = 0;
  v1::QueryAuditResponse records;
};

// The pages merged by time (a replica's own records keep their order; at
// equal times, the earlier page first): the first `limit` (100 when 0 or
// below) are
// the cluster's page, each record naming its replica. When more remain,
// `next_after_seqs` gives each replica's last record on this page (or its
// `after_seq` when none is). `known_replicas` are the replicas with a log
// (their checkpoints recorded in etcd): those without a page are listed in
// `missing_replicas`, since their records are not here.
v1::QueryAuditResponse MergeAuditPages(
    std::vector<ReplicaAuditPage> pages, int32_t limit,
    const std::vector<std::string>& known_replicas);

}  // namespace modelstate::server

#endif  // MODELSTATE_SERVER_CLUSTER_PAGES_H_
