// MetricsWriter: one val_<name> column per metric of the run, the same fields in JSONL, a resumed run
// with other metrics is refused without touching the file, and the curves plot every metric column; monitor
// columns (per-group LR and momentum, gradient norm) follow the metrics. JSONL rows are valid JSON whatever
// the names and values (escaped names, null for NaN and infinities). A failed write (a full device) is an
// error naming the file, and appending first drops a partial last row.
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support.h"
#include "trainkit/log/metrics.h"

using trainkit::test::TempDir;
using trainkit::test::read_text;
using trainkit::test::WhatContains;
namespace tl = trainkit::log;

TEST_CASE("MetricsWriter writes a column per metric of the run", "[log][metrics]") {
  TempDir tmp("metrics-writer");
  {
    tl::MetricsWriter w(tmp.str(), false, {"mse", "mae"});
    tl::MetricRow train;
    train.kind = "train";
    train.step = 10;
    train.loss = 0.5;
    train.lr = 0.01;
    w.write(train);
    tl::MetricRow epoch;
    epoch.kind = "epoch";
    epoch.step = 20;
    epoch.loss = 0.25;
    epoch.val_loss = 0.3;
    epoch.val_metrics = {{"mae", 0.4}, {"mse", 0.3}};  // any order
    w.write(epoch);
    epoch.val_metrics = {{"accuracy", 0.9}};
    CHECK_THROWS_MATCHES(w.write(epoch), std::invalid_argument,
                         WhatContains("metric \"accuracy\" has no column (columns: "
                                      "kind,step,epoch,loss,lr,samples_per_second,val_loss,val_mse,val_mae)"));
  }
  const std::string csv = read_text(tmp.str("metrics.csv"));
  CHECK(csv ==
        "kind,step,epoch,loss,lr,samples_per_second,val_loss,val_mse,val_mae\n"
        "train,10,0,0.5,0.01,,,,\n"
        "epoch,20,0,0.25,,,0.3,0.3,0.4\n");
  CHECK_THAT(read_text(tmp.str("metrics.jsonl")),
             Catch::Matchers::Contains("{\"kind\":\"epoch\",\"step\":20,\"epoch\":0,\"loss\":0.25,\"val_loss\":0.3,"
                                       "\"val_mse\":0.3,\"val_mae\":0.4}"));
  tl::write_curves_svg(tmp.str("metrics.csv"), tmp.str("curves.svg"), "run");
  const std::string svg = read_text(tmp.str("curves.svg"));
  CHECK_THAT(svg, Catch::Matchers::Contains("validation mse") && Catch::Matchers::Contains("validation mae"));

  // A resumed run with other metrics cannot append; the file is unchanged.
  CHECK_THROWS_MATCHES(tl::MetricsWriter(tmp.str(), true, {"accuracy"}), std::runtime_error,
                       WhatContains("metrics.csv: has columns"));
  CHECK(read_text(tmp.str("metrics.csv")) == csv);
  tl::MetricsWriter again(tmp.str(), true, {"mse", "mae"});  // the same metrics append
}

TEST_CASE("MetricsWriter writes monitor columns after the metrics, and every monitor to JSONL", "[log][metrics]") {
  TempDir tmp("metrics-monitors");
  {
    tl::MetricsWriter w(tmp.str(), false, {"accuracy"}, {"lr_group_0", "lr_group_1", "grad_norm"});
    tl::MetricRow train;
    train.kind = "train";
    train.step = 5;
    train.loss = 1.5;
    train.monitors = {{"grad_norm", 2.25}, {"lr_group_0", 0.1}, {"momentum_group_0", 0.9}};  // no group 1
    w.write(train);
    tl::MetricRow epoch;
    epoch.kind = "epoch";
    epoch.step = 5;
    epoch.val_metrics = {{"accuracy", 0.5}};
    w.write(epoch);
  }
  CHECK(read_text(tmp.str("metrics.csv")) ==
        "kind,step,epoch,loss,lr,samples_per_second,val_loss,val_accuracy,lr_group_0,lr_group_1,grad_norm\n"
        "train,5,0,1.5,,,,,0.1,,2.25\n"
        "epoch,5,0,,,,,0.5,,,\n");
  CHECK_THAT(read_text(tmp.str("metrics.jsonl")),
             Catch::Matchers::Contains("{\"kind\":\"train\",\"step\":5,\"epoch\":0,\"loss\":1.5,\"grad_norm\":2.25,"
                                       "\"lr_group_0\":0.1,\"momentum_group_0\":0.9}"));
  // A resumed run must declare the same monitor columns.
  CHECK_THROWS_MATCHES(tl::MetricsWriter(tmp.str(), true, {"accuracy"}), std::runtime_error,
                       WhatContains("metrics.csv: has columns"));
}

