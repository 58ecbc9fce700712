// The train config: every error names the source and the key; defaults come from one place; the
// effective config round-trips; docs/config.md is the generated key table.
#include <fstream>
#include <sstream>

#include "support.h"
#include "trainkit/app/config.h"
#include "trainkit/app/providers.h"

using trainkit::app::ConfigError;
using trainkit::app::parse_config;
using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

namespace {

/// The effective value of optimizer argument `key` (as the run directory's config.toml prints it).
const trainkit::ArgValue* opt_arg(const trainkit::app::Config& c, const std::string& key) {
  static trainkit::ArgTable table;
  table = trainkit::optim::optimizer_args(c.optimizer);
  return trainkit::find_arg(table, key);
}

double opt_num(const trainkit::app::Config& c, const std::string& key) {
  const auto* v = opt_arg(c, key);
  REQUIRE(v != nullptr);
  return v->as_number().value();
}

double beta(const trainkit::app::Config& c, size_t i) {
  const auto* v = opt_arg(c, "betas");
  REQUIRE(v != nullptr);
  return (*v->get_if<trainkit::ArgValue::Array>())[i].as_number().value();
}

}  // namespace

TEST_CASE("an empty config is the documented defaults", "[train][config]") {
  const auto c = parse_config("", "empty.toml");
  CHECK(c.model.name == "cnn");
  CHECK(c.train.batch_size == 128);
  // unset optimizer arguments take LibTorch's defaults for the chosen optimizer
  CHECK(opt_num(c, "lr") == 1e-3);
  CHECK(beta(c, 1) == 0.999);
  CHECK(opt_num(c, "weight_decay") == 0.0);
  const auto w = parse_config("[optimizer]\nname = \"adamw\"\n", "w.toml");
  CHECK(opt_num(w, "weight_decay") == 0.01);  // AdamW's own default, as in PyTorch
  CHECK(opt_arg(w, "momentum") == nullptr);
}

TEST_CASE("config errors name the source, the key and what was expected", "[train][config]") {
  SECTION("unknown key") {
    CHECK_THROWS_WITH(parse_config("[optimizer]\nlrr = 0.1\n", "a.toml"),
                      Contains("a.toml") && Contains("unknown key 'optimizer.lrr'") && Contains("line 2") &&
                          Contains("lr"));
  }
  SECTION("unknown table") {
    CHECK_THROWS_WITH(parse_config("[optimiser]\nlr = 0.1\n", "b.toml"),
                      Contains("b.toml") && Contains("optimiser") && Contains("[optimizer]"));
  }
  SECTION("wrong type") {
    CHECK_THROWS_WITH(parse_config("[train]\nbatch_size = \"big\"\n", "c.toml"),
                      Contains("c.toml: train.batch_size") && Contains("integer") && Contains("big"));
    CHECK_THROWS_WITH(parse_config("[model]\nbatch_norm = 1\n", "c.toml"),
                      Contains("model.batch_norm") && Contains("true or false"));
  }
  SECTION("out of range") {
    CHECK_THROWS_WITH(parse_config("[optimizer]\nlr = -0.1\n", "d.toml"),
                      Contains("d.toml: optimizer.lr") && Contains(">= 0") && Contains("-0.1"));
    CHECK_THROWS_WITH(parse_config("[optimizer]\nbetas = [0.9, 1.0]\n", "d.toml"),
                      Contains("optimizer.betas") && Contains("[0, 1)"));
    CHECK_THROWS_WITH(parse_config("[model]\ndropout = 1.0\n", "d.toml"), Contains("model.dropout"));
    CHECK_THROWS_WITH(parse_config("[train]\nlabel_smoothing = 1.0\n", "d.toml"),
                      Contains("d.toml: train.label_smoothing") && Contains("[0, 1)"));
    CHECK_THROWS_WITH(parse_config("[train]\nepochs = 0\n", "d.toml"), Contains("train.epochs") && Contains(">= 1"));
    CHECK_THROWS_WITH(parse_config("[model]\nname = \"vgg\"\n", "d.toml"),
                      Contains("model.name") && Contains("\"cnn\""));
  }
  SECTION("arguments that do not apply to the optimizer") {
    CHECK_THROWS_WITH(parse_config("[optimizer]\nmomentum = 0.9\n", "e.toml"),
                      Contains("optimizer.momentum does not apply") && Contains("adam"));
    CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"adam\"\ntrust_coefficient = 0.01\n", "e.toml"),
                      Contains("optimizer.trust_coefficient does not apply to optimizer \"adam\" (only to lars)"));
    CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"lars\"\nmax_grad_norm = 1.0\n", "e.toml"),
                      Contains("optimizer.max_grad_norm does not apply"));
    CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"sgd\"\nlr = 0.1\nnesterov = true\n", "e.toml"),
                      Contains("nesterov") && Contains("momentum > 0"));
  }
  SECTION("TOML syntax") {
    CHECK_THROWS_WITH(parse_config("[train\nepochs = 1\n", "f.toml"), Contains("f.toml") && Contains("line 1"));
  }
  SECTION("missing file") {
    CHECK_THROWS_WITH(trainkit::app::load_config("/nonexistent/x.toml"), Contains("/nonexistent/x.toml"));
  }
}

