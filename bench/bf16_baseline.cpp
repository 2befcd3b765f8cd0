// oneDNN's bfloat16 matmul as the BF16 GEMM baseline (see bf16_baseline.hpp). The primitive is created once per
// shape; its buffers are the caller's (user memory, no copies); A is M x K row-major ("ab"), B is given N x K, i.e.
// the K x N weights in "ba" order, C is M x N float32.
#include "bf16_baseline.hpp"

#include <stdexcept>
#include <vector>

#ifdef FP8KIT_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace fp8kit::bench {

#ifdef FP8KIT_HAVE_ONEDNN

const Bf16Library& bf16_library() {
  static const Bf16Library lib = [] {
    const dnnl_version_t* v = dnnl_version();
    return Bf16Library{
        true, "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch),
        ""};
  }();
  return lib;
}

struct Bf16Gemm::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
  dnnl::memory a, b, c;
};

Bf16Gemm::Bf16Gemm(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a, const std::uint16_t* b,
                   float* c)
    : impl_(std::make_unique<Impl>()) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc ad({m, k}, dt::bf16, tag::ab), bd({k, n}, dt::bf16, tag::ba), cd({m, n}, dt::f32, tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  impl_->pd = dnnl::matmul::primitive_desc(impl_->engine, ad, bd, cd);
#else
  impl_->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), impl_->engine);
#endif
  impl_->primitive = dnnl::matmul(impl_->pd);
  impl_->a = dnnl::memory(ad, impl_->engine, const_cast<std::uint16_t*>(a));
  impl_->b = dnnl::memory(bd, impl_->engine, const_cast<std::uint16_t*>(b));
  impl_->c = dnnl::memory(cd, impl_->engine, c);
}

void Bf16Gemm::run() {
  impl_->primitive.execute(impl_->stream,
                           {{DNNL_ARG_SRC, impl_->a}, {DNNL_ARG_WEIGHTS, impl_->b}, {DNNL_ARG_DST, impl_->c}});
  impl_->stream.wait();
}

std::string Bf16Gemm::implementation() const {
  return impl_->pd.impl_info_str();
}

#else

const Bf16Library& bf16_library() {
  static const Bf16Library lib{false, "",
                               "fp8kit was built without oneDNN; install the Debian package libdnnl-dev "
                               "and reconfigure (the README's setup command does both)"};
  return lib;
}

struct Bf16Gemm::Impl {};

Bf16Gemm::Bf16Gemm(std::int64_t, std::int64_t, std::int64_t, const std::uint16_t*, const std::uint16_t*, float*) {
  throw std::runtime_error(bf16_library().why_missing);
}
void Bf16Gemm::run() {}
std::string Bf16Gemm::implementation() const {
  return "";
}

#endif

Bf16Gemm::~Bf16Gemm() = default;

}  // namespace fp8kit::bench
