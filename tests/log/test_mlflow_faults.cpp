// MLflow against servers that misbehave and servers that want credentials: a test HTTP server
// (tests/log/http_test_server.h) answers 200 with odd bodies, 3xx and slow bodies, and records what reaches it;
// credentials come from MLflow's environment variables (as its Python client reads them) and appear nowhere
// but in the Authorization header (test_mlflow_run.cpp: the same for a whole `trainkit train` run); artifacts
// are streamed with a timeout that grows with their size, and the final warning names those not sent. The
// last cases run the real `mlflow server --app-name basic-auth` from the venv, and a TLS server (Python's ssl
// with a self-signed certificate from openssl) for the TLS variables.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log/mlflow_test_support.h"
#include "support.h"
#include "trainkit/log/mlflow.h"
#include "trainkit/subprocess.h"

using trainkit::test::HttpReply;
using trainkit::test::HttpRequest;
using trainkit::test::HttpTestServer;
using trainkit::test::TempDir;
using trainkit::test::WhatContains;
namespace tl = trainkit::log;
namespace fs = std::filesystem;

using namespace mlflow_faults;

namespace mlflow_faults {

/// A logger whose server answers `endpoint` with `odd` (and everything else as MLflow does) creates no run,
/// keeps going, and says which call failed and what was lost.
void check_odd_reply(const std::string& endpoint, const HttpReply& odd, const std::string& expected_message) {
  HttpTestServer server([&](const HttpRequest& r) { return r.is(endpoint) ? odd : mlflow_reply(r); });
  LogCapture log;
  tl::MlflowLoggerStats stats;
  {
    tl::MlflowLogger logger(quick_options(server.uri()));
    logger.log_params({{"optimizer.lr", "0.01"}});
    logger.log_metrics(some_points(5));
    stats = logger.finish();
    CHECK(logger.run_id().empty());
  }
  INFO(log.text());
  CHECK(stats.metrics_sent == 0);
  CHECK(stats.metrics_unsent == 5);
  CHECK(stats.failed_requests >= 1);
  CHECK_THAT(log.text(), Catch::Contains(endpoint));          // the call that failed is named
  CHECK_THAT(log.text(), Catch::Contains(expected_message));  // and why
  CHECK_THAT(log.text(), Catch::Contains("5 unsent"));        // and what was lost
}

}  // namespace mlflow_faults

TEST_CASE("MlflowLogger: a server that answers oddly gives a warning and never ends the process",
          "[log][mlflow]") {
  ScopedEnv env({});
  SECTION("runs/create: 200 without the run") {
    check_odd_reply("runs/create", {200, "{}"}, "the server's answer lacks what trainkit needs");
  }
  SECTION("runs/create: 200 with a run id that is a number") {
    check_odd_reply("runs/create", {200, R"({"run": {"info": {"run_id": 5, "experiment_id": "7"}}})"},
                    "the server's answer lacks what trainkit needs");
  }
  SECTION("experiments/get-by-name: 200 with a list") {
    check_odd_reply("experiments/get-by-name", {200, "[1, 2]"}, "the server's answer lacks what trainkit needs");
  }
  SECTION("experiments/get-by-name: 200 and not JSON") {
    check_odd_reply("experiments/get-by-name", {200, "<html>a proxy's login page</html>"},
                    "the server's answer is not JSON");
  }
  SECTION("runs/create: 302 to another place") {
    check_odd_reply("runs/create", {302, "", {{"Location", "http://elsewhere.invalid/login"}}},
                    "HTTP 302: a redirect to http://elsewhere.invalid/login");
  }
  SECTION("runs/create: an answer that trickles in slower than the request timeout") {
    HttpReply slow{200, kRun};
    slow.byte_delay = std::chrono::milliseconds(100);
    check_odd_reply("runs/create", slow, "does not answer");
  }
}

