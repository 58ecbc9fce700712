#include "trainkit/log/mlflow.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iterator>
#include <mutex>

#include <sys/stat.h>

#include <curl/curl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace trainkit::log {
namespace {

using Json = nlohmann::json;
using Pairs = std::vector<std::pair<std::string, std::string>>;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

size_t append_body(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

size_t read_file(char* data, size_t size, size_t count, void* file) {
  return std::fread(data, size, count, static_cast<std::FILE*>(file));
}

// A JSON body. Text that is not UTF-8 (a run directory's name, a tag) becomes U+FFFD instead of an
// exception: MLflow's server wants UTF-8, and a name is better sent a little changed than not at all.
std::string to_text(const Json& body) { return body.dump(-1, ' ', false, Json::error_handler_t::replace); }

Json key_values(const Pairs& pairs) {
  Json out = Json::array();
  for (const auto& [key, value] : pairs) {
    out.push_back({{"key", key}, {"value", value}});
  }
  return out;
}

// proto3's JSON form of a double: JSON has no NaN or infinities, the MLflow server (protobuf's parser)
// takes them as these strings.
Json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// What `read` takes from the JSON answer `body` of `what`; an answer that is not JSON, or lacks what
// `read` wants, is an MlflowError (status 200: retrying would not change it) that names the call.
template <class Read>
auto from_reply(const std::string& body, const std::string& what, Read&& read) {
  Json json;
  try {
    json = Json::parse(body);
  } catch (const Json::exception& e) {
    throw MlflowError(fmt::format("{}: the server's answer is not JSON ({}): {:.200}", what, e.what(), body), 200);
  }
  try {
    return read(json);
  } catch (const Json::exception& e) {
    throw MlflowError(fmt::format("{}: the server's answer lacks what trainkit needs ({}): {:.200}", what, e.what(),
                                  body),
                      200);
  }
}

MlflowRunInfo run_info(const Json& response) {
  const Json& info = response.at("run").at("info");
  return {info.at("run_id").get<std::string>(), info.at("experiment_id").get<std::string>(),
          info.value("artifact_uri", std::string())};
}

// Where the user info of "scheme://user:password@host/..." starts, and where its '@' is; npos for both when
// the URI has none.
std::pair<size_t, size_t> user_info(const std::string& uri) {
  constexpr auto none = std::pair{std::string::npos, std::string::npos};
  const size_t scheme = uri.find("://");
  if (scheme == std::string::npos) return none;
  const size_t begin = scheme + 3;
  const size_t end = std::min(uri.find_first_of("/?#", begin), uri.size());
  if (end == begin) return none;
  const size_t at = uri.rfind('@', end - 1);
  return at == std::string::npos || at < begin ? none : std::pair{begin, at};
}

std::string percent_decoded(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::nullopt : std::optional<std::string>(value);
}

// `auth` with its unset fields taken from the URI's user info and then from MLflow's environment
// variables; checked as the Python client checks them (MlflowHostCreds).
MlflowAuth resolved(MlflowAuth auth, const std::string& raw_uri) {
  const auto [begin, at] = user_info(raw_uri);
  if (begin != std::string::npos) {
    const std::string info = raw_uri.substr(begin, at - begin);
    const size_t colon = info.find(':');
    if (!auth.username) auth.username = percent_decoded(info.substr(0, colon));
    if (!auth.password && colon != std::string::npos) auth.password = percent_decoded(info.substr(colon + 1));
  }
  if (!auth.username) auth.username = env("MLFLOW_TRACKING_USERNAME");
  if (!auth.password) auth.password = env("MLFLOW_TRACKING_PASSWORD");
  if (!auth.token) auth.token = env("MLFLOW_TRACKING_TOKEN");
  if (!auth.server_cert_path) auth.server_cert_path = env("MLFLOW_TRACKING_SERVER_CERT_PATH");
  if (!auth.client_cert_path) auth.client_cert_path = env("MLFLOW_TRACKING_CLIENT_CERT_PATH");
  if (!auth.insecure_tls) {
    if (const auto text = env("MLFLOW_TRACKING_INSECURE_TLS")) {
      std::string lower = *text;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      if (lower != "true" && lower != "false" && lower != "1" && lower != "0") {
        throw std::invalid_argument(fmt::format(
            "MLFLOW_TRACKING_INSECURE_TLS=\"{}\": must be one of true, false, 1, 0 (any case)", *text));
      }
      auth.insecure_tls = lower == "true" || lower == "1";
    }
  }
  // The Python client ignores empty values (`if username and password`, `elif token`).
  for (auto* field : {&auth.username, &auth.password, &auth.token, &auth.server_cert_path, &auth.client_cert_path}) {
    if (*field && (*field)->empty()) field->reset();
  }
  if (auth.insecure_tls.value_or(false) && auth.server_cert_path) {
    throw std::invalid_argument(fmt::format(
        "MLflow: MLFLOW_TRACKING_INSECURE_TLS (insecure_tls) and MLFLOW_TRACKING_SERVER_CERT_PATH=\"{}\" "
        "(server_cert_path) are both set: only one of them may be (as in MLflow's Python client)",
        *auth.server_cert_path));
  }
  for (const auto& [name, path] : {std::pair{"MLFLOW_TRACKING_SERVER_CERT_PATH", auth.server_cert_path},
                                   std::pair{"MLFLOW_TRACKING_CLIENT_CERT_PATH", auth.client_cert_path}}) {
    std::error_code ec;
    if (path && !std::filesystem::is_regular_file(*path, ec)) {
      throw std::invalid_argument(fmt::format("MLflow: {}=\"{}\": no such file", name, *path));
    }
  }
  return auth;
}

// Which credentials a request carries, for the message of a 401 or 403 (never the secret itself).
std::string credentials_hint(const MlflowAuth& auth) {
  const char* sent = auth.username && auth.password ? "HTTP Basic credentials were sent"
                     : auth.token                   ? "a Bearer token was sent"
                                                    : "no credentials were sent";
  return fmt::format("{}; set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN", sent);
}

}  // namespace

std::string mlflow_redacted_uri(const std::string& uri) {
  const auto [begin, at] = user_info(uri);
  return begin == std::string::npos ? uri : uri.substr(0, begin) + uri.substr(at + 1);
}

std::vector<MlflowMetric> mlflow_metrics(const MetricRow& row) {
  std::vector<MlflowMetric> out;
  const auto add = [&](const std::string& key, const std::optional<double>& v) {
    if (v) out.push_back({key, *v, 0, row.step});
  };
  if (row.kind == "train") {
    add("train/loss", row.loss);
    add("train/lr", row.lr);
    add("train/samples_per_second", row.samples_per_second);
    for (const auto& [name, value] : row.monitors) add("train/" + name, value);
  } else {
    const std::string prefix = row.kind == "test" ? "test/" : "val/";
    if (row.kind != "val") {  // a mid-epoch validation's train loss covers part of the epoch
      add("epoch/train_loss", row.loss);
    }
    add(prefix + "loss", row.val_loss);
    for (const auto& [name, value] : row.val_metrics) add(prefix + name, value);
    for (const auto& [name, value] : row.monitors) add(name, value);
  }
  return out;
}

struct MlflowClient::Upload {
  std::FILE* file;
  curl_off_t size;
};

MlflowClient::MlflowClient(std::string tracking_uri, std::chrono::milliseconds timeout)
    : MlflowClient(std::move(tracking_uri), [&] {
        MlflowClientOptions o;
        o.timeout = timeout;
        return o;
      }()) {}

MlflowClient::MlflowClient(std::string tracking_uri, MlflowClientOptions options)
    : uri_(mlflow_redacted_uri(tracking_uri)), options_(std::move(options)) {
  while (!uri_.empty() && uri_.back() == '/') uri_.pop_back();
  if (uri_.rfind("http://", 0) != 0 && uri_.rfind("https://", 0) != 0) {
    throw std::invalid_argument(fmt::format(
        "MLflow tracking URI \"{}\": trainkit talks to a tracking server, give http://host:port", uri_));
  }
  if (options_.artifact_min_rate < 1) {
    throw std::invalid_argument(
        fmt::format("MLflow: artifact_min_rate must be >= 1 byte per second, got {}", options_.artifact_min_rate));
  }
  options_.auth = resolved(std::move(options_.auth), tracking_uri);
  static std::once_flag global;
  std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw std::runtime_error("MLflow: curl_easy_init failed");
}

MlflowClient::~MlflowClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

std::string MlflowClient::request(const std::string& method, const std::string& url, const std::string& body,
                                  const char* content_type, Upload* upload) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);
  const MlflowAuth& auth = options_.auth;
  std::string response;
  char error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, fmt::format("Content-Type: {}", content_type).c_str());
  headers = curl_slist_append(headers, "Expect:");  // no 100-continue round trip before a body
  const bool basic = auth.username && auth.password;
  if (!basic && auth.token) {
    headers = curl_slist_append(headers, fmt::format("Authorization: Bearer {}", *auth.token).c_str());
  }
  if (basic) {
    curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(curl, CURLOPT_USERNAME, auth.username->c_str());
    curl_easy_setopt(curl, CURLOPT_PASSWORD, auth.password->c_str());
  }
  if (auth.server_cert_path) curl_easy_setopt(curl, CURLOPT_CAINFO, auth.server_cert_path->c_str());
  if (auth.client_cert_path) {
    curl_easy_setopt(curl, CURLOPT_SSLCERT, auth.client_cert_path->c_str());
    curl_easy_setopt(curl, CURLOPT_SSLKEY, auth.client_cert_path->c_str());
  }
  if (auth.insecure_tls.value_or(false)) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  // An upload may take its size at artifact_min_rate on top of the usual limit.
  const int64_t timeout_ms =
      options_.timeout.count() + (upload == nullptr ? 0 : upload->size * 1000 / options_.artifact_min_rate);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(std::min<int64_t>(options_.timeout.count(), 5000)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  if (upload != nullptr) {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, read_file);
    curl_easy_setopt(curl, CURLOPT_READDATA, upload->file);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, upload->size);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
  } else if (method != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    throw MlflowError(fmt::format("{} {}: {}", method, url, error[0] != 0 ? error : curl_easy_strerror(rc)), 0);
  }
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 300 && status < 400) {
    char* location = nullptr;
    curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &location);
    throw MlflowError(fmt::format("{} {}: HTTP {}: a redirect to {}; trainkit does not follow redirects (they could "
                                  "take the credentials elsewhere): give the tracking URI it points to",
                                  method, url, status,
                                  location == nullptr ? "(no Location)" : mlflow_redacted_uri(location)),
                      status);
  }
  if (status >= 300) {
    throw MlflowError(fmt::format("{} {}: HTTP {}{}: {:.300}", method, url, status,
                                  status == 401 || status == 403 ? " (" + credentials_hint(auth) + ")" : "",
                                  response),
                      status);
  }
  return response;
}

