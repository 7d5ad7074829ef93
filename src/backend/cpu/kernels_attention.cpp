// CPU reference: scaled dot-product attention, its log-sum-exp, its FlashAttention-2 style derivatives and
// rotary embedding.
//
//   q [B, Hq, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]; query head h reads kv head h / (Hq / Hkv)
//   s_ij = scale * q_i · k_j + mask_ij   (mask additive, broadcast to [B, Hq, Sq, Skv])
//   causal: key j is visible to query i iff j <= i + (Skv - Sq), so the last query sees the last key
//   attention      o_i = sum_j softmax_j(s_ij) v_j
//   attention_lse  lse_i = log sum_j exp(s_ij)   [B, Hq, Sq]
// A masked score (causal, or an additive -inf) has probability exactly 0. A row with no visible key (causal
// with Sq > Skv, or a mask of -inf everywhere) is defined to give o_i = 0 and lse_i = -inf (the log-sum-exp
// of nothing), and contributes nothing to any derivative, so no NaN appears.
//
// Derivatives from the saved o and lse (q, k, v, o, do, lse [, mask]):
//   P_ij = exp(s_ij - lse_i),  D_i = do_i · o_i,  dS_ij = P_ij (do_i · v_j - D_i)
//   dq_i = scale * sum_j dS_ij k_j;  dk_j = scale * sum_i dS_ij q_i;  dv_j = sum_i P_ij do_i
// dk and dv sum over every query head that shares the kv head (GQA).
//
// rope(x, cos, sin), half-split pairs (d, d + D/2), cos/sin broadcast to [..., S, D/2]:
//   out[d] = x[d] cos - x[d + D/2] sin,  out[d + D/2] = x[d + D/2] cos + x[d] sin
#include <cmath>
#include <limits>
#include <optional>

#include "backend/cpu/kernels.h"

namespace mgn::cpu {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct AttnDims {
  int64_t B, Hq, Hkv, Sq, Skv, D, Dv;
  int64_t q_off(int64_t b, int64_t h, int64_t i) const { return ((b * Hq + h) * Sq + i) * D; }
  int64_t k_off(int64_t b, int64_t h, int64_t j) const { return ((b * Hkv + h) * Skv + j) * D; }
  int64_t v_off(int64_t b, int64_t h, int64_t j) const { return ((b * Hkv + h) * Skv + j) * Dv; }
  int64_t o_off(int64_t b, int64_t h, int64_t i) const { return ((b * Hq + h) * Sq + i) * Dv; }
  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * Hq + h) * Sq + i; }
  int64_t kv_head(int64_t h) const { return h / (Hq / Hkv); }
};

AttnDims dims_of(const Inputs& in) {
  const Shape &q = in[0]->shape, &k = in[1]->shape, &v = in[2]->shape;
  return {q[0], q[1], k[1], q[2], k[2], q[3], v[3]};
}

// The scores of one query row against every key, masked entries -inf.
class Scores {
 public:
  Scores(const ir::Node& n, const Inputs& in, size_t mask_index)
      : q_(in[0]->v), k_(in[1]->v), d_(dims_of(in)), scale_(n.attrs.f("scale")),
        causal_(n.attrs.i("causal") != 0), mask_(in.size() > mask_index ? in[mask_index] : nullptr) {
    if (mask_) mask_index_.emplace(mask_->shape, Shape{d_.B, d_.Hq, d_.Sq, d_.Skv});
  }

  const AttnDims& dims() const { return d_; }
  double scale() const { return scale_; }

  // Fills s[j] for query (b, h, i); returns the row maximum (-inf when every key is masked).
  double row(int64_t b, int64_t h, int64_t i, std::vector<double>& s) const {
    s.assign(size_t(d_.Skv), kNegInf);
    double mx = kNegInf;
    const double* q = q_.data() + d_.q_off(b, h, i);
    for (int64_t j = 0; j < d_.Skv; ++j) {
      if (causal_ && j > i + (d_.Skv - d_.Sq)) continue;
      const double* k = k_.data() + d_.k_off(b, d_.kv_head(h), j);
      double dot = 0;
      for (int64_t d = 0; d < d_.D; ++d) dot += q[d] * k[d];
      double v = scale_ * dot;
      if (mask_) v += mask_->v[size_t((*mask_index_)(d_.row(b, h, i) * d_.Skv + j))];
      s[size_t(j)] = v;
      if (v > mx) mx = v;
    }
    return mx;
  }

 private:
  const std::vector<double>&q_, &k_;
  AttnDims d_;
  double scale_;
  bool causal_;
  const Buffer* mask_;
  std::optional<BroadcastIndex> mask_index_;
};