TEST_CASE("MlflowLogger: a run name that is not UTF-8 reaches the server with U+FFFD in its place",
          "[log][mlflow]") {
  ScopedEnv env({});
  HttpTestServer server(mlflow_reply);
  tl::MlflowLoggerOptions options = quick_options(server.uri());
  options.run_name = "run-\xff\xfe-1";
  tl::MlflowLogger logger(options);
  logger.set_tags({{"trainkit.run_dir", "/tmp/run-\xff\xfe-1"}});
  logger.log_metrics(some_points(3));
  const tl::MlflowLoggerStats stats = logger.finish();
  CHECK(stats.metrics_sent == 3);
  CHECK(logger.run_id() == "run1");
  bool created = false;
  for (const HttpRequest& r : server.requests()) {
    if (r.is("runs/create")) {
      created = true;
      CHECK_THAT(r.body, Catch::Contains("\"run_name\":\"run-\xef\xbf\xbd\xef\xbf\xbd-1\""));
    }
    if (r.is("runs/log-batch") && r.body.find("trainkit.run_dir") != std::string::npos) {
      CHECK_THAT(r.body, Catch::Contains("/tmp/run-\xef\xbf\xbd\xef\xbf\xbd-1"));
    }
  }
  CHECK(created);
}

namespace mlflow_faults {

/// Every call of a client for `uri` under the environment `vars` carries the header Authorization: `expected`
/// ("" = none), and nothing else the server receives holds credentials.
void check_authorization(HttpTestServer& server, const std::string& uri,
                         const std::vector<std::pair<std::string, std::optional<std::string>>>& vars,
                         const std::string& expected) {
  ScopedEnv env(vars);
  tl::MlflowClient client(uri, std::chrono::seconds(5));
  CHECK(client.experiment_id("e") == "7");
  const tl::MlflowRunInfo run = client.create_run("7", "r", {});
  client.log_batch(run.run_id, some_points(2), {{"a", "b"}}, {});
  TempDir tmp("mlflow-auth");
  std::ofstream(tmp.str("a.txt")) << "artifact";
  client.log_artifact(run, tmp.str("a.txt"), "a.txt");
  const std::vector<HttpRequest> requests = server.requests();
  REQUIRE(requests.size() == 4);
  for (const HttpRequest& r : requests) {
    INFO(r.method << " " << r.target);
    CHECK(r.header("authorization") == expected);
  }
  const std::string rest = server.everything_but_authorization();
  for (const char* secret : {"p%40ss", "p@ss", "pa:ss word", "tok-123"}) CHECK(rest.find(secret) == std::string::npos);
  CHECK(client.tracking_uri() == server.uri());  // what the client shows has no credentials
}

}  // namespace mlflow_faults

TEST_CASE("MlflowClient: credentials come from MLflow's environment variables as its Python client reads them",
          "[log][mlflow]") {
  HttpTestServer server(mlflow_reply);
  SECTION("MLFLOW_TRACKING_TOKEN: Bearer") {
    check_authorization(server, server.uri(), {{"MLFLOW_TRACKING_TOKEN", "tok-123"}}, "Bearer tok-123");
  }
  SECTION("MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD: Basic") {
    check_authorization(server, server.uri(),
                        {{"MLFLOW_TRACKING_USERNAME", "alice"}, {"MLFLOW_TRACKING_PASSWORD", "pa:ss word"}},
                        "Basic " + base64("alice:pa:ss word"));
  }
  SECTION("a username and a password and a token: Basic (the Python client's order)") {
    check_authorization(server, server.uri(),
                        {{"MLFLOW_TRACKING_USERNAME", "alice"}, {"MLFLOW_TRACKING_PASSWORD", "pw"},
                         {"MLFLOW_TRACKING_TOKEN", "tok-123"}},
                        "Basic " + base64("alice:pw"));
  }
  SECTION("a username without a password and a token: Bearer") {
    check_authorization(server, server.uri(),
                        {{"MLFLOW_TRACKING_USERNAME", "alice"}, {"MLFLOW_TRACKING_TOKEN", "tok-123"}},
                        "Bearer tok-123");
  }
  SECTION("user info in the URI (percent-encoded) wins over the environment and stays out of the URL") {
    check_authorization(server, "http://bob:p%40ss@127.0.0.1:" + std::to_string(server.port()),
                        {{"MLFLOW_TRACKING_TOKEN", "tok-123"}}, "Basic " + base64("bob:p@ss"));
  }
  SECTION("none: no Authorization header") {
    check_authorization(server, server.uri(), {}, "");
  }
}

