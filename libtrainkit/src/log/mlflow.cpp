#include "trainkit/log/mlflow.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <fstream>
#include <iterator>
#include <mutex>

#include <curl/curl.h>
#include <fmt/format.h>
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

MlflowRunInfo run_info(const Json& response) {
  const Json& info = response.at("run").at("info");
  return {info.at("run_id").get<std::string>(), info.at("experiment_id").get<std::string>(),
          info.value("artifact_uri", std::string())};
}

Json parse_response(const std::string& body, const std::string& what) {
  try {
    return Json::parse(body);
  } catch (const Json::exception& e) {
    throw MlflowError(fmt::format("{}: the server's answer is not JSON ({}): {:.200}", what, e.what(), body), 200);
  }
}

}  // namespace

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

MlflowClient::MlflowClient(std::string tracking_uri, std::chrono::milliseconds timeout)
    : uri_(std::move(tracking_uri)), timeout_(timeout) {
  while (!uri_.empty() && uri_.back() == '/') uri_.pop_back();
  if (uri_.rfind("http://", 0) != 0 && uri_.rfind("https://", 0) != 0) {
    throw std::invalid_argument(fmt::format(
        "MLflow tracking URI \"{}\": trainkit talks to a tracking server, give http://host:port", uri_));
  }
  static std::once_flag global;
  std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
  if (curl_ == nullptr) throw std::runtime_error("MLflow: curl_easy_init failed");
}

MlflowClient::~MlflowClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

std::string MlflowClient::request(const std::string& method, const std::string& url, const std::string& body,
                                  const char* content_type) {
  CURL* curl = static_cast<CURL*>(curl_);
  curl_easy_reset(curl);
  std::string response;
  char error[CURL_ERROR_SIZE] = {0};
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, fmt::format("Content-Type: {}", content_type).c_str());
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_.count()));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min<int64_t>(timeout_.count(), 5000)));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &response);
  if (method != "GET") {
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
  if (status >= 300) {
    throw MlflowError(fmt::format("{} {}: HTTP {}: {:.300}", method, url, status, response), status);
  }
  return response;
}

std::string MlflowClient::post(const std::string& endpoint, const std::string& body) {
  return request("POST", uri_ + "/api/2.0/mlflow/" + endpoint, body, "application/json");
}

std::string MlflowClient::experiment_id(const std::string& name) {
  CURL* curl = static_cast<CURL*>(curl_);
  char* escaped = curl_easy_escape(curl, name.c_str(), static_cast<int>(name.size()));
  const std::string url = uri_ + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + escaped;
  curl_free(escaped);
  for (int attempt = 0;; ++attempt) {
    try {
      return parse_response(request("GET", url, "", "application/json"), url)
          .at("experiment").at("experiment_id").get<std::string>();
    } catch (const MlflowError& e) {
      if (e.http_status() != 404 || attempt > 0) throw;
    }
    try {
      const std::string body = post("experiments/create", Json{{"name", name}}.dump());
      return parse_response(body, "experiments/create").at("experiment_id").get<std::string>();
    } catch (const MlflowError& e) {
      if (e.http_status() != 400) throw;  // RESOURCE_ALREADY_EXISTS: another process created it; read it again
    }
  }
}

MlflowRunInfo MlflowClient::create_run(const std::string& experiment_id, const std::string& run_name,
                                       const Pairs& tags) {
  Json body = {{"experiment_id", experiment_id}, {"start_time", now_ms()}, {"tags", key_values(tags)}};
  if (!run_name.empty()) body["run_name"] = run_name;
  return run_info(parse_response(post("runs/create", body.dump()), "runs/create"));
}

MlflowRunInfo MlflowClient::get_run(const std::string& run_id) {
  const std::string url = uri_ + "/api/2.0/mlflow/runs/get?run_id=" + run_id;
  return run_info(parse_response(request("GET", url, "", "application/json"), url));
}

void MlflowClient::log_batch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                             const Pairs& params, const Pairs& tags) {
  Json m = Json::array();
  for (const MlflowMetric& p : metrics) {
    m.push_back({{"key", p.key}, {"value", metric_value(p.value)}, {"timestamp", p.timestamp_ms}, {"step", p.step}});
  }
  post("runs/log-batch",
       Json{{"run_id", run_id}, {"metrics", m}, {"params", key_values(params)}, {"tags", key_values(tags)}}.dump());
}

void MlflowClient::set_status(const std::string& run_id, const std::string& status) {
  Json body = {{"run_id", run_id}, {"status", status}};
  if (status != "RUNNING") body["end_time"] = now_ms();
  post("runs/update", body.dump());
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
  std::ifstream in(local_path, std::ios::binary);
  if (!in) {
    throw MlflowError(fmt::format("{}: cannot read the artifact", local_path), 400);
  }
  const std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  request("PUT", fmt::format("{}/api/2.0/mlflow-artifacts/artifacts/{}/{}", uri_, path, artifact_path), content,
          "application/octet-stream");
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

MlflowLogger::MlflowLogger(MlflowLoggerOptions options)
    : options_(std::move(options)), client_(options_.tracking_uri, options_.request_timeout) {
  if (options_.max_queued < 1) {
    throw std::invalid_argument(fmt::format("MlflowLogger: max_queued must be >= 1, got {}", options_.max_queued));
  }
  worker_ = std::thread([this] { loop(); });
}

MlflowLogger::~MlflowLogger() {
  if (worker_.joinable()) finish(std::uncaught_exceptions() > 0 ? "FAILED" : "FINISHED");
}

void MlflowLogger::enqueue(std::shared_ptr<Item> item) {
  std::lock_guard<std::mutex> lock(mutex_);
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
      std::unique_lock<std::mutex> lock(mutex_);
      ++stats_.failed_requests;
      if (!e.transient()) {
        lock.unlock();
        spdlog::error("MLflow: {} refused ({}); dropped", what, e.what());
        return false;
      }
      if (!down_) {
        down_ = true;
        if (!warned_down_) {
          warned_down_ = true;
          spdlog::warn("MLflow: {} does not answer ({}); training goes on, up to {} points are kept and sent when "
                       "it answers",
                       options_.tracking_uri, e.what(), options_.max_queued);
        }
      }
    }
    if (gave_up()) return false;
    wait_retry(attempt);
    if (gave_up()) return false;
  }
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
  if (options_.on_run) options_.on_run(info);
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
        spdlog::error("MLflow: no run on {} (refused, see above); nothing of this run is sent", options_.tracking_uri);
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
    if (sent) {
      stats_.metrics_sent += points;
      if (batch.front()->kind == Item::Kind::kArtifact) ++stats_.artifacts_sent;
    } else if (dead || (finishing_ && std::chrono::steady_clock::now() >= deadline_)) {
      stats_.metrics_unsent += points;
    } else {
      stats_.metrics_dropped += points;  // refused by the server (reported above)
    }
    if (finishing_ && std::chrono::steady_clock::now() >= deadline_) {
      for (const auto& item : queue_) stats_.metrics_unsent += static_cast<int64_t>(item->metrics.size());
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
}

}  // namespace trainkit::log
