// "Did you mean": names the closest subcommand or option when a command line has an unknown one.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace gpuopt::cli {

// After a parse error: the first word of argv that is neither a subcommand nor an option where it
// stands, as "gpuopt bench: unknown command 'stream'; did you mean 'streams'?" (without a
// suggestion when none is close). nullopt when every word is known.
std::optional<std::string> usage_hint(CLI::App& app, int argc, char** argv);

}  // namespace gpuopt::cli
