// tlog_bench: the transparency-log primitives at audit-log scale.
//
//   BM_FileStoreAppend/<sync every>  leaf hash + append of a 256-byte
//                                    record into a FileHashStore, with an
//                                    fdatasync every N appends (0: never)
//   BM_InclusionProof/<leaves>       proof for a random leaf in the full
//                                    tree, read from the file store
//   BM_ConsistencyProof/<leaves>     proof from a random older size
//   BM_VerifyInclusion/<leaves>      the client's side of the above
//   BM_ReopenStore/<leaves>          FileHashStore::Open of a built store
//                                    (restart cost: O(1) in the size)
//
// The stores for the proof benchmarks are built once per size in a temp
// directory ($TMPDIR or /tmp; 10^7 leaves is 640 MB) and removed at exit.
// They are read warm (the build leaves them in the page cache).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/merkle.h"
#include "benchmark/benchmark.h"

namespace modelstate {
namespace {

// A scratch directory removed (with its stores) when the program exits.
class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern =
        absl::StrCat(base != nullptr ? base : "/tmp", "/tlog_bench.XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    path_ = pattern;
  }
  ~ScratchDir() {
    for (const std::string& file : files_) unlink(file.c_str());
    rmdir(path_.c_str());
  }
  std::string File(absl::string_view name) {
    files_.push_back(absl::StrCat(path_, "/", name));
    unlink(files_.back().c_str());
    return files_.back();
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
};

// Destroyed (files removed) when the program exits.
ScratchDir& Scratch() {
  static ScratchDir dir;
  return dir;
}

std::string Record(uint64_t i) {
  std::string r = absl::StrCat("{\"seq\":", i, ",\"event\":\"register\"}");
  r.resize(256, ' ');
  return r;
}

struct BuiltStore {
  std::string path;
  std::unique_ptr<FileHashStore> store;
};

// A file store of `leaves` leaves, built on first use.
BuiltStore& Built(uint64_t leaves) {
  static auto* stores = new std::map<uint64_t, BuiltStore>;
  BuiltStore& built = (*stores)[leaves];
  if (built.store == nullptr) {
    built.path = Scratch().File(absl::StrCat(leaves, ".hashes"));
    auto& store = built.store;
    store = *FileHashStore::Open(built.path);
    std::vector<MerkleHash> batch;
    for (uint64_t i = 0; i < leaves; ++i) {
      batch.push_back(HashLeaf(Record(i)));
      if (batch.size() == 65536 || i + 1 == leaves) {
        if (!store->AppendLeaves(batch).ok()) std::abort();
        batch.clear();
      }
    }
    if (!store->Sync().ok()) std::abort();
  }
  return built;
}

FileHashStore& StoreOf(uint64_t leaves) { return *Built(leaves).store; }

void BM_FileStoreAppend(benchmark::State& state) {
  const int64_t sync_every = state.range(0);
  auto store = *FileHashStore::Open(Scratch().File("append"));
  uint64_t i = 0;
  for (auto _ : state) {
    if (!store->Append(HashLeaf(Record(i))).ok()) std::abort();
    ++i;
    if (sync_every > 0 && i % sync_every == 0 && !store->Sync().ok()) {
      std::abort();
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["leaves"] = static_cast<double>(store->size());
}
BENCHMARK(BM_FileStoreAppend)->Arg(0)->Arg(1000)->Arg(1)->UseRealTime();

void BM_InclusionProof(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  FileHashStore& store = StoreOf(n);
  std::mt19937_64 random(1);
  for (auto _ : state) {
    auto proof = InclusionProof(random() % n, n, store);
    if (!proof.ok()) std::abort();
    benchmark::DoNotOptimize(proof);
  }
}
BENCHMARK(BM_InclusionProof)
    ->Arg(1 << 20)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMicrosecond);

void BM_ConsistencyProof(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  FileHashStore& store = StoreOf(n);
  std::mt19937_64 random(2);
  for (auto _ : state) {
    auto proof = ConsistencyProof(1 + random() % (n - 1), n, store);
    if (!proof.ok()) std::abort();
    benchmark::DoNotOptimize(proof);
  }
}
BENCHMARK(BM_ConsistencyProof)
    ->Arg(1 << 20)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMicrosecond);

void BM_VerifyInclusion(benchmark::State& state) {
  const uint64_t n = static_cast<uint64_t>(state.range(0));
  FileHashStore& store = StoreOf(n);
  const MerkleHash root = *RootHash(n, store);
  const uint64_t m = n / 3;
  const std::vector<MerkleHash> proof = *InclusionProof(m, n, store);
  const MerkleHash leaf = HashLeaf(Record(m));
  for (auto _ : state) {
    if (!VerifyInclusion(leaf, m, n, root, proof).ok()) std::abort();
  }
}
BENCHMARK(BM_VerifyInclusion)->Arg(10'000'000)->Unit(benchmark::kMicrosecond);

void BM_ReopenStore(benchmark::State& state) {
  const std::string& path = Built(static_cast<uint64_t>(state.range(0))).path;
  for (auto _ : state) {
    auto store = FileHashStore::Open(path);
    if (!store.ok()) std::abort();
    benchmark::DoNotOptimize(store);
  }
}
BENCHMARK(BM_ReopenStore)
    ->Arg(1 << 20)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace modelstate

BENCHMARK_MAIN();