std::string MlflowClient::post(const std::string& endpoint, const std::string& body) {
  return request("POST", uri_ + "/api/2.0/mlflow/" + endpoint, body, "application/json");
}

std::string MlflowClient::get(const std::string& url) { return request("GET", url, "", "application/json"); }

std::string MlflowClient::experiment_id(const std::string& name) {
  CURL* curl = static_cast<CURL*>(curl_);
  char* escaped = curl_easy_escape(curl, name.c_str(), static_cast<int>(name.size()));
  const std::string url = uri_ + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + escaped;
  curl_free(escaped);
  const auto id = [](const Json& j) { return j.at("experiment_id").get<std::string>(); };
  for (int attempt = 0;; ++attempt) {
    try {
      return from_reply(get(url), url, [&](const Json& j) { return id(j.at("experiment")); });
    } catch (const MlflowError& e) {
      if (e.http_status() != 404 || attempt > 0) throw;
    }
    try {
      return from_reply(post("experiments/create", to_text(Json{{"name", name}})), "experiments/create", id);
    } catch (const MlflowError& e) {
      if (e.http_status() != 400) throw;  // RESOURCE_ALREADY_EXISTS: another process created it; read it again
    }
  }
}

MlflowRunInfo MlflowClient::create_run(const std::string& experiment_id, const std::string& run_name,
                                       const Pairs& tags) {
  Json body = {{"experiment_id", experiment_id}, {"start_time", now_ms()}, {"tags", key_values(tags)}};
  if (!run_name.empty()) body["run_name"] = run_name;
  return from_reply(post("runs/create", to_text(body)), "runs/create", run_info);
}

