#include "service/audit_log.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"
#include "service/audit_index.h"
#include "service/audit_tree.h"

// What is stored and what is hashed
// ---------------------------------
// Each record is one line: the JSON object written by SerializeUnhashed()
// below (keys in the fixed order seq, time, identity, correlation_id, type,
// namespace, module, outcome, details, prev), then ',"hash":"<64 hex>"}' and
// '\n'. The hash is the lowercase hex SHA-256 of exactly the line's bytes
// with the ',"hash":"<64 hex>"' part removed, i.e. of
//   {"seq":..., ..., "prev":"<64 hex>"}
// Because the serialization is canonical (fixed key order, no whitespace,
// one escaping of each string, `details` re-dumped compactly with sorted
// keys), a record has exactly one valid line, and Verify() checks both that
// the hash matches the stored bytes and that the bytes are that one line:
// any byte change in a stored line is detected.
//
// Memory: no record is kept in memory. An SQLite index (audit_index.h)
// says where each record's line lies and finds the lines a query wants;
// they are read back from the file with pread.

namespace modelstate {
namespace {

// Formats with exactly nine fractional digits, so every time has one text.
constexpr absl::string_view kTimeFormat = "%Y-%m-%d%ET%H:%M:%E9SZ";
// Accepts any number of fractional digits; the canonical-form check in
// CheckLine() rejects anything but nine.
constexpr absl::string_view kTimeParseFormat = "%Y-%m-%d%ET%H:%M:%E*SZ";
// ',"hash":"' + 64 hex digits + '"}'
constexpr size_t kHashSuffixSize = 9 + 64 + 2;
// Deeper `details` are rejected: nlohmann's dump() recurses once per level,
// and an audit record has no use for deep nesting.
constexpr int kMaxDetailsDepth = 64;

const std::string& GenesisHash() {
  static const std::string* const kZeros = new std::string(64, '0');
  return *kZeros;
}

std::string FormatRecordTime(absl::Time t) {
  return absl::FormatTime(kTimeFormat, t, absl::UTCTimeZone());
}

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF) starting at s[i], or 0 if there is
// none. These are the same rules nlohmann's parser applies, so everything
// Serialize() writes parses again.
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  auto byte = [&](size_t k) -> unsigned {
    // 0x100 lies outside every range below, so a short sequence fails.
    return k < s.size() ? static_cast<unsigned char>(s[k]) : 0x100u;
  };
  auto in = [](unsigned b, unsigned lo, unsigned hi) {
    return b >= lo && b <= hi;
  };
  const unsigned b0 = byte(i);
  if (b0 < 0x80) return 1;
  if (in(b0, 0xC2, 0xDF)) return in(byte(i + 1), 0x80, 0xBF) ? 2 : 0;
  if (in(b0, 0xE0, 0xEF)) {
    const unsigned lo = b0 == 0xE0 ? 0xA0 : 0x80;  // no overlongs
    const unsigned hi = b0 == 0xED ? 0x9F : 0xBF;  // no surrogates
    return in(byte(i + 1), lo, hi) && in(byte(i + 2), 0x80, 0xBF) ? 3 : 0;
  }
  if (in(b0, 0xF0, 0xF4)) {
    const unsigned lo = b0 == 0xF0 ? 0x90 : 0x80;  // no overlongs
    const unsigned hi = b0 == 0xF4 ? 0x8F : 0xBF;  // <= U+10FFFF
    return in(byte(i + 1), lo, hi) && in(byte(i + 2), 0x80, 0xBF) &&
                   in(byte(i + 3), 0x80, 0xBF)
               ? 4
               : 0;
  }
  return 0;
}

// Appends `s` as a JSON string literal. Quotes and backslashes are escaped,
// \n \r \t get their short escapes, every other control character becomes
// \u00xx (lowercase hex), valid UTF-8 passes through, and each byte that is
// not part of valid UTF-8 becomes U+FFFD: the text has to be valid JSON, and
// an audit record is better kept with a replaced byte than refused.
void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8SequenceLength(s, i);
      if (n == 0) {
        out->append("\xEF\xBF\xBD");
        ++i;
      } else {
        out->append(s.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

// True if brackets nest deeper than `limit` (strings are skipped). Checked
// before parsing so that no input can make nlohmann recurse deeply.
bool NestsDeeperThan(absl::string_view text, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > limit) return true;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return false;
}

// Parses without exceptions; a discarded value means "not JSON".
nlohmann::json ParseJson(absl::string_view text, int max_depth) {
  if (NestsDeeperThan(text, max_depth)) {
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  return nlohmann::json::parse(text.begin(), text.end(), nullptr,
                               /*allow_exceptions=*/false);
}

// The compact dump: no whitespace, object keys sorted (nlohmann's object is
// a std::map), so equivalent inputs give the same bytes.
std::string DumpCompact(const nlohmann::json& j) {
  return j.dump(-1, ' ', /*ensure_ascii=*/false,
                nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<std::string> CanonicalDetails(absl::string_view text) {
  // The details are one level below the record.
  nlohmann::json j = ParseJson(text, kMaxDetailsDepth);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat("details_json is not valid JSON (or nests deeper than ",
                     kMaxDetailsDepth, " levels)"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "details_json must be a JSON object, not ", j.type_name()));
  }
  return DumpCompact(j);
}

// The record's line up to and including "prev", without the closing brace;
// `details` must already be canonical.
std::string SerializeUnhashed(const AuditRecord& r, absl::string_view details) {
  std::string out;
  out.reserve(200 + r.identity.size() + r.correlation_id.size() +
              r.type.size() + r.ns.size() + r.module.size() + r.outcome.size() +
              details.size() + r.prev.size());
  absl::StrAppend(&out, "{\"seq\":", r.seq, ",\"time\":\"",
                  FormatRecordTime(r.time), "\",\"identity\":");
  AppendJsonString(r.identity, &out);
  out.append(",\"correlation_id\":");
  AppendJsonString(r.correlation_id, &out);
  out.append(",\"type\":");
  AppendJsonString(r.type, &out);
  out.append(",\"namespace\":");
  AppendJsonString(r.ns, &out);
  out.append(",\"module\":");
  AppendJsonString(r.module, &out);
  out.append(",\"outcome\":");
  AppendJsonString(r.outcome, &out);
  out.append(",\"details\":");
  out.append(details.data(), details.size());
  out.append(",\"prev\":");
  AppendJsonString(r.prev, &out);
  return out;
}

// SHA-256 of the record without its hash field: `unhashed` closed by '}'.
std::string HashUnhashed(absl::string_view unhashed) {
  Sha256 h;
  h.Update(unhashed);
  h.Update("}");
  return h.FinishHex();
}

void AppendHashField(absl::string_view hash, std::string* line) {
  line->append(",\"hash\":");
  AppendJsonString(hash, line);
  line->push_back('}');
}

constexpr const char* kRecordKeys[] = {
    "seq",    "time",    "identity", "correlation_id", "type", "namespace",
    "module", "outcome", "details",  "prev",           "hash"};

absl::StatusOr<AuditRecord> RecordFromJson(const nlohmann::json& j) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a JSON object but ", j.type_name()));
  }
  for (const auto& item : j.items()) {
    if (std::find(std::begin(kRecordKeys), std::end(kRecordKeys), item.key()) ==
        std::end(kRecordKeys)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected key \"", item.key(), "\""));
    }
  }
  for (const char* key : kRecordKeys) {
    if (!j.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing key \"", key, "\""));
    }
  }
  AuditRecord r;
  const nlohmann::json& seq = j["seq"];
  if (!seq.is_number_unsigned()) {
    return absl::InvalidArgumentError("seq is not an unsigned integer");
  }
  r.seq = seq.get<uint64_t>();
  struct StringField {
    const char* key;
    std::string* target;
  };
  std::string time_text;
  for (const StringField& f :
       {StringField{"time", &time_text}, StringField{"identity", &r.identity},
        StringField{"correlation_id", &r.correlation_id},
        StringField{"type", &r.type}, StringField{"namespace", &r.ns},
        StringField{"module", &r.module}, StringField{"outcome", &r.outcome},
        StringField{"prev", &r.prev}, StringField{"hash", &r.hash}}) {
    const nlohmann::json& v = j[f.key];
    if (!v.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f.key, " is not a string"));
    }
    *f.target = v.get<std::string>();
  }
  std::string error;
  if (!absl::ParseTime(kTimeParseFormat, time_text, absl::UTCTimeZone(),
                       &r.time, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("time \"", time_text, "\" is not RFC 3339 UTC: ", error));
  }
  const nlohmann::json& details = j["details"];
  if (!details.is_object()) {
    return absl::InvalidArgumentError("details is not a JSON object");
  }
  r.details_json = DumpCompact(details);
  if (!IsSha256Hex(r.prev)) {
    return absl::InvalidArgumentError("prev is not 64 lowercase hex digits");
  }
  if (!IsSha256Hex(r.hash)) {
    return absl::InvalidArgumentError("hash is not 64 lowercase hex digits");
  }
  return r;
}

