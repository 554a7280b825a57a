#include "base/merkle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace modelstate {
namespace {

using ::modelstate::testing::IsOk;
using ::modelstate::testing::StatusIs;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

MerkleHash FromHex(absl::string_view hex) {
  absl::StatusOr<MerkleHash> h =
      MerkleHashFromBytes(absl::HexStringToBytes(hex), "test vector");
  EXPECT_THAT(h, IsOk());
  return h.ok() ? *h : MerkleHash{};
}

std::vector<MerkleHash> FromHex(const std::vector<std::string>& hexes) {
  std::vector<MerkleHash> out;
  for (const std::string& hex : hexes) out.push_back(FromHex(hex));
  return out;
}

// The RFC 6962 test vectors of the Certificate Transparency projects
// (transparency-dev/merkle, testonly/constants.go): eight leaves and the
// root of every prefix, plus a few published proofs.
const std::vector<std::string>& ReferenceLeaves() {
  static const auto* leaves = new std::vector<std::string>{
      "",
      absl::HexStringToBytes("00"),
      absl::HexStringToBytes("10"),
      absl::HexStringToBytes("2021"),
      absl::HexStringToBytes("3031"),
      absl::HexStringToBytes("40414243"),
      absl::HexStringToBytes("5051525354555657"),
      absl::HexStringToBytes("606162636465666768696a6b6c6d6e6f"),
  };
  return *leaves;
}

constexpr const char* kReferenceRoots[] = {
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
};

std::unique_ptr<MemoryHashStore> StoreOf(
    const std::vector<MerkleHash>& leaves) {
  auto store = std::make_unique<MemoryHashStore>();
  for (const MerkleHash& leaf : leaves)
    EXPECT_THAT(store->Append(leaf), IsOk());
  return store;
}

std::vector<MerkleHash> TestLeaves(int n, absl::string_view salt = "leaf") {
  std::vector<MerkleHash> leaves;
  for (int i = 0; i < n; ++i) leaves.push_back(HashLeaf(absl::StrCat(salt, i)));
  return leaves;
}

// RFC 9162 section 2.1.1 word for word, over the whole leaf list: what the
// stored-hash arithmetic must agree with.
MerkleHash NaiveRoot(const std::vector<MerkleHash>& leaves, size_t lo,
                     size_t hi) {
  if (hi == lo) return EmptyTreeHash();
  if (hi - lo == 1) return leaves[lo];
  size_t k = 1;
  while (k * 2 < hi - lo) k *= 2;
  return HashChildren(NaiveRoot(leaves, lo, lo + k),
                      NaiveRoot(leaves, lo + k, hi));
}

// RFC 9162 section 2.1.3.1 PATH(m, D[lo:hi]).
void NaivePath(const std::vector<MerkleHash>& leaves, size_t m, size_t lo,
               size_t hi, std::vector<MerkleHash>* out) {
  if (hi - lo <= 1) return;
  size_t k = 1;
  while (k * 2 < hi - lo) k *= 2;
  if (m < k) {
    NaivePath(leaves, m, lo, lo + k, out);
    out->push_back(NaiveRoot(leaves, lo + k, hi));
  } else {
    NaivePath(leaves, m - k, lo + k, hi, out);
    out->push_back(NaiveRoot(leaves, lo, lo + k));
  }
}

// RFC 9162 section 2.1.4.1 SUBPROOF(m, D[lo:hi], b).
void NaiveSubproof(const std::vector<MerkleHash>& leaves, size_t m, size_t lo,
                   size_t hi, bool b, std::vector<MerkleHash>* out) {
  if (m == hi - lo) {
    if (!b) out->push_back(NaiveRoot(leaves, lo, hi));
    return;
  }
  size_t k = 1;
  while (k * 2 < hi - lo) k *= 2;
  if (m <= k) {
    NaiveSubproof(leaves, m, lo, lo + k, b, out);
    out->push_back(NaiveRoot(leaves, lo + k, hi));
  } else {
    NaiveSubproof(leaves, m - k, lo + k, hi, false, out);
    out->push_back(NaiveRoot(leaves, lo, lo + k));
  }
}

MerkleHash FlipBit(MerkleHash h, int bit) {
  h[(bit / 8) % 32] ^= static_cast<uint8_t>(1 << (bit % 8));
  return h;
}

TEST(MerkleTest, HashesMatchRfc6962Vectors) {
  std::vector<MerkleHash> leaves;
  for (const std::string& leaf : ReferenceLeaves()) {
    leaves.push_back(HashLeaf(leaf));
  }
  MemoryHashStore store;
  for (size_t n = 0; n <= leaves.size(); ++n) {
    EXPECT_THAT(RootHash(n, store), IsOk());
    EXPECT_EQ(MerkleHashHex(*RootHash(n, store)), kReferenceRoots[n])
        << "size " << n;
    if (n < leaves.size()) {
      ASSERT_THAT(store.Append(leaves[n]), IsOk());
    }
  }
  EXPECT_EQ(MerkleHashHex(EmptyTreeHash()), kReferenceRoots[0]);
  EXPECT_EQ(HashChildren(leaves[0], leaves[1]), FromHex(kReferenceRoots[2]));
}

TEST(MerkleTest, ProofsMatchPublishedVectors) {
  std::vector<MerkleHash> leaves;
  for (const std::string& leaf : ReferenceLeaves()) {
    leaves.push_back(HashLeaf(leaf));
  }
  std::unique_ptr<MemoryHashStore> store = StoreOf(leaves);
  EXPECT_THAT(
      *InclusionProof(0, 8, *store),
      ElementsAreArray(FromHex(
          {"96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
           "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
           "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e"
           "4"})));
  EXPECT_THAT(
      *InclusionProof(5, 8, *store),
      ElementsAreArray(FromHex(
          {"bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
           "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
           "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b"
           "7"})));
  EXPECT_THAT(
      *ConsistencyProof(2, 8, *store),
      ElementsAreArray(FromHex(
          {"5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
           "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e"
           "4"})));
  EXPECT_THAT(
      *ConsistencyProof(6, 8, *store),
      ElementsAreArray(FromHex(
          {"0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
           "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
           "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b"
           "7"})));
  EXPECT_THAT(
      *ConsistencyProof(2, 5, *store),
      ElementsAreArray(FromHex(
          {"5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
           "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6"
           "b"})));
}

TEST(MerkleTest, StoredHashIndexesAreDenseAndInCompletionOrder) {
  // Every complete subtree of a tree of n leaves has its own slot, and the
  // slots are exactly 0 .. StoredHashCount(n) - 1.
  for (uint64_t n = 0; n <= 300; ++n) {
    std::set<uint64_t> seen;
    for (int level = 0; (uint64_t{1} << level) <= n; ++level) {
      for (uint64_t i = 0; ((i + 1) << level) <= n; ++i) {
        EXPECT_TRUE(seen.insert(StoredHashIndex(level, i)).second)
            << "level " << level << " index " << i;
      }
    }
    EXPECT_EQ(seen.size(), StoredHashCount(n));
    if (!seen.empty()) {
      EXPECT_EQ(*seen.rbegin(), StoredHashCount(n) - 1);
    }
    EXPECT_EQ(TreeSizeForStoredHashCount(StoredHashCount(n)), n);
  }
  // A count inside a leaf's group belongs to the tree before that leaf.
  EXPECT_EQ(StoredHashCount(4), 7u);
  EXPECT_EQ(TreeSizeForStoredHashCount(6), 3u);
  EXPECT_EQ(StoredHashIndex(0, 3), 4u);
  EXPECT_EQ(StoredHashIndex(2, 0), 6u);
  EXPECT_EQ(StoredHashCount(10'000'000), 20'000'000u - 8);
}

TEST(MerkleTest, RootsAndProofsMatchTheRfcDefinitionUpTo64Leaves) {
  const std::vector<MerkleHash> leaves = TestLeaves(64);
  MemoryHashStore store;
  MerkleFrontier frontier;
  std::vector<MerkleHash> sink;
  for (size_t n = 0; n <= leaves.size(); ++n) {
    const MerkleHash root = NaiveRoot(leaves, 0, n);
    ASSERT_THAT(RootHash(n, store), IsOk());
    EXPECT_EQ(*RootHash(n, store), root) << n;
    EXPECT_EQ(frontier.Root(), root) << n;
    for (size_t m = 0; m < n; ++m) {
      std::vector<MerkleHash> want;
      NaivePath(leaves, m, 0, n, &want);
      EXPECT_THAT(*InclusionProof(m, n, store), ElementsAreArray(want))
          << m << " in " << n;
    }
    for (size_t m = 1; m < n; ++m) {
      std::vector<MerkleHash> want;
      NaiveSubproof(leaves, m, 0, n, true, &want);
      EXPECT_THAT(*ConsistencyProof(m, n, store), ElementsAreArray(want))
          << m << " to " << n;
    }
    if (n < leaves.size()) {
      ASSERT_THAT(store.Append(leaves[n]), IsOk());
      frontier.Append(leaves[n], &sink);
    }
  }
  EXPECT_EQ(sink.size(), StoredHashCount(64));
}

TEST(MerkleTest, EveryInclusionProofVerifiesAndNoAlteredOneDoes) {
  const std::vector<MerkleHash> leaves = TestLeaves(64);
  std::unique_ptr<MemoryHashStore> store = StoreOf(leaves);
  std::vector<MerkleHash> roots;
  for (uint64_t n = 0; n <= 64; ++n) roots.push_back(*RootHash(n, *store));
  int bit = 0;
  for (uint64_t n = 1; n <= 64; ++n) {
    const MerkleHash& root = roots[n];
    for (uint64_t m = 0; m < n; ++m) {
      const std::vector<MerkleHash> proof = *InclusionProof(m, n, *store);
      ASSERT_THAT(VerifyInclusion(leaves[m], m, n, root, proof), IsOk())
          << m << " in " << n;
      // One flipped bit anywhere: in each proof hash, the leaf, the root.
      for (size_t i = 0; i < proof.size(); ++i) {
        std::vector<MerkleHash> bad = proof;
        bad[i] = FlipBit(bad[i], bit++);
        EXPECT_THAT(VerifyInclusion(leaves[m], m, n, root, bad),
                    StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("leads to root")));
      }
      EXPECT_THAT(VerifyInclusion(FlipBit(leaves[m], bit++), m, n, root, proof),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      EXPECT_THAT(VerifyInclusion(leaves[m], m, n, FlipBit(root, bit++), proof),
                  StatusIs(absl::StatusCode::kInvalidArgument));
      // Any other index fails too.
      for (uint64_t other = 0; other < n; ++other) {
        if (other == m) continue;
        EXPECT_THAT(VerifyInclusion(leaves[m], other, n, root, proof),
                    StatusIs(absl::StatusCode::kInvalidArgument))
            << m << " as " << other << " in " << n;
      }
      // So does any other tree (size and its root: a checkpoint signs the
      // two together), unless its proof for this leaf is the same hashes.
      for (uint64_t other = m + 1; other <= 64; ++other) {
        if (*InclusionProof(m, other, *store) == proof) continue;
        EXPECT_THAT(VerifyInclusion(leaves[m], m, other, roots[other], proof),
                    StatusIs(absl::StatusCode::kInvalidArgument))
            << m << " in " << n << " as " << other;
      }
      // A proof one hash short or long.
      if (!proof.empty()) {
        std::vector<MerkleHash> shorter(proof.begin(), proof.end() - 1);
        EXPECT_THAT(
            VerifyInclusion(leaves[m], m, n, root, shorter),
            StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs")));
      }
      std::vector<MerkleHash> longer = proof;
      longer.push_back(root);
      EXPECT_THAT(VerifyInclusion(leaves[m], m, n, root, longer),
                  StatusIs(absl::StatusCode::kInvalidArgument));
    }
  }
}

TEST(MerkleTest, EveryConsistencyProofVerifiesAndNoAlteredOneDoes) {
  const std::vector<MerkleHash> leaves = TestLeaves(64);
  std::unique_ptr<MemoryHashStore> store = StoreOf(leaves);
  std::vector<MerkleHash> roots;
  for (uint64_t n = 0; n <= 64; ++n) roots.push_back(*RootHash(n, *store));
  int bit = 0;
  for (uint64_t n = 0; n <= 64; ++n) {
    for (uint64_t m = 0; m <= n; ++m) {
      const std::vector<MerkleHash> proof = *ConsistencyProof(m, n, *store);
      ASSERT_THAT(VerifyConsistency(m, n, roots[m], roots[n], proof), IsOk())
          << m << " to " << n;
      for (size_t i = 0; i < proof.size(); ++i) {
        std::vector<MerkleHash> bad = proof;
        bad[i] = FlipBit(bad[i], bit++);
        EXPECT_THAT(VerifyConsistency(m, n, roots[m], roots[n], bad),
                    StatusIs(absl::StatusCode::kInvalidArgument))
            << m << " to " << n << " hash " << i;
      }
      EXPECT_THAT(
          VerifyConsistency(m, n, FlipBit(roots[m], bit++), roots[n], proof),
          StatusIs(absl::StatusCode::kInvalidArgument));
      if (m > 0) {
        EXPECT_THAT(
            VerifyConsistency(m, n, roots[m], FlipBit(roots[n], bit++), proof),
            StatusIs(absl::StatusCode::kInvalidArgument));
      }
      // The same proof for other sizes: it must not verify.
      for (uint64_t other = 1; other < n; ++other) {
        if (other == m) continue;
        EXPECT_THAT(VerifyConsistency(other, n, roots[other], roots[n], proof),
                    StatusIs(absl::StatusCode::kInvalidArgument))
            << m << " as " << other << " to " << n;
      }
    }
  }
}

TEST(MerkleTest, BadArgumentsAreNamed) {
  std::unique_ptr<MemoryHashStore> store = StoreOf(TestLeaves(8));
  EXPECT_THAT(InclusionProof(8, 8, *store),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("leaf index 8 is not below the tree size 8")));
  EXPECT_THAT(InclusionProof(3, 9, *store),
              StatusIs(absl::StatusCode::kOutOfRange,
                       HasSubstr("the tree has 8 leaves")));
  EXPECT_THAT(RootHash(9, *store), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ConsistencyProof(5, 3, *store),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("old tree size 5 is larger than the new "
                                 "tree size 3")));
  EXPECT_THAT(ConsistencyProof(3, 9, *store),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ConsistencyProof(9, 9, *store),
              StatusIs(absl::StatusCode::kOutOfRange));
  // Sizes whose stored-hash indexes would not fit in 64 bits.
  for (uint64_t huge : {kMaxStoredTreeSize + 1, ~uint64_t{0}}) {
    EXPECT_THAT(RootHash(huge, *store),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("2^62")));
    EXPECT_THAT(InclusionProof(0, huge, *store),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("2^62")));
    EXPECT_THAT(ConsistencyProof(1, huge, *store),
                StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("2^62")));
  }
  const MerkleHash root = *RootHash(8, *store);
  EXPECT_THAT(
      VerifyInclusion(root, 8, 8, root, {}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("leaf index 8")));
  EXPECT_THAT(VerifyConsistency(8, 4, root, root, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("old tree size 8")));
  EXPECT_THAT(VerifyConsistency(0, 8, root, root, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("of the tree of size 0")));
  EXPECT_THAT(
      VerifyConsistency(0, 8, EmptyTreeHash(), root, {root}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be empty")));
  EXPECT_THAT(MerkleHashFromBytes("short", "root hash"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("root hash is 5 bytes long")));
  EXPECT_THAT(store->Truncate(9), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MerkleFrontier::FromStoredHashes(3, {root}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(MerkleTest, MemoryStoreTruncatesAndGrowsAgain) {
  const std::vector<MerkleHash> leaves = TestLeaves(40);
  std::unique_ptr<MemoryHashStore> store = StoreOf(leaves);
  const MerkleHash root23 = *RootHash(23, *store);
  ASSERT_THAT(store->Truncate(23), IsOk());
  EXPECT_EQ(store->size(), 23u);
  EXPECT_THAT(RootHash(24, *store), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(*RootHash(23, *store), root23);
  ASSERT_THAT(store->AppendLeaves(absl::MakeConstSpan(leaves).subspan(23)),
              IsOk());
  EXPECT_EQ(*RootHash(40, *store), NaiveRoot(leaves, 0, 40));
}

// A fresh directory under TEST_TMPDIR (or /tmp), removed afterwards.
class FileHashStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/merkle_test.XXXXXX");
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    path_ = dir_ + "/tree.hashes";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  uint64_t FileSize() {
    struct stat st;
    EXPECT_EQ(stat(path_.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_size);
  }
  void AppendRawBytes(absl::string_view bytes) {
    int fd = open(path_.c_str(), O_WRONLY | O_APPEND);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, bytes.data(), bytes.size()),
              static_cast<ssize_t>(bytes.size()));
    close(fd);
  }

  std::string dir_;
  std::string path_;
};

TEST_F(FileHashStoreTest, SurvivesReopen) {
  const std::vector<MerkleHash> leaves = TestLeaves(100);
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ((*store)->size(), 0u);
    for (int i = 0; i < 60; ++i)
      ASSERT_THAT((*store)->Append(leaves[i]), IsOk());
    ASSERT_THAT((*store)->AppendLeaves(absl::MakeConstSpan(leaves).subspan(60)),
                IsOk());
    ASSERT_THAT((*store)->Sync(), IsOk());
  }
  EXPECT_EQ(FileSize(), StoredHashCount(100) * 32);
  auto store = FileHashStore::Open(path_);
  ASSERT_THAT(store, IsOk());
  EXPECT_EQ((*store)->size(), 100u);
  EXPECT_EQ((*store)->recovered_bytes(), 0u);
  std::unique_ptr<MemoryHashStore> memory = StoreOf(leaves);
  for (uint64_t n : {1, 37, 64, 99, 100}) {
    EXPECT_EQ(*RootHash(n, **store), *RootHash(n, *memory)) << n;
    EXPECT_EQ(*InclusionProof(n / 2, n, **store),
              *InclusionProof(n / 2, n, *memory));
    EXPECT_EQ(*ConsistencyProof(n / 3, n, **store),
              *ConsistencyProof(n / 3, n, *memory));
  }
  // The frontier rebuilt on open appends exactly as before.
  ASSERT_THAT((*store)->Append(HashLeaf("more")), IsOk());
  ASSERT_THAT(memory->Append(HashLeaf("more")), IsOk());
  EXPECT_EQ(*RootHash(101, **store), *RootHash(101, *memory));
}

TEST_F(FileHashStoreTest, TornTailIsCutBackToWholeLeaves) {
  const std::vector<MerkleHash> leaves = TestLeaves(21);
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT(store, IsOk());
    ASSERT_THAT((*store)->AppendLeaves(leaves), IsOk());
  }
  // Part of a hash.
  AppendRawBytes("seventeen bytes!!");
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT(store, IsOk());
    EXPECT_EQ((*store)->size(), 21u);
    EXPECT_EQ((*store)->recovered_bytes(), 17u);
    EXPECT_EQ(FileSize(), StoredHashCount(21) * 32);
  }
  // Leaf 23 completes three subtrees: a crash after writing its leaf hash
  // and the first of its subtree hashes leaves the file inside its group.
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT((*store)->AppendLeaves(TestLeaves(3, "more")), IsOk());
  }
  ASSERT_EQ(truncate(path_.c_str(),
                     static_cast<off_t>((StoredHashCount(23) + 2) * 32)),
            0);
  auto store = FileHashStore::Open(path_);
  ASSERT_THAT(store, IsOk());
  EXPECT_EQ((*store)->size(), 23u);
  EXPECT_EQ((*store)->recovered_bytes(), 64u);
  std::vector<MerkleHash> all = leaves;
  for (const MerkleHash& h : TestLeaves(2, "more")) all.push_back(h);
  EXPECT_EQ(*RootHash(23, **store), NaiveRoot(all, 0, 23));
}