MlflowRunInfo MlflowClient::get_run(const std::string& run_id) {
  char* escaped = curl_easy_escape(static_cast<CURL*>(curl_), run_id.c_str(), static_cast<int>(run_id.size()));
  const std::string url = uri_ + "/api/2.0/mlflow/runs/get?run_id=" + escaped;
  curl_free(escaped);
  return from_reply(get(url), url, run_info);
}

void MlflowClient::log_batch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                             const Pairs& params, const Pairs& tags) {
  Json m = Json::array();
  for (const MlflowMetric& p : metrics) {
    m.push_back({{"key", p.key}, {"value", metric_value(p.value)}, {"timestamp", p.timestamp_ms}, {"step", p.step}});
  }
  post("runs/log-batch",
       to_text(Json{{"run_id", run_id}, {"metrics", m}, {"params", key_values(params)}, {"tags", key_values(tags)}}));
}

void MlflowClient::set_status(const std::string& run_id, const std::string& status) {
  Json body = {{"run_id", run_id}, {"status", status}};
  if (status != "RUNNING") body["end_time"] = now_ms();
  post("runs/update", to_text(body));
}

void MlflowClient::log_artifact(const MlflowRunInfo& run, const std::string& local_path,
                                const std::string& artifact_path) {
  // mlflow-artifacts:/<path> or mlflow-artifacts://<host:port>/<path>: the server proxies the store.
  const std::string scheme = "mlflow-artifacts:";
  if (run.artifact_uri.rfind(scheme, 0) != 0) {
    throw MlflowError(fmt::format("run {}: its artifact store is {}; trainkit uploads through the tracking "
                                  "server's artifact proxy (start the server with --serve-artifacts, its default)",
                                  run.run_id, run.artifact_uri),
                      400);
  }
  std::string path = run.artifact_uri.substr(scheme.size());
  if (path.rfind("//", 0) == 0) {
    const size_t slash = path.find('/', 2);
    path = slash == std::string::npos ? "" : path.substr(slash);
  }
  while (!path.empty() && path.front() == '/') path.erase(path.begin());
  // Streamed from disk: a model of several GB never sits in memory.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(local_path.c_str(), "rb"), &std::fclose);
  struct stat info {};
  if (file == nullptr || ::fstat(::fileno(file.get()), &info) != 0 || !S_ISREG(info.st_mode)) {
    throw MlflowError(fmt::format("{}: cannot read the artifact ({})", local_path,
                                  file == nullptr ? std::strerror(errno) : "not a regular file"),
                      400);
  }
  Upload upload{file.get(), static_cast<curl_off_t>(info.st_size)};
  request("PUT", fmt::format("{}/api/2.0/mlflow-artifacts/artifacts/{}/{}", uri_, path, artifact_path), "",
          "application/octet-stream", &upload);
}

