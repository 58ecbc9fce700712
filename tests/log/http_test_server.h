#pragma once
// A small HTTP/1.1 server on loopback for the MLflow client's tests: one thread, one request per connection
// (each reply says "Connection: close"), every request recorded. A handler chooses each reply: its status,
// headers and body, and how slowly the body goes out; the server reads request bodies at a chosen rate.
// It stands in for a tracking server that answers oddly (200 without the expected fields, not JSON, 3xx,
// slow), which the real `mlflow server` never does.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

namespace trainkit::test {

/// One request as the server read it.
struct HttpRequest {
  std::string method;
  std::string target;                         ///< path and query, e.g. "/api/2.0/mlflow/runs/create"
  std::map<std::string, std::string> headers;  ///< names in lower case
  std::string body;
  /// The header `name` (lower case), "" when absent.
  std::string header(const std::string& name) const {
    const auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  /// Starts with "/api/2.0/mlflow/" + `endpoint` (e.g. "runs/create").
  bool is(const std::string& endpoint) const { return target.rfind("/api/2.0/mlflow/" + endpoint, 0) == 0; }
};

/// One reply.
struct HttpReply {
  HttpReply(int status_ = 200, std::string body_ = "{}", std::vector<std::pair<std::string, std::string>> headers_ = {})
      : status(status_), body(std::move(body_)), headers(std::move(headers_)) {}
  int status;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// Pause before each byte of the body (a server that stalls mid-answer); 0 sends it at once.
  std::chrono::milliseconds byte_delay{0};
};

class HttpTestServer {
 public:
  using Handler = std::function<HttpReply(const HttpRequest&)>;

  explicit HttpTestServer(Handler handler) : handler_(std::move(handler)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd_ >= 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof(addr);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~HttpTestServer() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  HttpTestServer(const HttpTestServer&) = delete;
  HttpTestServer& operator=(const HttpTestServer&) = delete;

  int port() const { return port_; }
  /// "http://127.0.0.1:<port>".
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// Request bodies are read at about this many bytes per second (0: as fast as they come).
  void read_rate(size_t bytes_per_second) { read_rate_ = bytes_per_second; }
  /// Every request read so far, in order.
  std::vector<HttpRequest> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }
  /// Everything the client sent (request lines, headers but Authorization, bodies), for leak checks.
  std::string everything_but_authorization() const {
    std::string out;
    for (const HttpRequest& r : requests()) {
      out += r.method + " " + r.target + "\n";
      for (const auto& [name, value] : r.headers) {
        if (name != "authorization") out += name + ": " + value + "\n";
      }
      out += r.body + "\n";
    }
    return out;
  }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) continue;
      timeval tv{5, 0};
      ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      handle(conn);
      ::close(conn);
    }
  }

  bool send_all(int conn, const std::string& data) {
    for (size_t at = 0; at < data.size();) {
      const ssize_t n = ::send(conn, data.data() + at, data.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }

  void handle(int conn) {
    std::string in;
    char buf[65536];
    size_t end = std::string::npos;
    while ((end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(conn, buf, sizeof(buf), 0);
      if (n <= 0) return;
      in.append(buf, static_cast<size_t>(n));
    }
    HttpRequest request;
    const std::string head = in.substr(0, end);
    std::string body = in.substr(end + 4);
    size_t line_end = head.find("\r\n");
    const std::string first = head.substr(0, line_end);
    const size_t sp1 = first.find(' ');
    const size_t sp2 = first.find(' ', sp1 + 1);
    request.method = first.substr(0, sp1);
    request.target = first.substr(sp1 + 1, sp2 - sp1 - 1);
    while (line_end != std::string::npos && line_end < head.size()) {
      const size_t next = head.find("\r\n", line_end + 2);
      const std::string line = head.substr(line_end + 2, next == std::string::npos ? std::string::npos : next - line_end - 2);
      line_end = next;
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon);
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(' '));
      request.headers[name] = value;
    }
    if (request.header("expect") == "100-continue" && !send_all(conn, "HTTP/1.1 100 Continue\r\n\r\n")) return;
    const size_t length = request.header("content-length").empty() ? 0 : std::stoul(request.header("content-length"));
    const auto start = std::chrono::steady_clock::now();
    while (body.size() < length) {
      const size_t want = std::min(sizeof(buf), length - body.size());
      const ssize_t n = ::recv(conn, buf, read_rate_ > 0 ? std::min<size_t>(want, 16384) : want, 0);
      if (n <= 0) return;
      body.append(buf, static_cast<size_t>(n));
      if (read_rate_ > 0) {  // hold the pace: the bytes read so far may not arrive before their time
        std::this_thread::sleep_until(start + std::chrono::microseconds(body.size() * 1000000 / read_rate_));
      }
    }
    request.body = std::move(body);
    HttpReply reply = handler_(request);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(request);
    }
    std::string out = "HTTP/1.1 " + std::to_string(reply.status) + " Test\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(reply.body.size()) + "\r\n";
    for (const auto& [name, value] : reply.headers) out += name + ": " + value + "\r\n";
    out += "\r\n";
    if (reply.byte_delay.count() == 0) {
      send_all(conn, out + reply.body);
      return;
    }
    if (!send_all(conn, out)) return;
    for (char c : reply.body) {
      std::this_thread::sleep_for(reply.byte_delay);
      if (stop_ || !send_all(conn, std::string(1, c))) return;
    }
  }

  Handler handler_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> read_rate_{0};
  mutable std::mutex mutex_;
  std::vector<HttpRequest> requests_;
  std::thread thread_;
};

}  // namespace trainkit::test