// Where the chain stands after the records read so far.
struct ChainEnd {
  uint64_t seq = 0;
  std::string hash = GenesisHash();
  absl::Time time = absl::UnixEpoch();
};

struct LineProblem {
  std::string text;  // empty: the line is a valid next record
  uint64_t seq = 0;  // the seq written in the line, if it has one
  bool not_json = false;
};

// Checks that `line` is the record that validly follows `end`, in this
// order: it is a record, its seq is the next one, its prev is the previous
// hash, its hash matches its bytes, and its bytes are the canonical line.
LineProblem CheckLine(absl::string_view line, const ChainEnd& end,
                      AuditRecord* record) {
  LineProblem p;
  // Records nest one level more than their details.
  nlohmann::json j = ParseJson(line, kMaxDetailsDepth + 1);
  if (j.is_discarded()) {
    p.not_json = true;
    p.text = line.empty() ? "line is not a valid record: empty line"
                          : "line is not a valid record: not valid JSON";
    return p;
  }
  if (j.is_object() && j.contains("seq") && j["seq"].is_number_unsigned()) {
    p.seq = j["seq"].get<uint64_t>();
  }
  absl::StatusOr<AuditRecord> parsed = RecordFromJson(j);
  if (!parsed.ok()) {
    p.text =
        absl::StrCat("line is not a valid record: ", parsed.status().message());
    return p;
  }
  AuditRecord& r = *parsed;
  if (r.seq != end.seq + 1) {
    if (end.seq == 0) {
      p.text = absl::StrCat("the first record has seq ", r.seq,
                            ", not 1: records are missing at the start");
    } else if (r.seq > end.seq + 1) {
      p.text = absl::StrCat("seq ", r.seq, " follows ", end.seq,
                            ": a record is missing (or out of order)");
    } else {
      p.text = absl::StrCat("seq ", r.seq, " follows ", end.seq,
                            ": a record is duplicated or out of order");
    }
    return p;
  }
  if (r.prev != end.hash) {
    p.text =
        end.seq == 0
            ? std::string("prev of the first record is not 64 zeros")
            : absl::StrCat("prev does not match the hash of record ", end.seq);
    return p;
  }
  const std::string suffix = absl::StrCat(",\"hash\":\"", r.hash, "\"}");
  if (line.size() < kHashSuffixSize ||
      line.substr(line.size() - kHashSuffixSize) != suffix) {
    p.text = "record is not in canonical form: it does not end with its hash";
    return p;
  }
  if (HashUnhashed(line.substr(0, line.size() - kHashSuffixSize)) != r.hash) {
    p.text = "hash mismatch: record was modified";
    return p;
  }
  // r.details_json is already the compact dump, so no need to parse it
  // again as Serialize() would.
  std::string canonical = SerializeUnhashed(r, r.details_json);
  AppendHashField(r.hash, &canonical);
  if (canonical != line) {
    p.text =
        "record is not in canonical form: its bytes were rewritten (and "
        "rehashed)";
    return p;
  }
  *record = std::move(r);
  return p;
}

// Reads a file's lines in order from a byte offset, holding one chunk
// (or one line, when a line is longer) in memory.
class LineReader {
 public:
  LineReader(int fd, const std::string& path, uint64_t offset)
      : fd_(fd), path_(path), chunk_offset_(offset) {}

  // The next line without its '\n' (valid until the next call), or nullopt
  // at the end of the file. *terminated says whether it had its '\n'.
  absl::StatusOr<std::optional<absl::string_view>> Next(bool* terminated) {
    for (;;) {
      const size_t newline = chunk_.find('\n', pos_);
      if (newline != std::string::npos || eof_) {
        if (pos_ == chunk_.size()) return std::nullopt;
        const size_t end =
            newline != std::string::npos ? newline : chunk_.size();
        line_offset_ = chunk_offset_ + pos_;
        absl::string_view line(chunk_.data() + pos_, end - pos_);
        *terminated = newline != std::string::npos;
        pos_ = *terminated ? end + 1 : end;
        return line;
      }
      MODELSTATE_RETURN_IF_ERROR(ReadMore());
    }
  }
  // Where the line Next last returned starts in the file.
  uint64_t line_offset() const { return line_offset_; }

 private:
  static constexpr size_t kChunk = size_t{1} << 20;