TEST_CASE("MlflowClient: TLS settings from the environment are checked and name the variable", "[log][mlflow]") {
  SECTION("MLFLOW_TRACKING_INSECURE_TLS takes true, false, 1, 0") {
    ScopedEnv env({{"MLFLOW_TRACKING_INSECURE_TLS", "yes"}});
    CHECK_THROWS_MATCHES(tl::MlflowClient("https://127.0.0.1:5000"), std::invalid_argument,
                         WhatContains("MLFLOW_TRACKING_INSECURE_TLS=\"yes\""));
  }
  SECTION("MLFLOW_TRACKING_INSECURE_TLS and MLFLOW_TRACKING_SERVER_CERT_PATH exclude each other") {
    TempDir tmp("mlflow-tls");
    std::ofstream(tmp.str("ca.pem")) << "not a certificate";
    ScopedEnv env({{"MLFLOW_TRACKING_INSECURE_TLS", "TRUE"}, {"MLFLOW_TRACKING_SERVER_CERT_PATH", tmp.str("ca.pem")}});
    CHECK_THROWS_MATCHES(tl::MlflowClient("https://127.0.0.1:5000"), std::invalid_argument,
                         WhatContains("only one of"));
  }
  SECTION("MLFLOW_TRACKING_SERVER_CERT_PATH must be a file") {
    ScopedEnv env({{"MLFLOW_TRACKING_SERVER_CERT_PATH", "/nonexistent/ca.pem"}});
    CHECK_THROWS_MATCHES(tl::MlflowClient("https://127.0.0.1:5000"), std::invalid_argument,
                         WhatContains("MLFLOW_TRACKING_SERVER_CERT_PATH=\"/nonexistent/ca.pem\""));
  }
}

TEST_CASE("MlflowLogger: credentials in the tracking URI never reach the log", "[log][mlflow]") {
  ScopedEnv env({});
  const std::string port = std::to_string(unused_port());
  LogCapture log;
  {
    tl::MlflowLogger logger(quick_options("http://alice:s3cret-pw@127.0.0.1:" + port));
    logger.log_metrics(some_points(2));
    logger.log_artifact("/nonexistent/file.txt");
    logger.finish();
  }
  INFO(log.text());
  CHECK_THAT(log.text(), Catch::Contains("http://127.0.0.1:" + port));  // it did warn, with the URI
  CHECK(log.text().find("s3cret-pw") == std::string::npos);
  CHECK(log.text().find("alice") == std::string::npos);
}

TEST_CASE("MlflowLogger: the final warning names every artifact that was not sent", "[log][mlflow]") {
  ScopedEnv env({});
  TempDir tmp("mlflow-artifacts");
  std::ofstream(tmp.str("ok.txt")) << "fine";
  std::ofstream(tmp.str("refused.bin")) << "no";
  HttpTestServer server([](const HttpRequest& r) {
    if (r.target.find("refused.bin") != std::string::npos) return HttpReply{403, R"({"error_code": "PERMISSION_DENIED"})"};
    return mlflow_reply(r);
  });
  LogCapture log;
  tl::MlflowLoggerStats stats;
  {
    tl::MlflowLogger logger(quick_options(server.uri()));
    logger.log_artifact(tmp.str("ok.txt"));
    logger.log_artifact(tmp.str("missing.pt"));
    logger.log_artifact(tmp.str("refused.bin"));
    stats = logger.finish();
  }
  INFO(log.text());
  CHECK(stats.artifacts_sent == 1);
  CHECK_THAT(log.text(), Catch::Contains("2 artifacts not sent: missing.pt, refused.bin"));
  CHECK_THAT(log.text(), Catch::Contains(tmp.str("missing.pt")));  // why: the file named
  CHECK_THAT(log.text(), Catch::Contains("HTTP 403"));
}

