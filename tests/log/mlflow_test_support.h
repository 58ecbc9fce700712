#pragma once
// What the MLflow tests share: a log capture, environment variables set for a scope, a tracking server's
// answers for the test HTTP server, and small helpers.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "log/http_test_server.h"
#include "trainkit/log/mlflow.h"

namespace mlflow_faults {

using trainkit::test::HttpReply;
using trainkit::test::HttpRequest;
using trainkit::test::LogCapture;
namespace tl = trainkit::log;


/// Sets (or, with nullopt, removes) environment variables, and puts them back as they were on destruction.
/// MLflow's credential and TLS variables not named are removed meanwhile.
class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::optional<std::string>>> vars) {
    for (const char* name : {"MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                             "MLFLOW_TRACKING_SERVER_CERT_PATH", "MLFLOW_TRACKING_CLIENT_CERT_PATH",
                             "MLFLOW_TRACKING_INSECURE_TLS"}) {
      if (std::none_of(vars.begin(), vars.end(), [&](const auto& v) { return v.first == name; })) {
        vars.emplace_back(name, std::nullopt);
      }
    }
    for (const auto& [name, value] : vars) {
      const char* old = std::getenv(name.c_str());
      saved_.emplace_back(name, old == nullptr ? std::nullopt : std::optional<std::string>(old));
      set(name, value);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) set(name, value);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

inline const char* const kRun =
    R"({"run": {"info": {"run_id": "run1", "experiment_id": "7", "artifact_uri": "mlflow-artifacts:/7/run1/artifacts"}}})";

/// What a tracking server answers to the calls trainkit makes.
inline HttpReply mlflow_reply(const HttpRequest& r) {
  if (r.is("experiments/get-by-name")) return {200, R"({"experiment": {"experiment_id": "7"}})"};
  if (r.is("runs/create") || r.is("runs/get")) return {200, kRun};
  return {200, "{}"};
}

/// A loopback port that nothing listens on.
inline int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

inline tl::MlflowLoggerOptions quick_options(const std::string& uri) {
  tl::MlflowLoggerOptions o;
  o.tracking_uri = uri;
  o.flush_timeout = std::chrono::milliseconds(1500);
  o.retry_interval = std::chrono::milliseconds(20);
  o.request_timeout = std::chrono::milliseconds(500);
  return o;
}

inline std::vector<tl::MlflowMetric> some_points(int n) {
  std::vector<tl::MlflowMetric> out;
  for (int i = 0; i < n; ++i) out.push_back({"train/loss", 1.0 / (i + 1), 0, i});
  return out;
}

inline std::string base64(const std::string& in) {
  static const char* const table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += table[(v >> s) & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint8_t(in[i]) << 16;
    out += std::string{table[(v >> 18) & 63], table[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += std::string{table[(v >> 18) & 63], table[(v >> 12) & 63], table[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace mlflow_faults