// ---------------------------------------------------------------------------------------------------------

struct MlflowLogger::Item {
  enum class Kind { kParamsTags, kMetrics, kArtifact } kind;
  Pairs params;
  Pairs tags;
  std::vector<MlflowMetric> metrics;
  std::string local_path;
  std::string artifact_path;
};

namespace {

MlflowClientOptions client_options(const MlflowLoggerOptions& o) {
  MlflowClientOptions out;
  out.timeout = o.request_timeout;
  out.artifact_min_rate = o.artifact_min_rate;
  out.auth = o.auth;
  return out;
}

}  // namespace

MlflowLogger::MlflowLogger(MlflowLoggerOptions options)
    : options_(std::move(options)), client_(options_.tracking_uri, client_options(options_)) {
  if (options_.max_queued < 1) {
    throw std::invalid_argument(fmt::format("MlflowLogger: max_queued must be >= 1, got {}", options_.max_queued));
  }
  options_.tracking_uri = client_.tracking_uri();  // the credentials stay with the client only
  options_.auth = {};
  worker_ = std::thread([this] {
    try {
      loop();
    } catch (const std::exception& e) {  // a last resort: loop() and retry() catch what the calls throw
      stop_on_error(e.what());
    } catch (...) {
      stop_on_error("an unknown exception");
    }
  });
}