TEST_F(FileHashStoreTest, ZeroFilledTailIsDetectedAndDropped) {
  const std::vector<MerkleHash> leaves = TestLeaves(16);
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT((*store)->AppendLeaves(leaves), IsOk());
  }
  // What a file system may show after a crash: the size grew, the data of
  // leaves 16..19 never arrived. Leaf 17's and 19's subtree hashes cannot
  // be the hashes of zeros.
  AppendRawBytes(
      std::string((StoredHashCount(20) - StoredHashCount(16)) * 32, '\0'));
  auto store = FileHashStore::Open(path_);
  ASSERT_THAT(store, IsOk());
  EXPECT_EQ((*store)->size(), 17u);  // leaf 16 alone cannot be checked
  EXPECT_EQ((*store)->dropped_leaves(), 3u);
  EXPECT_EQ(*RootHash(16, **store), NaiveRoot(leaves, 0, 16));
  // The log above cuts what its records do not back, and appends again.
  ASSERT_THAT((*store)->Truncate(16), IsOk());
  ASSERT_THAT((*store)->Append(HashLeaf("x")), IsOk());
  std::vector<MerkleHash> all = leaves;
  all.push_back(HashLeaf("x"));
  EXPECT_EQ(*RootHash(17, **store), NaiveRoot(all, 0, 17));
}