TEST_CASE("MlflowLogger: an artifact is streamed with a timeout that grows with its size", "[log][mlflow]") {
  ScopedEnv env({});
  TempDir tmp("mlflow-stream");
  std::string content(6 << 20, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 2654435761u) >> 13);
  std::ofstream(tmp.str("model.bin"), std::ios::binary) << content;
  HttpTestServer server(mlflow_reply);
  server.read_rate(3 << 20);  // 2 s for the file: beyond the 1 s request timeout, within 1 s + 6 MiB at 1 MiB/s
  tl::MlflowLoggerOptions options = quick_options(server.uri());
  options.request_timeout = std::chrono::seconds(1);
  options.flush_timeout = std::chrono::seconds(6);
  LogCapture log;
  tl::MlflowLoggerStats stats;
  {
    tl::MlflowLogger logger(options);
    logger.log_artifact(tmp.str("model.bin"));
    stats = logger.finish();
  }
  INFO(log.text());
  CHECK(stats.artifacts_sent == 1);
  CHECK(stats.failed_requests == 0);
  bool uploaded = false;
  for (const HttpRequest& r : server.requests()) {
    if (r.method == "PUT") {
      uploaded = true;
      CHECK(r.target == "/api/2.0/mlflow-artifacts/artifacts/7/run1/artifacts/model.bin");
      CHECK(r.body.size() == content.size());
      CHECK(r.body == content);
    }
  }
  CHECK(uploaded);
}

