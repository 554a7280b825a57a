#include "base/merkle.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/status_macros.h"

namespace modelstate {
namespace {

// ------------------------------------------------------------- hashing --

// One digest context per thread: tree hashing runs millions of tiny digests,
// and creating a context (and looking up SHA-256) for each would cost more
// than the hash itself.
class Sha256Context {
 public:
  Sha256Context() : ctx_(EVP_MD_CTX_new()) {
    MODELSTATE_CHECK(ctx_ != nullptr) << "EVP_MD_CTX_new failed";
  }
  ~Sha256Context() { EVP_MD_CTX_free(ctx_); }
  Sha256Context(const Sha256Context&) = delete;
  Sha256Context& operator=(const Sha256Context&) = delete;

  MerkleHash Digest(absl::string_view a, absl::string_view b,
                    absl::string_view c) {
    MODELSTATE_CHECK(EVP_DigestInit_ex(ctx_, Md(), nullptr) == 1 &&
                     EVP_DigestUpdate(ctx_, a.data(), a.size()) == 1 &&
                     EVP_DigestUpdate(ctx_, b.data(), b.size()) == 1 &&
                     EVP_DigestUpdate(ctx_, c.data(), c.size()) == 1)
        << "SHA-256 failed";
    MerkleHash out;
    unsigned int length = 0;
    MODELSTATE_CHECK(EVP_DigestFinal_ex(ctx_, out.data(), &length) == 1 &&
                     length == out.size())
        << "SHA-256 failed";
    return out;
  }

