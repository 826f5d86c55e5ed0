// The CLI's output convention, shared by every command:
//   -o, --output FILE   where the command's main output goes (its JSON with --json, its text
//                       otherwise); '-' or none = stdout; checked before any work starts and
//                       written atomically (a temporary file renamed into place)
//   --out-dir DIR       for a command that writes several files
//   --json              JSON for programs instead of text for people
//   -q, --quiet         no progress line on stderr (benches, audit)
// and plain error messages: "gpuopt CMD: <message>", never an internal status-code prefix.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "gpuopt/core/status.hpp"

namespace gpuopt::cli {

struct OutputOptions {
  std::string output;  // -o/--output; empty or "-" = stdout
  bool json = false;
  bool quiet = false;
  bool to_stdout() const { return output.empty() || output == "-"; }
};

struct OutputFlags {
  // --json, -q/--quiet: the flags of a command that draws a progress line.
  static OutputFlags with_quiet() {
    OutputFlags flags;
    flags.quiet = true;
    return flags;
  }
  bool json = true;    // add --json
  bool quiet = false;  // add -q/--quiet
  // What --json prints, for the help text ("the report", "one JSON object").
  std::string json_help = "JSON instead of text (to stdout, or to --output)";
  // Old spellings of --output kept working but left out of --help.
  std::vector<std::string> hidden_aliases;
};

// Adds -o/--output FILE (and --json, -q/--quiet as `flags` asks) to `command`.
void add_output_flags(CLI::App& command, OutputOptions& options, const OutputFlags& flags = {});

// Adds --out-dir DIR to `command`, and `hidden_aliases` (old spellings such as "--out") that set
// the same value without showing in --help.
CLI::Option* add_out_dir_flag(CLI::App& command, std::string& directory, const std::string& help,
                              const std::vector<std::string>& hidden_aliases = {});

// Adds an old spelling of an option that sets the same value and is hidden from --help.
template <typename T>
void add_hidden_alias(CLI::App& command, const std::string& name, T& value) {
  command.add_option(name, value)->group("");
}

// Before any work: OK for stdout, else check_output_path on the file. On error prints
// "gpuopt CMD: <message>" and returns false; the command then exits kExitErrors (a usage error).
bool output_usable(std::string_view command, const OutputOptions& options);

// Writes the command's main output to stdout, or atomically to --output. On error prints
// "gpuopt CMD: <message>" and returns false (the command exits kExitToolFailed).
bool write_output(std::string_view command, const OutputOptions& options,
                  std::string_view contents);

// Whether a progress line may be drawn: stderr is a terminal, and neither --json nor --quiet.
bool progress_wanted(const OutputOptions& options);

// "gpuopt CMD: <message>" on stderr: the status's message in plain words, without the code name
// that Status::to_string() puts in front (the code belongs in JSON, as its own field).
void print_error(std::string_view command, const Status& status);
// The message alone, or a plain wording of the code when the message is empty.
std::string plain_message(const Status& status);

// The exit code for a failed command: kExitErrors when the user's input was at fault (a bad
// argument, a file that is not there), kExitToolFailed otherwise.
int exit_code_for_error(const Status& status);

}  // namespace gpuopt::cli
