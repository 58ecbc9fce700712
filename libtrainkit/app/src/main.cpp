#include "trainkit/app/main.h"

#include <csignal>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "trainkit/app/config.h"
#include "trainkit/app/run.h"
#include "trainkit/data/idx.h"
#include "trainkit/train/checkpoint.h"

namespace trainkit::app {

int run_main(const std::function<int()>& body) {
  // A file-size limit (RLIMIT_FSIZE) then fails the write with EFBIG and a message naming the file, as a
  // full disk does, instead of killing the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    return body();
  } catch (const ConfigError& e) {
    spdlog::error("config: {}", e.what());
    return kExitUsage;
  } catch (const UsageError& e) {
    spdlog::error("{}", e.what());
    return kExitUsage;
  } catch (const data::DataError& e) {
    spdlog::error("data: {}", e.what());
  } catch (const train::CheckpointError& e) {
    spdlog::error("checkpoint: {}", e.what());
  } catch (const c10::Error& e) {
    spdlog::error("{}", spdlog::should_log(spdlog::level::debug) ? e.what() : e.what_without_backtrace());
  } catch (const std::invalid_argument& e) {
    spdlog::error("{}", e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
  return kExitFailure;
}

void set_log_level(const std::string& level) {
  spdlog::set_pattern("[%H:%M:%S] %^%l%$ %v");
  spdlog::set_level(spdlog::level::from_str(level));
}

}  // namespace trainkit::app
