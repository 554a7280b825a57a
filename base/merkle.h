// File: merkle.h
// RFC 6962 / RFC 9162 Merkle trees over an append-only list of records: leaf
// and node hashing, a storage layout for the tree's hashes that grows by
// O(1) amortised writes per leaf, the tree hash of any prefix of the list,
// inclusion and consistency proofs, and their verifiers (which need nothing
// but the proof, so a client can run them offline).
//
// Storage layout. The hash of every complete subtree (2^level leaves starting
// at leaf index * 2^level) is stored exactly once, in the order the subtrees
// complete: appending leaf m stores its leaf hash, then the hash of each
// subtree that leaf completes, lowest first. The position of any subtree's
// hash is a closed formula (StoredHashIndex), so a reader fetches every hash
// a proof needs with one batch of O(log n) point reads, and the store is a
// flat array (a file read with pread, or memory). A tree of n leaves stores
// StoredHashCount(n) = 2n - popcount(n) hashes.
//
// Example:
//   MODELSTATE_ASSIGN_OR_RETURN(std::unique_ptr<FileHashStore> store,
//                               FileHashStore::Open("data/audit.hashes"));
//   MODELSTATE_RETURN_IF_ERROR(store->Append(HashLeaf(record)).status());
//   MODELSTATE_RETURN_IF_ERROR(store->Sync());
//   uint64_t n = store->size();
//   MODELSTATE_ASSIGN_OR_RETURN(MerkleHash root, RootHash(n, *store));
//   MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> proof,
//                               InclusionProof(/*index=*/3, n, *store));
//   // Client side, offline:
//   MODELSTATE_RETURN_IF_ERROR(
//       VerifyInclusion(HashLeaf(record3), 3, n, root, proof));
#ifndef MODELSTATE_BASE_MERKLE_H_
#define MODELSTATE_BASE_MERKLE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/sync.h"

namespace modelstate {

// A SHA-256 tree hash.
using MerkleHash = std::array<uint8_t, 32>;

// SHA-256(0x00 || record): the hash of a leaf (RFC 6962 section 2.1).
MerkleHash HashLeaf(absl::string_view record);
// SHA-256(0x01 || left || right): the hash of an interior node.
MerkleHash HashChildren(const MerkleHash& left, const MerkleHash& right);
// SHA-256 of the empty string: the hash of the tree with no leaves.
MerkleHash EmptyTreeHash();

// Lowercase hex, for messages and tests.
std::string MerkleHashHex(const MerkleHash& hash);
// The hash in 32 raw bytes, or INVALID_ARGUMENT naming `what` when `bytes`
// is not 32 bytes long.
absl::StatusOr<MerkleHash> MerkleHashFromBytes(absl::string_view bytes,
                                               absl::string_view what);

// The largest tree the storage layout addresses (its stored-hash indexes
// fit in 64 bits). RootHash and the proof functions refuse larger sizes.
inline constexpr uint64_t kMaxStoredTreeSize = uint64_t{1} << 62;

// Where the hash of the complete subtree covering leaves
// [index * 2^level, (index + 1) * 2^level) is stored. REQUIRES: the
// subtree's last leaf is below kMaxStoredTreeSize.
uint64_t StoredHashIndex(int level, uint64_t index);
// How many hashes a tree of `size` leaves stores: 2 * size - popcount(size).
uint64_t StoredHashCount(uint64_t size);
// The largest tree whose hashes all fit in the first `count` stored hashes.
uint64_t TreeSizeForStoredHashCount(uint64_t count);

// Read access to stored hashes. Implementations must allow concurrent calls.
class HashReader {
 public:
  virtual ~HashReader() = default;
  // Fills out[i] with the hash stored at indexes[i].
  // REQUIRES: out.size() == indexes.size().
  // Returns OUT_OF_RANGE if an index is not stored (yet), or the storage's
  // own error (DATA_LOSS, an I/O error) naming where it failed.
  virtual absl::Status ReadHashes(absl::Span<const uint64_t> indexes,
                                  absl::Span<MerkleHash> out) const = 0;
};

// The right edge of a tree: the roots of its complete subtrees, one per set
// bit of its size, largest first. That is all appending needs, so a store
// keeps one in memory and appends without reading.
class MerkleFrontier {
 public:
  // The stored hashes a frontier for `size` leaves is made of, for
  // FromStoredHashes.
  static std::vector<uint64_t> StoredIndexes(uint64_t size);
  // The frontier of a tree of `size` leaves, from the hashes read at
  // StoredIndexes(size). INVALID_ARGUMENT if there are not as many.
  static absl::StatusOr<MerkleFrontier> FromStoredHashes(
      uint64_t size, std::vector<MerkleHash> hashes);