  absl::Status ReadMore() {
    chunk_.erase(0, pos_);
    chunk_offset_ += pos_;
    pos_ = 0;
    const size_t have = chunk_.size();
    chunk_.resize(have + kChunk);
    ssize_t n;
    do {
      n = ::pread(fd_, chunk_.data() + have, kChunk,
                  static_cast<off_t>(chunk_offset_ + have));
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      chunk_.resize(have);
      return ErrnoStatus(errno, path_, "cannot read the audit log");
    }
    chunk_.resize(have + static_cast<size_t>(n));
    eof_ = n == 0;
    return absl::OkStatus();
  }

  const int fd_;
  const std::string& path_;
  std::string chunk_;
  uint64_t chunk_offset_;  // where chunk_[0] lies in the file
  size_t pos_ = 0;         // the first byte of chunk_ not yet returned
  uint64_t line_offset_ = 0;
  bool eof_ = false;
};

struct ChainWalk {
  AuditVerification verification;
  ChainEnd end;
  // Bytes of the file taken up by valid records (with their newlines).
  uint64_t valid_bytes = 0;
  // The break is a final line without '\n' that is not even JSON: a write
  // cut short by a crash.
  bool torn_tail = false;
  // The file ends in a valid record that lacks its '\n'.
  bool unterminated = false;
};

// Called for each valid record with its line (without '\n') and where the
// line starts in the file; an error stops the walk.
using RecordVisitor = absl::FunctionRef<absl::Status(
    const AuditRecord& record, absl::string_view line, uint64_t offset)>;

// Reads the file line by line until the end or the first break, showing
// each valid record to `visit`. The reader starts at the beginning of the
// file, or right after the record `start` (the reader's offset is then
// `start_offset`), whose successors are checked against it.
absl::StatusOr<ChainWalk> WalkChain(LineReader& reader, RecordVisitor visit,
                                    ChainEnd start = {},
                                    uint64_t start_offset = 0) {
  ChainWalk w;
  w.end = std::move(start);
  w.verification.records = w.end.seq;
  w.valid_bytes = start_offset;
  uint64_t line_number = w.end.seq;  // one line per record
  for (;;) {
    bool terminated = false;
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<absl::string_view> line,
                                reader.Next(&terminated));
    if (!line.has_value()) return w;
    ++line_number;
    AuditRecord record;
    LineProblem problem = CheckLine(*line, w.end, &record);
    if (!problem.text.empty()) {
      w.verification.ok = false;
      w.verification.broken_seq = problem.seq;
      w.verification.broken_line = line_number;
      w.verification.problem = std::move(problem.text);
      w.torn_tail = !terminated && problem.not_json;
      return w;
    }
    MODELSTATE_RETURN_IF_ERROR(visit(record, *line, reader.line_offset()));
    w.end.seq = record.seq;
    w.end.hash = record.hash;
    w.end.time = record.time;
    ++w.verification.records;
    w.valid_bytes = reader.line_offset() + line->size() + (terminated ? 1 : 0);
    w.unterminated = !terminated;
  }
}

absl::StatusOr<int> OpenForReading(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat("audit log ", path, " does not exist"));
    }
    return ErrnoStatus(errno, path, "cannot open the audit log");
  }
  return fd;
}

// What Query returns, found by reading the whole log: the slow path for
// when the index has failed. A last line without its '\n' is an append in
// progress and is skipped.
absl::StatusOr<std::vector<AuditRecord>> ScanLog(int fd,
                                                 const std::string& path,
                                                 const AuditQuery& query) {
  std::vector<AuditRecord> out;
  const size_t limit = query.EffectiveLimit();
  LineReader reader(fd, path, 0);
  for (;;) {
    bool terminated = false;
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<absl::string_view> line,
                                reader.Next(&terminated));
    if (!line.has_value() || !terminated) return out;
    absl::StatusOr<AuditRecord> r = AuditLog::Parse(std::string(*line));
    if (!r.ok()) {
      return absl::DataLossError(absl::StrCat(
          "audit log ", path, ": a line at byte ", reader.line_offset(),
          " is not a record: ", r.status().message()));
    }
    if (r->seq <= query.after_seq || !query.Matches(*r)) continue;
    out.push_back(*std::move(r));
    if (out.size() == limit) return out;
  }
}

// The lines at `where` (in seq order) parsed back into records. Adjacent
// lines are read with one pread, in runs of at most kRunBytes.
absl::StatusOr<std::vector<AuditRecord>> ReadRecords(
    int fd, const std::string& path, absl::Span<const AuditLocation> where) {
  constexpr uint64_t kRunBytes = uint64_t{4} << 20;
  std::vector<AuditRecord> out;
  out.reserve(where.size());
  std::string run;
  size_t i = 0;
  while (i < where.size()) {
    size_t j = i + 1;
    uint64_t end = where[i].offset + where[i].length + 1;
    while (j < where.size() && where[j].offset == end &&
           end + where[j].length + 1 - where[i].offset <= kRunBytes) {
      end += where[j].length + 1;
      ++j;
    }
    run.resize(end - where[i].offset);
    MODELSTATE_RETURN_IF_ERROR(
        PreadAll(fd, run.data(), run.size(), where[i].offset, path));
    for (size_t k = i; k < j; ++k) {
      const absl::string_view line(
          run.data() + (where[k].offset - where[i].offset), where[k].length);
      absl::StatusOr<AuditRecord> r = AuditLog::Parse(std::string(line));
      if (!r.ok() || r->seq != where[k].seq) {
        return absl::DataLossError(absl::StrCat(
            "audit log ", path, ": record ", where[k].seq,
            " is not where the index says; the log was changed behind the "
            "server's back (run `modelstatectl audit verify`)"));
      }
      out.push_back(*std::move(r));
    }
    i = j;
  }
  return out;
}

// Opens `path` for appending, creating it if it does not exist; *created
// says which happened (only a created file needs its directory synced).
absl::StatusOr<int> OpenOrCreate(const std::string& path, bool* created) {
  constexpr int kFlags = O_RDWR | O_APPEND | O_CLOEXEC;
  // A bounded loop: another process may create (or delete) the file between
  // the two open calls.
  for (int attempt = 0; attempt < 100; ++attempt) {
    int fd = ::open(path.c_str(), kFlags);
    if (fd >= 0) {
      *created = false;
      return fd;
    }
    if (errno == EINTR) continue;
    if (errno != ENOENT)
      return ErrnoStatus(errno, path, "cannot open the audit log");
    fd = ::open(path.c_str(), kFlags | O_CREAT | O_EXCL, 0640);
    if (fd >= 0) {
      *created = true;
      return fd;
    }
    if (errno != EEXIST && errno != EINTR) {
      return ErrnoStatus(errno, path, "cannot create the audit log");
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "cannot open audit log ", path, ": it keeps appearing and disappearing"));
}