 private:
  static const EVP_MD* Md() {
    static const EVP_MD* const md = EVP_sha256();
    return md;
  }
  EVP_MD_CTX* const ctx_;
};

MerkleHash Sha256Of(absl::string_view a, absl::string_view b = {},
                    absl::string_view c = {}) {
  thread_local Sha256Context context;
  return context.Digest(a, b, c);
}

absl::string_view Bytes(const MerkleHash& h) {
  return absl::string_view(reinterpret_cast<const char*>(h.data()), h.size());
}

// ------------------------------------------------------ tree arithmetic --

// The largest power of two strictly below n. REQUIRES: n >= 2.
uint64_t SplitPoint(uint64_t n) { return std::bit_floor(n - 1); }

// A run of leaves [lo, hi) whose MTH a proof or root needs. Every range the
// RFC 9162 recursion produces starts at a multiple of the largest power of
// two not above its length, which is what SubtreesOf relies on.
struct Range {
  uint64_t lo;
  uint64_t hi;
};

// A complete subtree: leaves [index << level, (index + 1) << level).
struct Subtree {
  int level;
  uint64_t index;
};

// The complete subtrees that make up `range`, largest (leftmost) first. Its
// MTH is their hashes folded from the right.
void SubtreesOf(Range range, std::vector<Subtree>* out) {
  uint64_t lo = range.lo;
  while (lo < range.hi) {
    int level = std::bit_width(range.hi - lo) - 1;
    while (level > 0 && (lo & ((uint64_t{1} << level) - 1)) != 0) --level;
    out->push_back({level, lo >> level});
    lo += uint64_t{1} << level;
  }
}

// MTH of each range, reading every stored hash they need in one batch.
absl::StatusOr<std::vector<MerkleHash>> RangeHashes(
    const std::vector<Range>& ranges, const HashReader& reader) {
  for (const Range& range : ranges) {
    if (range.hi > kMaxStoredTreeSize) {
      return absl::OutOfRangeError(
          absl::StrCat("tree size ", range.hi,
                       " is above the largest stored tree, 2^62 leaves"));
    }
  }
  std::vector<Subtree> subtrees;
  std::vector<size_t> ends;  // ranges[i]'s subtrees end at ends[i]
  for (const Range& range : ranges) {
    SubtreesOf(range, &subtrees);
    ends.push_back(subtrees.size());
  }
  std::vector<uint64_t> indexes;
  indexes.reserve(subtrees.size());
  for (const Subtree& s : subtrees) {
    indexes.push_back(StoredHashIndex(s.level, s.index));
  }
  std::vector<MerkleHash> stored(indexes.size());
  MODELSTATE_RETURN_IF_ERROR(
      reader.ReadHashes(indexes, absl::MakeSpan(stored)));
  std::vector<MerkleHash> out;
  out.reserve(ranges.size());
  size_t begin = 0;
  for (size_t end : ends) {
    MerkleHash h = stored[end - 1];
    for (size_t i = end - 1; i > begin; --i) h = HashChildren(stored[i - 1], h);
    out.push_back(h);
    begin = end;
  }
  return out;
}

// The ranges whose MTHs form PATH(index, D[0:size]), bottom up.
// REQUIRES: index < size.
std::vector<Range> InclusionRanges(uint64_t index, uint64_t size) {
  std::vector<Range> ranges;
  uint64_t lo = 0;
  uint64_t hi = size;
  while (hi - lo > 1) {
    const uint64_t mid = lo + SplitPoint(hi - lo);
    if (index < mid) {
      ranges.push_back({mid, hi});
      hi = mid;
    } else {
      ranges.push_back({lo, mid});
      lo = mid;
    }
  }
  std::reverse(ranges.begin(), ranges.end());
  return ranges;
}

// The ranges whose MTHs form PROOF(old_size, D[0:new_size]), in proof
// order. REQUIRES: 0 < old_size < new_size.
std::vector<Range> ConsistencyRanges(uint64_t old_size, uint64_t new_size) {
  std::vector<Range> ranges;
  uint64_t lo = 0;
  uint64_t hi = new_size;
  // RFC 9162's SUBPROOF flag: true while [lo, hi) is the old tree's left
  // edge, whose hash the verifier already knows (the old root or a prefix).
  bool known = true;
  while (old_size != hi) {
    const uint64_t mid = lo + SplitPoint(hi - lo);
    if (old_size <= mid) {
      ranges.push_back({mid, hi});
      hi = mid;
    } else {
      ranges.push_back({lo, mid});
      lo = mid;
      known = false;
    }
  }
  if (!known) ranges.push_back({lo, hi});
  std::reverse(ranges.begin(), ranges.end());
  return ranges;
}

bool IsPowerOfTwo(uint64_t n) { return n != 0 && (n & (n - 1)) == 0; }

// Shifts fn and sn right until fn's lowest bit is set or fn is 0.
void ShiftWhileEven(uint64_t& fn, uint64_t& sn) {
  while (fn != 0 && (fn & 1) == 0) {
    fn >>= 1;
    sn >>= 1;
  }
}

absl::Status CheckLeafIndex(uint64_t index, uint64_t size) {
  if (index < size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("leaf index ", index, " is not below the tree size ", size));
}

absl::Status CheckSizeOrder(uint64_t old_size, uint64_t new_size) {
  if (old_size <= new_size) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("old tree size ", old_size,
                   " is larger than the new tree size ", new_size));
}

}  // namespace

// ------------------------------------------------------------- hashing --

MerkleHash HashLeaf(absl::string_view record) {
  static constexpr char kLeafPrefix[1] = {0x00};
  return Sha256Of(absl::string_view(kLeafPrefix, 1), record);
}

MerkleHash HashChildren(const MerkleHash& left, const MerkleHash& right) {
  static constexpr char kNodePrefix[1] = {0x01};
  return Sha256Of(absl::string_view(kNodePrefix, 1), Bytes(left), Bytes(right));
}

MerkleHash EmptyTreeHash() { return Sha256Of(absl::string_view()); }

std::string MerkleHashHex(const MerkleHash& hash) {
  return absl::BytesToHexString(Bytes(hash));
}

