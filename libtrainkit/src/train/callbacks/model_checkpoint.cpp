#include "trainkit/train/callbacks/model_checkpoint.h"
#include "trainkit/io/export.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <torch/torch.h>

#include "trainkit/train/checkpoint.h"
#include "trainkit/train/trainer.h"
#include "detail/check.h"

namespace trainkit::train {

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  TRAINKIT_CHECK_ARG(options_.mode() == "min" || options_.mode() == "max",
                     "ModelCheckpoint: invalid mode \"{}\" (\"min\" or \"max\")", options_.mode());
  TRAINKIT_CHECK_ARG(options_.save_top_k() >= -1, "ModelCheckpoint: invalid save_top_k: {} (-1, 0 or more)",
                     options_.save_top_k());
  TRAINKIT_CHECK_ARG(!options_.dir().empty(), "ModelCheckpoint: dir must not be empty");
  max_ = options_.mode() == "max";
}

size_t ModelCheckpoint::worst_index() const {
  size_t worst = 0;
  for (size_t i = 1; i < best_k_.size(); ++i) {
    if (better(best_k_[worst].second, best_k_[i].second)) {
      worst = i;
    }
  }
  return worst;
}

std::pair<bool, std::string> ModelCheckpoint::update(const std::string& name, double current) {
  const int64_t top_k = options_.save_top_k();
  if (top_k == 0) {
    return {false, ""};
  }
  const bool fewer = top_k == -1 || static_cast<int64_t>(best_k_.size()) < top_k;
  if (!fewer && !better(current, best_k_[worst_index()].second)) {
    return {false, ""};
  }
  std::string deleted;
  if (!fewer) {
    const size_t w = worst_index();
    deleted = best_k_[w].first;
    best_k_.erase(best_k_.begin() + static_cast<std::ptrdiff_t>(w));
  }
  if (std::isnan(current)) {
    current = max_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  }
  best_k_.emplace_back(name, current);
  return {true, deleted == name ? "" : deleted};
}

std::string ModelCheckpoint::best_model_path() const {
  if (best_k_.empty()) {
    return "";
  }
  size_t best = 0;
  for (size_t i = 1; i < best_k_.size(); ++i) {
    if (better(best_k_[i].second, best_k_[best].second)) {
      best = i;
    }
  }
  return best_k_[best].first;
}

double ModelCheckpoint::best_model_score() const {
  const std::string path = best_model_path();
  for (const auto& [name, score] : best_k_) {
    if (name == path) {
      return score;
    }
  }
  return std::numeric_limits<double>::quiet_NaN();
}

bool ModelCheckpoint::on_validation_point(Trainer& trainer, const EpochEvent& event) {
  namespace fs = std::filesystem;
  const double current = monitored_value(event, options_.monitor(), "ModelCheckpoint");
  const std::string name = fmt::format("epoch={}-step={}.pt", event.epoch, event.step);
  const auto [saved, deleted] = update(name, current);
  if (saved || options_.save_last()) {
    fs::create_directories(options_.dir());
  }
  const auto stem = [](const std::string& file) { return fs::path(file).stem().string(); };
  if (saved) {
    save_weights(trainer.module(), (fs::path(options_.dir()) / name).string());
    io::export_weights(trainer.module(), options_.dir(), stem(name), options_.export_formats());
  }
  if (!deleted.empty()) {
    std::error_code ec;
    fs::remove(fs::path(options_.dir()) / deleted, ec);
    for (const std::string& copy : io::export_paths(options_.dir(), stem(deleted), options_.export_formats())) {
      fs::remove(copy, ec);
    }
  }
  if (options_.save_last()) {
    save_weights(trainer.module(), (fs::path(options_.dir()) / "last.pt").string());
    io::export_weights(trainer.module(), options_.dir(), "last", options_.export_formats());
  }
  return false;
}

void ModelCheckpoint::save(torch::serialize::OutputArchive& archive) const {
  std::string names;
  std::vector<double> scores;
  for (const auto& [name, score] : best_k_) {
    names += name + '\n';
    scores.push_back(score);
  }
  archive.write("names", c10::IValue(names));
  archive.write("scores", torch::tensor(scores, torch::kFloat64));
}

void ModelCheckpoint::load(torch::serialize::InputArchive& archive) {
  c10::IValue names;
  archive.read("names", names);
  at::Tensor scores;
  archive.read("scores", scores);
  best_k_.clear();
  std::istringstream in(names.toStringRef());
  std::string name;
  for (int64_t i = 0; std::getline(in, name); ++i) {
    best_k_.emplace_back(name, scores[i].item<double>());
  }
}

}  // namespace trainkit::train