TEST_F(FileHashStoreTest, TruncateThenReopen) {
  const std::vector<MerkleHash> leaves = TestLeaves(50);
  {
    auto store = FileHashStore::Open(path_);
    ASSERT_THAT((*store)->AppendLeaves(leaves), IsOk());
    EXPECT_THAT(
        (*store)->Truncate(51),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("it has 50")));
    ASSERT_THAT((*store)->Truncate(31), IsOk());
    EXPECT_THAT(RootHash(32, **store), StatusIs(absl::StatusCode::kOutOfRange));
    ASSERT_THAT((*store)->Sync(), IsOk());
  }
  auto store = FileHashStore::Open(path_);
  EXPECT_EQ((*store)->size(), 31u);
  EXPECT_EQ(*RootHash(31, **store), NaiveRoot(leaves, 0, 31));
}

TEST_F(FileHashStoreTest, ReadersRunWhileTheTreeGrows) {
  auto opened = FileHashStore::Open(path_);
  ASSERT_THAT(opened, IsOk());
  FileHashStore& store = **opened;
  const std::vector<MerkleHash> leaves = TestLeaves(600);
  ASSERT_THAT(store.AppendLeaves(absl::MakeConstSpan(leaves).subspan(0, 8)),
              IsOk());
  std::thread writer([&] {
    for (size_t i = 8; i < leaves.size(); ++i) {
      ASSERT_THAT(store.Append(leaves[i]), IsOk());
    }
  });
  // Every tree a reader sees is a prefix that verifies against the naive
  // root of that prefix.
  for (int round = 0; round < 200; ++round) {
    const uint64_t n = store.size();
    absl::StatusOr<MerkleHash> root = RootHash(n, store);
    ASSERT_THAT(root, IsOk());
    EXPECT_EQ(*root, NaiveRoot(leaves, 0, n));
    absl::StatusOr<std::vector<MerkleHash>> proof =
        InclusionProof(n - 1, n, store);
    ASSERT_THAT(proof, IsOk());
    EXPECT_THAT(VerifyInclusion(leaves[n - 1], n - 1, n, *root, *proof),
                IsOk());
  }
  writer.join();
  EXPECT_EQ(store.size(), leaves.size());
}

TEST_F(FileHashStoreTest, OpenNamesTheFileOnError) {
  EXPECT_THAT(FileHashStore::Open(dir_ + "/missing/dir/tree.hashes"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing/dir")));
}

}  // namespace
}  // namespace modelstate
