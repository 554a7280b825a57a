#include "service/audit_tree.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

// Leaf hashes are read back in batches of this many (one pread each).
constexpr uint64_t kLeafBatch = 4096;

// The index of the first of the first `count` leaves where `reader`
// disagrees with `leaves`, or `count` when they agree.
absl::StatusOr<uint64_t> FirstDifferingLeaf(absl::Span<const MerkleHash> leaves,
                                            const HashReader& reader,
                                            uint64_t count) {
  std::vector<uint64_t> indexes;
  std::vector<MerkleHash> stored;
  for (uint64_t first = 0; first < count; first += kLeafBatch) {
    const uint64_t n = std::min(kLeafBatch, count - first);
    indexes.resize(n);
    stored.resize(n);
    for (uint64_t i = 0; i < n; ++i) {
      indexes[i] = StoredHashIndex(0, first + i);
    }
    MODELSTATE_RETURN_IF_ERROR(
        reader.ReadHashes(indexes, absl::MakeSpan(stored)));
    for (uint64_t i = 0; i < n; ++i) {
      if (first + i >= leaves.size() || stored[i] != leaves[first + i]) {
        return first + i;
      }
    }
  }
  return count;
}

// The first of the first `count` leaves whose stored hashes (its own and
// those of the subtrees it completes) are not what `leaves` give; `count`
// when all are. Reads every stored hash once, in storage order, so that a
// damaged leaf under intact subtree hashes (which the root alone cannot
// show) is found too.
absl::StatusOr<uint64_t> FirstUnfaithfulLeaf(
    absl::Span<const MerkleHash> leaves, const HashReader& reader,
    uint64_t count) {
  MerkleFrontier frontier;
  std::vector<MerkleHash> expected, stored;
  std::vector<uint64_t> indexes;
  std::vector<size_t> group_end;  // in `expected`, after each leaf's group
  for (uint64_t first = 0; first < count; first += kLeafBatch) {
    const uint64_t n = std::min(kLeafBatch, count - first);
    expected.clear();
    group_end.clear();
    for (uint64_t i = 0; i < n; ++i) {
      frontier.Append(leaves[first + i], &expected);
      group_end.push_back(expected.size());
    }
    const uint64_t base = StoredHashCount(first);
    indexes.resize(expected.size());
    stored.resize(expected.size());
    for (size_t i = 0; i < indexes.size(); ++i) indexes[i] = base + i;
    MODELSTATE_RETURN_IF_ERROR(
        reader.ReadHashes(indexes, absl::MakeSpan(stored)));
    for (size_t i = 0; i < expected.size(); ++i) {
      if (stored[i] == expected[i]) continue;
      const size_t leaf =
          std::upper_bound(group_end.begin(), group_end.end(), i) -
          group_end.begin();
      return first + leaf;
    }
  }
  return count;
}

// The first record of the checkpoint's tree that `leaves` lack or change,
// when `old_tree` holds that tree; 0 when it cannot tell.
uint64_t LocateDifference(absl::Span<const MerkleHash> leaves,
                          const Checkpoint& checkpoint,
                          const HashReader* old_tree, uint64_t old_tree_size) {
  if (old_tree == nullptr || old_tree_size < checkpoint.size) return 0;
  absl::StatusOr<MerkleHash> old_root = RootHash(checkpoint.size, *old_tree);
  if (!old_root.ok() || *old_root != checkpoint.root) return 0;
  absl::StatusOr<uint64_t> index =
      FirstDifferingLeaf(leaves, *old_tree, checkpoint.size);
  if (!index.ok() || *index >= checkpoint.size) return 0;
  return *index + 1;
}

}  // namespace

MerkleHash RootOfLeaves(absl::Span<const MerkleHash> leaves) {
  MerkleFrontier frontier;
  std::vector<MerkleHash> ignored;
  for (const MerkleHash& leaf : leaves) {
    ignored.clear();
    frontier.Append(leaf, &ignored);
  }
  return frontier.Root();
}

CheckpointComparison CompareWithCheckpoint(absl::Span<const MerkleHash> leaves,
                                           const Checkpoint& checkpoint,
                                           const HashReader* old_tree,
                                           uint64_t old_tree_size) {
  CheckpointComparison c;
  const uint64_t n = leaves.size();
  if (n < checkpoint.size) {
    c.ok = false;
    c.problem = absl::StrCat("the log has ", n,
                             " records, fewer than the checkpoint's tree size ",
                             checkpoint.size, ": records were cut off");
  } else if (RootOfLeaves(leaves.subspan(0, checkpoint.size)) !=
             checkpoint.root) {
    c.ok = false;
    c.problem =
        absl::StrCat("the log's first ", checkpoint.size, " records (of ", n,
                     ") do not hash to the checkpoint's root for tree size ",
                     checkpoint.size, ": records were rewritten");
  } else {
    return c;
  }
  c.first_differing_seq =
      LocateDifference(leaves, checkpoint, old_tree, old_tree_size);
  if (c.first_differing_seq == 0 && n < checkpoint.size) {
    // Without the old tree, the first record known to be missing.
    c.first_differing_seq = n + 1;
  }
  if (c.first_differing_seq != 0) {
    absl::StrAppend(&c.problem, "; the first differing record is seq ",
                    c.first_differing_seq);
  }
  return c;
}

