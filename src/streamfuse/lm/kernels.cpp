// Fused CPU kernels for the int8 Gemma decode path (built on first use by kernels.py).
//
// Eager PyTorch spends more time dispatching ~80 small ops per layer than moving weights when
// decoding one token. These kernels fuse the element-wise work around the int8 matrix products
// (RMSNorm + activation quantization, int32 accumulator rescaling + residual + norm, q/k norm +
// RoPE, GeGLU + quantization) so a layer is ~20 calls. Every kernel loops row by row with a
// fixed summation order, so a row's result never depends on which other rows share the call:
// greedy decoding, batched decoding and speculative verification stay token-identical.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <cmath>
#include <string>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define STREAMFUSE_VNNI 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define STREAMFUSE_AVX2_GEMV 1
#endif

namespace {

constexpr float kQMax = 127.0f;

void check_rows(const at::Tensor& t, at::ScalarType dtype, const char* name) {
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D, got ", t.dim(), "-D");
  TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type());
  TORCH_CHECK(t.stride(1) == 1, name, " rows must be contiguous");
}

// Symmetric int8 of one row: q = round(v / amax * 127) (ties to even), returns amax.
inline float quantize_row(const float* v, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(v[j]));
  if (amax == 0.0f) {
    for (int64_t j = 0; j < n; ++j) q[j] = 0;
    return 0.0f;
  }
  const float inv = kQMax / amax;
  for (int64_t j = 0; j < n; ++j) q[j] = static_cast<int8_t>(std::nearbyint(v[j] * inv));
  return amax;
}

inline float inv_rms(const float* v, int64_t n, double eps) {
  double ss = 0.0;
  for (int64_t j = 0; j < n; ++j) ss += static_cast<double>(v[j]) * v[j];
  return static_cast<float>(1.0 / std::sqrt(ss / n + eps));
}

}  // namespace

// x: (R, K) float -> (q int8 (R, K), amax float (R, 1)).
std::vector<at::Tensor> quantize_rows(const at::Tensor& x) {
  check_rows(x, at::kFloat, "x");
  const int64_t R = x.size(0), K = x.size(1);
  auto q = at::empty({R, K}, x.options().dtype(at::kChar));
  auto amax = at::empty({R, 1}, x.options());
  for (int64_t r = 0; r < R; ++r) {
    amax.data_ptr<float>()[r] =
        quantize_row(x.data_ptr<float>() + r * x.stride(0), K, q.data_ptr<int8_t>() + r * K);
  }
  return {q, amax};
}

// h = rms_norm(x) * w, quantized: (q, amax of h).
std::vector<at::Tensor> rms_norm_quantize(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, at::kFloat, "x");
  const int64_t R = x.size(0), K = x.size(1);
  TORCH_CHECK(w.numel() == K && w.is_contiguous(), "w must hold ", K, " values");
  auto q = at::empty({R, K}, x.options().dtype(at::kChar));
  auto amax = at::empty({R, 1}, x.options());
  std::vector<float> h(K);
  const float* wp = w.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data_ptr<float>() + r * x.stride(0);
    const float s = inv_rms(xr, K, eps);
    for (int64_t j = 0; j < K; ++j) h[j] = xr[j] * s * wp[j];
    amax.data_ptr<float>()[r] = quantize_row(h.data(), K, q.data_ptr<int8_t>() + r * K);
  }
  return {q, amax};
}

// x += rms_norm(acc * amax * wscale) * w, in place; returns x.
at::Tensor add_rms_norm_acc(at::Tensor x, const at::Tensor& acc, const at::Tensor& amax,
                            const at::Tensor& wscale, const at::Tensor& w, double eps) {
  check_rows(x, at::kFloat, "x");
  check_rows(acc, at::kInt, "acc");
  const int64_t R = x.size(0), K = x.size(1);
  TORCH_CHECK(acc.size(0) == R && acc.size(1) == K, "acc shape mismatch");
  TORCH_CHECK(wscale.numel() == K && w.numel() == K, "scale sizes mismatch");
  std::vector<float> y(K);
  const float* ws = wscale.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* a = acc.data_ptr<int32_t>() + r * acc.stride(0);
    float* xr = x.data_ptr<float>() + r * x.stride(0);
    const float sc = amax.data_ptr<float>()[r];
    for (int64_t j = 0; j < K; ++j) y[j] = static_cast<float>(a[j]) * sc * ws[j];
    const float s = inv_rms(y.data(), K, eps);
    for (int64_t j = 0; j < K; ++j) xr[j] += y[j] * s * wp[j];
  }
  return x;
}

