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

/// How MlflowClient authenticates and checks the server's TLS certificate. A field left unset is read from
/// the environment variable that MLflow's Python client reads for it (mlflow/environment_variables.py), so
/// that one shell setup serves both; a field set here wins over the variable.
/// Which header is sent follows the Python client (mlflow/utils/rest_utils.py): a username and a password
/// give HTTP Basic, else a token gives `Authorization: Bearer <token>`, else nothing. User info in the
/// tracking URI (`http://user:password@host`, percent-encoded) stands for a username and password set
/// here, over the variables, as `requests` lets a URL's user info win. Credentials are sent in that header
/// only: never logged, never in an error message, never in MlflowClient::tracking_uri().
struct MlflowAuth {
  std::optional<std::string> username;          ///< MLFLOW_TRACKING_USERNAME
  std::optional<std::string> password;          ///< MLFLOW_TRACKING_PASSWORD
  std::optional<std::string> token;             ///< MLFLOW_TRACKING_TOKEN
  /// A CA bundle (PEM) that the server's certificate must chain to, instead of the system's:
  /// MLFLOW_TRACKING_SERVER_CERT_PATH. Must be a file.
  std::optional<std::string> server_cert_path;
  /// A client certificate with its key, one PEM file (requests' `cert`): MLFLOW_TRACKING_CLIENT_CERT_PATH.
  std::optional<std::string> client_cert_path;
  /// Do not verify the server's certificate or host name: MLFLOW_TRACKING_INSECURE_TLS, which takes
  /// "true", "false", "1", "0" (any case). Not together with a server_cert_path.
  std::optional<bool> insecure_tls;
};

/// Options of MlflowClient.
struct MlflowClientOptions {
  /// Limit of one request, connecting included.
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
  /// An artifact upload may take timeout + its size / artifact_min_rate (bytes per second): at the default
  /// 1 MiB/s a 100 MiB model gets 10 s + 100 s. Artifacts are streamed from disk, never held in memory.
  int64_t artifact_min_rate = int64_t{1} << 20;
  MlflowAuth auth;
};

/// `uri` without the user info of its authority ("http://user:pw@host:5000/x" -> "http://host:5000/x"),
/// everything else unchanged. What trainkit logs, saves (config.toml), sends as a param and uploads
/// whenever it shows an MLflow tracking URI.
std::string mlflow_redacted_uri(const std::string& uri);

/// Synchronous calls of MLflow's REST API (`/api/2.0/mlflow/...`), one HTTP request each (libcurl).
/// Every call throws MlflowError on failure; redirects are not followed (a 3xx is an error that names where
/// it points), so that credentials never travel to another place.
class MlflowClient {
 public:
  /// `tracking_uri`: "http://host:port" or https (a trailing slash is dropped). Throws
  /// std::invalid_argument for another scheme, and for TLS settings that are not usable (naming the
  /// variable or option and its value).
  MlflowClient(std::string tracking_uri, MlflowClientOptions options);
  /// With MlflowClientOptions' defaults but `timeout`.
  explicit MlflowClient(std::string tracking_uri, std::chrono::milliseconds timeout = MlflowClientOptions().timeout);
  ~MlflowClient();
  MlflowClient(const MlflowClient&) = delete;
  MlflowClient& operator=(const MlflowClient&) = delete;

  /// The tracking URI without credentials (mlflow_redacted_uri).
  const std::string& tracking_uri() const { return uri_; }
  /// The id of experiment `name`, created when it does not exist.
  std::string experiment_id(const std::string& name);
  /// A new run in `experiment_id`, started now, with `tags`. Text that is not UTF-8 (a run directory's
  /// name) is sent with U+FFFD in place of each invalid byte.
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
  /// artifact root, through the server's artifact proxy (`mlflow-artifacts:` URIs; other stores throw),
  /// streamed from disk within timeout + size / artifact_min_rate.
  void log_artifact(const MlflowRunInfo& run, const std::string& local_path, const std::string& artifact_path);

 private:
  struct Upload;
  std::string post(const std::string& endpoint, const std::string& body);
  std::string get(const std::string& url);
  std::string request(const std::string& method, const std::string& url, const std::string& body,
                      const char* content_type, Upload* upload = nullptr);
  std::string uri_;  // without user info
  MlflowClientOptions options_;  // auth resolved: URI user info and the environment applied
  void* curl_ = nullptr;  // CURL*, reused between calls (keeps the connection)
};

/// Options of MlflowLogger.
struct MlflowLoggerOptions {
  std::string tracking_uri;              ///< "http://host:port" (user info there is taken as credentials)
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
  /// Limit of one request (MlflowClientOptions::timeout).
  std::chrono::milliseconds request_timeout = MlflowClientOptions().timeout;
  /// Artifact uploads may take request_timeout + size / artifact_min_rate (MlflowClientOptions).
  int64_t artifact_min_rate = MlflowClientOptions().artifact_min_rate;
  /// Credentials and TLS; unset fields come from MLflow's environment variables (MlflowAuth).
  MlflowAuth auth;
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
  /// The artifact paths not uploaded (refused, unreadable, or still queued when finish() gave up), in order.
  std::vector<std::string> artifacts_failed;
};

/// A run's MLflow logging, asynchronous: every call only queues; a background thread creates (or resumes)
/// the run, then sends params and tags, metrics in batches (MLflow's batch API) and artifacts, in the
/// order given. When the server does not answer, it warns once, keeps the points (up to max_queued) and
/// retries; when it answers again it warns no more and sends what it kept. A request the server refuses
/// (4xx, 3xx), an answer without what trainkit needs, or any other error of a call is reported and its item
/// dropped; the last warning counts the points lost and names the artifacts not sent. Nothing here throws
/// into training, and nothing escapes the background thread.
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
  bool failed(const std::string& what, const std::string& error, bool transient);
  void stop_on_error(const std::string& what);
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
  bool stopped_ = false;  // the background thread ended on an error: calls only count what they drop
  std::thread worker_;
};

}  // namespace trainkit::log