// Softmax of one row in place (s becomes p) with its log-sum-exp; a row with no visible key becomes all
// zeros with lse -inf.
double softmax_row(std::vector<double>& s, double mx) {
  if (mx == kNegInf) {
    std::fill(s.begin(), s.end(), 0.0);
    return kNegInf;
  }
  double sum = 0;
  for (double& v : s) {
    v = v == kNegInf ? 0.0 : std::exp(v - mx);
    sum += v;
  }
  for (double& v : s) v /= sum;
  return mx + std::log(sum);
}

enum class Grad { Q, K, V };

void attention_grad(const ir::Node& n, const Inputs& in, Buffer& out, Grad which) {
  Scores sc(n, in, 6);
  const AttnDims& d = sc.dims();
  const auto &q = in[0]->v, &k = in[1]->v, &v = in[2]->v, &o = in[3]->v, &dout = in[4]->v, &lse = in[5]->v;
  std::vector<double> s;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h) {
      int64_t hk = d.kv_head(h);
      for (int64_t i = 0; i < d.Sq; ++i) {
        double mx = sc.row(b, h, i, s);
        if (mx == kNegInf) continue;  // no visible key: the row has no derivative
        double l = lse[size_t(d.row(b, h, i))];
        const double* do_i = dout.data() + d.o_off(b, h, i);
        const double* o_i = o.data() + d.o_off(b, h, i);
        double Di = 0;
        for (int64_t e = 0; e < d.Dv; ++e) Di += do_i[e] * o_i[e];
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (s[size_t(j)] == kNegInf) continue;
          double p = std::exp(s[size_t(j)] - l);
          if (which == Grad::V) {
            double* dv = out.v.data() + d.v_off(b, hk, j);
            for (int64_t e = 0; e < d.Dv; ++e) dv[e] += p * do_i[e];
            continue;
          }
          const double* v_j = v.data() + d.v_off(b, hk, j);
          double dp = 0;
          for (int64_t e = 0; e < d.Dv; ++e) dp += do_i[e] * v_j[e];
          double ds = p * (dp - Di) * sc.scale();
          if (which == Grad::Q) {
            double* dq = out.v.data() + d.q_off(b, h, i);
            const double* k_j = k.data() + d.k_off(b, hk, j);
            for (int64_t e = 0; e < d.D; ++e) dq[e] += ds * k_j[e];
          } else {
            double* dk = out.v.data() + d.k_off(b, hk, j);
            const double* q_i = q.data() + d.q_off(b, h, i);
            for (int64_t e = 0; e < d.D; ++e) dk[e] += ds * q_i[e];
          }
        }
      }
    }
}

}  // namespace

void k_Attention(const ir::Node& n, const Inputs& in, Buffer& out) {
  Scores sc(n, in, 3);
  const AttnDims& d = sc.dims();
  const auto& v = in[2]->v;
  std::vector<double> s;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) {
        softmax_row(s, sc.row(b, h, i, s));
        double* o = out.v.data() + d.o_off(b, h, i);
        for (int64_t j = 0; j < d.Skv; ++j) {
          if (s[size_t(j)] == 0.0) continue;
          const double* vj = v.data() + d.v_off(b, d.kv_head(h), j);
          for (int64_t e = 0; e < d.Dv; ++e) o[e] += s[size_t(j)] * vj[e];
        }
      }
}

void k_AttentionLse(const ir::Node& n, const Inputs& in, Buffer& out) {
  Scores sc(n, in, 3);
  const AttnDims& d = sc.dims();
  std::vector<double> s;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t i = 0; i < d.Sq; ++i) out.v[size_t(d.row(b, h, i))] = softmax_row(s, sc.row(b, h, i, s));
}

void k_AttentionGradQ(const ir::Node& n, const Inputs& in, Buffer& out) { attention_grad(n, in, out, Grad::Q); }
void k_AttentionGradK(const ir::Node& n, const Inputs& in, Buffer& out) { attention_grad(n, in, out, Grad::K); }
void k_AttentionGradV(const ir::Node& n, const Inputs& in, Buffer& out) { attention_grad(n, in, out, Grad::V); }

void k_Rope(const ir::Node&, const Inputs& in, Buffer& out) {
  const Shape& xs = in[0]->shape;
  int64_t D = xs.back(), half = D / 2;
  Shape hs = xs;
  hs.back() = half;
  BroadcastIndex ci(in[1]->shape, hs);  // cos and sin share a shape (checked by the shape rule)
  const auto &x = in[0]->v, &cs = in[1]->v, &sn = in[2]->v;
  int64_t rows = numel(xs) / D;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < half; ++d) {
      int64_t t = ci(r * half + d);
      double a = x[size_t(r * D + d)], b = x[size_t(r * D + d + half)];
      out.v[size_t(r * D + d)] = a * cs[size_t(t)] - b * sn[size_t(t)];
      out.v[size_t(r * D + d + half)] = b * cs[size_t(t)] + a * sn[size_t(t)];
    }
}

}  // namespace mgn::cpu
