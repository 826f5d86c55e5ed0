// libFuzzer target: the vector store's catalogue loader (Store::open, then what `vector info
// --verify` and a query do) on a catalogue that is as untrusted as any input. The first byte
// picks the mode:
//   bit 0 clear: the rest of the input is the whole store.sqlite file (arbitrary bytes, or a
//                catalogue made by the CLI from the corpus), beside the segments of the base store;
//   bit 0 set:   the rest is a list of edits to the base store's valid catalogue (below), so the
//                loader's checks of each field see values SQLite accepts;
//   bit 1:       open for writing instead of read-only.
// The base store's other files are restored before each input.
// The base store, built once: collection "default" (dim 4, l2; two batches with metadata, an
// upsert and a delete, so tombstones; a saved IVF index) and "c2" (dim 3, ip; one batch).
// Each edit is 4 bytes and a value: table (of the five), column, row, kind; kind 0 deletes the
// row, 1 copies it with the column changed (INSERT OR IGNORE), 2-7 set the column to NULL, the
// old integer plus a signed byte, a 64-bit integer, a text of up to 64 bytes, a blob of up to 64
// bytes, or a double. Expected: a clean Status from every call, never a crash.
#include <sqlite3.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "gpuopt/vector/store.hpp"

namespace {

namespace fs = std::filesystem;
using namespace gpuopt::vector;

struct Table {
  const char* name;
  std::vector<const char*> columns;
};
const Table kTables[] = {
    {"collections", {"name", "dim", "metric", "next_segment"}},
    {"segments", {"collection", "sequence", "file", "rows", "bytes", "crc"}},
    {"items", {"collection", "id", "segment", "row", "meta"}},
    {"dead", {"collection", "segment", "row"}},
    {"ivf_indexes", {"collection", "file", "generation", "bytes", "crc"}},
};

std::vector<std::uint8_t> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_all(const fs::path& path, const std::uint8_t* data, std::size_t size) {
  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, out) != size) std::abort();
  if (std::fclose(out) != 0) std::abort();
}

void must(const gpuopt::Status& status) {
  if (!status.ok()) {
    std::fprintf(stderr, "base store: %s\n", status.to_string().c_str());
    std::abort();
  }
}

// The base store's files, kept in memory; the directory the fuzzer opens is rewritten from them.
struct Base {
  fs::path dir;
  std::vector<std::uint8_t> catalogue;
  std::map<fs::path, std::vector<std::uint8_t>> files;  // relative path -> bytes

  Base() {
    dir = fs::temp_directory_path() / ("gpuopt-fuzz-catalogue-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    {
      auto store = Store::open(dir, {.create = true});
      must(store.status());
      auto made = (*store)->create_collection("default", {4, Metric::kL2});
      must(made.status());
      Collection& c = **made;
      std::vector<float> v(4 * 8);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = float(i % 7) - 3.0f + 0.25f * float(i);
      std::vector<std::uint64_t> first = {0, 1, 2}, second = {3, 4, 5};
      std::vector<Metadata> meta = {{{"k", std::string("x")}}, {{"n", 2.0}}, {}};
      must(c.add(first, v.data(), meta));
      must(c.add(second, v.data() + 12));
      std::vector<std::uint64_t> again = {1};
      must(c.upsert(again, v.data() + 24));
      std::vector<std::uint64_t> gone = {4};
      must(c.remove(gone).status());
      IvfParams params;
      params.nlist = 2;
      params.iterations = 2;
      params.engine = QueryEngine::kCpu;
      must(c.build_ivf(params, 1).status());
      auto other = (*store)->create_collection("c2", {3, Metric::kInnerProduct});
      must(other.status());
      std::vector<std::uint64_t> ids = {7, 9};
      must((*other)->add(ids, v.data()));
    }
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file()) continue;
      auto relative = fs::relative(entry.path(), dir);
      if (relative == "store.sqlite") {
        catalogue = read_all(entry.path());
      } else if (relative.string().find("store.sqlite-") != 0) {
        files[relative] = read_all(entry.path());
      }
    }
    if (catalogue.empty()) std::abort();
  }
  ~Base() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
  // The store directory as the base left it, with `bytes` as its catalogue.
  void reset(const std::uint8_t* bytes, std::size_t size) {
    for (const char* suffix : {"-wal", "-shm", "-journal"}) {
      std::error_code ignored;
      fs::remove(dir / (std::string("store.sqlite") + suffix), ignored);
    }
    // A writable open may have replaced or removed files (an IVF index trained by a query).
    std::error_code ignored;
    std::vector<fs::path> extra;
    for (const auto& entry : fs::recursive_directory_iterator(dir, ignored)) {
      auto relative = fs::relative(entry.path(), dir);
      if (entry.is_regular_file() && files.count(relative) == 0 && relative != "store.sqlite") {
        extra.push_back(entry.path());
      }
    }
    for (const auto& path : extra) fs::remove(path, ignored);
    for (const auto& [relative, content] : files) {
      fs::create_directories((dir / relative).parent_path());
      write_all(dir / relative, content.data(), content.size());
    }
    write_all(dir / "store.sqlite", bytes, size);
  }
};

Base& base() {
  static Base instance;
  return instance;
}

