// The command-line parser facade (app/cli.h): values bound for every type it takes, defaults kept, each
// rule rejecting a bad value with CLI11's code and a message naming the option, help, subcommands.
#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "trainkit/app/cli.h"

using trainkit::app::Cli;
using Catch::Matchers::Contains;

namespace {

struct CliResult {
  std::optional<int> code;  // nothing: parsed, the program goes on
  std::string out;
  std::string err;
};

CliResult parse_cli(Cli& cli, std::vector<const char*> args) {
  args.insert(args.begin(), "prog");
  std::ostringstream out;
  std::ostringstream err;
  const auto code = cli.parse(static_cast<int>(args.size()), args.data(), out, err);
  return {code, out.str(), err.str()};
}

}  // namespace

TEST_CASE("Cli binds a value of every type it takes", "[app][cli]") {
  Cli cli{"all types"};
  int i = 1;
  int64_t i64 = 2;
  uint64_t u64 = 3;
  double d = 0.5;
  bool b = true;
  bool f = false;
  std::string s = "a";
  std::vector<std::string> vs;
  std::vector<int64_t> vi{16, 64};
  std::vector<double> vd{0.1};
  cli.option("--int", i, "int");
  cli.option("--int64", i64, "int64_t");
  cli.option("--uint64", u64, "uint64_t");
  cli.option("--double", d, "double");
  cli.option("--bool", b, "bool with a value");
  cli.flag("--flag", f, "flag");
  cli.option("--string", s, "string");
  cli.option("--strings", vs, "strings");
  cli.option("--ints", vi, "int64_t values").delimiter(',');
  cli.option("--doubles", vd, "doubles");

  SECTION("given values are stored") {
    const auto r = parse_cli(cli, {"--int", "-7", "--int64", "5000000000", "--uint64", "18446744073709551615",
                                   "--double", "1e-3", "--bool", "false", "--flag", "--string", "x y",
                                   "--strings", "p", "q", "--ints", "1,2,3", "--doubles", "0.25", "2"});
    REQUIRE_FALSE(r.code);
    CHECK(i == -7);
    CHECK(i64 == 5000000000);
    CHECK(u64 == 18446744073709551615ULL);
    CHECK(d == 1e-3);
    CHECK_FALSE(b);
    CHECK(f);
    CHECK(s == "x y");
    CHECK(vs == std::vector<std::string>{"p", "q"});
    CHECK(vi == std::vector<int64_t>{1, 2, 3});  // given values replace the default
    CHECK(vd == std::vector<double>{0.25, 2.0});
  }
  SECTION("absent options keep their variables' values") {
    REQUIRE_FALSE(parse_cli(cli, {}).code);
    CHECK(i == 1);
    CHECK(i64 == 2);
    CHECK(u64 == 3);
    CHECK(d == 0.5);
    CHECK(b);
    CHECK_FALSE(f);
    CHECK(s == "a");
    CHECK(vs.empty());
    CHECK(vi == std::vector<int64_t>{16, 64});
    CHECK(vd == std::vector<double>{0.1});
  }
  SECTION("a repeated vector option appends") {
    REQUIRE_FALSE(parse_cli(cli, {"--strings", "a.b=1", "--strings", "c.d=2", "--ints", "8", "--ints", "9,10"}).code);
    CHECK(vs == std::vector<std::string>{"a.b=1", "c.d=2"});
    CHECK(vi == std::vector<int64_t>{8, 9, 10});
  }
  SECTION("a value of the wrong type, an unknown option") {
    const auto bad = parse_cli(cli, {"--int64", "ten"});
    CHECK(bad.code == 104);  // CLI11's ConversionError
    CHECK_THAT(bad.err, Contains("--int64") && Contains("ten"));
    const auto unknown = parse_cli(cli, {"--nope", "1"});
    CHECK(unknown.code == 109);  // ExtrasError
    CHECK_THAT(unknown.err, Contains("--nope") && Contains("Run with --help for more information."));
  }
}

