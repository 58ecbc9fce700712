// MLflow tracking without a server: which MLflow metrics a metrics row becomes, the metrics writer's sink,
// and the logger's behaviour when the server does not answer (training goes on, nothing throws, points
// beyond the queue bound are dropped and counted, the rest reported unsent). The real server is the ctest
// mlflow_server_receives_run (scripts/mlflow_check.py).
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "support.h"
#include "trainkit/log/metrics.h"
#include "trainkit/log/mlflow.h"

using trainkit::test::TempDir;
using trainkit::test::WhatContains;
namespace tl = trainkit::log;

namespace {

/// A loopback port that nothing listens on (bound, then closed): connections are refused at once.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::map<std::string, std::pair<double, int64_t>> by_key(const std::vector<tl::MlflowMetric>& metrics) {
  std::map<std::string, std::pair<double, int64_t>> out;
  for (const auto& m : metrics) out[m.key] = {m.value, m.step};
  return out;
}

std::vector<tl::MlflowMetric> points(int n) {
  std::vector<tl::MlflowMetric> out;
  for (int i = 0; i < n; ++i) out.push_back({"train/loss", 1.0 / (i + 1), 0, i});
  return out;
}

}  // namespace

TEST_CASE("A metrics row becomes MLflow metrics named as in TensorBoard, at the row's step", "[log][mlflow]") {
  tl::MetricRow train;
  train.kind = "train";
  train.step = 40;
  train.loss = 0.5;
  train.lr = 0.01;
  train.samples_per_second = 900;
  train.monitors = {{"lr_group_1", 0.02}, {"grad_norm", 3.5}};
  const auto t = by_key(tl::mlflow_metrics(train));
  CHECK(t.size() == 5);
  CHECK(t.at("train/loss") == std::make_pair(0.5, int64_t{40}));
  CHECK(t.at("train/lr").first == 0.01);
  CHECK(t.at("train/samples_per_second").first == 900);
  CHECK(t.at("train/lr_group_1").first == 0.02);
  CHECK(t.at("train/grad_norm").first == 3.5);

  tl::MetricRow epoch;
  epoch.kind = "epoch";
  epoch.step = 50;
  epoch.loss = 0.4;
  epoch.val_loss = 0.6;
  epoch.val_metrics = {{"accuracy", 0.8}};
  epoch.monitors = {{"val_ema/loss", 0.55}};
  const auto e = by_key(tl::mlflow_metrics(epoch));
  CHECK(e.size() == 4);
  CHECK(e.at("epoch/train_loss") == std::make_pair(0.4, int64_t{50}));
  CHECK(e.at("val/loss").first == 0.6);
  CHECK(e.at("val/accuracy").first == 0.8);
  CHECK(e.at("val_ema/loss").first == 0.55);

  tl::MetricRow test;
  test.kind = "test";
  test.step = 50;
  test.val_loss = 0.7;
  test.val_metrics = {{"accuracy", 0.75}};
  const auto s = by_key(tl::mlflow_metrics(test));
  CHECK(s.size() == 2);
  CHECK(s.at("test/loss").first == 0.7);
  CHECK(s.at("test/accuracy").first == 0.75);
}

TEST_CASE("MetricsWriter passes every row it writes to its sinks", "[log][mlflow]") {
  TempDir tmp("mlflow-sink");
  tl::MetricsWriter writer(tmp.str(), false);
  std::vector<int64_t> steps;
  writer.add_sink([&](const tl::MetricRow& row) { steps.push_back(row.step); });
  for (int64_t step : {10, 20, 30}) {
    tl::MetricRow row;
    row.kind = "train";
    row.step = step;
    row.loss = 1.0;
    writer.write(row);
  }
  CHECK(steps == std::vector<int64_t>{10, 20, 30});
}

TEST_CASE("MlflowClient wants a tracking server's http URI", "[log][mlflow]") {
  CHECK_THROWS_MATCHES(tl::MlflowClient("file:///tmp/mlruns"), std::invalid_argument,
                       WhatContains("\"file:///tmp/mlruns\": trainkit talks to a tracking server"));
  CHECK_NOTHROW(tl::MlflowClient("http://127.0.0.1:5000/"));
}

TEST_CASE("MlflowClient names the URL when the server does not answer", "[log][mlflow]") {
  const std::string uri = "http://127.0.0.1:" + std::to_string(closed_port());
  tl::MlflowClient client(uri, std::chrono::seconds(2));
  try {
    client.experiment_id("x");
    FAIL("no error");
  } catch (const tl::MlflowError& e) {
    CHECK(e.http_status() == 0);
    CHECK(e.transient());
    CHECK_THAT(std::string(e.what()), Catch::Contains(uri + "/api/2.0/mlflow/experiments/get-by-name"));
  }
}

TEST_CASE("MlflowLogger without a server: training goes on, the queue is bounded, the loss is counted",
          "[log][mlflow]") {
  tl::MlflowLoggerOptions options;
  options.tracking_uri = "http://127.0.0.1:" + std::to_string(closed_port());
  options.flush_timeout = std::chrono::milliseconds(300);
  options.retry_interval = std::chrono::milliseconds(20);
  SECTION("below the bound nothing is dropped; what finish() could not send is reported unsent") {
    tl::MlflowLogger logger(options);
    logger.log_params({{"optimizer.lr", "0.01"}});
    logger.log_metrics(points(25));
    const auto start = std::chrono::steady_clock::now();
    const tl::MlflowLoggerStats stats = logger.finish();
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));  // gives up after flush_timeout
    CHECK(stats.metrics_sent == 0);
    CHECK(stats.metrics_dropped == 0);
    CHECK(stats.metrics_unsent == 25);
    CHECK(stats.failed_requests > 0);
    CHECK(logger.run_id().empty());
  }
  SECTION("beyond max_queued the oldest points are dropped") {
    options.max_queued = 10;
    tl::MlflowLogger logger(options);
    logger.log_params({{"optimizer.lr", "0.01"}});  // the worker waits on this one while the points queue
    for (int i = 0; i < 5; ++i) logger.log_metrics(points(5));
    const tl::MlflowLoggerStats stats = logger.finish();
    CHECK(stats.metrics_dropped == 15);
    CHECK(stats.metrics_unsent == 10);
    CHECK(stats.metrics_sent == 0);
  }
  SECTION("max_queued must be positive") {
    options.max_queued = 0;
    CHECK_THROWS_MATCHES(tl::MlflowLogger(options), std::invalid_argument, WhatContains("max_queued must be >= 1"));
  }
}