// The checkpoint saved at `path`, with its note; nullopt when there is no
// file. Its signature is the signer's business: here it only says how much
// of the log the server once vouched for.
absl::StatusOr<std::optional<std::pair<Checkpoint, std::string>>>
ReadSavedCheckpoint(const std::string& path) {
  absl::StatusOr<std::string> note = ReadFile(path);
  if (absl::IsNotFound(note.status())) return std::nullopt;
  MODELSTATE_RETURN_IF_ERROR(note.status());
  absl::StatusOr<SignedNote> parsed = ParseSignedNote(*note);
  absl::StatusOr<Checkpoint> checkpoint =
      parsed.ok() ? ParseCheckpoint(parsed->text) : parsed.status();
  if (!checkpoint.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the last signed checkpoint ", path,
                     " is malformed: ", checkpoint.status().message()));
  }
  return std::make_pair(*std::move(checkpoint), *std::move(note));
}

// Refuses a log that the last saved checkpoint does not cover, and then
// makes the hash file match the log. The comparison comes first, while the
// hash file still holds the tree the checkpoint was signed over.
absl::Status ReconcileTree(const std::string& log_path,
                           const AuditLogOptions& options,
                           absl::Span<const MerkleHash> leaves, AuditTree& tree,
                           std::string* repair, std::string* checkpoint_note) {
  if (!options.checkpoint_path.empty()) {
    MODELSTATE_ASSIGN_OR_RETURN(auto saved,
                                ReadSavedCheckpoint(options.checkpoint_path));
    if (saved.has_value()) {
      CheckpointComparison c = CompareWithCheckpoint(
          leaves, saved->first, &tree.hashes(), tree.size());
      if (!c.ok) {
        return absl::FailedPreconditionError(
            absl::StrCat("audit log ", log_path,
                         " does not match the last checkpoint the "
                         "server signed (",
                         options.checkpoint_path, ", tree size ",
                         saved->first.size, "; the log has ", leaves.size(),
                         " records): ", c.problem, "; refusing to start"));
      }
      *checkpoint_note = std::move(saved->second);
    }
  }
  MODELSTATE_ASSIGN_OR_RETURN(*repair, tree.Reconcile(leaves));
  return absl::OkStatus();
}

// Whether the tree (trusted after a clean close) still hashes to the last
// saved checkpoint; *checkpoint_note receives the checkpoint when it does.
absl::StatusOr<bool> TreeMatchesCheckpoint(const AuditLogOptions& options,
                                           const AuditTree& tree,
                                           std::string* checkpoint_note) {
  if (options.checkpoint_path.empty()) return true;
  MODELSTATE_ASSIGN_OR_RETURN(auto saved,
                              ReadSavedCheckpoint(options.checkpoint_path));
  if (!saved.has_value()) return true;
  if (saved->first.size > tree.size()) return false;
  absl::StatusOr<MerkleHash> root = tree.Root(saved->first.size);
  if (!root.ok() || *root != saved->first.root) return false;
  *checkpoint_note = std::move(saved->second);
  return true;
}

// Ends a walk that reached the end of the log for appending: a broken
// chain is refused, a torn last line cut off (*recovered_torn_tail), a whole
// last line missing its newline completed, and the file synced.
absl::Status FinishWalk(int fd, const std::string& path, ChainWalk& walk,
                        bool* recovered_torn_tail) {
  if (!walk.verification.ok) {
    if (!walk.torn_tail) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "audit log %s is broken at line %d (seq %d): %s; refusing to "
          "continue a broken chain",
          path, walk.verification.broken_line, walk.verification.broken_seq,
          walk.verification.problem));
    }
    // A crash cut the last append short; that record was never
    // acknowledged, so dropping it loses nothing anyone was promised.
    if (::ftruncate(fd, static_cast<off_t>(walk.valid_bytes)) != 0) {
      return ErrnoStatus(errno, path, "cannot truncate the torn tail");
    }
    *recovered_torn_tail = true;
  } else if (walk.unterminated) {
    // The record is whole but its newline was not written; add it, or the
    // next record would be glued onto this line.
    size_t written = 0;
    absl::Status st = WriteAll(fd, "\n", path, &written);
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("cannot complete the last line of ", path,
                                  ": ", st.message()));
    }
    ++walk.valid_bytes;
  }
  // Whatever an earlier process wrote may still be only in the page cache;
  // one sync here lets synced_seq start at the last record.
  return Fdatasync(fd, path);
}

// What reading the whole log found besides where its chain ends.
struct WholeLogRead {
  ChainWalk walk;
  bool recovered_torn_tail = false;
  std::string tree_repair;
  std::string checkpoint_note;
  absl::Status index_error;  // the index could not be rebuilt
  // For a read of the tail only (ReadLogTail): the records read after
  // record `tail_from`.
  uint64_t tail_from = 0;
  uint64_t tail_records = 0;
};

// Reads and checks every record of the log in `fd`, rebuilds `index` from
// it, repairs a torn or unterminated last line, and reconciles `tree` with
// it (refusing a log that the last checkpoint does not cover).
absl::StatusOr<WholeLogRead> ReadWholeLog(int fd, const std::string& path,
                                          const AuditLogOptions& options,
                                          AuditIndex* index, AuditTree& tree) {
  WholeLogRead read;
  if (index == nullptr) {
    read.index_error = absl::UnavailableError("no index");
  } else {
    read.index_error = index->Clear();
  }
  std::vector<MerkleHash> leaves;
  LineReader reader(fd, path, 0);
  MODELSTATE_ASSIGN_OR_RETURN(
      read.walk,
      WalkChain(reader, [&](const AuditRecord& r, absl::string_view line,
                            uint64_t offset) {
        leaves.push_back(AuditLeafHash(line));
        if (read.index_error.ok() &&
            index->Add(r, {r.seq, offset, line.size()})) {
          read.index_error = index->Flush();
        }
        return absl::OkStatus();
      }));
  MODELSTATE_RETURN_IF_ERROR(
      FinishWalk(fd, path, read.walk, &read.recovered_torn_tail));
  if (read.index_error.ok()) read.index_error = index->Flush();
  MODELSTATE_RETURN_IF_ERROR(ReconcileTree(
      path, options, leaves, tree, &read.tree_repair, &read.checkpoint_note));
  return read;
}

}  // namespace

bool AuditQuery::Matches(const AuditRecord& r) const {
  if (since.has_value() && r.time < *since) return false;
  if (until.has_value() && r.time >= *until) return false;
  if (!ns.empty() && r.ns != ns) return false;
  if (!module.empty() && r.module != module) return false;
  if (!identity.empty() && r.identity != identity) return false;
  if (!outcome.empty() && r.outcome != outcome) return false;
  if (!type.empty() && r.type != type) return false;
  if (!correlation_id.empty() && r.correlation_id != correlation_id) {
    return false;
  }
  return true;
}