  uint64_t size() const { return size_; }
  // Adds a leaf and appends the hashes it stores to `stored`: the leaf hash,
  // then one per subtree it completes (what belongs at
  // StoredHashCount(size()) before the call).
  void Append(const MerkleHash& leaf_hash, std::vector<MerkleHash>* stored);
  // The tree's root hash, without reading anything.
  MerkleHash Root() const;

 private:
  uint64_t size_ = 0;
  std::vector<MerkleHash> roots_;  // largest subtree first
};

// The root hash of the first `size` leaves (RFC 9162 MTH). EmptyTreeHash()
// for size 0. O(log size) reads. OUT_OF_RANGE above kMaxStoredTreeSize;
// other errors come from `reader` (OUT_OF_RANGE when the store holds fewer
// than `size` leaves).
absl::StatusOr<MerkleHash> RootHash(uint64_t size, const HashReader& reader);

// The audit path of leaf `index` in the tree of the first `size` leaves
// (RFC 9162 section 2.1.3.1), bottom up. INVALID_ARGUMENT if index >= size;
// reader errors as for RootHash. O(log size) reads in one batch.
absl::StatusOr<std::vector<MerkleHash>> InclusionProof(
    uint64_t index, uint64_t size, const HashReader& reader);

// The consistency proof from the tree of `old_size` leaves to the tree of
// `new_size` leaves (RFC 9162 section 2.1.4.1). Empty when old_size is 0 or
// equals new_size. INVALID_ARGUMENT if old_size > new_size; reader errors as
// for RootHash. O(log new_size) reads in one batch.
absl::StatusOr<std::vector<MerkleHash>> ConsistencyProof(
    uint64_t old_size, uint64_t new_size, const HashReader& reader);

// Checks that `proof` shows leaf `leaf_hash` at `index` in the tree of
// `size` leaves with root `root` (RFC 9162 section 2.1.3.2). Returns
// INVALID_ARGUMENT naming what is wrong: index >= size, a proof of the wrong
// length for (index, size), or a proof that does not lead to `root`.
absl::Status VerifyInclusion(const MerkleHash& leaf_hash, uint64_t index,
                             uint64_t size, const MerkleHash& root,
                             absl::Span<const MerkleHash> proof);

// Checks that `proof` shows the tree (old_size, old_root) is a prefix of the
// tree (new_size, new_root) (RFC 9162 section 2.1.4.2). For old_size 0 the
// proof must be empty and old_root EmptyTreeHash(); for old_size ==
// new_size it must be empty and the roots equal. Returns INVALID_ARGUMENT
// naming what is wrong: old_size > new_size, a proof of the wrong length,
// or a proof that reproduces neither root.
absl::Status VerifyConsistency(uint64_t old_size, uint64_t new_size,
                               const MerkleHash& old_root,
                               const MerkleHash& new_root,
                               absl::Span<const MerkleHash> proof);

// A growing tree's hashes: a HashReader that can append leaves.
// Implementations are thread-safe: one writer and many readers may run at
// once, and a reader never sees a partly appended leaf.
class HashStore : public HashReader {
 public:
  // Number of leaves stored.
  virtual uint64_t size() const = 0;
  // Appends leaves with these hashes (with their subtree hashes); returns
  // the index of the first. On error nothing is appended.
  virtual absl::StatusOr<uint64_t> AppendLeaves(
      absl::Span<const MerkleHash> leaf_hashes) = 0;
  absl::StatusOr<uint64_t> Append(const MerkleHash& leaf_hash) {
    return AppendLeaves(absl::MakeConstSpan(&leaf_hash, 1));
  }
  // Drops every leaf from `size` on, so a log can cut its tree back to the
  // records it knows are durable. INVALID_ARGUMENT if size > this->size().
  virtual absl::Status Truncate(uint64_t size) = 0;
  // Makes everything appended so far durable.
  virtual absl::Status Sync() = 0;
};

// Hashes in memory (tests, small trees, caches). Thread-safe.
class MemoryHashStore : public HashStore {
 public:
  uint64_t size() const override;
  absl::Status ReadHashes(absl::Span<const uint64_t> indexes,
                          absl::Span<MerkleHash> out) const override;
  absl::StatusOr<uint64_t> AppendLeaves(
      absl::Span<const MerkleHash> leaf_hashes) override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Sync() override { return absl::OkStatus(); }