void MlflowLogger::stop_on_error(const std::string& what) {
  std::vector<std::string> artifacts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    for (const auto& item : queue_) {
      stats_.metrics_unsent += static_cast<int64_t>(item->metrics.size());
      if (item->kind == Item::Kind::kArtifact) stats_.artifacts_failed.push_back(item->artifact_path);
    }
    queue_.clear();
    queued_metrics_ = 0;
    artifacts = stats_.artifacts_failed;
  }
  spdlog::error("MLflow: logging to {} stopped on an error ({}); nothing more of this run is sent{}",
                client_.tracking_uri(), what,
                artifacts.empty() ? "" : fmt::format("; artifacts not sent: {}", fmt::join(artifacts, ", ")));
}

MlflowLogger::~MlflowLogger() {
  if (worker_.joinable()) finish(std::uncaught_exceptions() > 0 ? "FAILED" : "FINISHED");
}

void MlflowLogger::enqueue(std::shared_ptr<Item> item) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) {
    if (item->kind == Item::Kind::kArtifact) stats_.artifacts_failed.push_back(item->artifact_path);
    return;
  }
  queue_.push_back(std::move(item));
  wake_.notify_all();
}

void MlflowLogger::log_params(Pairs params) {
  enqueue(std::make_shared<Item>(Item{Item::Kind::kParamsTags, std::move(params), {}, {}, {}, {}}));
}

void MlflowLogger::set_tags(Pairs tags) {
  enqueue(std::make_shared<Item>(Item{Item::Kind::kParamsTags, {}, std::move(tags), {}, {}, {}}));
}

void MlflowLogger::log_metrics(std::vector<MlflowMetric> metrics) {
  if (metrics.empty()) return;
  const int64_t now = now_ms();
  for (MlflowMetric& m : metrics) {
    if (m.timestamp_ms == 0) m.timestamp_ms = now;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) {
    stats_.metrics_dropped += static_cast<int64_t>(metrics.size());
    return;
  }
  queued_metrics_ += static_cast<int64_t>(metrics.size());
  queue_.push_back(std::make_shared<Item>(Item{Item::Kind::kMetrics, {}, {}, std::move(metrics), {}, {}}));
  // Over the bound: drop the oldest queued points (those in flight are the worker's already).
  for (auto it = queue_.begin(); queued_metrics_ > options_.max_queued && it != queue_.end();) {
    if ((*it)->kind != Item::Kind::kMetrics) {
      ++it;
      continue;
    }
    auto& points = (*it)->metrics;
    const auto n = std::min<int64_t>(static_cast<int64_t>(points.size()), queued_metrics_ - options_.max_queued);
    points.erase(points.begin(), points.begin() + n);
    queued_metrics_ -= n;
    stats_.metrics_dropped += n;
    it = points.empty() ? queue_.erase(it) : std::next(it);
  }
  wake_.notify_all();
}

void MlflowLogger::log_artifact(std::string local_path, std::string artifact_path) {
  if (artifact_path.empty()) {
    const size_t slash = local_path.find_last_of('/');
    artifact_path = slash == std::string::npos ? local_path : local_path.substr(slash + 1);
  }
  enqueue(std::make_shared<Item>(
      Item{Item::Kind::kArtifact, {}, {}, {}, std::move(local_path), std::move(artifact_path)}));
}

std::string MlflowLogger::run_id() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return run_ ? run_->run_id : "";
}

MlflowLoggerStats MlflowLogger::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