size_t AuditQuery::EffectiveLimit() const {
  if (limit == 0) return kDefaultLimit;
  return std::min(limit, kMaxLimit);
}

struct AuditLog::State {
  State(std::string p, int f) : path(std::move(p)), fd(f) {}
  ~State() { ::close(fd); }

  const std::string path;
  const int fd;  // O_APPEND; flock()ed so that no second writer forks the chain
  std::string checkpoint_path;  // constant after Open
  bool opened = false;          // Open succeeded
  // False once the index failed (it is derived data: the log goes on, and
  // queries scan the log until the next start rebuilds the index).
  mutable std::atomic<bool> index_ok{true};
  // The Merkle tree: leaf i is record i + 1's line. Appended under `mu`
  // right after the line is written; readable without `mu` (it is
  // thread-safe and only grows once Open is done).
  std::unique_ptr<AuditTree> tree;
  // Where each record's line lies. Added to under `mu` (so in seq order);
  // read without it (it has its own lock, always taken after `mu`).
  std::unique_ptr<AuditIndex> index;

  // Guards the chain: appends (the write() included, so file order is seq
  // order).
  mutable Mutex mu;
  CondVar appended;  // signalled after each append, for WaitForRecords
  uint64_t last_seq ABSL_GUARDED_BY(mu) = 0;
  std::string last_hash ABSL_GUARDED_BY(mu);
  absl::Time last_time ABSL_GUARDED_BY(mu);
  uint64_t file_size ABSL_GUARDED_BY(mu) = 0;
  // Sticky: set by the first failed write. A record that could not be
  // written means a change went unrecorded; refusing every later append
  // (and so every change, see health()) beats carrying on unaudited.
  absl::Status write_error ABSL_GUARDED_BY(mu);
  // The seqs appended so far for each call being collected (BeginCall).
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> calls
      ABSL_GUARDED_BY(mu);

  // Group commit. Separate from `mu` so that appends go on while one thread
  // is in fdatasync; never held together with `mu`.
  Mutex sync_mu;
  CondVar sync_done;
  uint64_t synced_seq ABSL_GUARDED_BY(sync_mu) = 0;
  bool sync_in_progress ABSL_GUARDED_BY(sync_mu) = false;
  // Sticky: after a failed fdatasync the kernel may have dropped the dirty
  // pages, so a later "successful" one would prove nothing.
  absl::Status sync_error ABSL_GUARDED_BY(sync_mu);
};

namespace {

absl::StatusOr<AuditFileStamp> StampOf(int fd, const std::string& path,
                                       uint64_t last_seq) {
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return ErrnoStatus(errno, path, "cannot stat the audit log");
  }
  return AuditFileStamp{static_cast<uint64_t>(st.st_size),
                        absl::ToUnixNanos(absl::TimeFromTimespec(st.st_mtim)),
                        static_cast<uint64_t>(st.st_ino), last_seq};
}

// Where the chain stood after record `seq` and where the next line starts,
// from the index's location of that record, checked against the tree's
// leaf; nullopt when the log, the index and the tree do not agree on it.
struct Anchor {
  ChainEnd end;
  uint64_t next_offset = 0;
};
absl::StatusOr<std::optional<Anchor>> AnchorAt(int fd, const std::string& path,
                                               AuditIndex& index,
                                               const AuditTree& tree,
                                               uint64_t seq) {
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<AuditLocation> where,
                              index.Locate(seq));
  if (!where.has_value() || seq > tree.size()) return std::nullopt;
  // The line and the newline after it.
  std::string line(where->length + 1, '\0');
  if (!PreadAll(fd, line.data(), line.size(), where->offset, path).ok() ||
      line.back() != '\n') {
    return std::nullopt;
  }
  line.pop_back();
  absl::StatusOr<AuditRecord> record = AuditLog::Parse(line);
  std::vector<MerkleHash> leaf(1);
  if (!record.ok() || record->seq != seq ||
      !tree.hashes()
           .ReadHashes({StoredHashIndex(0, seq - 1)}, absl::MakeSpan(leaf))
           .ok() ||
      leaf[0] != AuditLeafHash(line)) {
    return std::nullopt;
  }
  Anchor a;
  a.end.seq = seq;
  a.end.hash = record->hash;
  a.end.time = record->time;
  a.next_offset = where->offset + where->length + 1;
  return a;
}

// Where the chain ends, from the index and the tree alone, when the log
// was closed cleanly (`stamp`) and nothing has touched it since; nullopt
// (with the reason in *why) when the whole log has to be read.
absl::StatusOr<std::optional<ChainWalk>> TrustedEnd(
    int fd, const std::string& path, const AuditFileStamp& stamp,
    AuditIndex& index, AuditTree& tree, std::string* why) {
  MODELSTATE_ASSIGN_OR_RETURN(AuditFileStamp now,
                              StampOf(fd, path, stamp.last_seq));
  MODELSTATE_ASSIGN_OR_RETURN(uint64_t indexed, index.LastSeq());
  if (now != stamp || indexed != stamp.last_seq ||
      tree.size() != stamp.last_seq) {
    *why = absl::StrCat(
        "the log, its index or its tree changed since the last clean close "
        "(log ",
        now.size, " bytes, ", stamp.size, " then; ", indexed,
        " records indexed and ", tree.size(), " in the tree, ", stamp.last_seq,
        " then)");
    return std::nullopt;
  }
  ChainWalk w;
  w.valid_bytes = now.size;
  if (stamp.last_seq == 0) return w;
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<Anchor> anchor,
                              AnchorAt(fd, path, index, tree, stamp.last_seq));
  if (!anchor.has_value() || anchor->next_offset != now.size) {
    *why = "the last record does not match the tree";
    return std::nullopt;
  }
  w.end = std::move(anchor->end);
  w.verification.records = w.end.seq;
  return w;
}

