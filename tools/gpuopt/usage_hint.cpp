// Unknown subcommands and options, named with the nearest known one (usage_hint.hpp).
#include "usage_hint.hpp"

#include <fmt/format.h>

#include <vector>

#include "gpuopt/core/suggest.hpp"

namespace gpuopt::cli {

namespace {

std::vector<CLI::App*> subcommands(CLI::App& app) {
  return app.get_subcommands([](CLI::App*) { return true; });
}

std::string path_of(const std::vector<std::string>& path) {
  std::string out = "gpuopt";
  for (const auto& word : path) out += " " + word;
  return out;
}

std::string did_you_mean(const std::optional<std::string>& match) {
  return match ? fmt::format("; did you mean '{}'?", *match) : std::string(".");
}

}  // namespace

std::optional<std::string> usage_hint(CLI::App& app, int argc, char** argv) {
  CLI::App* current = &app;
  std::vector<std::string> path;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") return std::nullopt;
    if (word.rfind("--", 0) == 0) {
      const std::string name = word.substr(0, word.find('='));
      if (const CLI::Option* option = current->get_option_no_throw(name)) {
        // An option that takes a value consumes the next word unless it was given with '='.
        if (option->get_type_size_max() > 0 && word.find('=') == std::string::npos) ++i;
        continue;
      }
      // Old spellings kept as hidden aliases are accepted but never suggested.
      std::vector<std::string> names;
      for (const CLI::Option* option : current->get_options()) {
        if (option->get_group().empty()) continue;
        for (const auto& long_name : option->get_lnames()) names.push_back("--" + long_name);
      }
      return fmt::format("{}: unknown option '{}'{}", path_of(path), name,
                         did_you_mean(closest_match(name, names)));
    }
    if (word.rfind('-', 0) == 0) {
      if (const CLI::Option* option = current->get_option_no_throw(word.substr(0, 2))) {
        if (option->get_type_size_max() > 0 && word.size() == 2) ++i;
      }
      continue;
    }
    std::vector<std::string> names;
    CLI::App* next = nullptr;
    for (CLI::App* sub : subcommands(*current)) {
      names.push_back(sub->get_name());
      if (sub->get_name() == word) next = sub;
    }
    if (next != nullptr) {
      current = next;
      path.push_back(word);
      continue;
    }
    // A word where only subcommands may stand.
    if (!names.empty() &&
        current->get_options([](const CLI::Option* option) { return option->get_positional(); })
            .empty()) {
      return fmt::format("{}: unknown command '{}'{}", path_of(path), word,
                         did_you_mean(closest_match(word, names)));
    }
  }
  return std::nullopt;
}

}  // namespace gpuopt::cli
