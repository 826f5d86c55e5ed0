// `gpuopt vector compact`: merges a collection's small segments and drops its deleted rows
// (Collection::compact), crash-safe like an import.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command_registry.hpp"
#include "gpuopt/vector/store.hpp"
#include "numeric_checks.hpp"
#include "output_options.hpp"

namespace gpuopt::cli {
namespace {

using nlohmann::json;
namespace vec = gpuopt::vector;

struct CompactArgs {
  std::string directory;
  std::string collection = vec::kDefaultCollection;
  std::size_t target_rows = 0;
  int wait_ms = 0;
  OutputOptions out;  // -o/--output, --json
};

int run_compact(const CompactArgs& args) {
  auto fail = [&](const Status& status) {
    if (args.out.json) {
      json error = {
          {"schema_version", 1},
          {"error", {{"code", status_code_name(status.code())}, {"message", status.message()}}}};
      write_output("vector", args.out, error.dump() + "\n");
    }
    print_error("vector", status);
    return kExitErrors;
  };
  vec::OpenOptions options;
  options.writer_wait_ms = args.wait_ms;
  auto store = vec::Store::open(args.directory, options);
  if (!store.ok()) return fail(store.status());
  auto collection = (*store)->collection(args.collection);
  if (!collection.ok()) return fail(collection.status());
  vec::CompactOptions compact;
  compact.target_rows = args.target_rows;
  auto report = (*collection)->compact(compact);
  if (!report.ok()) return fail(report.status().with_context(args.directory));
  if (args.out.json) {
    json out = {{"schema_version", 1},
                {"directory", args.directory},
                {"collection", args.collection},
                {"segments_before", report->segments_before},
                {"segments_after", report->segments_after},
                {"rows_dropped", report->rows_dropped},
                {"ivf_resaved", report->ivf_resaved},
                {"ivf_error", report->ivf_error.empty() ? json(nullptr) : json(report->ivf_error)},
                {"ivf_resave_seconds", report->ivf_resave_seconds},
                {"count", (*collection)->size()}};
    return write_output("vector", args.out, out.dump() + "\n") ? kExitOk : kExitToolFailed;
  }
  std::string ivf;
  if (report->ivf_resaved) {
    ivf = ", IVF index rebuilt for the new layout and saved";
  } else if (!report->ivf_error.empty()) {
    // The compaction stands: only the IVF index is left to be rebuilt in memory at the next load.
    ivf = fmt::format(", IVF index not saved again ({})", report->ivf_error);
  }
  return write_output("vector", args.out,
                      fmt::format("compacted {}: {} segments -> {}, {} deleted rows dropped, {} "
                                  "rows{}\n",
                                  args.collection, report->segments_before, report->segments_after,
                                  report->rows_dropped, (*collection)->size(), ivf))
             ? kExitOk
             : kExitToolFailed;
}

// Runs after vector_command.cpp (order 70) has added the `vector` group.
GPUOPT_REGISTER_COMMAND("", 72, [](CLI::App& parent, int& exit_code) {
  CLI::App* vector = parent.get_subcommand("vector");
  auto args = std::make_shared<CompactArgs>();
  CLI::App* command = vector->add_subcommand(
      "compact", "Merge a collection's small segments and drop its deleted rows");
  command->add_option("DIR", args->directory, "store directory")->required();
  command->add_option("--collection", args->collection, "collection name (default: default)");
  command
      ->add_option("--target-rows", args->target_rows,
                   "rows per merged segment (default: 64 MiB of vectors)")
      ->check(whole_number_at_least(0));
  command
      ->add_option("--wait", args->wait_ms,
                   "milliseconds to wait for another writer to finish (default 0)")
      ->check(whole_number_at_least(0));
  add_output_flags(*command, args->out);
  command->callback([args, &exit_code] {
    exit_code = output_usable("vector", args->out) ? run_compact(*args) : kExitErrors;
  });
});

}  // namespace
}  // namespace gpuopt::cli