absl::StatusOr<MerkleHash> MerkleHashFromBytes(absl::string_view bytes,
                                               absl::string_view what) {
  MerkleHash h;
  if (bytes.size() != h.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " is ", bytes.size(), " bytes long; a hash is ", h.size()));
  }
  std::memcpy(h.data(), bytes.data(), h.size());
  return h;
}

// ------------------------------------------------------ storage layout --

uint64_t StoredHashCount(uint64_t size) {
  // Leaf j stores its own hash plus one per subtree it completes (the
  // trailing one bits of j); summed over j < size that is
  // size + (size - popcount(size)).
  return 2 * size - static_cast<uint64_t>(std::popcount(size));
}

uint64_t StoredHashIndex(int level, uint64_t index) {
  // The subtree completes with its last leaf, whose group of hashes starts
  // after all earlier groups and holds level 0, 1, 2, ... in order.
  const uint64_t last_leaf = ((index + 1) << level) - 1;
  return StoredHashCount(last_leaf) + static_cast<uint64_t>(level);
}

uint64_t TreeSizeForStoredHashCount(uint64_t count) {
  // StoredHashCount is strictly increasing and StoredHashCount(n) >= n.
  uint64_t lo = 0;
  uint64_t hi = count;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo + 1) / 2;
    if (StoredHashCount(mid) <= count) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ------------------------------------------------------------ frontier --

std::vector<uint64_t> MerkleFrontier::StoredIndexes(uint64_t size) {
  std::vector<Subtree> subtrees;
  SubtreesOf({0, size}, &subtrees);
  std::vector<uint64_t> indexes;
  for (const Subtree& s : subtrees) {
    indexes.push_back(StoredHashIndex(s.level, s.index));
  }
  return indexes;
}

absl::StatusOr<MerkleFrontier> MerkleFrontier::FromStoredHashes(
    uint64_t size, std::vector<MerkleHash> hashes) {
  const size_t want = static_cast<size_t>(std::popcount(size));
  if (hashes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("the frontier of a tree of ", size, " leaves has ", want,
                     " hashes, not ", hashes.size()));
  }
  MerkleFrontier frontier;
  frontier.size_ = size;
  frontier.roots_ = std::move(hashes);
  return frontier;
}

void MerkleFrontier::Append(const MerkleHash& leaf_hash,
                            std::vector<MerkleHash>* stored) {
  MerkleHash h = leaf_hash;
  stored->push_back(h);
  // The new leaf completes one subtree per trailing one bit of the old
  // size; each merges the frontier's smallest subtree with the hash so far.
  for (uint64_t n = size_; (n & 1) != 0; n >>= 1) {
    h = HashChildren(roots_.back(), h);
    roots_.pop_back();
    stored->push_back(h);
  }
  roots_.push_back(h);
  ++size_;
}

MerkleHash MerkleFrontier::Root() const {
  if (roots_.empty()) return EmptyTreeHash();
  MerkleHash h = roots_.back();
  for (size_t i = roots_.size() - 1; i > 0; --i) {
    h = HashChildren(roots_[i - 1], h);
  }
  return h;
}

// ------------------------------------------------------ roots and proofs --

absl::StatusOr<MerkleHash> RootHash(uint64_t size, const HashReader& reader) {
  if (size == 0) return EmptyTreeHash();
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<MerkleHash> hashes,
                              RangeHashes({Range{0, size}}, reader));
  return hashes[0];
}

absl::StatusOr<std::vector<MerkleHash>> InclusionProof(
    uint64_t index, uint64_t size, const HashReader& reader) {
  MODELSTATE_RETURN_IF_ERROR(CheckLeafIndex(index, size));
  return RangeHashes(InclusionRanges(index, size), reader);
}

absl::StatusOr<std::vector<MerkleHash>> ConsistencyProof(
    uint64_t old_size, uint64_t new_size, const HashReader& reader) {
  MODELSTATE_RETURN_IF_ERROR(CheckSizeOrder(old_size, new_size));
  if (old_size == 0 || old_size == new_size) {
    // Nothing to prove, but the new tree must exist.
    MODELSTATE_RETURN_IF_ERROR(RootHash(new_size, reader).status());
    return std::vector<MerkleHash>();
  }
  return RangeHashes(ConsistencyRanges(old_size, new_size), reader);
}

