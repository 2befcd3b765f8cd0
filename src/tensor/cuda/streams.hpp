// The state behind cuda::Stream and cuda::Event (fp8kit/tensor/cuda_stream.hpp), and the calling thread's current
// stream per device, which every CUDA entry of fp8kit queues its work on (CUDA builds only).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

namespace fp8kit::cuda::detail {

struct StreamState {
  int device = 0;
  cudaStream_t stream = nullptr;  // cudaStreamLegacy for the legacy default stream
  bool owned = false;             // created by fp8kit: synchronized and destroyed with the state
  ~StreamState();
};

struct EventState {
  int device = 0;
  cudaEvent_t event = nullptr;
  ~EventState();
};

}  // namespace fp8kit::cuda::detail

namespace fp8kit::cuda_detail {

// The calling thread's current stream of `device`: a StreamGuard's, else cudaStreamLegacy.
cudaStream_t stream_of(int device);
// Its state, null for the legacy default stream: an allocation keeps it, to be freed on the stream it was made on.
std::shared_ptr<cuda::detail::StreamState> current_stream_state(int device);

}  // namespace fp8kit::cuda_detail