// After a crash: the index commits its rows in batches and the tree gets
// each leaf right after its line is written, so both hold a prefix of the
// log, a few thousand records short at most. The records after the last one
// both hold are read, checked against the chain and the tree's leaves, and
// added to whichever lacks them; the prefix is trusted as a clean close's
// stamp would be. nullopt (with the reason in *why) when the index, the
// tree and the log disagree: Open then reads the whole log, which names
// what differs.
absl::StatusOr<std::optional<WholeLogRead>> ReadLogTail(int fd,
                                                        const std::string& path,
                                                        AuditIndex& index,
                                                        AuditTree& tree,
                                                        std::string* why) {
  MODELSTATE_ASSIGN_OR_RETURN(const uint64_t indexed, index.LastSeq());
  const uint64_t in_tree = tree.size();
  const uint64_t from = std::min(indexed, in_tree);
  if (from == 0) {
    *why =
        "the index holds no clean-close stamp and no records (a first start "
        "with an index, or a crash before the first batch was indexed)";
    return std::nullopt;
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::optional<Anchor> anchor,
                              AnchorAt(fd, path, index, tree, from));
  if (!anchor.has_value()) {
    *why = absl::StrCat("after a crash, record ", from,
                        " does not match the index and the tree");
    return std::nullopt;
  }
  WholeLogRead read;
  std::vector<MerkleHash> new_leaves;
  uint64_t differs = 0;  // the first record whose leaf the tree disagrees on
  LineReader reader(fd, path, anchor->next_offset);
  absl::StatusOr<ChainWalk> walk = WalkChain(
      reader,
      [&](const AuditRecord& r, absl::string_view line, uint64_t offset) {
        const MerkleHash leaf = AuditLeafHash(line);
        if (r.seq <= in_tree) {
          // A leaf that cannot be read or differs stops the walk; the whole
          // read that follows repairs the tree.
          std::vector<MerkleHash> stored(1);
          if (!tree.hashes()
                   .ReadHashes({StoredHashIndex(0, r.seq - 1)},
                               absl::MakeSpan(stored))
                   .ok() ||
              stored[0] != leaf) {
            differs = r.seq;
            return absl::AbortedError("the tree differs");
          }
        } else {
          new_leaves.push_back(leaf);
        }
        if (r.seq > indexed && read.index_error.ok() &&
            index.Add(r, {r.seq, offset, line.size()})) {
          read.index_error = index.Flush();
        }
        return absl::OkStatus();
      },
      std::move(anchor->end), anchor->next_offset);
  if (differs != 0) {
    *why =
        absl::StrCat("after a crash, the tree disagrees with record ", differs);
    return std::nullopt;
  }
  MODELSTATE_RETURN_IF_ERROR(walk.status());
  read.walk = *std::move(walk);
  const uint64_t last = read.walk.end.seq;
  if (last < in_tree || last < indexed) {
    *why = absl::StrCat("after a crash, the log ends at record ", last,
                        " but its tree has ", in_tree, " leaves and its index ",
                        indexed, " rows");
    return std::nullopt;
  }
  MODELSTATE_RETURN_IF_ERROR(
      FinishWalk(fd, path, read.walk, &read.recovered_torn_tail));
  if (read.index_error.ok()) read.index_error = index.Flush();
  for (const MerkleHash& leaf : new_leaves) {
    MODELSTATE_RETURN_IF_ERROR(tree.Append(leaf));
  }
  MODELSTATE_RETURN_IF_ERROR(tree.Sync());
  read.tail_records = last - from;
  read.tail_from = from;
  return read;
}

}  // namespace

AuditLog::~AuditLog() {
  // Only a log that Open accepted may vouch for itself.
  if (state_ == nullptr || !state_->opened) return;
  State& s = *state_;
  // A clean close leaves a stamp of the file so that the next Open need
  // not read it all; anything less than a fully synced log gets none.
  uint64_t last_seq;
  {
    MutexLock lock(&s.mu);
    if (!s.write_error.ok()) return;
    last_seq = s.last_seq;
  }
  if (!s.index_ok.load() || !Sync(last_seq).ok() || !s.tree->Sync().ok()) {
    return;
  }
  absl::StatusOr<AuditFileStamp> stamp = StampOf(s.fd, s.path, last_seq);
  if (stamp.ok()) (void)s.index->SaveCleanStamp(*stamp);
}

absl::StatusOr<std::unique_ptr<AuditLog>> AuditLog::Open(
    const std::string& path, AuditLogOptions options) {
  bool created = false;
  MODELSTATE_ASSIGN_OR_RETURN(int fd, OpenOrCreate(path, &created));
  std::unique_ptr<AuditLog> log = absl::WrapUnique(new AuditLog());
  log->state_ = std::make_unique<State>(path, fd);  // owns fd from here on
  State& s = *log->state_;

  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrCat(
          "audit log ", path,
          " is already open (in this or another process); two writers "
          "would fork the chain"));
    }
    return ErrnoStatus(errno, path, "cannot lock the audit log");
  }
  if (created) MODELSTATE_RETURN_IF_ERROR(FsyncParentDirectory(path));

  absl::StatusOr<std::unique_ptr<AuditIndex>> index =
      AuditIndex::Open(options.index_path);
  if (index.ok()) {
    s.index = *std::move(index);
  } else {
    log->IndexFailed(index.status());
  }
  MODELSTATE_ASSIGN_OR_RETURN(s.tree, AuditTree::Open(options.hashes_path));
  std::string& why = log->read_whole_log_;
  std::optional<ChainWalk> end;
  if (s.index == nullptr) {
    why = "the index cannot be opened";
  } else {
    MODELSTATE_ASSIGN_OR_RETURN(std::optional<AuditFileStamp> stamp,
                                s.index->TakeCleanStamp());
    if (options.hashes_path.empty() || options.index_path.empty()) {
      why = "the tree or the index is kept in memory";
    } else if (stamp.has_value()) {
      MODELSTATE_ASSIGN_OR_RETURN(
          end, TrustedEnd(fd, path, *stamp, *s.index, *s.tree, &why));
    } else {
      MODELSTATE_ASSIGN_OR_RETURN(
          std::optional<WholeLogRead> tail,
          ReadLogTail(fd, path, *s.index, *s.tree, &why));
      if (tail.has_value()) {
        if (!tail->index_error.ok()) log->IndexFailed(tail->index_error);
        log->recovered_torn_tail_ = tail->recovered_torn_tail;
        log->read_after_crash_ = absl::StrCat(
            "read and checked the ", tail->tail_records,
            " records after record ", tail->tail_from,
            ", the last one the index and the tree held after a crash");
        end = std::move(tail->walk);
      }
    }
  }
  if (end.has_value()) {
    MODELSTATE_ASSIGN_OR_RETURN(
        bool matches,
        TreeMatchesCheckpoint(options, *s.tree, &log->opened_checkpoint_));
    if (!matches) {
      // The whole read names what differs.
      why = "the tree does not match the last signed checkpoint";
      log->read_after_crash_.clear();
      end.reset();
    }
  }
  if (!end.has_value()) {
    if (s.index != nullptr && !s.index->rebuilt().empty()) {
      absl::StrAppend(&why, "; ", s.index->rebuilt());
    }
    MODELSTATE_ASSIGN_OR_RETURN(
        WholeLogRead read,
        ReadWholeLog(fd, path, options, s.index.get(), *s.tree));
    if (!read.index_error.ok()) log->IndexFailed(read.index_error);
    // A tail read that was set aside may already have cut the torn line.
    log->recovered_torn_tail_ |= read.recovered_torn_tail;
    log->tree_repair_ = std::move(read.tree_repair);
    log->opened_checkpoint_ = std::move(read.checkpoint_note);
    end = std::move(read.walk);
  }
  s.checkpoint_path = options.checkpoint_path;
  {
    MutexLock lock(&s.mu);
    s.last_seq = end->end.seq;
    s.last_hash = end->end.hash;
    s.last_time = end->end.time;
    s.file_size = end->valid_bytes;
  }
  {
    MutexLock lock(&s.sync_mu);
    s.synced_seq = end->end.seq;
  }
  s.opened = true;
  return log;
}