TEST_CASE("overrides given with --set are typed and validated like the file", "[train][config]") {
  const auto c = parse_config("[train]\nepochs = 3\n", "g.toml",
                              {"train.epochs=5", "optimizer.name=sgd", "optimizer.lr=0.05", "model.channels=[8, 16]",
                               "data.dir=/tmp/x y"});
  CHECK(c.trainer.epochs() == 5);
  CHECK(c.optimizer.name == "sgd");
  CHECK(opt_num(c, "lr") == 0.05);
  CHECK(opt_num(c, "momentum") == 0.0);
  CHECK(read_extra(c, "model", trainkit::app::ImageModelOptions::binding()).cnn().channels() ==
        std::vector<int64_t>{8, 16});
  CHECK(c.data.dir == "/tmp/x y");
  // Unset arguments take the optimizer's own defaults (timm's for LARS and LAMB).
  const auto lamb = parse_config("[optimizer]\nname = \"lamb\"\n", "h.toml");
  CHECK(opt_num(lamb, "lr") == 1e-3);
  CHECK(opt_num(lamb, "eps") == 1e-6);
  CHECK(opt_num(lamb, "weight_decay") == 0.01);
  CHECK(opt_num(lamb, "max_grad_norm") == 1.0);
  const auto lars = parse_config("[optimizer]\nname = \"lars\"\nno_decay_1d = true\n", "h.toml");
  CHECK(opt_num(lars, "lr") == 1.0);
  CHECK(opt_num(lars, "trust_coefficient") == 0.001);
  CHECK(lars.optimizer.no_decay_1d);
  CHECK_THROWS_WITH(parse_config("", "g.toml", {"train.epoch=5"}),
                    Contains("--set train.epoch=5") && Contains("unknown key"));
  CHECK_THROWS_WITH(parse_config("", "g.toml", {"train.epochs=-1"}),
                    Contains("--set train.epochs=-1") && Contains(">= 1"));
  CHECK_THROWS_WITH(parse_config("", "g.toml", {"epochs"}), Contains("section.key=value"));
  CHECK_THROWS_WITH(parse_config("optimizer = 3\n", "g.toml", {"optimizer.lr=0.1"}),
                    Contains("--set optimizer.lr=0.1") && Contains("'optimizer' must be a table"));
  // An optimizer or scheduler key that came from --set: the --set is the culprit, not the file.
  CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"adam\"\n", "g.toml", {"optimizer.momentum=0.9"}),
                    StartsWith("--set optimizer.momentum=0.9: optimizer.momentum does not apply to optimizer \"adam\""));
  CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"sgd\"\n", "g.toml", {"optimizer.lr=\"fast\""}),
                    StartsWith("--set optimizer.lr=\"fast\": optimizer.lr: expected"));
  CHECK_THROWS_WITH(parse_config("[optimizer]\nname = \"sgd\"\nmomentum = \"x\"\n", "g.toml", {"optimizer.lr=0.1"}),
                    StartsWith("g.toml: optimizer.momentum: expected"));  // the file's own key still names the file
  CHECK_THROWS_WITH(parse_config("[scheduler]\ntype = \"StepLR\"\nstep_size = 3\n", "g.toml", {"scheduler.gamma=\"x\""}),
                    StartsWith("--set scheduler.gamma=\"x\": "));
}

TEST_CASE("the [scheduler] table is validated when the config is read", "[train][config][sched]") {
  const std::string base = "[scheduler]\ntype = \"CosineAnnealingLR\"\nT_max = 10\n";
  const auto c = parse_config(base, "s.toml", {"scheduler.eta_min=0.001"});
  REQUIRE(c.scheduler.has_value());
  CHECK(c.scheduler->type == "CosineAnnealingLR");
  CHECK_THAT(trainkit::app::to_toml(c), Contains("T_max = 10") && Contains("eta_min = 0.001"));
  CHECK_THAT(trainkit::app::to_toml(c), Contains("[scheduler]") && Contains("CosineAnnealingLR"));
  CHECK(trainkit::app::to_toml(parse_config(trainkit::app::to_toml(c), "again.toml")) == trainkit::app::to_toml(c));
  CHECK_THROWS_WITH(parse_config(base + "Tmax = 3\n", "s.toml"),
                    Contains("s.toml: [scheduler]") && Contains("unknown key 'Tmax'"));
  CHECK_THROWS_WITH(parse_config(base, "s.toml", {"scheduler.T_max=0"}),
                    StartsWith("--set scheduler.T_max=0: ") && Contains("T_max: expected an integer >= 1, got 0"));
  CHECK_THROWS_WITH(parse_config("[scheduler]\ntype = \"CosineAnnealingLR\"\nT_max = 0\n", "s.toml"),
                    StartsWith("s.toml: [scheduler]") && Contains("T_max: expected an integer >= 1, got 0 (line 3)"));
  CHECK_THROWS_WITH(parse_config("[scheduler]\ntype = \"CosineAnnealingLR\"\n", "s.toml"),
                    Contains("s.toml: [scheduler]") && Contains("T_max is required"));
  CHECK_THROWS_WITH(parse_config("[scheduler]\ntype = \"Cosine\"\n", "s.toml"), Contains("unknown type"));
  CHECK_THROWS_AS(parse_config("[scheduler]\ntype = \"CyclicLR\"\nbase_lr = 0.1\nmax_lr = 0.01\n", "s.toml"),
                  ConfigError);
}

