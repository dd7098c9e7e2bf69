#include "examples/gpt/lm_head.hpp"

#include <Eigen/Dense>
#include <dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "examples/gpt/error.hpp"

namespace gpt {
namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

// 64-byte aligned scratch that only grows (reused across calls: no per-step allocation).
class Scratch {
 public:
  void* get(std::size_t bytes) {
    if (bytes > bytes_) {
      ptr_.reset(static_cast<std::byte*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
      GPT_CHECK(ptr_ != nullptr, "lm_head: cannot allocate ", bytes, " bytes of scratch");
      bytes_ = bytes;
    }
    return ptr_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> ptr_;
  std::size_t bytes_ = 0;
};

void to_bf16(const float* src, std::size_t n, std::uint16_t* dst) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16_bits(src[i]);
}

}  // namespace

std::string head_precision_name(HeadPrecision p) { return p == HeadPrecision::bf16 ? "bf16" : "fp32"; }

HeadPrecision parse_head_precision(const std::string& value, const std::string& field) {
  if (value == "fp32") return HeadPrecision::fp32;
  if (value == "bf16") return HeadPrecision::bf16;
  GPT_THROW(field, ": '", value, "' is not a head precision (fp32 or bf16)");
}

// C[M, N] (+)= A[M, K] B[K, N] with A and B given by their strides (row, column) in elements,
// C row-major fp32; primitives are built once per shape and reused.
struct LmHead::Impl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::tuple<long, long, long, long, long, long, long, int, bool>, dnnl::matmul> cache;
  Scratch logits, g16, x16, w16;

  void matmul(long M, long N, long K, const void* a, dims a_strides, const void* b, dims b_strides,
              float* c, dt type, bool accumulate) {
    const auto key = std::make_tuple(M, N, K, a_strides[0], a_strides[1], b_strides[0], b_strides[1],
                                     static_cast<int>(type), accumulate);
    auto it = cache.find(key);
    dnnl::memory::desc ad({M, K}, type, a_strides), bd({K, N}, type, b_strides),
        cd({M, N}, dt::f32, dims{N, 1});
    if (it == cache.end()) {
      dnnl::primitive_attr attr;
      if (accumulate) {
        dnnl::post_ops po;
        po.append_sum(1.0f);
        attr.set_post_ops(po);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(ad, bd, cd), attr, engine);
      it = cache.emplace(key, dnnl::matmul(pd)).first;
    }
    dnnl::memory am(ad, engine, const_cast<void*>(a)), bm(bd, engine, const_cast<void*>(b)), cm(cd, engine, c);
    it->second.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    stream.wait();
  }
};

LmHead::LmHead(HeadPrecision training_precision, int chunk_rows)
    : precision_(training_precision), chunk_(chunk_rows), impl_(std::make_unique<Impl>()) {
  GPT_CHECK(chunk_rows >= 1, "lm_head: chunk_rows must be >= 1, got ", chunk_rows);
}

LmHead::~LmHead() = default;

double LmHead::loss(const float* x, const float* wte, const std::int32_t* targets, int N, int C, int V) {
  return run(x, wte, targets, N, C, V, nullptr, nullptr, false);
}

double LmHead::loss_and_grad(const float* x, const float* wte, const std::int32_t* targets, int N, int C,
                             int V, float* dx, float* dwte) {
  GPT_CHECK(dx != nullptr && dwte != nullptr, "lm_head: loss_and_grad needs dx and dwte");
  return run(x, wte, targets, N, C, V, dx, dwte, precision_ == HeadPrecision::bf16);
}

double LmHead::run(const float* x, const float* wte, const std::int32_t* targets, int N, int C, int V,
                   float* dx, float* dwte, bool bf16) {
  GPT_CHECK(N >= 1 && C >= 1 && V >= 1, "lm_head: N, C, V must be >= 1, got ", N, ", ", C, ", ", V);
  Impl& I = *impl_;
  const int chunk = std::min(chunk_, N);
  const bool grad = dx != nullptr;
  const std::size_t CV = static_cast<std::size_t>(C) * V;
  float* logits = static_cast<float*>(I.logits.get(static_cast<std::size_t>(chunk) * V * sizeof(float)));
  std::uint16_t *w16 = nullptr, *x16 = nullptr, *g16 = nullptr;
  if (bf16) {
    w16 = static_cast<std::uint16_t*>(I.w16.get(CV * 2));
    x16 = static_cast<std::uint16_t*>(I.x16.get(static_cast<std::size_t>(N) * C * 2));
    g16 = static_cast<std::uint16_t*>(I.g16.get(static_cast<std::size_t>(chunk) * V * 2));
    to_bf16(wte, CV, w16);
    to_bf16(x, static_cast<std::size_t>(N) * C, x16);
  }
  const dt type = bf16 ? dt::bf16 : dt::f32;
  const void* w = bf16 ? static_cast<const void*>(w16) : wte;
  const float inv_n = 1.0f / static_cast<float>(N);
  double loss = 0;
  for (int r0 = 0; r0 < N; r0 += chunk) {
    const int R = std::min(chunk, N - r0);
    const void* xr = bf16 ? static_cast<const void*>(x16 + static_cast<std::size_t>(r0) * C)
                          : static_cast<const void*>(x + static_cast<std::size_t>(r0) * C);
    // logits[R, V] = x_r[R, C] · wte^T ([C, V], wte read column-wise).
    I.matmul(R, V, C, xr, {C, 1}, w, {1, C}, logits, type, false);
    for (int r = 0; r < R; ++r) {
      Eigen::Map<Eigen::ArrayXf> row(logits + static_cast<std::size_t>(r) * V, V);
      const int y = targets[r0 + r];
      const float mx = row.maxCoeff();
      const float target_logit = row(y);
      row = (row - mx).exp();  // softmax numerators
      const float sum = row.sum();
      loss += std::log(static_cast<double>(sum)) + static_cast<double>(mx - target_logit);
      if (!grad) continue;
      // G = softmax / N - onehot / N; in bf16 the scaling and the rounding share one pass.
      const float scale = 1.0f / (sum * static_cast<float>(N));
      if (bf16) {
        std::uint16_t* g = g16 + static_cast<std::size_t>(r) * V;
        const float* e = row.data();
        for (int v = 0; v < V; ++v) g[v] = to_bf16_bits(e[v] * scale);
        g[y] = to_bf16_bits(e[y] * scale - inv_n);
      } else {
        row *= scale;
        row(y) -= inv_n;
      }
    }
    if (grad) {
      const void* g = bf16 ? static_cast<const void*>(g16) : logits;
      // dx_r[R, C] += G[R, V] · wte[V, C];  dwte[V, C] += G^T[V, R] · x_r[R, C].
      I.matmul(R, C, V, g, {V, 1}, w, {C, 1}, dx + static_cast<std::size_t>(r0) * C, type, true);
      I.matmul(V, C, R, g, {1, V}, xr, {C, 1}, dwte, type, true);
    }
  }
  return loss / N;
}

}  // namespace gpt