absl::StatusOr<uint64_t> AuditLog::Append(AuditRecord record) {
  metrics::ScopedTimer timer(append_seconds_);
  // Parsing and re-dumping the details is the expensive part; do it before
  // taking the lock.
  MODELSTATE_ASSIGN_OR_RETURN(record.details_json,
                              CanonicalDetails(record.details_json));
  bool index_batch_full = false;
  absl::StatusOr<uint64_t> seq = Write(std::move(record), &index_batch_full);
  // The index's commit happens here, outside the log's lock, so appends go
  // on while SQLite writes the batch.
  if (index_batch_full) {
    if (absl::Status flushed = state_->index->Flush(); !flushed.ok()) {
      IndexFailed(flushed);
    }
  }
  return seq;
}

absl::StatusOr<uint64_t> AuditLog::Write(AuditRecord record,
                                         bool* index_batch_full) {
  State& s = *state_;
  MutexLock lock(&s.mu);
  MODELSTATE_RETURN_IF_ERROR(s.write_error);
  record.seq = s.last_seq + 1;
  // Whole nanoseconds, so the time survives its text form exactly; never
  // before the previous record, even if the clock steps back.
  const absl::Time now = absl::FromUnixNanos(absl::ToUnixNanos(absl::Now()));
  record.time = std::max(now, s.last_time);
  record.prev = s.last_hash;
  std::string line = SerializeUnhashed(record, record.details_json);
  record.hash = HashUnhashed(line);
  AppendHashField(record.hash, &line);
  line.push_back('\n');

  size_t written = 0;
  absl::Status st = WriteAll(s.fd, line, s.path, &written);
  if (!st.ok()) {
    // Undo a partial line, so that the file stays a valid chain.
    if (written > 0 &&
        ::ftruncate(s.fd, static_cast<off_t>(s.file_size)) != 0) {
      s.write_error = absl::DataLossError(
          absl::StrCat("audit log ", s.path,
                       " may end in a partial record after a failed write (",
                       st.message(), "); reopen it to recover"));
    } else {
      s.write_error = absl::UnavailableError(absl::StrCat(
          "audit log ", s.path, " failed (cannot append: ", st.message(),
          "); changes are refused until the server restarts with a "
          "writable audit log"));
    }
    return s.write_error;
  }
  const AuditLocation where{record.seq, s.file_size, line.size() - 1};
  s.file_size += line.size();
  line.pop_back();  // the leaf is the line without its newline
  if (absl::Status added = s.tree->Append(AuditLeafHash(line)); !added.ok()) {
    // The record is in the file but not in the tree; the next Open adds
    // it. Until then no checkpoint could cover it, so stop here.
    s.write_error = absl::UnavailableError(
        absl::StrCat("audit log ", s.path, " failed (cannot add record ",
                     record.seq, " to its hash tree: ", added.message(),
                     "); changes are refused until the server restarts"));
    return s.write_error;
  }
  if (s.index_ok.load()) *index_batch_full = s.index->Add(record, where);
  if (record.call_id != 0 && !s.calls.empty()) {
    if (auto call = s.calls.find(record.call_id); call != s.calls.end()) {
      call->second.push_back(record.seq);
    }
  }
  s.last_seq = record.seq;
  s.last_hash = record.hash;
  s.last_time = record.time;
  s.appended.SignalAll();
  return record.seq;
}

absl::Status AuditLog::Sync(uint64_t seq) {
  State& s = *state_;
  if (seq == 0) return absl::OkStatus();
  metrics::ScopedTimer timer(sync_seconds_);
  {
    ReaderMutexLock lock(&s.mu);
    if (seq > s.last_seq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot sync audit record ", seq, ": the last is ", s.last_seq));
    }
  }
  {
    MutexLock lock(&s.sync_mu);
    for (;;) {
      if (seq <= s.synced_seq) return absl::OkStatus();
      MODELSTATE_RETURN_IF_ERROR(s.sync_error);
      if (!s.sync_in_progress) break;
      // Another thread's fdatasync is running; it may or may not cover
      // `seq`, so look again when it is done.
      s.sync_done.Wait(&s.sync_mu);
    }
    s.sync_in_progress = true;
  }
  // Every record counted here has been written (Append writes before it
  // publishes), so this one fdatasync covers all of them, including those
  // of threads now waiting above.
  uint64_t target;
  {
    ReaderMutexLock lock(&s.mu);
    target = s.last_seq;
  }
  absl::Status synced = Fdatasync(s.fd, s.path);
  MutexLock lock(&s.sync_mu);
  s.sync_in_progress = false;
  if (synced.ok()) {
    s.synced_seq = std::max(s.synced_seq, target);
  } else {
    s.sync_error = std::move(synced);
  }
  s.sync_done.SignalAll();
  return s.sync_error;
}

absl::Status AuditLog::health() const {
  State& s = *state_;
  {
    ReaderMutexLock lock(&s.mu);
    if (!s.write_error.ok()) return s.write_error;
  }
  MutexLock lock(&s.sync_mu);
  return s.sync_error;
}

void AuditLog::BeginCall(uint64_t call_id) {
  if (call_id == 0) return;
  MutexLock lock(&state_->mu);
  state_->calls.try_emplace(call_id);
}

std::vector<uint64_t> AuditLog::EndCall(uint64_t call_id) {
  std::vector<uint64_t> seqs;
  if (call_id == 0) return seqs;
  MutexLock lock(&state_->mu);
  auto call = state_->calls.find(call_id);
  if (call == state_->calls.end()) return seqs;
  seqs = std::move(call->second);
  state_->calls.erase(call);
  return seqs;
}

uint64_t AuditLog::last_seq() const {
  ReaderMutexLock lock(&state_->mu);
  return state_->last_seq;
}

