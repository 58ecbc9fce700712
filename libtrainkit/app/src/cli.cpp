// The one source that includes CLI11 (header only, and about 15 s of compile in each program that did).
#include "trainkit/app/cli.h"

#include <deque>
#include <iostream>
#include <sstream>
#include <utility>

#include <CLI/CLI.hpp>

namespace trainkit::app {

struct CliOption::Ref {
  CLI::Option* option;
};

CliOption& CliOption::positive() {
  ref_->option->check(CLI::PositiveNumber);
  return *this;
}

CliOption& CliOption::non_negative() {
  ref_->option->check(CLI::NonNegativeNumber);
  return *this;
}

CliOption& CliOption::range(int64_t lo, int64_t hi) {
  ref_->option->check(CLI::Range(lo, hi));
  return *this;
}

CliOption& CliOption::range(int lo, int hi) { return range(int64_t{lo}, int64_t{hi}); }

CliOption& CliOption::range(double lo, double hi) {
  ref_->option->check(CLI::Range(lo, hi));
  return *this;
}

CliOption& CliOption::one_of(const std::vector<std::string>& choices) {
  ref_->option->check(CLI::IsMember(choices));
  return *this;
}

CliOption& CliOption::required() {
  ref_->option->required();
  return *this;
}

CliOption& CliOption::show_default() {
  ref_->option->capture_default_str();
  return *this;
}

CliOption& CliOption::delimiter(char separator) {
  ref_->option->delimiter(separator);
  return *this;
}

namespace {

// A vector's default in the help: its values separated by spaces, as they are typed (CLI11's own would be
// "[32,64]"; the programs showed "32 64" while they compiled CLI11 next to LibTorch's operator<< for vectors).
template <typename T>
void show_values_spaced(CLI::Option* option, const std::vector<T>& target) {
  option->default_function([&target] {
    std::ostringstream out;
    for (size_t i = 0; i < target.size(); ++i) {
      out << (i > 0 ? " " : "") << target[i];
    }
    return out.str();
  });
}

}  // namespace

struct Cli::Impl {
  std::unique_ptr<CLI::App> owned;  // the top parser's; a subcommand's App belongs to its parent's
  CLI::App* app = nullptr;
  std::deque<CliOption::Ref> options;  // a deque: the handles given out keep their addresses
  std::vector<std::unique_ptr<Cli>> subcommands;
};

Cli::Cli(const std::string& description) : impl_(std::make_unique<Impl>()) {
  impl_->owned = std::make_unique<CLI::App>(description);
  impl_->app = impl_->owned.get();
}

Cli::Cli(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Cli::~Cli() = default;

template <typename T>
CliOption Cli::add_option(const std::string& name, T& target, const std::string& help) {
  return CliOption(&impl_->options.emplace_back(CliOption::Ref{impl_->app->add_option(name, target, help)}));
}

CliOption Cli::option(const std::string& name, int& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, int64_t& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, uint64_t& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, double& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, bool& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, std::string& target, const std::string& help) {
  return add_option(name, target, help);
}
CliOption Cli::option(const std::string& name, std::vector<std::string>& target, const std::string& help) {
  auto option = add_option(name, target, help);
  show_values_spaced(option.ref_->option, target);
  return option;
}
CliOption Cli::option(const std::string& name, std::vector<int64_t>& target, const std::string& help) {
  auto option = add_option(name, target, help);
  show_values_spaced(option.ref_->option, target);
  return option;
}
CliOption Cli::option(const std::string& name, std::vector<double>& target, const std::string& help) {
  auto option = add_option(name, target, help);
  show_values_spaced(option.ref_->option, target);
  return option;
}

CliOption Cli::flag(const std::string& name, bool& target, const std::string& help) {
  return CliOption(&impl_->options.emplace_back(CliOption::Ref{impl_->app->add_flag(name, target, help)}));
}

Cli& Cli::subcommand(const std::string& name, const std::string& help) {
  auto impl = std::make_unique<Impl>();
  impl->app = impl_->app->add_subcommand(name, help);
  impl_->subcommands.push_back(std::unique_ptr<Cli>(new Cli(std::move(impl))));
  return *impl_->subcommands.back();
}

Cli& Cli::require_subcommand() {
  impl_->app->require_subcommand(1);
  return *this;
}

bool Cli::parsed() const { return impl_->app->parsed(); }

std::optional<int> Cli::parse(int argc, const char* const* argv) { return parse(argc, argv, std::cout, std::cerr); }

std::optional<int> Cli::parse(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  try {
    impl_->app->parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return impl_->app->exit(e, out, err);
  }
  return std::nullopt;
}

}  // namespace trainkit::app