TEST_CASE("mlflow basic-auth server: credentials from the environment log a run and wrong ones are refused",
          "[log][mlflow][may-skip]") {
  const std::string python = trainkit::test::source_path(".venv/bin/python");
  if (!fs::exists(python)) TRAINKIT_SKIP("no Python at " << python << " (scripts/setup.sh)");
  {
    trainkit::Subprocess probe(trainkit::SubprocessOptions()
                                   .argv({python, "-c", "import mlflow.server.auth"})
                                   .log_file("/dev/null"));
    if (!probe.wait().ok()) {
      TRAINKIT_SKIP("the venv's mlflow cannot start its basic-auth app (Flask-WTF: scripts/setup.sh)");
    }
  }
  TempDir tmp("mlflow-basic-auth");
  std::ofstream(tmp.str("auth.ini")) << "[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///"
                                     << tmp.str("auth.db")
                                     << "\nadmin_username = admin\n"
                                        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n";
  const std::string password = "Adm1n-pass-word";
  const int port = unused_port();
  trainkit::Subprocess server(
      trainkit::SubprocessOptions()
          .argv({python, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port",
                 std::to_string(port), "--backend-store-uri", "sqlite:///" + tmp.str("mlflow.db"),
                 "--artifacts-destination", tmp.str("artifacts"), "--workers", "1"})
          .env({{"MLFLOW_AUTH_CONFIG_PATH", tmp.str("auth.ini")},
                {"MLFLOW_AUTH_ADMIN_USERNAME", "admin"},
                {"MLFLOW_AUTH_ADMIN_PASSWORD", password},
                {"MLFLOW_FLASK_SERVER_SECRET_KEY", "trainkit-test-key"}})
          .log_file(tmp.str("server.log"))
          .new_session(true));
  const std::string uri = "http://127.0.0.1:" + std::to_string(port);
  {  // up: it answers, with 401 to a client without credentials
    ScopedEnv env({});
    tl::MlflowClient probe(uri, std::chrono::seconds(5));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
    long status = 0;
    while (status == 0) {
      REQUIRE(server.running());
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      try {
        probe.experiment_id("x");
      } catch (const tl::MlflowError& e) {
        status = e.http_status();
        if (status == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    }
    INFO(trainkit::test::read_text(tmp.str("server.log")));
    REQUIRE(status == 401);
  }
  std::ofstream(tmp.str("notes.txt")) << "an artifact";
  {  // the right password: the run, its points and its artifact are there
    ScopedEnv env({{"MLFLOW_TRACKING_USERNAME", "admin"}, {"MLFLOW_TRACKING_PASSWORD", password}});
    LogCapture log;
    tl::MlflowLoggerOptions options;
    options.tracking_uri = uri;
    options.experiment = "basic-auth";
    options.flush_timeout = std::chrono::seconds(60);
    tl::MlflowLoggerStats stats;
    std::string run_id;
    {
      tl::MlflowLogger logger(options);
      logger.log_params({{"optimizer.lr", "0.01"}});
      logger.log_metrics(some_points(20));
      logger.log_artifact(tmp.str("notes.txt"));
      stats = logger.finish();
      run_id = logger.run_id();
    }
    INFO(log.text());
    CHECK(stats.metrics_sent == 20);
    CHECK(stats.artifacts_sent == 1);
    CHECK(stats.failed_requests == 0);
    REQUIRE(!run_id.empty());
    tl::MlflowClient reader(uri, std::chrono::seconds(10));
    CHECK(reader.get_run(run_id).run_id == run_id);
    bool found = false;
    for (const auto& entry : fs::recursive_directory_iterator(tmp.str("artifacts"))) {
      if (entry.path().filename() == "notes.txt") found = trainkit::test::read_text(entry.path()) == "an artifact";
    }
    CHECK(found);
    CHECK(log.text().find(password) == std::string::npos);
  }
  {  // a wrong password: refused with 401, named, nothing sent, no crash
    ScopedEnv env({{"MLFLOW_TRACKING_USERNAME", "admin"}, {"MLFLOW_TRACKING_PASSWORD", "wrong-password"}});
    LogCapture log;
    tl::MlflowLoggerOptions options;
    options.tracking_uri = uri;
    tl::MlflowLoggerStats stats;
    {
      tl::MlflowLogger logger(options);
      logger.log_metrics(some_points(4));
      stats = logger.finish();
    }
    INFO(log.text());
    CHECK(stats.metrics_sent == 0);
    CHECK(stats.metrics_unsent == 4);
    CHECK_THAT(log.text(), Catch::Contains("HTTP 401"));
    CHECK_THAT(log.text(), Catch::Contains("MLFLOW_TRACKING_USERNAME"));
    CHECK(log.text().find("wrong-password") == std::string::npos);
  }
}

TEST_CASE("mlflow over TLS: MLFLOW_TRACKING_SERVER_CERT_PATH and MLFLOW_TRACKING_INSECURE_TLS reach the TLS check",
          "[log][mlflow][may-skip]") {
  const std::string python = trainkit::test::source_path(".venv/bin/python");
  if (!fs::exists(python)) TRAINKIT_SKIP("no Python at " << python << " (scripts/setup.sh)");
  TempDir tmp("mlflow-tls-server");
  {  // a self-signed certificate for 127.0.0.1
    trainkit::Subprocess openssl(trainkit::SubprocessOptions()
                                     .argv({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                                            tmp.str("key.pem"), "-out", tmp.str("cert.pem"), "-days", "1", "-subj",
                                            "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"})
                                     .log_file(tmp.str("openssl.log")));
    if (!openssl.wait().ok()) TRAINKIT_SKIP("openssl cannot make a certificate: " << trainkit::test::read_text(tmp.str("openssl.log")));
  }
  const char* const script = R"(
import http.server, ssl, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"experiment": {"experiment_id": "7"}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(sys.argv[2], sys.argv[3])
server.socket = context.wrap_socket(server.socket, server_side=True)
server.serve_forever()
)";
  const int port = unused_port();
  trainkit::Subprocess server(trainkit::SubprocessOptions()
                                  .argv({python, "-c", script, std::to_string(port), tmp.str("cert.pem"),
                                         tmp.str("key.pem")})
                                  .log_file(tmp.str("server.log"))
                                  .new_session(true));
  const std::string uri = "https://127.0.0.1:" + std::to_string(port);
  // Up once it takes connections.
  for (const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);;) {
    REQUIRE(server.running());
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool up = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  INFO(trainkit::test::read_text(tmp.str("server.log")));
  {  // the system's CAs do not know the certificate
    ScopedEnv env({});
    tl::MlflowClient client(uri, std::chrono::seconds(5));
    CHECK_THROWS_MATCHES(client.experiment_id("e"), tl::MlflowError, WhatContains("certificate"));
  }
  {
    ScopedEnv env({{"MLFLOW_TRACKING_SERVER_CERT_PATH", tmp.str("cert.pem")}});
    tl::MlflowClient client(uri, std::chrono::seconds(5));
    CHECK(client.experiment_id("e") == "7");
  }
  {
    ScopedEnv env({{"MLFLOW_TRACKING_INSECURE_TLS", "true"}});
    tl::MlflowClient client(uri, std::chrono::seconds(5));
    CHECK(client.experiment_id("e") == "7");
  }
  {  // the C++ option wins over the variable
    ScopedEnv env({{"MLFLOW_TRACKING_INSECURE_TLS", "true"}});
    tl::MlflowClientOptions options;
    options.timeout = std::chrono::seconds(5);
    options.auth.insecure_tls = false;
    tl::MlflowClient client(uri, options);
    CHECK_THROWS_MATCHES(client.experiment_id("e"), tl::MlflowError, WhatContains("certificate"));
  }
}