TEST_CASE("the effective config reads back to the same values", "[train][config]") {
  const auto c = parse_config("", "h.toml",
                              {"optimizer.name=adamw", "optimizer.lr=3e-4", "optimizer.betas=[0.8, 0.95]",
                               "model.dropout=0", "train.device=cpu", "log.progress=lines"});
  const std::string text = trainkit::app::to_toml(c);
  const auto again = parse_config(text, "effective.toml");
  CHECK(trainkit::app::to_toml(again) == text);
  CHECK(opt_num(again, "lr") == 3e-4);
  CHECK(beta(again, 0) == 0.8);
  CHECK(read_extra(again, "model", trainkit::app::ImageModelOptions::binding()).cnn().dropout() == 0.0);
  CHECK(text.find("momentum") == std::string::npos);  // sgd-only keys are left out for adamw
}

TEST_CASE("shipped configs parse and docs/config.md is the generated key table", "[train][config]") {
  CHECK_NOTHROW(trainkit::app::load_config(trainkit::test::source_path("configs/fashion_mnist.toml")));
  CHECK_NOTHROW(trainkit::app::load_config(trainkit::test::source_path("configs/fashion_mnist_constant_lr.toml")));
  CHECK_NOTHROW(trainkit::app::load_config(trainkit::test::source_path("configs/image_classification.toml")));
  CHECK_NOTHROW(trainkit::app::load_config(trainkit::test::source_path("configs/fast.toml")));
  const auto recipe = trainkit::app::load_config(trainkit::test::source_path("configs/recipe.toml"));
  CHECK(recipe.amp.enabled);
  CHECK(recipe.trainer.accumulation_steps() == 2);
  CHECK(recipe.trainer.clip_grad_norm() == 1.0);
  std::ifstream doc(trainkit::test::source_path("docs/config.md"));
  REQUIRE(doc);
  std::stringstream text;
  text << doc.rdbuf();
  INFO("regenerate the table with: trainkit train --list-keys");
  CHECK_THAT(text.str(), Contains(trainkit::app::config_keys_markdown()));
}

TEST_CASE("[early_stopping], [ema], [swa] and the best-k checkpoint keys are read and validated",
          "[train][config]") {
  const auto c = parse_config(
      "[early_stopping]\nenabled = true\nmonitor = \"val_ema/loss\"\npatience = 2\nmin_delta = 0.01\n"
      "[ema]\nenabled = true\ndecay = 0.998\nuse_warmup = true\n"
      "[swa]\nenabled = true\nswa_start = 3\nswa_lr = 0.01\nanneal_strategy = \"linear\"\n"
      "[checkpoint]\nsave_top_k = 2\nmonitor = \"val/accuracy\"\nmode = \"max\"\n",
      "h.toml");
  CHECK(c.early_stopping.enabled);
  CHECK(c.early_stopping.options.monitor() == "val_ema/loss");
  CHECK(c.early_stopping.options.patience() == 2);
  CHECK(c.early_stopping.options.mode() == "min");  // the library's default
  CHECK(c.ema.options.decay() == 0.998);
  CHECK(c.ema.options.warmup_power() == Approx(2.0 / 3.0));
  CHECK(c.swa.options.swa_start() == 3);
  CHECK(c.swa.options.anneal_epochs() == 10);
  CHECK(c.swa.options.anneal_strategy() == "linear");
  CHECK(c.checkpoint.best.save_top_k() == 2);
  CHECK(c.checkpoint.best.mode() == "max");
  CHECK_THROWS_WITH(parse_config("[early_stopping]\nmonitor = \"loss\"\n", "i.toml"),
                    Contains("i.toml: early_stopping.monitor") && Contains("val_ema/"));
  CHECK_THROWS_WITH(parse_config("[ema]\ndecay = 1.5\n", "i.toml"), Contains("ema.decay") && Contains("1.5"));
  CHECK_THROWS_WITH(parse_config("[swa]\nanneal_strategy = \"step\"\n", "i.toml"), Contains("swa.anneal_strategy"));
  CHECK_THROWS_WITH(parse_config("[checkpoint]\nsave_top_k = -2\n", "i.toml"), Contains("checkpoint.save_top_k"));
}
