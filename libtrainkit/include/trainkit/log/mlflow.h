#pragma once
/// @file
/// MLflow tracking over its REST API (a tracking server: `mlflow server`): `MlflowClient` makes the calls,
/// `MlflowLogger` queues a run's metrics, params, tags and artifacts and sends them from a background thread,
/// so that a slow or stopped server never slows or stops training.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "trainkit/log/metrics.h"

namespace trainkit::log {

/// A call the server refused or could not be reached for. what() names the URL and the server's answer.
class MlflowError : public std::runtime_error {
 public:
  /// `http_status`: 0 when the server could not be reached (connection refused, timeout).
  MlflowError(const std::string& message, long http_status)
      : std::runtime_error(message), http_status_(http_status) {}
  /// The HTTP status (0: no answer).
  long http_status() const { return http_status_; }
  /// Worth retrying: no answer, 429 or 5xx. A 4xx (a bad request) fails the same way again.
  bool transient() const { return http_status_ == 0 || http_status_ == 429 || http_status_ >= 500; }

 private:
  long http_status_;
};

/// One metric point (MLflow's Metric: key, value, timestamp in ms since the epoch, step).
struct MlflowMetric {
  std::string key;
  double value = 0;  ///< NaN and infinities are sent as proto3 JSON's "NaN", "Infinity", "-Infinity"
  int64_t timestamp_ms = 0;
  int64_t step = 0;
};

/// A metrics row as MLflow metrics at the row's step, named as in TensorBoard: a "train" row gives
/// train/loss, train/lr, train/samples_per_second and train/<monitor>; an "epoch" row epoch/train_loss,
/// val/loss, val/<metric> and its monitors under their own names (val_ema/loss); a "test" row test/loss and
/// test/<metric>.
std::vector<MlflowMetric> mlflow_metrics(const MetricRow& row);

/// A run on the server.
struct MlflowRunInfo {
  std::string run_id;
  std::string experiment_id;
  std::string artifact_uri;  ///< e.g. "mlflow-artifacts:/1/<run_id>/artifacts" (the server stores them)
};

/// Synchronous calls of MLflow's REST API (`/api/2.0/mlflow/...`), one HTTP request each (libcurl).
/// Every call throws MlflowError on failure.
class MlflowClient {
 public:
  /// `tracking_uri`: "http://host:port" (a trailing slash is dropped); `timeout`: per request.
  explicit MlflowClient(std::string tracking_uri, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~MlflowClient();
  MlflowClient(const MlflowClient&) = delete;
  MlflowClient& operator=(const MlflowClient&) = delete;

  const std::string& tracking_uri() const { return uri_; }
  /// The id of experiment `name`, created when it does not exist.
  std::string experiment_id(const std::string& name);
  /// A new run in `experiment_id`, started now, with `tags`.
  MlflowRunInfo create_run(const std::string& experiment_id, const std::string& run_name,
                           const std::vector<std::pair<std::string, std::string>>& tags);
  /// The run `run_id` (to continue it).
  MlflowRunInfo get_run(const std::string& run_id);
  /// One log-batch call: at most 1000 metrics, 100 params and 100 tags (MLflow's limits; callers split).
  void log_batch(const std::string& run_id, const std::vector<MlflowMetric>& metrics,
                 const std::vector<std::pair<std::string, std::string>>& params,
                 const std::vector<std::pair<std::string, std::string>>& tags);
  /// Sets the run's status ("RUNNING", "FINISHED", "FAILED", "KILLED"); a final status also sets its end time.
  void set_status(const std::string& run_id, const std::string& status);
  /// Uploads the file `local_path` as `artifact_path` (relative, e.g. "curves.svg") under the run's
  /// artifact root, through the server's artifact proxy (`mlflow-artifacts:` URIs; other stores throw).
  void log_artifact(const MlflowRunInfo& run, const std::string& local_path, const std::string& artifact_path);

 private:
  std::string post(const std::string& endpoint, const std::string& body);
  std::string request(const std::string& method, const std::string& url, const std::string& body,
                      const char* content_type);
  std::string uri_;
  std::chrono::milliseconds timeout_;
  void* curl_ = nullptr;  // CURL*, reused between calls (keeps the connection)
};

/// Options of MlflowLogger.
struct MlflowLoggerOptions {
  std::string tracking_uri;              ///< "http://host:port"
  std::string experiment = "trainkit";  ///< created when missing
  std::string run_name;                  ///< shown in the UI ("" lets the server pick one)
  /// Continue this run instead of creating one (a resumed training run); "" creates one.
  std::string resume_run_id;
  /// Metric points held while the server is slow or down; beyond it the oldest are dropped (and counted).
  int64_t max_queued = 100000;
  /// How long finish() waits for the queue to drain (the server may be restarting).
  std::chrono::milliseconds flush_timeout = std::chrono::seconds(60);
  /// Pause between attempts while the server does not answer (doubles up to 8×).
  std::chrono::milliseconds retry_interval = std::chrono::milliseconds(500);
  std::chrono::milliseconds request_timeout = std::chrono::seconds(10);
  /// Called (on the logger's thread) once the run exists on the server, e.g. to note its id for a resume.
  std::function<void(const MlflowRunInfo&)> on_run;
};

/// What a logger sent and lost.
struct MlflowLoggerStats {
  int64_t metrics_sent = 0;
  int64_t metrics_dropped = 0;   ///< dropped because the queue was full (max_queued)
  int64_t metrics_unsent = 0;    ///< still queued when finish() gave up
  int64_t artifacts_sent = 0;
  int64_t failed_requests = 0;   ///< requests that failed and were retried (or given up)
};

/// A run's MLflow logging, asynchronous: every call only queues; a background thread creates (or resumes)
/// the run, then sends params and tags, metrics in batches (MLflow's batch API) and artifacts, in the
/// order given. When the server does not answer, it warns once, keeps the points (up to max_queued) and
/// retries; when it answers again it warns no more and sends what it kept. A request the server refuses
/// (4xx) is reported and dropped. Nothing here throws into training.
class MlflowLogger {
 public:
  explicit MlflowLogger(MlflowLoggerOptions options);
  /// When finish() was not called: finish("FAILED") while an exception unwinds the stack, else
  /// finish("FINISHED") (a program that simply ends). A process killed by a signal leaves the run RUNNING.
  ~MlflowLogger();
  MlflowLogger(const MlflowLogger&) = delete;
  MlflowLogger& operator=(const MlflowLogger&) = delete;

