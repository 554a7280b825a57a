// File: cluster_pages_test.cc
// The merge of replicas' pages into the cluster's page (no servers: the
// cluster integration test runs the same merges through real replicas).
#include "server/cluster_pages.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modelstate::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

v1::ListModulesResponse ModulePage(std::vector<std::string> names,
                                   std::string token = "") {
  v1::ListModulesResponse page;
  for (const std::string& name : names) page.add_modules()->set_module(name);
  page.set_next_page_token(std::move(token));
  return page;
}

std::vector<std::string> Names(const v1::ListModulesResponse& page) {
  std::vector<std::string> names;
  for (const auto& summary : page.modules()) names.push_back(summary.module());
  return names;
}

TEST(MergeModulePagesTest, MergesByNameAndCutsAtThePageSize) {
  std::vector<v1::ListModulesResponse> pages = {ModulePage({"a/1", "c/1"}),
                                                ModulePage({"b/1", "d/1"}),
                                                ModulePage({"a/2"})};
  v1::ListModulesResponse page = MergeModulePages(pages, 3);
  EXPECT_THAT(Names(page), ElementsAre("a/1", "a/2", "b/1"));
  // Cut here: the next page starts after the last name shown.
  EXPECT_EQ(page.next_page_token(), "b/1");

  page = MergeModulePages(pages, 10);
  EXPECT_THAT(Names(page), ElementsAre("a/1", "a/2", "b/1", "c/1", "d/1"));
  EXPECT_EQ(page.next_page_token(), "");
}

TEST(MergeModulePagesTest, NoNameIsSkippedWhenAReplicaStopsShort) {
  // The first replica has more after "b/1" though it sent fewer names than
  // asked: "z/1" must wait, or a next page after it would skip the first
  // replica's names between.
  std::vector<v1::ListModulesResponse> pages = {
      ModulePage({"a/1", "b/1"}, "b/1"), ModulePage({"a/5", "z/1"})};
  v1::ListModulesResponse page = MergeModulePages(pages, 5);
  EXPECT_THAT(Names(page), ElementsAre("a/1", "a/5", "b/1"));
  EXPECT_EQ(page.next_page_token(), "b/1");
  // The next page, as the replicas answer it after "b/1".
  page = MergeModulePages({ModulePage({"c/1"}), ModulePage({"z/1"})}, 5);
  EXPECT_THAT(Names(page), ElementsAre("c/1", "z/1"));
  EXPECT_EQ(page.next_page_token(), "");
}

TEST(MergeModulePagesTest, DefaultsToAHundredAndAnEmptyMergeHasNoToken) {
  std::vector<std::string> many;
  for (int i = 0; i < 150; ++i) many.push_back(absl::StrCat("m/", 1000 + i));
  v1::ListModulesResponse page = MergeModulePages({ModulePage(many)}, 0);
  EXPECT_EQ(page.modules_size(), 100);
  EXPECT_EQ(page.next_page_token(), "m/1099");
  page = MergeModulePages({ModulePage({}, ""), ModulePage({}, "")}, -1);
  EXPECT_EQ(page.modules_size(), 0);
  EXPECT_EQ(page.next_page_token(), "");
}

v1::AuditRecordProto Record(uint64_t seq, const std::string& time) {
  v1::AuditRecordProto record;
  record.set_seq(seq);
  record.set_time(time);
  return record;
}

ReplicaAuditPage AuditPage(const std::string& replica, uint64_t after_seq,
                           std::vector<v1::AuditRecordProto> records,
                           uint64_t next_after_seq = 0) {
  ReplicaAuditPage page{replica, after_seq, {}};
  for (auto& record : records) *page.records.add_records() = record;
  page.records.set_next_after_seq(next_after_seq);
  return page;
}

std::vector<std::string> Seen(const v1::QueryAuditResponse& response) {
  std::vector<std::string> seen;
  for (const auto& record : response.records()) {
    seen.push_back(absl::StrCat(record.replica(), ":", record.seq()));
  }
  return seen;
}

TEST(MergeAuditPagesTest, MergesByTimeAndGivesEachReplicaItsNextStart) {
  std::vector<ReplicaAuditPage> pages = {
      AuditPage("r0", 10,
                {Record(11, "2026-11-30T00:00:01Z"),
                 Record(12, "2026-11-30T00:00:04Z")}),
      AuditPage("r1", 0,
                {Record(1, "2026-11-30T00:00:02Z"),
                 Record(2, "2026-11-30T00:00:03Z")}),
      AuditPage("r2", 7, {})};
  v1::QueryAuditResponse merged = MergeAuditPages(pages, 3, {"r0", "r1"});
  EXPECT_THAT(Seen(merged), ElementsAre("r0:11", "r1:1", "r1:2"));
  EXPECT_THAT(merged.replicas(), ElementsAre("r0", "r1", "r2"));
  // r0 resumes after its record on this page, r2 where it was.
  EXPECT_THAT(
      merged.next_after_seqs(),
      UnorderedElementsAre(Pair("r0", 11), Pair("r1", 2), Pair("r2", 7)));
  EXPECT_THAT(merged.missing_replicas(), IsEmpty());

  merged = MergeAuditPages(pages, 0, {});
  EXPECT_THAT(Seen(merged), ElementsAre("r0:11", "r1:1", "r1:2", "r0:12"));
  EXPECT_THAT(merged.next_after_seqs(), IsEmpty());
}

TEST(MergeAuditPagesTest, EqualTimesKeepPageOrderAndUnparsedTimesComeFirst) {
  const std::string t = "2026-11-30T00:00:05.123456Z";
  v1::QueryAuditResponse merged = MergeAuditPages(
      {AuditPage("r0", 0, {Record(1, t), Record(2, t)}),
       AuditPage("r1", 0, {Record(1, t), Record(2, "not a time")})},
      0, {});
  EXPECT_THAT(Seen(merged), ElementsAre("r1:2", "r0:1", "r0:2", "r1:1"));
}

TEST(MergeAuditPagesTest, AReplicaWithMoreRecordsMeansAnotherPage) {
  v1::QueryAuditResponse merged = MergeAuditPages(
      {AuditPage("r0", 0, {Record(1, "2026-11-30T00:00:01Z")}, 1),
       AuditPage("r1", 4, {})},
      10, {"r0", "r1", "r2"});
  EXPECT_THAT(merged.next_after_seqs(),
              UnorderedElementsAre(Pair("r0", 1), Pair("r1", 4)));
  // r2 has a log but no page here (no live lease).
  EXPECT_THAT(merged.missing_replicas(), ElementsAre("r2"));
}

}  // namespace
}  // namespace modelstate::server
