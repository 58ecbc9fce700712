// Named arguments: the core's ArgReader (types, unknown keys, messages with the source line) and the
// application layer's TOML bridge (parse_toml, --set values, printing back).
#include "support.h"
#include "trainkit/app/toml_args.h"
#include "trainkit/args.h"

using trainkit::ArgError;
using trainkit::ArgReader;
using trainkit::ArgTable;
using trainkit::ArgValue;
using Catch::Matchers::Contains;

TEST_CASE("ArgReader reads typed values and rejects what it did not read", "[args]") {
  const ArgTable table = {{"lr", ArgValue(0.1, 3)},      {"steps", ArgValue(int64_t{5}, 4)},
                          {"nesterov", ArgValue(true)},  {"mode", ArgValue("cos")},
                          {"milestones", ArgValue(ArgValue::Array{2, 5})}, {"max_lr", ArgValue(int64_t{1})}};
  ArgReader r(table, "x.toml: [t]");
  CHECK(r.number("lr") == 0.1);
  CHECK(r.number("steps") == 5.0);  // an integer is a number
  CHECK(r.integer("missing") == std::nullopt);
  CHECK(r.boolean("nesterov") == true);
  CHECK(r.required_string("mode") == "cos");
  CHECK(r.required_integers("milestones") == std::vector<int64_t>{2, 5});
  CHECK(r.required_numbers("max_lr") == std::vector<double>{1.0});  // one value for every group
  CHECK_NOTHROW(r.finish("T"));
  CHECK_THROWS_WITH(r.required_integer("absent"), Contains("x.toml: [t]: absent is required"));
  ArgReader partial(table, "x.toml: [t]");
  partial.number("lr");
  CHECK_THROWS_WITH(partial.finish("T"), Contains("unknown key 'steps' (line 4) for T (known: lr)"));
  ArgReader wrong(table, "x.toml: [t]");
  CHECK_THROWS_AS(wrong.integer("lr"), ArgError);
  CHECK_THROWS_WITH(wrong.integer("lr"), Contains("x.toml: [t]: lr: expected an integer, got 0.1 (line 3)"));
  CHECK_THROWS_WITH(wrong.string("steps"), Contains("expected a string, got 5"));
}

TEST_CASE("TOML text becomes an ArgTable and prints back to the same values", "[args][app]") {
  const std::string text =
      "type = \"SequentialLR\"\nmilestones = [3]\nlr = 1e-05\nname = 'a \"q\"'\n"
      "[[schedulers]]\ntype = \"LinearLR\"\nstart_factor = 0.1\n[[schedulers]]\ntype = \"ExponentialLR\"\ngamma = 0.9\n";
  const ArgTable table = trainkit::app::parse_toml(text, "s.toml");
  REQUIRE(trainkit::find_arg(table, "milestones") != nullptr);
  CHECK(trainkit::find_arg(table, "milestones")->line() == 2);
  const auto* members = trainkit::find_arg(table, "schedulers")->get_if<ArgValue::Array>();
  REQUIRE(members != nullptr);
  CHECK(members->size() == 2);
  const std::string printed = trainkit::app::to_toml_lines(table);
  const ArgTable again = trainkit::app::parse_toml(printed, "printed");
  CHECK(trainkit::app::to_toml_lines(again) == printed);
  CHECK(trainkit::find_arg(again, "lr")->as_number() == 1e-05);
  CHECK(*trainkit::find_arg(again, "name")->get_if<std::string>() == "a \"q\"");
  CHECK_THROWS_WITH(trainkit::app::parse_toml("[t\n", "bad.toml"), Contains("bad.toml: TOML syntax error at line 1"));
  CHECK(trainkit::app::parse_toml_value("0.5").as_number() == 0.5);
  CHECK(*trainkit::app::parse_toml_value("/tmp/x y").get_if<std::string>() == "/tmp/x y");  // a bare string
  CHECK(trainkit::app::parse_toml_value("[1, 2]").get_if<ArgValue::Array>()->size() == 2);
}