TEST_CASE("Cli rules reject a bad value with a message naming the option", "[app][cli]") {
  Cli cli{"rules"};
  int64_t steps = 200;
  double lr = 0.1;
  int64_t epochs = 60;
  double fraction = 0.2;
  int64_t batch = 32;
  std::string device = "cpu";
  std::vector<std::string> modes{"power"};
  std::vector<int64_t> workers{0, 1};
  std::string config;
  cli.option("--steps", steps, "Steps").show_default().positive();
  cli.option("--lr", lr, "LR").non_negative();
  cli.option("--epochs", epochs, "Epochs").range(1, 100000);
  cli.option("--fraction", fraction, "Fraction").range(0.0, 1.0);
  cli.option("--batch", batch, "Batch").range(int64_t{2}, int64_t{1} << 20);
  cli.option("--device", device, "Device").one_of({"cpu", "cuda"}).show_default();
  cli.option("--mode", modes, "Modes").one_of({"power", "binsearch"});
  cli.option("--workers", workers, "Workers").non_negative();
  cli.option("--config", config, "Config").required();

  struct Case {
    std::vector<const char*> args;  // besides --config
    const char* option;
  };
  const std::vector<Case> rejected = {
      {{"--steps", "0"}, "--steps"},          {{"--steps", "-3"}, "--steps"},
      {{"--lr", "-1e-9"}, "--lr"},            {{"--epochs", "0"}, "--epochs"},
      {{"--epochs", "100001"}, "--epochs"},   {{"--fraction", "1.5"}, "--fraction"},
      {{"--fraction", "-0.1"}, "--fraction"}, {{"--batch", "1"}, "--batch"},
      {{"--device", "tpu"}, "--device"},      {{"--device", "CPU"}, "--device"},
      {{"--mode", "power", "bisect"}, "--mode"}, {{"--workers", "2", "-1"}, "--workers"},
  };
  for (const auto& c : rejected) {
    std::vector<const char*> args = c.args;
    args.push_back("--config");
    args.push_back("c.toml");
    const auto r = parse_cli(cli, args);
    INFO(c.args.front() << " " << c.args.back() << ": " << r.err);
    CHECK(r.code == 105);  // CLI11's ValidationError
    CHECK_THAT(r.err, Contains(c.option));
  }
  CHECK(steps == 200);
  CHECK(device == "cpu");

  const auto missing = parse_cli(cli, {"--steps", "5"});
  CHECK(missing.code == 106);  // RequiredError
  CHECK_THAT(missing.err, Contains("--config"));

  const auto ok = parse_cli(cli, {"--steps", "5", "--lr", "0", "--epochs", "100000", "--fraction", "1", "--batch",
                                  "2", "--device", "cuda", "--mode", "binsearch", "power", "--workers", "0",
                                  "--config", "c.toml"});
  REQUIRE_FALSE(ok.code);
  CHECK(steps == 5);
  CHECK(lr == 0);
  CHECK(epochs == 100000);
  CHECK(fraction == 1.0);
  CHECK(batch == 2);
  CHECK(device == "cuda");
  CHECK(modes == std::vector<std::string>{"binsearch", "power"});
  CHECK(workers == std::vector<int64_t>{0});
  CHECK(config == "c.toml");
}

TEST_CASE("Cli --help prints the options and returns 0", "[app][cli]") {
  Cli cli{"Trace an LR schedule"};
  int64_t steps = 200;
  std::string device = "cpu";
  std::string config;
  cli.option("--steps", steps, "Steps to trace").show_default().positive();
  cli.option("--device", device, "cpu or cuda").one_of({"cpu", "cuda"});
  cli.option("--config", config, "Config").required();  // --help needs no required option
  std::vector<int64_t> sizes{32, 64};
  std::vector<double> lrs{0.01, 0.001};
  cli.option("--sizes", sizes, "Sizes").show_default();
  cli.option("--lrs", lrs, "LRs").show_default().delimiter(',');
  const auto r = parse_cli(cli, {"--help"});
  CHECK(r.code == 0);
  CHECK(r.err.empty());
  CHECK_THAT(r.out, Contains("Trace an LR schedule") && Contains("Steps to trace") &&
                        Contains("INT:POSITIVE=200") && Contains("{cpu,cuda}"));
  // A vector's default as its values are typed (what the programs showed before this parser).
  CHECK_THAT(r.out, Contains("--sizes INT=32 64 ...") && Contains("--lrs FLOAT=0.01 0.001 ..."));
}

TEST_CASE("Cli subcommands: exactly one, with its own options and positionals", "[app][cli]") {
  Cli cli{"tool"};
  cli.require_subcommand();
  std::string level = "info";
  cli.option("--log-level", level, "level");
  std::string config;
  Cli& train = cli.subcommand("train", "Train");
  train.option("--config", config, "Config");
  train.option("--log-level", level, "level");
  std::vector<std::string> files;
  Cli& check = cli.subcommand("checkpoint", "Check files");
  check.option("files", files, "Files").required();

  SECTION("the one given is parsed, with its options") {
    REQUIRE_FALSE(parse_cli(cli, {"train", "--config", "a.toml", "--log-level", "warn"}).code);
    CHECK(train.parsed());
    CHECK_FALSE(check.parsed());
    CHECK(config == "a.toml");
    CHECK(level == "warn");
  }
  SECTION("positionals") {
    REQUIRE_FALSE(parse_cli(cli, {"checkpoint", "a.tkpt", "b.tkpt"}).code);
    CHECK(check.parsed());
    CHECK_FALSE(train.parsed());
    CHECK(files == std::vector<std::string>{"a.tkpt", "b.tkpt"});
    CHECK(parse_cli(cli, {"checkpoint"}).code == 106);
  }
  SECTION("none given") {
    const auto r = parse_cli(cli, {"--log-level", "warn"});
    REQUIRE(r.code);
    CHECK(*r.code != 0);
    CHECK_THAT(r.err, Contains("subcommand"));
  }
  SECTION("a subcommand's help") {
    const auto r = parse_cli(cli, {"train", "--help"});
    CHECK(r.code == 0);
    CHECK_THAT(r.out, Contains("Train") && Contains("--config"));
  }
}