  /// Queues run params (MLflow keeps the first value of a key: a resumed run sends the same ones).
  void log_params(std::vector<std::pair<std::string, std::string>> params);
  /// Queues run tags.
  void set_tags(std::vector<std::pair<std::string, std::string>> tags);
  /// Queues metric points; their timestamp is now when 0.
  void log_metrics(std::vector<MlflowMetric> metrics);
  /// Queues the upload of a file (read when it is sent) as `artifact_path` ("" = its file name).
  void log_artifact(std::string local_path, std::string artifact_path = "");
  /// Sends what is queued (waiting up to flush_timeout for the server), then sets the run's status.
  /// Returns the final counts; later calls return them again.
  MlflowLoggerStats finish(const std::string& status = "FINISHED");
  /// The run's id once the server created it (or the resumed one), else "".
  std::string run_id() const;
  /// The counts so far.
  MlflowLoggerStats stats() const;

 private:
  struct Item;
  void enqueue(std::shared_ptr<Item> item);
  void loop();
  bool ensure_run();
  template <class Call>
  bool retry(const std::string& what, Call&& call);
  void wait_retry(int attempt);
  bool gave_up();

  MlflowLoggerOptions options_;
  MlflowClient client_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Item>> queue_;
  int64_t queued_metrics_ = 0;
  bool finishing_ = false;
  std::string finish_status_;
  std::chrono::steady_clock::time_point deadline_;
  std::optional<MlflowRunInfo> run_;
  MlflowLoggerStats stats_;
  bool down_ = false;
  bool warned_down_ = false;
  std::thread worker_;
};

}  // namespace trainkit::log
