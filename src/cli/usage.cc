#include "cli/usage.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "gpusnap/workload.h"

namespace gpusnap::cli {

namespace {

// The command the line chose, as words after `gpusnap` ("" for none, "cuda lock").
struct Chosen {
  const CLI::App* app;
  std::string path;
};

Chosen DeepestChosen(const CLI::App& top) {
  Chosen c{&top, ""};
  for (;;) {
    auto subs = c.app->get_subcommands();
    if (subs.empty()) return c;
    c.app = subs.front();
    c.path += (c.path.empty() ? "" : " ") + c.app->get_name();
  }
}

// Every command (at any depth) that has the option `flag`, in the order of
// `gpusnap --help`.
void CommandsWithOption(const CLI::App& app, const std::string& path, const std::string& flag,
                        std::vector<std::string>& out) {
  for (const CLI::App* sub : app.get_subcommands(std::function<bool(const CLI::App*)>{})) {
    std::string sub_path = path.empty() ? sub->get_name() : path + " " + sub->get_name();
    auto options = sub->get_options([&](const CLI::Option* o) { return o->check_name(flag); });
    if (!options.empty()) out.push_back(sub_path);
    CommandsWithOption(*sub, sub_path, flag, out);
  }
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

std::string SeeHelp(const std::string& path) {
  return fmt::format("(see gpusnap {}--help)", path.empty() ? "" : path + " ");
}

// The first left-over argument that looks like an option, without a value
// given to it with `=`; else empty.
std::string FirstFlag(const std::vector<std::string>& extras) {
  for (const auto& e : extras)
    if (e.size() > 1 && e[0] == '-' && e != "--") return e.substr(0, e.find('='));
  return "";
}

std::string FirstWord(const std::vector<std::string>& extras) {
  for (const auto& e : extras)
    if (!e.empty() && e[0] != '-') return e;
  return "";
}

std::string OneLine(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace

std::string UsageErrorLine(const CLI::App& top, const CLI::ParseError& error) {
  Chosen chosen = DeepestChosen(top);
  std::vector<std::string> extras = top.remaining(true);
  const std::string& at = chosen.path;
  std::string where = at.empty() ? "gpusnap" : at;

  // A command that needs a command after it: none given, or one it does not have.
  if (chosen.app->get_require_subcommand_min() > 0 && chosen.app->get_subcommands().empty()) {
    std::string word = FirstWord(extras);
    if (!word.empty())
      return fmt::format("unknown command `{}{}` {}", at.empty() ? "" : at + " ", word, SeeHelp(at));
    return fmt::format("a command is required{} {}", at.empty() ? "" : " after `" + at + "`", SeeHelp(at));
  }
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    std::string flag = FirstFlag(extras);
    if (flag.empty())
      return fmt::format("unexpected argument `{}` for {} {}", FirstWord(extras), where, SeeHelp(at));
    std::vector<std::string> owners;
    CommandsWithOption(top, "", flag, owners);
    if (std::find(owners.begin(), owners.end(), at) != owners.end())
      return fmt::format("{} is an option of {}: give it after `{}` {}", flag, at, at, SeeHelp(at));
    if (!owners.empty()) return fmt::format("{} is an option of {}; not of {}", flag, Join(owners), where);
    return fmt::format("unknown option `{}` for {} {}", flag, where, SeeHelp(at));
  }
  return fmt::format("{}: {} {}", where, OneLine(error.what()), SeeHelp(at));
}

std::string WorkloadNameError(const std::string& name) {
  Status st = CheckWorkloadName(name);
  return st.ok() ? std::string() : st.message();
}

int ReportUsageError(const CLI::App& top, const CLI::ParseError& error) {
  std::fprintf(stderr, "gpusnap: error: %s\n", UsageErrorLine(top, error).c_str());
  return kUsageExitCode;
}

}  // namespace gpusnap::cli