// GeGLU on the fused gate|up product, quantized for the down projection.
// acc: (R, 2F) int32, amax: (R, 1), wscale: (2F) -> (q int8 (R, F), amax (R, 1)).
// The GELU itself is ATen's (vectorized tanh form); everything around it is fused here.
std::vector<at::Tensor> geglu_quantize_acc(const at::Tensor& acc, const at::Tensor& amax,
                                           const at::Tensor& wscale) {
  check_rows(acc, at::kInt, "acc");
  const int64_t R = acc.size(0), F = acc.size(1) / 2;
  TORCH_CHECK(wscale.numel() == 2 * F, "wscale size mismatch");
  auto fopt = acc.options().dtype(at::kFloat);
  auto gate = at::empty({R, F}, fopt);
  auto up = at::empty({R, F}, fopt);
  const float* ws = wscale.data_ptr<float>();
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* a = acc.data_ptr<int32_t>() + r * acc.stride(0);
    const float s = amax.data_ptr<float>()[r];
    float* g = gate.data_ptr<float>() + r * F;
    float* u = up.data_ptr<float>() + r * F;
    for (int64_t j = 0; j < F; ++j) g[j] = static_cast<float>(a[j]) * s * ws[j];
    for (int64_t j = 0; j < F; ++j) u[j] = static_cast<float>(a[F + j]) * s * ws[F + j];
  }
  at::gelu_(gate, "tanh");
  auto q = at::empty({R, F}, acc.options().dtype(at::kChar));
  auto out_amax = at::empty({R, 1}, fopt);
  for (int64_t r = 0; r < R; ++r) {
    float* g = gate.data_ptr<float>() + r * F;
    const float* u = up.data_ptr<float>() + r * F;
    for (int64_t j = 0; j < F; ++j) g[j] *= u[j];
    out_amax.data_ptr<float>()[r] = quantize_row(g, F, q.data_ptr<int8_t>() + r * F);
  }
  return {q, out_amax};
}

// From the fused q|k|v product: per-head RMSNorm of q and k times `mult` ((H+KV), D), RoPE with
// per-row cos / signed sin tables (R, D) (rotate_half's sign folded into sin), and v.
// Returns (qk (R, H+KV, D), v (R, KV, D)).
std::vector<at::Tensor> qkv_norm_rope_acc(const at::Tensor& acc, const at::Tensor& amax,
                                          const at::Tensor& wscale, const at::Tensor& mult,
                                          const at::Tensor& cos, const at::Tensor& sin,
                                          int64_t H, int64_t KV, int64_t D, double eps) {
  check_rows(acc, at::kInt, "acc");
  check_rows(cos, at::kFloat, "cos");
  check_rows(sin, at::kFloat, "sin");
  const int64_t R = acc.size(0), NQK = H + KV;
  TORCH_CHECK(acc.size(1) == (NQK + KV) * D, "acc width mismatch");
  TORCH_CHECK(mult.numel() == NQK * D && mult.is_contiguous(), "mult size mismatch");
  TORCH_CHECK(cos.size(0) == R && cos.size(1) == D && sin.size(0) == R, "rope table mismatch");
  auto fopt = acc.options().dtype(at::kFloat);
  auto qk = at::empty({R, NQK, D}, fopt);
  auto v = at::empty({R, KV, D}, fopt);
  const float* ws = wscale.data_ptr<float>();
  const float* mp = mult.data_ptr<float>();
  std::vector<float> y(D);
  const int64_t half = D / 2;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* a = acc.data_ptr<int32_t>() + r * acc.stride(0);
    const float s = amax.data_ptr<float>()[r];
    const float* c = cos.data_ptr<float>() + r * cos.stride(0);
    const float* sn = sin.data_ptr<float>() + r * sin.stride(0);
    float* out = qk.data_ptr<float>() + r * NQK * D;
    for (int64_t h = 0; h < NQK; ++h) {
      const int64_t o = h * D;
      for (int64_t j = 0; j < D; ++j) y[j] = static_cast<float>(a[o + j]) * s * ws[o + j];
      const float n = inv_rms(y.data(), D, eps);
      for (int64_t j = 0; j < D; ++j) y[j] = y[j] * n * mp[o + j];
      for (int64_t j = 0; j < D; ++j) {
        const float rot = y[j < half ? j + half : j - half];
        out[o + j] = y[j] * c[j] + rot * sn[j];
      }
    }
    float* vo = v.data_ptr<float>() + r * KV * D;
    const int64_t ov = NQK * D;
    for (int64_t j = 0; j < KV * D; ++j) vo[j] = static_cast<float>(a[ov + j]) * s * ws[ov + j];
  }
  return {qk, v};
}