absl::Status VerifyInclusion(const MerkleHash& leaf_hash, uint64_t index,
                             uint64_t size, const MerkleHash& root,
                             absl::Span<const MerkleHash> proof) {
  MODELSTATE_RETURN_IF_ERROR(CheckLeafIndex(index, size));
  const size_t want = InclusionRanges(index, size).size();
  if (proof.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("inclusion proof has ", proof.size(), " hashes; leaf ",
                     index, " in a tree of ", size, " needs ", want));
  }
  // RFC 9162 section 2.1.3.2.
  uint64_t fn = index;
  uint64_t sn = size - 1;
  MerkleHash r = leaf_hash;
  for (const MerkleHash& p : proof) {
    if (sn == 0) break;  // the length check above makes this unreachable
    if ((fn & 1) != 0 || fn == sn) {
      r = HashChildren(p, r);
      ShiftWhileEven(fn, sn);
    } else {
      r = HashChildren(r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0 || r != root) {
    return absl::InvalidArgumentError(
        absl::StrCat("inclusion proof for leaf ", index, " in a tree of ", size,
                     " leads to root ", MerkleHashHex(r),
                     ", not the given root ", MerkleHashHex(root)));
  }
  return absl::OkStatus();
}

absl::Status VerifyConsistency(uint64_t old_size, uint64_t new_size,
                               const MerkleHash& old_root,
                               const MerkleHash& new_root,
                               absl::Span<const MerkleHash> proof) {
  MODELSTATE_RETURN_IF_ERROR(CheckSizeOrder(old_size, new_size));
  const std::string sizes = absl::StrCat(old_size, " to ", new_size);
  if (old_size == 0 || old_size == new_size) {
    if (!proof.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("consistency proof from ", sizes,
                       " must be empty; it has ", proof.size(), " hashes"));
    }
    const MerkleHash& want = old_size == 0 ? EmptyTreeHash() : new_root;
    if (old_root != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "old root ", MerkleHashHex(old_root), " is not the root ",
          MerkleHashHex(want), " of the tree of size ", old_size));
    }
    return absl::OkStatus();
  }
  const size_t want = ConsistencyRanges(old_size, new_size).size();
  if (proof.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("consistency proof from ",
                                                   sizes, " has ", proof.size(),
                                                   " hashes; it needs ", want));
  }
  // RFC 9162 section 2.1.4.2. When the old tree is a complete subtree its
  // root is the proof's implicit first element.
  std::vector<MerkleHash> path;
  if (IsPowerOfTwo(old_size)) path.push_back(old_root);
  path.insert(path.end(), proof.begin(), proof.end());
  uint64_t fn = old_size - 1;
  uint64_t sn = new_size - 1;
  while ((fn & 1) != 0) {
    fn >>= 1;
    sn >>= 1;
  }
  MerkleHash fr = path[0];
  MerkleHash sr = path[0];
  for (size_t i = 1; i < path.size(); ++i) {
    const MerkleHash& c = path[i];
    if (sn == 0) break;  // the length check above makes this unreachable
    if ((fn & 1) != 0 || fn == sn) {
      fr = HashChildren(c, fr);
      sr = HashChildren(c, sr);
      ShiftWhileEven(fn, sn);
    } else {
      sr = HashChildren(sr, c);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0 || fr != old_root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consistency proof from ", sizes, " leads to old root ",
        MerkleHashHex(fr), ", not the given ", MerkleHashHex(old_root)));
  }
  if (sr != new_root) {
    return absl::InvalidArgumentError(absl::StrCat(
        "consistency proof from ", sizes, " leads to new root ",
        MerkleHashHex(sr), ", not the given ", MerkleHashHex(new_root)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------- memory store --

uint64_t MemoryHashStore::size() const {
  ReaderMutexLock lock(&mu_);
  return frontier_.size();
}

absl::Status MemoryHashStore::ReadHashes(absl::Span<const uint64_t> indexes,
                                         absl::Span<MerkleHash> out) const {
  ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < indexes.size(); ++i) {
    if (indexes[i] >= hashes_.size()) {
      return absl::OutOfRangeError(absl::StrCat(
          "hash ", indexes[i], " is not stored: the tree has ",
          frontier_.size(), " leaves (", hashes_.size(), " hashes)"));
    }
    out[i] = hashes_[indexes[i]];
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> MemoryHashStore::AppendLeaves(
    absl::Span<const MerkleHash> leaf_hashes) {
  MutexLock lock(&mu_);
  const uint64_t first = frontier_.size();
  for (const MerkleHash& leaf : leaf_hashes) frontier_.Append(leaf, &hashes_);
  return first;
}

absl::Status MemoryHashStore::Truncate(uint64_t size) {
  MutexLock lock(&mu_);
  if (size > frontier_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot truncate the tree to ", size, " leaves: it has ",
                     frontier_.size()));
  }
  hashes_.resize(StoredHashCount(size));
  std::vector<MerkleHash> roots;
  for (uint64_t index : MerkleFrontier::StoredIndexes(size)) {
    roots.push_back(hashes_[index]);
  }
  MODELSTATE_ASSIGN_OR_RETURN(
      frontier_, MerkleFrontier::FromStoredHashes(size, std::move(roots)));
  return absl::OkStatus();
}

// ------------------------------------------------------------ file store --

namespace {

constexpr uint64_t kHashBytes = sizeof(MerkleHash);

// How many of the last leaves Open checks. A torn or zero-filled tail spans
// at most a few file-system blocks (128 hashes each at 4 KiB), i.e. fewer
// leaves than this.
constexpr uint64_t kRecoveryWindow = 256;

}  // namespace

absl::StatusOr<std::unique_ptr<FileHashStore>> FileHashStore::Open(
    const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, path, "cannot open the hash store");
  std::unique_ptr<FileHashStore> store(new FileHashStore(path, fd));
  MODELSTATE_RETURN_IF_ERROR(store->Recover());
  return store;
}

FileHashStore::~FileHashStore() { close(fd_); }

absl::Status FileHashStore::Recover() {
  struct stat st;
  if (fstat(fd_, &st) != 0) return ErrnoStatus(errno, path_, "cannot stat");
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  // Whole leaves only: a crash mid-append leaves part of a hash, or part of
  // a leaf's group of hashes, at the end.
  const uint64_t whole = TreeSizeForStoredHashCount(bytes / kHashBytes);
  MODELSTATE_ASSIGN_OR_RETURN(
      const uint64_t size,
      FirstUnsoundLeaf(whole,
                       whole > kRecoveryWindow ? whole - kRecoveryWindow : 0));
  dropped_leaves_ = whole - size;
  const uint64_t keep = StoredHashCount(size) * kHashBytes;
  recovered_bytes_ = bytes - keep;
  MutexLock lock(&mu_);
  MODELSTATE_RETURN_IF_ERROR(TruncateLocked(size));
  if (keep != bytes && fdatasync(fd_) != 0) {
    return ErrnoStatus(errno, path_, "sync failed");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FileHashStore::FirstUnsoundLeaf(uint64_t size,
                                                         uint64_t first) const {
  const uint64_t stored = StoredHashCount(size);
  for (uint64_t leaf = first; leaf < size; ++leaf) {
    // The leaf stored one subtree hash per trailing one bit; each must be
    // the hash of that subtree's two halves.
    for (int level = 1; ((leaf >> (level - 1)) & 1) != 0; ++level) {
      const uint64_t node = leaf >> level;
      const uint64_t indexes[3] = {StoredHashIndex(level - 1, 2 * node),
                                   StoredHashIndex(level - 1, 2 * node + 1),
                                   StoredHashIndex(level, node)};
      MerkleHash h[3];
      MODELSTATE_RETURN_IF_ERROR(
          ReadStored(stored, indexes, absl::MakeSpan(h)));
      if (HashChildren(h[0], h[1]) != h[2]) return leaf;
    }
  }
  return size;
}

uint64_t FileHashStore::size() const {
  ReaderMutexLock lock(&mu_);
  return frontier_.size();
}

absl::Status FileHashStore::ReadHashes(absl::Span<const uint64_t> indexes,
                                       absl::Span<MerkleHash> out) const {
  // The lock keeps Truncate from shrinking the file under the reads.
  ReaderMutexLock lock(&mu_);
  return ReadStored(StoredHashCount(frontier_.size()), indexes, out);
}

absl::Status FileHashStore::ReadStored(uint64_t stored,
                                       absl::Span<const uint64_t> indexes,
                                       absl::Span<MerkleHash> out) const {
  for (size_t i = 0; i < indexes.size(); ++i) {
    if (indexes[i] >= stored) {
      return absl::OutOfRangeError(absl::StrCat(
          path_, ": hash ", indexes[i], " is not stored: the tree has ",
          TreeSizeForStoredHashCount(stored), " leaves (", stored, " hashes)"));
    }
    MODELSTATE_RETURN_IF_ERROR(
        PreadAll(fd_, reinterpret_cast<char*>(out[i].data()), kHashBytes,
                 indexes[i] * kHashBytes, path_));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FileHashStore::AppendLeaves(
    absl::Span<const MerkleHash> leaf_hashes) {
  MutexLock lock(&mu_);
  const uint64_t first = frontier_.size();
  MerkleFrontier frontier = frontier_;
  std::vector<MerkleHash> added;
  added.reserve(2 * leaf_hashes.size() + 64);
  for (const MerkleHash& leaf : leaf_hashes) frontier.Append(leaf, &added);
  const uint64_t offset = StoredHashCount(first) * kHashBytes;
  absl::Status written =
      PwriteAll(fd_,
                absl::string_view(reinterpret_cast<const char*>(added.data()),
                                  added.size() * kHashBytes),
                offset, path_);
  if (!written.ok()) {
    // Take back whatever part of the write landed, so the file still ends
    // on a whole leaf.
    if (ftruncate(fd_, static_cast<off_t>(offset)) != 0) {
      return ErrnoStatus(errno, path_,
                         absl::StrCat("cannot cut back a failed append (",
                                      written.message(), ")"));
    }
    return written;
  }
  frontier_ = std::move(frontier);
  return first;
}

absl::Status FileHashStore::Truncate(uint64_t size) {
  MutexLock lock(&mu_);
  if (size > frontier_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": cannot truncate the tree to ", size,
                     " leaves: it has ", frontier_.size()));
  }
  return TruncateLocked(size);
}

absl::Status FileHashStore::TruncateLocked(uint64_t size) {
  const uint64_t stored = StoredHashCount(size);
  if (ftruncate(fd_, static_cast<off_t>(stored * kHashBytes)) != 0) {
    return ErrnoStatus(errno, path_, "truncate failed");
  }
  const std::vector<uint64_t> indexes = MerkleFrontier::StoredIndexes(size);
  std::vector<MerkleHash> roots(indexes.size());
  MODELSTATE_RETURN_IF_ERROR(
      ReadStored(stored, indexes, absl::MakeSpan(roots)));
  MODELSTATE_ASSIGN_OR_RETURN(
      frontier_, MerkleFrontier::FromStoredHashes(size, std::move(roots)));
  return absl::OkStatus();
}

absl::Status FileHashStore::Sync() {
  if (fdatasync(fd_) != 0) return ErrnoStatus(errno, path_, "sync failed");
  return absl::OkStatus();
}

}  // namespace modelstate