absl::StatusOr<std::unique_ptr<MemoryHashStore>> ReadHashFile(
    const std::string& path) {
  MODELSTATE_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  const uint64_t count = bytes.size() / sizeof(MerkleHash);
  const uint64_t leaves = TreeSizeForStoredHashCount(count);
  std::vector<MerkleHash> leaf_hashes(leaves);
  for (uint64_t i = 0; i < leaves; ++i) {
    const uint64_t at = StoredHashIndex(0, i) * sizeof(MerkleHash);
    std::memcpy(leaf_hashes[i].data(), bytes.data() + at, sizeof(MerkleHash));
  }
  auto store = std::make_unique<MemoryHashStore>();
  MODELSTATE_RETURN_IF_ERROR(store->AppendLeaves(leaf_hashes).status());
  return store;
}

absl::StatusOr<std::unique_ptr<AuditTree>> AuditTree::Open(
    const std::string& hashes_path) {
  std::unique_ptr<HashStore> store;
  if (hashes_path.empty()) {
    store = std::make_unique<MemoryHashStore>();
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(store, FileHashStore::Open(hashes_path));
  }
  return std::unique_ptr<AuditTree>(new AuditTree(std::move(store)));
}

absl::StatusOr<std::string> AuditTree::Reconcile(
    absl::Span<const MerkleHash> leaves) {
  const uint64_t n = leaves.size();
  const uint64_t stored = store_->size();
  const uint64_t common = std::min(n, stored);
  std::string repaired;
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t first,
                              FirstUnfaithfulLeaf(leaves, *store_, common));
  if (first < common) {
    repaired =
        absl::StrCat("rebuilt the audit hash store from seq ", first + 1,
                     ": its hashes disagreed with the log's records there");
    MODELSTATE_RETURN_IF_ERROR(store_->Truncate(first));
  } else if (stored > n) {
    repaired = absl::StrCat("dropped the hashes of ", stored - n,
                            " records the audit log does not have");
    MODELSTATE_RETURN_IF_ERROR(store_->Truncate(n));
  }
  const uint64_t have = store_->size();
  if (have < n) {
    MODELSTATE_RETURN_IF_ERROR(
        store_->AppendLeaves(leaves.subspan(have)).status());
  }
  MODELSTATE_RETURN_IF_ERROR(store_->Sync());
  return repaired;
}

absl::Status AuditTree::Append(const MerkleHash& leaf_hash) {
  return store_->Append(leaf_hash).status();
}

absl::Status AuditTree::CheckTreeSize(uint64_t tree_size,
                                      absl::string_view field) const {
  const uint64_t n = size();
  if (tree_size <= n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " ", tree_size, " is beyond the audit log's ", n, " records"));
}

absl::StatusOr<MerkleHash> AuditTree::Root(uint64_t tree_size) const {
  MODELSTATE_RETURN_IF_ERROR(CheckTreeSize(tree_size, "tree_size"));
  return RootHash(tree_size, *store_);
}

absl::StatusOr<std::vector<MerkleHash>> AuditTree::InclusionProof(
    uint64_t seq, uint64_t tree_size) const {
  const uint64_t n = size();
  if (seq == 0 || seq > n) {
    return absl::NotFoundError(absl::StrCat(
        "seq ", seq, ": no such audit record (the log has ", n, ")"));
  }
  MODELSTATE_RETURN_IF_ERROR(CheckTreeSize(tree_size, "tree_size"));
  if (seq > tree_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "seq ", seq, " is not in the tree of tree_size ", tree_size));
  }
  return modelstate::InclusionProof(seq - 1, tree_size, *store_);
}

absl::StatusOr<std::vector<MerkleHash>> AuditTree::ConsistencyProof(
    uint64_t old_size, uint64_t new_size) const {
  MODELSTATE_RETURN_IF_ERROR(CheckTreeSize(new_size, "new_size"));
  if (old_size > new_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("old_size ", old_size, " is above new_size ", new_size));
  }
  return modelstate::ConsistencyProof(old_size, new_size, *store_);
}

}  // namespace modelstate