// Writes each row's keys and values into its slot and position of one layer's pool tensors
// (slots, kv_heads, tokens, head_dim): one call instead of two index_put_ over permuted views.
void write_kv(at::Tensor kc, at::Tensor vc, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot, const at::Tensor& pos) {
  TORCH_CHECK(kc.is_contiguous() && vc.is_contiguous(), "pool tensors must be contiguous");
  TORCH_CHECK(kc.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat, "float32 only");
  const int64_t R = k.size(0), KV = kc.size(1), T = kc.size(2), D = kc.size(3);
  TORCH_CHECK(k.size(1) == KV && k.size(2) == D && v.size(0) == R, "k/v shape mismatch");
  TORCH_CHECK(slot.numel() == R && pos.numel() == R, "one slot and position per row");
  const int64_t* sp = slot.data_ptr<int64_t>();
  const int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(sp[r] >= 0 && sp[r] < kc.size(0) && pp[r] >= 0 && pp[r] < T, "row out of pool");
    for (int64_t h = 0; h < KV; ++h) {
      const int64_t dst = ((sp[r] * KV + h) * T + pp[r]) * D;
      const float* ks = k.data_ptr<float>() + r * k.stride(0) + h * k.stride(1);
      const float* vs = v.data_ptr<float>() + r * v.stride(0) + h * v.stride(1);
      float* kd = kc.data_ptr<float>() + dst;
      float* vd = vc.data_ptr<float>() + dst;
      for (int64_t j = 0; j < D; ++j) kd[j] = ks[j * k.stride(2)];
      for (int64_t j = 0; j < D; ++j) vd[j] = vs[j * v.stride(2)];
    }
  }
}


#if defined(STREAMFUSE_VNNI) || defined(STREAMFUSE_AVX2_GEMV)
namespace {
// The int8 product's blocking, both forms.
constexpr int64_t kRowBlock = 4;    // weight rows per block
constexpr int64_t kPrefetchBlocks = 2;  // blocks ahead that are prefetched (a prefetch past the
                                        // end of the weight is harmless: it never faults)
}  // namespace
#endif

#ifdef STREAMFUSE_VNNI
namespace {

// Sums the 16 lanes of each of 16 accumulators at once (a transposing tree: ~45 instructions
// instead of 16 separate reductions of ~9), then stores row m's four sums minus `comp`.
inline void reduce_store_4x4(const __m512i (&acc)[4][4], const int32_t* comp, int32_t* out,
                             int64_t ldo) {
  __m512i a[8], b[4];
  for (int i = 0; i < 8; ++i) {  // pairs: per 128-bit lane, two partial sums of each vector
    const __m512i x = acc[i / 2][(i % 2) * 2], y = acc[i / 2][(i % 2) * 2 + 1];
    a[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(x, y), _mm512_unpackhi_epi32(x, y));
  }
  for (int j = 0; j < 4; ++j)  // per 128-bit lane: one partial sum of each of 4 vectors
    b[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                            _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]));
  // Across the four 128-bit lanes: b[j]'s lanes summed into lane j of the result.
  const __m512i c0 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[0], b[1], 0x88),
                                      _mm512_shuffle_i32x4(b[0], b[1], 0xDD));
  const __m512i c1 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2], b[3], 0x88),
                                      _mm512_shuffle_i32x4(b[2], b[3], 0xDD));
  const __m512i d = _mm512_add_epi32(_mm512_shuffle_i32x4(c0, c1, 0x88),
                                     _mm512_shuffle_i32x4(c0, c1, 0xDD));
  const __m512i r = _mm512_sub_epi32(
      d, _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(comp))));
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, r);
  for (int m = 0; m < 4; ++m)
    for (int n = 0; n < 4; ++n) out[m * ldo + n] = lanes[m * 4 + n];
}