 private:
  mutable Mutex mu_;
  std::vector<MerkleHash> hashes_ ABSL_GUARDED_BY(mu_);
  MerkleFrontier frontier_ ABSL_GUARDED_BY(mu_);
};

// Hashes in one append-only file of 32-byte records in storage order, read
// with pread (the page cache keeps hot subtrees in memory; the process holds
// only the file descriptor, so memory and open time do not grow with the
// tree). Thread-safe.
//
// Crash safety: appends are plain writes and Sync() is fdatasync. On Open, a
// file whose length is not a whole number of hashes, or that ends inside a
// leaf's group of hashes (a crash mid-append), is cut back to the last whole
// leaf, and the subtree hashes the last leaves completed are checked
// against their children; a leaf whose group fails that check is cut off as
// well. Leaf hashes themselves cannot be checked here: the log above should
// compare the last few with its records.
class FileHashStore : public HashStore {
 public:
  // Opens `path`, creating an empty store if it does not exist.
  static absl::StatusOr<std::unique_ptr<FileHashStore>> Open(
      const std::string& path);
  ~FileHashStore() override;

  uint64_t size() const override;
  absl::Status ReadHashes(absl::Span<const uint64_t> indexes,
                          absl::Span<MerkleHash> out) const override;
  absl::StatusOr<uint64_t> AppendLeaves(
      absl::Span<const MerkleHash> leaf_hashes) override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Sync() override;

  // What Open cut off the end of the file: bytes (0 for a clean file) and
  // whole leaves whose subtree hashes did not match their children.
  uint64_t recovered_bytes() const { return recovered_bytes_; }
  uint64_t dropped_leaves() const { return dropped_leaves_; }

 private:
  FileHashStore(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status Recover();
  // The first leaf in [first, size) whose stored subtree hashes do not
  // match their children, or `size` if there is none.
  absl::StatusOr<uint64_t> FirstUnsoundLeaf(uint64_t size,
                                            uint64_t first) const;
  // Reads hashes from the file, refusing indexes at or past `stored`.
  absl::Status ReadStored(uint64_t stored, absl::Span<const uint64_t> indexes,
                          absl::Span<MerkleHash> out) const;
  // Cuts the file to `size` leaves and rebuilds the frontier from it.
  absl::Status TruncateLocked(uint64_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const int fd_;
  uint64_t recovered_bytes_ = 0;
  uint64_t dropped_leaves_ = 0;
  mutable Mutex mu_;
  MerkleFrontier frontier_ ABSL_GUARDED_BY(mu_);  // its size is the tree's
};

}  // namespace modelstate

#endif  // MODELSTATE_BASE_MERKLE_H_
