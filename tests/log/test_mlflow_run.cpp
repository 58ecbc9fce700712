// A `trainkit train` run whose log.mlflow_uri holds credentials (http://user:password@host), against the test
// HTTP server: they reach the server as its Authorization header only, never the log, config.toml, the params
// or the uploaded artifacts.
#include <filesystem>
#include <fstream>
#include <string>

#include "log/mlflow_test_support.h"
#include "support.h"
#include "trainkit/app/jobs.h"

using trainkit::test::HttpRequest;
using trainkit::test::HttpTestServer;
using trainkit::test::TempDir;
using namespace mlflow_faults;

TEST_CASE("trainkit train: credentials in log.mlflow_uri reach the server only as its Authorization header",
          "[log][mlflow][app]") {
  ScopedEnv env({});
  TempDir tmp("mlflow-train");
  HttpTestServer server(mlflow_reply);
  const std::string uri = "http://alice:s3cret-pw@127.0.0.1:" + std::to_string(server.port());
  std::ofstream(tmp.str("run.toml"))
      << "[data]\nval_size = 100\nlimit_train = 200\nlimit_test = 100\n"
         "[model]\nname = \"mlp\"\nhidden = 8\n"
         "[train]\nepochs = 1\nbatch_size = 50\nseed = 5\nthreads = 1\n"
         "[log]\nprogress = \"lines\"\nmlflow_uri = \"" << uri << "\"\n";
  trainkit::app::TrainJobOptions options;
  options.config_path = tmp.str("run.toml");
  options.out_dir = tmp.str("run");
  LogCapture log;
  const trainkit::app::TrainJobResult result = trainkit::app::run_train_job(options);
  REQUIRE(result.finished);
  INFO(log.text());
  const std::string sent = server.everything_but_authorization();
  const std::string config_toml = trainkit::test::read_text(std::filesystem::path(result.run_dir) / "config.toml");
  for (const std::string secret : {"s3cret-pw", "alice"}) {
    CHECK(log.text().find(secret) == std::string::npos);
    CHECK(sent.find(secret) == std::string::npos);          // params, tags, the config.toml artifact
    CHECK(config_toml.find(secret) == std::string::npos);
  }
  CHECK_THAT(config_toml, Catch::Contains("mlflow_uri = \"" + server.uri() + "\""));
  CHECK_THAT(sent, Catch::Contains("\"key\":\"log.mlflow_uri\",\"value\":\"" + server.uri() + "\""));
  bool artifact = false;
  for (const HttpRequest& r : server.requests()) {
    CHECK(r.header("authorization") == "Basic " + base64("alice:s3cret-pw"));
    if (r.method == "PUT" && r.target.find("/config.toml") != std::string::npos) artifact = true;
  }
  CHECK(artifact);
}