TEST_CASE("MetricsWriter writes JSON Lines: names escaped, non-finite values as null, full precision",
          "[log][metrics][json]") {
  TempDir tmp("metrics-json");
  const std::string odd = "say \"hi\" \\ back\nslash";  // a quote, a backslash and a newline
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  {
    tl::MetricsWriter w(tmp.str(), false, {"accuracy"});
    tl::MetricRow row;
    row.kind = "train";
    row.step = 3;
    row.loss = nan;
    row.lr = 0.1 + 0.2;  // 0.30000000000000004: nine significant digits would print 0.3
    row.samples_per_second = inf;
    row.val_loss = -inf;
    row.monitors = {{odd, 1.5}, {"grad_norm", nan}};
    w.write(row);
  }
  const std::string text = read_text(tmp.str("metrics.jsonl"));
  INFO(text);
  REQUIRE(trainkit::test::count_occurrences(text, "\n") == 1);  // the newline in the name is escaped
  CHECK_THAT(text, Catch::Matchers::Contains("\"loss\":null") && Catch::Matchers::Contains("\"grad_norm\":null"));
  CHECK_THAT(text, Catch::Matchers::Contains(R"("say \"hi\" \\ back\nslash":1.5)"));
  nlohmann::json row;
  REQUIRE_NOTHROW(row = nlohmann::json::parse(text));
  CHECK(row["kind"] == "train");
  CHECK(row["step"] == 3);
  CHECK(row["loss"].is_null());
  CHECK(row["samples_per_second"].is_null());
  CHECK(row["val_loss"].is_null());
  CHECK(row["grad_norm"].is_null());
  CHECK(row["lr"].get<double>() == 0.1 + 0.2);  // the exact double, read back
  CHECK(row[odd].get<double>() == 1.5);
  // The CSV keeps its plain text for non-finite values.
  CHECK(read_text(tmp.str("metrics.csv")) ==
        "kind,step,epoch,loss,lr,samples_per_second,val_loss,val_accuracy\n"
        "train,3,0,nan,0.3,inf,-inf,\n");
}

TEST_CASE("MetricsWriter: a failed write is an error naming the file, and appending drops a partial last row",
          "[log][metrics][faults][may-skip]") {
  TempDir tmp("metrics-writer-faults");
  tl::MetricRow row;
  row.kind = "train";
  row.step = 1;
  row.loss = 0.5;
  SECTION("a full device (/dev/full gives ENOSPC on every write)") {
    if (!std::filesystem::exists("/dev/full")) {
      TRAINKIT_SKIP("no /dev/full on this system");
    }
    std::filesystem::create_symlink("/dev/full", tmp.path() / "metrics.jsonl");
    tl::MetricsWriter w(tmp.str(), true);
    CHECK_THROWS_MATCHES(w.write(row), std::runtime_error,
                         WhatContains("metrics.jsonl: write failed: No space left on device"));
  }
  SECTION("a row cut off by a killed run is dropped before the next one is appended") {
    {
      tl::MetricsWriter w(tmp.str(), false);
      w.write(row);
    }
    const std::string complete_csv = read_text(tmp.str("metrics.csv"));
    const std::string complete_jsonl = read_text(tmp.str("metrics.jsonl"));
    std::ofstream(tmp.str("metrics.csv"), std::ios::app) << "train,2,0,0.4";
    std::ofstream(tmp.str("metrics.jsonl"), std::ios::app) << "{\"kind\":\"train\",\"st";
    {
      tl::MetricsWriter w(tmp.str(), true);
      row.step = 3;
      w.write(row);
    }
    CHECK(read_text(tmp.str("metrics.csv")) == complete_csv + "train,3,0,0.5,,,,\n");
    const std::string jsonl = read_text(tmp.str("metrics.jsonl"));
    CHECK(jsonl.rfind(complete_jsonl, 0) == 0);
    std::istringstream lines(jsonl);
    int rows = 0;
    for (std::string line; std::getline(lines, line); ++rows) {
      INFO(line);
      CHECK_NOTHROW(nlohmann::json::parse(line));
    }
    CHECK(rows == 2);
  }
}