absl::StatusOr<AuditRecord> AuditLog::Get(uint64_t seq) const {
  State& s = *state_;
  std::optional<AuditLocation> where;
  if (s.index_ok.load()) {
    absl::StatusOr<std::optional<AuditLocation>> found = s.index->Locate(seq);
    if (found.ok()) {
      where = *found;
    } else {
      IndexFailed(found.status());
    }
  }
  if (!s.index_ok.load() && seq > 0 && seq <= last_seq()) {
    AuditQuery one;
    one.after_seq = seq - 1;
    one.limit = 1;
    MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> scanned,
                                ScanLog(s.fd, s.path, one));
    if (!scanned.empty()) return std::move(scanned.front());
  }
  if (!where.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "seq ", seq, ": no such audit record (the log has ", last_seq(), ")"));
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> records,
                              ReadRecords(s.fd, s.path, {*where}));
  return std::move(records.front());
}

absl::StatusOr<MerkleHash> AuditLog::TreeRoot(uint64_t tree_size) const {
  return state_->tree->Root(tree_size);
}

absl::StatusOr<std::vector<MerkleHash>> AuditLog::InclusionProof(
    uint64_t seq, uint64_t tree_size) const {
  return state_->tree->InclusionProof(seq, tree_size);
}

absl::StatusOr<std::vector<MerkleHash>> AuditLog::ConsistencyProof(
    uint64_t old_size, uint64_t new_size) const {
  return state_->tree->ConsistencyProof(old_size, new_size);
}

absl::StatusOr<AuditTreeHead> AuditLog::SyncTree() {
  State& s = *state_;
  AuditTreeHead head;
  {
    ReaderMutexLock lock(&s.mu);
    MODELSTATE_RETURN_IF_ERROR(s.write_error);
    head.size = s.tree->size();
  }
  // The log first: a hash file ahead of its log after a crash is trimmed
  // at the next Open, a checkpoint ahead of it is not.
  MODELSTATE_RETURN_IF_ERROR(Sync(head.size));
  MODELSTATE_RETURN_IF_ERROR(s.tree->Sync());
  MODELSTATE_ASSIGN_OR_RETURN(head.root, s.tree->Root(head.size));
  return head;
}

absl::Status AuditLog::SaveCheckpoint(absl::string_view signed_note) {
  if (state_->checkpoint_path.empty()) {
    return absl::FailedPreconditionError(
        "this audit log keeps no checkpoint file");
  }
  return WriteFileAtomically(state_->checkpoint_path, signed_note);
}

absl::StatusOr<std::vector<AuditLocation>> AuditLog::FindInIndex(
    const AuditQuery& query) const {
  if (!state_->index_ok.load()) return absl::UnavailableError("no index");
  absl::StatusOr<std::vector<AuditLocation>> where = state_->index->Find(query);
  if (!where.ok()) IndexFailed(where.status());
  return where;
}

absl::StatusOr<std::vector<AuditRecord>> AuditLog::Query(
    const AuditQuery& query) const {
  State& s = *state_;
  absl::StatusOr<std::vector<AuditLocation>> where = FindInIndex(query);
  if (!where.ok()) return ScanLog(s.fd, s.path, query);
  return ReadRecords(s.fd, s.path, *where);
}

absl::StatusOr<std::vector<uint64_t>> AuditLog::QuerySeqs(
    const AuditQuery& query) const {
  std::vector<uint64_t> seqs;
  absl::StatusOr<std::vector<AuditLocation>> where = FindInIndex(query);
  if (where.ok()) {
    for (const AuditLocation& w : *where) seqs.push_back(w.seq);
    return seqs;
  }
  MODELSTATE_ASSIGN_OR_RETURN(std::vector<AuditRecord> records,
                              ScanLog(state_->fd, state_->path, query));
  for (const AuditRecord& r : records) seqs.push_back(r.seq);
  return seqs;
}

void AuditLog::IndexFailed(const absl::Status& why) const {
  if (state_->index_ok.exchange(false)) {
    internal::LogLine(absl::StrCat(
        "audit log ", state_->path, ": its index failed (", why.ToString(),
        "); queries read the log itself until the next start rebuilds the "
        "index"));
  }
}

absl::StatusOr<std::vector<AuditRecord>> AuditLog::WaitForRecords(
    uint64_t after_seq, absl::Time deadline, size_t limit) {
  State& s = *state_;
  {
    MutexLock lock(&s.mu);
    while (s.last_seq <= after_seq) {
      if (deadline == absl::InfiniteFuture()) {
        s.appended.Wait(&s.mu);
      } else if (s.appended.WaitWithDeadline(&s.mu, deadline)) {
        break;
      }
    }
  }
  AuditQuery next;
  next.after_seq = after_seq;
  next.limit = limit;
  return Query(next);
}

absl::StatusOr<AuditVerification> AuditLog::Verify(
    const std::string& path, std::vector<MerkleHash>* leaves) {
  MODELSTATE_ASSIGN_OR_RETURN(int fd, OpenForReading(path));
  ScopedFd file(fd);
  LineReader reader(fd, path, 0);
  MODELSTATE_ASSIGN_OR_RETURN(
      ChainWalk walk, WalkChain(reader, [&](const AuditRecord&,
                                            absl::string_view line, uint64_t) {
        if (leaves != nullptr) leaves->push_back(AuditLeafHash(line));
        return absl::OkStatus();
      }));
  if (leaves != nullptr && !walk.verification.ok) {
    // The leaves of the lines from the broken one on too: the tree is over
    // the lines as stored, whatever their chain, and without them a record
    // changed in place would compare with a checkpoint as a log cut short
    // there, not as the rewrite it is.
    LineReader rest(fd, path, 0);
    leaves->clear();
    for (;;) {
      bool terminated = false;
      MODELSTATE_ASSIGN_OR_RETURN(std::optional<absl::string_view> line,
                                  rest.Next(&terminated));
      if (!line.has_value()) break;
      leaves->push_back(AuditLeafHash(*line));
    }
  }
  return walk.verification;
}

std::string AuditLog::Serialize(const AuditRecord& record) {
  // Details that are not a JSON object cannot come from Append or Parse;
  // they are written as {} so that the line is still valid JSON.
  absl::StatusOr<std::string> details = CanonicalDetails(record.details_json);
  std::string line =
      SerializeUnhashed(record, details.ok() ? *details : std::string("{}"));
  AppendHashField(record.hash, &line);
  return line;
}

absl::StatusOr<AuditRecord> AuditLog::Parse(const std::string& line) {
  nlohmann::json j = ParseJson(line, kMaxDetailsDepth + 1);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError("not an audit record: not valid JSON");
  }
  absl::StatusOr<AuditRecord> r = RecordFromJson(j);
  if (!r.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not an audit record: ", r.status().message()));
  }
  return r;
}

}  // namespace modelstate
