// Profiler: one complete event per op (name, start, duration, input dtypes, the path taken and why), written as a
// Chrome trace (Perfetto, chrome://tracing) and summarized per op. Dispatch decisions are events too.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fp8kit {

struct ProfileEvent {
  std::string name;      // "linear.forward", "conv2d.forward", "cast bf16->e4m3fn", ...
  std::string category;  // "op", "cast", "gemm", "optimizer", ...
  double start_us = 0;   // since the profiler was created
  double duration_us = 0;
  std::map<std::string, std::string> args;  // "dtypes", "path" ("fp8" | "fallback" | ...), "reason", shapes
  int track = 0;                            // the trace's thread row (e.g. one per recipe of a comparison)
};

class Profiler {
 public:
  Profiler();
  double now_us() const;
  void record(ProfileEvent event);           // thread-safe
  std::vector<ProfileEvent> events() const;  // a copy, taken under the lock: record() may run meanwhile
  void clear();

  // Chrome trace JSON ({"traceEvents": [{"ph": "X", ...}]}) into `out`, beginning with kChromeTraceStart (by which
  // fp8kit train knows an earlier trace it may replace).
  static constexpr std::string_view kChromeTraceStart = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  void write_chrome_trace(std::ostream& out) const;
  // The same into a file (written in place: fp8kit train writes it through a temporary file and a rename); throws
  // fp8kit::Error when it cannot be written.
  void write_chrome_trace(const std::string& path) const;

  // Per (name, path, reason): calls and total time, sorted by total time, longest first.
  struct Summary {
    std::string name, path, reason;
    std::int64_t calls = 0;
    double total_us = 0;
  };
  std::vector<Summary> summary() const;

 private:
  std::chrono::steady_clock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<ProfileEvent> events_;
};

// Times a scope and records it on destruction (does nothing when the profiler is null). Args can be added
// while the op runs: the dispatcher sets "path" and "reason" once it has decided.
class ScopedEvent {
 public:
  ScopedEvent(Profiler* profiler, std::string name, std::string category = "op");
  ~ScopedEvent();
  ScopedEvent(const ScopedEvent&) = delete;
  ScopedEvent& operator=(const ScopedEvent&) = delete;
  void arg(const std::string& key, std::string value);

 private:
  Profiler* profiler_;
  ProfileEvent event_;
};

}  // namespace fp8kit