// NR weight rows against MR activation rows, all K: AVX-512 VNNI multiplies unsigned by signed
// bytes, so the activations enter shifted by +128 (`xu`) and 128 * (the weight row's sum) comes
// off afterwards (`comp`). Integer sums are exact, so the result equals torch._int_mm's bit
// for bit, whatever the order.
template <int NR, int MR>
inline void dot_block(const int8_t* w, int64_t ldw, const uint8_t* xu, int64_t K,
                      const int32_t* comp, int32_t* out, int64_t ldo) {
  __m512i acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_si512();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    __m512i wv[NR];
    for (int n = 0; n < NR; ++n) {
      const int8_t* ahead = w + (n + kPrefetchBlocks * kRowBlock) * ldw + k;
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
      wv[n] = _mm512_loadu_si512(w + n * ldw + k);
    }
    for (int m = 0; m < MR; ++m) {
      const __m512i xv = _mm512_loadu_si512(xu + m * K + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], xv, wv[n]);
    }
  }
  if (k < K) {  // the last partial 64 bytes: masked-off lanes load as zero on both sides
    const __mmask64 mask = (1ULL << (K - k)) - 1;
    __m512i wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = _mm512_maskz_loadu_epi8(mask, w + n * ldw + k);
    for (int m = 0; m < MR; ++m) {
      const __m512i xv = _mm512_maskz_loadu_epi8(mask, xu + m * K + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbusd_epi32(acc[m][n], xv, wv[n]);
    }
  }
  if constexpr (MR == 4 && NR == 4) {
    reduce_store_4x4(acc, comp, out, ldo);
  } else {
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n) out[m * ldo + n] = _mm512_reduce_add_epi32(acc[m][n]) - comp[n];
  }
}

template <int NR>
inline void dot_rows(const int8_t* w, int64_t ldw, const uint8_t* xu, int64_t M, int64_t K,
                     const int32_t* comp, int32_t* out, int64_t ldo) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) dot_block<NR, 4>(w, ldw, xu + m * K, K, comp, out + m * ldo, ldo);
  switch (M - m) {
    case 3: dot_block<NR, 3>(w, ldw, xu + m * K, K, comp, out + m * ldo, ldo); break;
    case 2: dot_block<NR, 2>(w, ldw, xu + m * K, K, comp, out + m * ldo, ldo); break;
    case 1: dot_block<NR, 1>(w, ldw, xu + m * K, K, comp, out + m * ldo, ldo); break;
    default: break;
  }
}

}  // namespace
#endif

