// Fuzz target `config`: app::parse_config over TOML text plus `--set` overrides (fuzz_config.h). An
// accepted configuration must print (to_toml) as TOML that reads back to the same text: the run
// directory's config.toml is what `--resume` and the reproducibility story rely on.

#include <stdexcept>
#include <string>

#include "fuzz_config.h"
#include "fuzz_target.h"
#include "trainkit/app/config.h"

TRAINKIT_FUZZ_TARGET(config) {
  const trainkit::fuzz::ConfigInput input = trainkit::fuzz::split_config_input(data, size);
  std::string printed;
  try {
    const trainkit::app::Config config = trainkit::app::parse_config(input.toml, "fuzz.toml", input.overrides);
    printed = trainkit::app::to_toml(config);
  } catch (const trainkit::ArgError&) {
    return 0;  // ConfigError and the factories' ArgError: rejected with a message naming the key
  }
  try {
    const trainkit::app::Config again = trainkit::app::parse_config(printed, "printed.toml");
    trainkit::fuzz::check(trainkit::app::to_toml(again) == printed,
                          "to_toml(parse_config(to_toml(config))) differs from to_toml(config):\n" + printed);
  } catch (const trainkit::ArgError& e) {
    trainkit::fuzz::fail(std::string("the printed configuration does not read back: ") + e.what() + "\n" + printed);
  }
  return 0;
}
