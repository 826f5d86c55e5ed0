// The CLI's output convention (output_options.hpp).
#include "output_options.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>

#include "command_registry.hpp"
#include "gpuopt/core/output_file.hpp"

namespace gpuopt::cli {

void add_output_flags(CLI::App& command, OutputOptions& options, const OutputFlags& flags) {
  command
      .add_option("-o,--output", options.output,
                  "Write the output to FILE instead of stdout ('-' = stdout); checked before "
                  "the work starts, replaced atomically")
      ->type_name("FILE");
  for (const auto& alias : flags.hidden_aliases) add_hidden_alias(command, alias, options.output);
  if (flags.json) command.add_flag("--json", options.json, flags.json_help);
  if (flags.quiet) command.add_flag("-q,--quiet", options.quiet, "No progress line on stderr");
}

CLI::Option* add_out_dir_flag(CLI::App& command, std::string& directory, const std::string& help,
                              const std::vector<std::string>& hidden_aliases) {
  CLI::Option* option = command.add_option("--out-dir", directory, help)->type_name("DIR");
  for (const auto& alias : hidden_aliases) add_hidden_alias(command, alias, directory);
  return option;
}

bool output_usable(std::string_view command, const OutputOptions& options) {
  if (options.to_stdout()) return true;
  if (Status usable = check_output_path(options.output); !usable.ok()) {
    print_error(command, usable.with_context("--output"));
    return false;
  }
  return true;
}

bool write_output(std::string_view command, const OutputOptions& options,
                  std::string_view contents) {
  if (options.to_stdout()) {
    std::fwrite(contents.data(), 1, contents.size(), stdout);
    std::fflush(stdout);
    return !std::ferror(stdout);
  }
  if (Status written = write_file_atomically(options.output, contents); !written.ok()) {
    print_error(command, written);
    return false;
  }
  return true;
}

bool progress_wanted(const OutputOptions& options) {
  return !options.json && !options.quiet && isatty(STDERR_FILENO) == 1;
}

std::string plain_message(const Status& status) {
  if (!status.message().empty()) return status.message();
  switch (status.code()) {
    case StatusCode::kOk:
      return "no error";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kResourceExhausted:
      return "out of memory or space";
    case StatusCode::kFailedPrecondition:
      return "not possible in the current state";
    case StatusCode::kUnimplemented:
      return "not supported by this build";
    case StatusCode::kUnavailable:
      return "not available on this machine";
    default:
      return "internal error";
  }
}

void print_error(std::string_view command, const Status& status) {
  std::fprintf(stderr, "gpuopt %.*s: %s\n", static_cast<int>(command.size()), command.data(),
               plain_message(status).c_str());
}

int exit_code_for_error(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kOutOfRange:
      return kExitErrors;
    default:
      return kExitToolFailed;
  }
}

}  // namespace gpuopt::cli