// Applies the edits to the catalogue at `path` (errors from SQLite, such as a constraint, skip
// that edit).
void apply_edits(const fs::path& path, const std::uint8_t* data, std::size_t size) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return;
  }
  sqlite3_exec(db, "PRAGMA synchronous=OFF", nullptr, nullptr, nullptr);
  std::size_t at = 0;
  while (at + 4 <= size) {
    const Table& table = kTables[data[at] % std::size(kTables)];
    const std::size_t column = data[at + 1] % table.columns.size();
    const int row = data[at + 2] % 8;
    const int kind = data[at + 3] % 8;
    at += 4;
    // The row's current values, to name it (two tables have no rowid) and to copy it.
    std::string select = std::string("SELECT * FROM ") + table.name + " LIMIT 1 OFFSET ?";
    sqlite3_stmt* read = nullptr;
    if (sqlite3_prepare_v2(db, select.c_str(), -1, &read, nullptr) != SQLITE_OK) {
      sqlite3_finalize(read);
      continue;
    }
    sqlite3_bind_int(read, 1, row);
    if (sqlite3_step(read) != SQLITE_ROW) {
      sqlite3_finalize(read);
      continue;
    }
    std::string where, names, marks;
    for (std::size_t c = 0; c < table.columns.size(); ++c) {
      where += std::string(c ? " AND " : "") + table.columns[c] + " IS ?";
      names += std::string(c ? ", " : "") + table.columns[c];
      marks += c ? ", ?" : "?";
    }
    std::string sql;
    if (kind == 0) {
      sql = std::string("DELETE FROM ") + table.name + " WHERE " + where;
    } else if (kind == 1) {
      sql = std::string("INSERT OR IGNORE INTO ") + table.name + "(" + names + ") VALUES (" +
            marks + ")";
    } else {
      sql = std::string("UPDATE ") + table.name + " SET " + table.columns[column] + " = ? WHERE " +
            where;
    }
    sqlite3_stmt* write = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &write, nullptr) != SQLITE_OK) {
      sqlite3_finalize(write);
      sqlite3_finalize(read);
      continue;
    }
    // The new value of the chosen column, from the bytes after the edit's header.
    auto bind_value = [&](int index) {
      const std::size_t left = size - at;
      const std::uint8_t length = left > 0 ? data[at] % 65 : 0;
      switch (kind) {
        case 2:
          sqlite3_bind_null(write, index);
          break;
        case 3: {
          const std::int8_t delta = left > 0 ? static_cast<std::int8_t>(data[at++]) : 1;
          sqlite3_bind_int64(write, index,
                             sqlite3_column_int64(read, static_cast<int>(column)) + delta);
          break;
        }
        case 4: {
          std::int64_t value = 0;
          const std::size_t n = std::min<std::size_t>(8, left);
          std::memcpy(&value, data + at, n);
          at += n;
          sqlite3_bind_int64(write, index, value);
          break;
        }
        case 5:
        case 6: {
          const std::size_t n = std::min<std::size_t>(length, left > 0 ? left - 1 : 0);
          const char* bytes = reinterpret_cast<const char*>(data + at + (left > 0 ? 1 : 0));
          if (kind == 5) {
            sqlite3_bind_text(write, index, bytes, static_cast<int>(n), SQLITE_TRANSIENT);
          } else {
            sqlite3_bind_blob(write, index, bytes, static_cast<int>(n), SQLITE_TRANSIENT);
          }
          at += n + (left > 0 ? 1 : 0);
          break;
        }
        default: {
          double value = 0;
          const std::size_t n = std::min<std::size_t>(8, left);
          std::memcpy(&value, data + at, n);
          at += n;
          sqlite3_bind_double(write, index, value);
          break;
        }
      }
    };
    const int columns = static_cast<int>(table.columns.size());
    if (kind == 1) {
      for (int c = 0; c < columns; ++c) {
        if (c == static_cast<int>(column)) {
          bind_value(c + 1);
        } else {
          sqlite3_bind_value(write, c + 1, sqlite3_column_value(read, c));
        }
      }
    } else {
      int first = 1;
      if (kind != 0) {
        bind_value(1);
        first = 2;
      }
      for (int c = 0; c < columns; ++c) {
        sqlite3_bind_value(write, first + c, sqlite3_column_value(read, c));
      }
    }
    sqlite3_step(write);
    sqlite3_finalize(write);
    sqlite3_finalize(read);
  }
  sqlite3_close(db);
}

// What `vector info --verify` and `vector query` do with an open store.
void exercise(Store& store) {
  for (const auto& name : store.collection_names()) {
    auto found = store.collection(name);
    if (!found.ok()) continue;
    Collection& c = **found;
    (void)c.size();
    (void)c.stats();
    (void)c.verify();
    for (std::uint64_t id : {0, 1, 4, 7}) (void)c.get(id);
    if (c.dim() > 0 && c.dim() <= 16) {
      std::vector<float> query(c.dim(), 0.5f);
      QueryOptions options;
      options.k = 3;
      (void)c.query(query.data(), 1, options);
      options.index = IndexKind::kIvf;
      options.nprobe = 2;
      (void)c.query(query.data(), 1, options);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  Base& b = base();
  const std::uint8_t mode = data[0];
  const bool edits = (mode & 1) != 0, writable = (mode & 2) != 0;
  if (edits) {
    b.reset(b.catalogue.data(), b.catalogue.size());
    apply_edits(b.dir / "store.sqlite", data + 1, size - 1);
  } else {
    b.reset(data + 1, size - 1);
  }
  OpenOptions options;
  options.read_only = !writable;
  options.compact_above_segments = 0;
  auto store = Store::open(b.dir, options);
  if (store.ok()) exercise(**store);
  return 0;
}