MlflowLoggerStats MlflowLogger::finish(const std::string& status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!finishing_) {
    finishing_ = true;
    finish_status_ = status;
    deadline_ = std::chrono::steady_clock::now() + options_.flush_timeout;
    wake_.notify_all();
  }
  lock.unlock();
  if (worker_.joinable()) worker_.join();
  lock.lock();
  return stats_;
}

void MlflowLogger::wait_retry(int attempt) {
  const auto pause = options_.retry_interval * (1 << std::min(attempt, 3));
  std::unique_lock<std::mutex> lock(mutex_);
  auto until = std::chrono::steady_clock::now() + pause;
  if (finishing_) until = std::min(until, deadline_);
  // Woken early by finish() (which may set a deadline sooner than the pause).
  wake_.wait_until(lock, until, [&] { return finishing_ && std::chrono::steady_clock::now() >= deadline_; });
}

bool MlflowLogger::gave_up() {
  std::lock_guard<std::mutex> lock(mutex_);
  return finishing_ && std::chrono::steady_clock::now() >= deadline_;
}

// Runs `call` until it succeeds (true), the server refuses it (false, reported) or finish()'s deadline
// passes (false).
template <class Call>
bool MlflowLogger::retry(const std::string& what, Call&& call) {
  for (int attempt = 0;; ++attempt) {
    try {
      call();
      std::lock_guard<std::mutex> lock(mutex_);
      if (down_) {
        down_ = false;
        spdlog::info("MLflow: {} answers again", options_.tracking_uri);
      }
      return true;
    } catch (const MlflowError& e) {
      if (!failed(what, e.what(), e.transient())) return false;
    } catch (const std::exception& e) {  // anything else a call throws (bad_alloc, a filesystem error ...)
      if (!failed(what, e.what(), false)) return false;
    } catch (...) {
      if (!failed(what, "an unknown exception", false)) return false;
    }
    if (gave_up()) return false;
    wait_retry(attempt);
    if (gave_up()) return false;
  }
}

// Counts and reports a failed call; true when it is worth retrying.
bool MlflowLogger::failed(const std::string& what, const std::string& error, bool transient) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++stats_.failed_requests;
  if (!transient) {
    lock.unlock();
    spdlog::error("MLflow: {} failed ({}); dropped", what, error);
    return false;
  }
  if (!down_) {
    down_ = true;
    if (!warned_down_) {
      warned_down_ = true;
      spdlog::warn("MLflow: {} does not answer ({}); training goes on, up to {} points are kept and sent when it "
                   "answers",
                   options_.tracking_uri, error, options_.max_queued);
    }
  }
  return true;
}

bool MlflowLogger::ensure_run() {
  if (run_id().size() > 0) return true;
  MlflowRunInfo info;
  const bool ok = retry("creating the run", [&] {
    if (!options_.resume_run_id.empty()) {
      info = client_.get_run(options_.resume_run_id);
      client_.set_status(info.run_id, "RUNNING");
    } else {
      info = client_.create_run(client_.experiment_id(options_.experiment), options_.run_name, {});
    }
  });
  if (!ok) return false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    run_ = info;
  }
  if (options_.on_run) {
    try {
      options_.on_run(info);
    } catch (const std::exception& e) {  // e.g. the file noting the run's id: the run itself goes on
      spdlog::warn("MLflow: run {}: on_run failed ({})", info.run_id, e.what());
    }
  }
  return true;
}

