// The profiler: events under a mutex, a Chrome trace writer (JSON by hand: names are escaped) and the summary.
#include "fp8kit/common/profiler.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <tuple>

#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace

Profiler::Profiler() : origin_(std::chrono::steady_clock::now()) {}

double Profiler::now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - origin_).count();
}

void Profiler::record(ProfileEvent event) {
  const std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(std::move(event));
}

std::vector<ProfileEvent> Profiler::events() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return events_;
}

void Profiler::clear() {
  const std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
}

void Profiler::write_chrome_trace(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  FP8KIT_CHECK(static_cast<bool>(out), "cannot write the trace to '", path, "' (check the directory exists)");
  write_chrome_trace(out);
  FP8KIT_CHECK(static_cast<bool>(out), "writing the trace to '", path, "' failed (disk full?)");
}

void Profiler::write_chrome_trace(std::ostream& out) const {
  out << kChromeTraceStart << "\n";
  const std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < events_.size(); ++i) {
    const ProfileEvent& e = events_[i];
    char times[96];
    std::snprintf(times, sizeof times, "\"ts\": %.3f, \"dur\": %.3f", e.start_us, e.duration_us);
    out << "{\"name\": \"" << json_escape(e.name) << "\", \"cat\": \"" << json_escape(e.category)
        << "\", \"ph\": \"X\", \"pid\": 1, \"tid\": " << e.track + 1 << ", " << times << ", \"args\": {";
    bool first = true;
    for (const auto& [k, v] : e.args) {
      out << (first ? "" : ", ") << "\"" << json_escape(k) << "\": \"" << json_escape(v) << "\"";
      first = false;
    }
    out << "}}" << (i + 1 < events_.size() ? ",\n" : "\n");
  }
  out << "]}\n";
}

std::vector<Profiler::Summary> Profiler::summary() const {
  std::map<std::tuple<std::string, std::string, std::string>, Summary> by;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (const ProfileEvent& e : events_) {
      const auto path = e.args.count("path") ? e.args.at("path") : std::string();
      const auto reason = e.args.count("reason") ? e.args.at("reason") : std::string();
      Summary& s = by[{e.name, path, reason}];
      s.name = e.name;
      s.path = path;
      s.reason = reason;
      ++s.calls;
      s.total_us += e.duration_us;
    }
  }
  std::vector<Summary> out;
  for (auto& [key, s] : by) out.push_back(s);
  std::sort(out.begin(), out.end(), [](const Summary& a, const Summary& b) { return a.total_us > b.total_us; });
  return out;
}

ScopedEvent::ScopedEvent(Profiler* profiler, std::string name, std::string category) : profiler_(profiler) {
  if (profiler_ == nullptr) return;
  event_.name = std::move(name);
  event_.category = std::move(category);
  event_.start_us = profiler_->now_us();
}

ScopedEvent::~ScopedEvent() {
  if (profiler_ == nullptr) return;
  event_.duration_us = profiler_->now_us() - event_.start_us;
  profiler_->record(std::move(event_));
}

void ScopedEvent::arg(const std::string& key, std::string value) {
  if (profiler_ != nullptr) event_.args[key] = std::move(value);
}

}  // namespace fp8kit