#ifdef STREAMFUSE_AVX2_GEMV
namespace {

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// NR weight rows against MR activation rows, all K, with AVX2 alone: `vpmaddubsw` multiplies
// unsigned by signed bytes and adds pairs into int16 with saturation, so each activation byte
// enters as its magnitude (`xa`, unsigned) and its sign moves onto the weight byte
// (`vpsignb`). With weights in [-127, 127] (what `quant.quantize_rows` makes: a -128 weight
// would flip to -128 instead of +128) a pair is at most 2 x 128 x 127 = 32,512, under int16's
// 32,767: no sum saturates, and the int32 result equals torch._int_mm's bit for bit.
template <int NR, int MR>
inline void dot_block(const int8_t* w, int64_t ldw, const int8_t* xs, const uint8_t* xa,
                      int64_t K, int32_t* out, int64_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_si256();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m256i wv[NR];
    for (int n = 0; n < NR; ++n) {
      const int8_t* ahead = w + (n + kPrefetchBlocks * kRowBlock) * ldw + k;
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
      wv[n] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + n * ldw + k));
    }
    for (int m = 0; m < MR; ++m) {
      const __m256i sv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs + m * K + k));
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xa + m * K + k));
      for (int n = 0; n < NR; ++n) {
        const __m256i pairs = _mm256_maddubs_epi16(av, _mm256_sign_epi8(wv[n], sv));
        acc[m][n] = _mm256_add_epi32(acc[m][n], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int n = 0; n < NR; ++n) {
      int32_t sum = hsum_epi32(acc[m][n]);
      for (int64_t j = k; j < K; ++j)  // the last K % 32 bytes
        sum += static_cast<int32_t>(xs[m * K + j]) * static_cast<int32_t>(w[n * ldw + j]);
      out[m * ldo + n] = sum;
    }
  }
}

// Two activation rows per pass: 8 accumulators, 4 weight vectors and the operands fit AVX2's
// 16 registers (four rows would spill); the weight block stays in L1 between passes.
template <int NR>
inline void dot_rows(const int8_t* w, int64_t ldw, const int8_t* xs, const uint8_t* xa,
                     int64_t M, int64_t K, int32_t* out, int64_t ldo) {
  int64_t m = 0;
  for (; m + 2 <= M; m += 2) dot_block<NR, 2>(w, ldw, xs + m * K, xa + m * K, K, out + m * ldo, ldo);
  if (m < M) dot_block<NR, 1>(w, ldw, xs + m * K, xa + m * K, K, out + m * ldo, ldo);
}

}  // namespace
#endif

// Which compiled int8 product this build has: "avx512_vnni", "avx2", or "" (none: callers
// use torch._int_mm).
std::string int8_gemv_isa() {
#if defined(STREAMFUSE_VNNI)
  return "avx512_vnni";
#elif defined(STREAMFUSE_AVX2_GEMV)
  return "avx2";
#else
  return "";
#endif
}

bool has_int8_gemv() { return !int8_gemv_isa().empty(); }

// Exact int32 products of a few int8 rows x (M, K) with a row-major int8 weight w (N, K):
// (M, N), equal to torch._int_mm(x, w.t()). `comp` is 128 * each weight row's sum (N,).
// Built for decoding (M of 1 to a few): the weight streams from memory once, each block of
// rows meeting every activation row while it is in L1, spread over torch's threads by rows.
// On AVX2-only CPUs it serves prompt chunks too (torch._int_mm has no fast int8 path there).
at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& w, const at::Tensor& comp) {
#if defined(STREAMFUSE_VNNI) || defined(STREAMFUSE_AVX2_GEMV)
  check_rows(x, at::kChar, "x");
  check_rows(w, at::kChar, "w");
  TORCH_CHECK(w.is_contiguous() && comp.is_contiguous(), "w and comp must be contiguous");
  TORCH_CHECK(comp.scalar_type() == at::kInt, "comp must be int32");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && comp.numel() == N, "x (", M, ", ", K, ") w (", N, ", ",
              w.size(1), ") comp ", comp.numel(), ": shapes do not match");
  auto out = at::empty({M, N}, x.options().dtype(at::kInt));
  // The activation rows, packed: +128-shifted (VNNI) or magnitude and sign (AVX2).
  std::vector<uint8_t> xu(M * K);
#ifdef STREAMFUSE_AVX2_GEMV
  std::vector<int8_t> xs(M * K);
#endif
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xr = x.data_ptr<int8_t>() + m * x.stride(0);
    for (int64_t k = 0; k < K; ++k) {
#ifdef STREAMFUSE_VNNI
      xu[m * K + k] = static_cast<uint8_t>(xr[k]) ^ 0x80u;
#else
      xs[m * K + k] = xr[k];
      xu[m * K + k] = static_cast<uint8_t>(xr[k] < 0 ? -static_cast<int32_t>(xr[k]) : xr[k]);
#endif
    }
  }
  const int8_t* wp = w.data_ptr<int8_t>();
  const int32_t* cp = comp.data_ptr<int32_t>();
  int32_t* op = out.data_ptr<int32_t>();
  const int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kRowBlock;