void MlflowLogger::loop() {
  bool have_run = false;
  bool dead = false;  // the run could not be created: nothing can be sent
  for (;;) {
    std::vector<std::shared_ptr<Item>> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return !queue_.empty() || finishing_; });
      if (queue_.empty()) break;  // finishing, all sent
      // One request: a run of metric items (up to 1000 points), or one other item.
      if (queue_.front()->kind == Item::Kind::kMetrics) {
        size_t points = 0;
        while (!queue_.empty() && queue_.front()->kind == Item::Kind::kMetrics &&
               points + queue_.front()->metrics.size() <= 1000) {
          points += queue_.front()->metrics.size();
          queued_metrics_ -= static_cast<int64_t>(queue_.front()->metrics.size());
          batch.push_back(queue_.front());
          queue_.pop_front();
        }
        if (batch.empty()) {  // one item of more than 1000 points: split it
          auto& first = queue_.front()->metrics;
          auto part = std::make_shared<Item>(Item{Item::Kind::kMetrics, {}, {}, {}, {}, {}});
          part->metrics.assign(first.begin(), first.begin() + 1000);
          first.erase(first.begin(), first.begin() + 1000);
          queued_metrics_ -= 1000;
          batch.push_back(part);
        }
      } else {
        batch.push_back(queue_.front());
        queue_.pop_front();
      }
    }
    if (!dead && !have_run) {
      have_run = ensure_run();
      dead = !have_run;
      if (dead && !gave_up()) {
        spdlog::error("MLflow: no run on {} (see above); nothing of this run is sent", options_.tracking_uri);
      }
    }
    int64_t points = 0;
    for (const auto& item : batch) points += static_cast<int64_t>(item->metrics.size());
    bool sent = false;
    if (!dead) {
      const Item& first = *batch.front();
      const std::string id = run_id();
      if (first.kind == Item::Kind::kMetrics) {
        std::vector<MlflowMetric> metrics;
        metrics.reserve(static_cast<size_t>(points));
        for (const auto& item : batch) metrics.insert(metrics.end(), item->metrics.begin(), item->metrics.end());
        sent = retry("log-batch", [&] { client_.log_batch(id, metrics, {}, {}); });
      } else if (first.kind == Item::Kind::kParamsTags) {
        // MLflow takes at most 100 params and 100 tags per call.
        sent = true;
        for (size_t i = 0; sent && i < std::max(first.params.size(), first.tags.size()); i += 100) {
          const auto slice = [&](const Pairs& all) {
            return Pairs(all.begin() + static_cast<std::ptrdiff_t>(std::min(i, all.size())),
                         all.begin() + static_cast<std::ptrdiff_t>(std::min(i + 100, all.size())));
          };
          sent = retry("params and tags", [&] { client_.log_batch(id, {}, slice(first.params), slice(first.tags)); });
        }
      } else {
        sent = retry("artifact " + first.artifact_path,
                     [&] { client_.log_artifact(*run_, first.local_path, first.artifact_path); });
      }
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (batch.front()->kind == Item::Kind::kArtifact) {
      if (sent) {
        ++stats_.artifacts_sent;
      } else {
        stats_.artifacts_failed.push_back(batch.front()->artifact_path);
      }
    }
    if (sent) {
      stats_.metrics_sent += points;
    } else if (dead || (finishing_ && std::chrono::steady_clock::now() >= deadline_)) {
      stats_.metrics_unsent += points;
    } else {
      stats_.metrics_dropped += points;  // refused by the server (reported above)
    }
    if (finishing_ && std::chrono::steady_clock::now() >= deadline_) {
      for (const auto& item : queue_) {
        stats_.metrics_unsent += static_cast<int64_t>(item->metrics.size());
        if (item->kind == Item::Kind::kArtifact) stats_.artifacts_failed.push_back(item->artifact_path);
      }
      queue_.clear();
      queued_metrics_ = 0;
    }
  }
  if (have_run && !gave_up()) {
    const std::string id = run_id();
    retry("setting the run's status", [&] { client_.set_status(id, finish_status_); });
  }
  const MlflowLoggerStats s = stats();
  if (s.metrics_dropped > 0 || s.metrics_unsent > 0) {
    spdlog::warn("MLflow: {} metric points sent, {} dropped (queue bound {} or refused), {} unsent when the run ended",
                 s.metrics_sent, s.metrics_dropped, options_.max_queued, s.metrics_unsent);
  }
  if (!s.artifacts_failed.empty()) {
    spdlog::warn("MLflow: {} artifact{} not sent: {}", s.artifacts_failed.size(),
                 s.artifacts_failed.size() == 1 ? "" : "s", fmt::join(s.artifacts_failed, ", "));
  }
}

}  // namespace trainkit::log
