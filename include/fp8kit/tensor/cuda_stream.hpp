// CUDA streams and events (a build with the CUDA backend): where fp8kit queues its device work. Without a guard
// everything goes to the legacy default stream, in order. A StreamGuard makes a stream the calling thread's current
// stream of its device for a scope: every kernel, cuBLASLt call, copy, fill and allocation fp8kit queues there
// from that thread goes to it (PyTorch's torch.cuda.stream(s)). Work on different streams is not ordered: order it
// with an Event (record on one, wait on the other), as with PyTorch's streams. A tensor's memory is freed on the
// stream it was allocated on: a tensor used on another stream must stay alive until that work is done (PyTorch's
// record_stream caveat). A build without the CUDA backend, or a device that is not there, throws Error(kUnsupported).
#pragma once

#include <memory>
#include <utility>

namespace fp8kit::cuda {

namespace detail {
struct StreamState;
struct EventState;
}  // namespace detail

class Stream {
 public:
  // A new stream on `device` (non-blocking: not ordered with the legacy default stream), destroyed when the last
  // Stream and the last tensor allocated on it are gone.
  explicit Stream(int device = 0);
  // The legacy default stream of `device` (what fp8kit uses without a guard).
  static Stream legacy(int device = 0);

  int device() const noexcept;
  bool is_legacy() const noexcept;
  // The cudaStream_t, for the caller's own kernels and libraries.
  void* handle() const noexcept;
  // Waits until everything queued on the stream has finished.
  void synchronize() const;
  // Whether everything queued on it has finished (without waiting).
  bool done() const;

  friend bool operator==(const Stream& a, const Stream& b) noexcept {
    return a.device() == b.device() && a.handle() == b.handle();
  }

 private:
  explicit Stream(std::shared_ptr<detail::StreamState> state) : state_(std::move(state)) {}
  friend Stream current_stream(int device);
  friend class StreamGuard;
  std::shared_ptr<detail::StreamState> state_;
};

// The calling thread's current stream of `device` (the legacy default stream unless a StreamGuard says otherwise).
Stream current_stream(int device = 0);

// Makes `stream` the calling thread's current stream of its device until the guard goes out of scope (guards nest).
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_ = 0;
  std::shared_ptr<detail::StreamState> previous_;
};

// A point in a stream's work: recorded on one stream, waited for by another stream (no host wait) or by the host.
class Event {
 public:
  // `timing`: the event keeps a timestamp, for seconds_since.
  explicit Event(int device = 0, bool timing = false);
  // Records the work queued on `stream` so far (on the current stream of the event's device without an argument).
  void record(const Stream& stream);
  void record();
  // Everything queued on `stream` after this call waits for the recorded work (the host does not wait).
  void wait(const Stream& stream) const;
  // The host waits for the recorded work.
  void synchronize() const;
  bool done() const;
  // Seconds from `start` to this event (both recorded, both timing events, this one finished).
  double seconds_since(const Event& start) const;

 private:
  std::shared_ptr<detail::EventState> state_;
};

}  // namespace fp8kit::cuda