#ifdef STREAMFUSE_VNNI
      switch (std::min<int64_t>(kRowBlock, N - n)) {
        case 4: dot_rows<4>(wp + n * K, K, xu.data(), M, K, cp + n, op + n, N); break;
        case 3: dot_rows<3>(wp + n * K, K, xu.data(), M, K, cp + n, op + n, N); break;
        case 2: dot_rows<2>(wp + n * K, K, xu.data(), M, K, cp + n, op + n, N); break;
        default: dot_rows<1>(wp + n * K, K, xu.data(), M, K, cp + n, op + n, N); break;
      }
#else
      (void)cp;  // the magnitude-and-sign form needs no correction
      switch (std::min<int64_t>(kRowBlock, N - n)) {
        case 4: dot_rows<4>(wp + n * K, K, xs.data(), xu.data(), M, K, op + n, N); break;
        case 3: dot_rows<3>(wp + n * K, K, xs.data(), xu.data(), M, K, op + n, N); break;
        case 2: dot_rows<2>(wp + n * K, K, xs.data(), xu.data(), M, K, op + n, N); break;
        default: dot_rows<1>(wp + n * K, K, xs.data(), xu.data(), M, K, op + n, N); break;
      }
#endif
    }
  });
  return out;
#else
  TORCH_CHECK(false, "int8_gemv needs AVX-512 VNNI or AVX2 (this build has neither); use torch._int_mm");
#endif
}

// Greedy next tokens from the int8 head: per row, the first index maximizing acc * scale
// (the row's activation scale is one positive factor and cannot change the order).
at::Tensor argmax_scaled(const at::Tensor& acc, const at::Tensor& scale) {
  check_rows(acc, at::kInt, "acc");
  const int64_t R = acc.size(0), V = acc.size(1);
  TORCH_CHECK(scale.numel() == V && scale.is_contiguous(), "scale size mismatch");
  auto out = at::empty({R}, acc.options().dtype(at::kLong));
  const float* sc = scale.data_ptr<float>();
  constexpr int64_t L = 16;  // independent lanes: the compiler vectorizes the max pass
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* a = acc.data_ptr<int32_t>() + r * acc.stride(0);
    float lane[L];
    for (int64_t l = 0; l < L; ++l) lane[l] = -INFINITY;
    const int64_t body = V - V % L;
    for (int64_t j = 0; j < body; j += L) {
      for (int64_t l = 0; l < L; ++l) {
        const float x = static_cast<float>(a[j + l]) * sc[j + l];
        lane[l] = x > lane[l] ? x : lane[l];
      }
    }
    float best = -INFINITY;
    for (int64_t l = 0; l < L; ++l) best = lane[l] > best ? lane[l] : best;
    for (int64_t j = body; j < V; ++j) {
      const float x = static_cast<float>(a[j]) * sc[j];
      best = x > best ? x : best;
    }
    int64_t arg = 0;  // the first index reaching the maximum (same product, same rounding)
    for (int64_t j = 0; j < V; ++j) {
      if (static_cast<float>(a[j]) * sc[j] == best) {
        arg = j;
        break;
      }
    }
    out.data_ptr<int64_t>()[r] = arg;
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("write_kv", &write_kv);
  m.def("has_int8_gemv", &has_int8_gemv);
  m.def("int8_gemv_isa", &int8_gemv_isa);
  m.def("int8_gemv", &int8_gemv);
  m.def("argmax_scaled", &argmax_scaled);
  m.def("quantize_rows", &quantize_rows);
  m.def("rms_norm_quantize", &rms_norm_quantize);
  m.def("add_rms_norm_acc", &add_rms_norm_acc);
  m.def("geglu_quantize_acc", &geglu_quantize_acc);
  m.def("qkv_norm_rope_acc", &qkv_norm_rope_acc);
}
