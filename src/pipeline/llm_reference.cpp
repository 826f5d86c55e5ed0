// LLM stage CPU twin: the decoder's forward in float32 on the same seeded weights (regenerated
// with the shared hash), W4A16's CPU reference for every matrix. The GPU tests' oracle.
#include <algorithm>
#include <cmath>
#include <string>

#include "gpuopt/kernels/quant_formats.hpp"
#include "gpuopt/kernels/w4a16.hpp"
#include "gpuopt/pipeline/llm.hpp"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {
namespace {

kernels::W4A16Weights make_host_matrix(std::uint64_t seed, std::uint32_t id, int k, int n) {
  kernels::W4A16Weights w;
  w.k = k;
  w.n = n;
  w.group_size = kLlmGroupSize;
  w.type = kernels::ActivationType::kFloat16;
  w.has_zeros = false;
  w.tiles.resize(static_cast<std::size_t>(k) * n / 8);
  for (std::size_t i = 0; i < w.tiles.size(); ++i) w.tiles[i] = llm_tile_word(seed, id, i);
  const int exponent = llm_scale_exponent(k);
  w.scales.resize(static_cast<std::size_t>(k / kLlmGroupSize) * n);
  for (std::size_t i = 0; i < w.scales.size(); ++i) {
    w.scales[i] = llm_scale_bits(seed, id, i, exponent);
  }
  return w;
}

// The GPU feeds every GEMM fp16 activations; the twin rounds at the same points.
std::vector<std::uint16_t> to_fp16(const std::vector<float>& x) {
  std::vector<std::uint16_t> bits(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = kernels::float_to_fp16_bits(x[i]);
  return bits;
}

std::vector<float> gemm(const kernels::W4A16Weights& w, const std::vector<float>& x, int m) {
  const std::vector<std::uint16_t> bits = to_fp16(x);
  return kernels::w4a16_reference(w, bits.data(), m);
}

struct HostLayer {
  kernels::W4A16Weights qkv, o, gate_up, down;
};

}  // namespace

std::vector<float> llm_rms_norm_reference(const std::vector<float>& x, float eps) {
  double sum = 0;
  for (float v : x) sum += static_cast<double>(v) * v;
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum / x.size()) + eps);
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv;
  return y;
}

void llm_rope_table(int max_context, int head_dim, double theta, std::vector<float>& cos_table,
                    std::vector<float>& sin_table) {
  const int half = head_dim / 2;
  cos_table.assign(static_cast<std::size_t>(max_context) * half, 0.0f);
  sin_table.assign(cos_table.size(), 0.0f);
  for (int p = 0; p < max_context; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * std::pow(theta, -2.0 * i / head_dim);
      cos_table[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_table[static_cast<std::size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

void llm_rope_reference(float* head, int head_dim, int position, double theta) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = position * std::pow(theta, -2.0 * i / head_dim);
    const float c = static_cast<float>(std::cos(angle));
    const float s = static_cast<float>(std::sin(angle));
    const float a = head[i];
    const float b = head[i + half];
    head[i] = a * c - b * s;
    head[i + half] = b * c + a * s;
  }
}

std::vector<float> llm_attention_reference(const float* q, const float* keys, const float* values,
                                           int positions, int head_dim) {
  std::vector<float> scores(positions);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  float max_score = -INFINITY;
  for (int t = 0; t < positions; ++t) {
    float dot = 0;
    for (int i = 0; i < head_dim; ++i)
      dot += q[i] * keys[static_cast<std::size_t>(t) * head_dim + i];
    scores[t] = dot * scale;
    max_score = std::max(max_score, scores[t]);
  }
  float total = 0;
  for (float& s : scores) {
    s = std::exp(s - max_score);
    total += s;
  }
  std::vector<float> out(head_dim, 0.0f);
  for (int t = 0; t < positions; ++t) {
    const float weight = scores[t] / total;
    for (int i = 0; i < head_dim; ++i) {
      out[i] += weight * values[static_cast<std::size_t>(t) * head_dim + i];
    }
  }
  return out;
}

StatusOr<LlmReferenceResult> llm_generate_reference(
    const LlmConfig& c, const std::vector<std::int32_t>& prompts, int batch, int prompt_len,
    int new_tokens, const std::vector<std::int32_t>* forced_tokens) {
  GPUOPT_RETURN_IF_ERROR(check_llm_config(c));
  if (batch < 1 || prompt_len < 1 || new_tokens < 1 || prompt_len + new_tokens > c.max_context) {
    return invalid_argument(
        "llm_generate_reference: need batch >= 1, prompt_len >= 1, "
        "new_tokens >= 1 and prompt_len + new_tokens <= max_context");
  }
  if (prompts.size() != static_cast<std::size_t>(batch) * prompt_len) {
    return invalid_argument("llm_generate_reference: prompts must hold batch x prompt_len tokens");
  }
  for (std::int32_t t : prompts) {
    if (t < 0 || t >= c.vocab) {
      return invalid_argument("llm_generate_reference: prompt token " + std::to_string(t) +
                              " outside [0, vocab)");
    }
  }
  if (forced_tokens != nullptr &&
      forced_tokens->size() != static_cast<std::size_t>(batch) * new_tokens) {
    return invalid_argument("llm_generate_reference: forced_tokens must hold batch x new_tokens");
  }

  const int h = c.hidden, d = c.head_dim, nh = c.heads, nkv = c.kv_heads, f = c.ffn;
  const int qkv_n = (nh + 2 * nkv) * d;
  std::vector<HostLayer> layers(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    layers[l].qkv = make_host_matrix(c.seed, llm_matrix_id(l, LlmMatrixKind::kQkv), h, qkv_n);
    layers[l].o = make_host_matrix(c.seed, llm_matrix_id(l, LlmMatrixKind::kO), nh * d, h);
    layers[l].gate_up =
        make_host_matrix(c.seed, llm_matrix_id(l, LlmMatrixKind::kGateUp), h, 2 * f);
    layers[l].down = make_host_matrix(c.seed, llm_matrix_id(l, LlmMatrixKind::kDown), f, h);
  }
  const kernels::W4A16Weights lm_head = make_host_matrix(c.seed, kLlmLmHeadId, h, c.vocab);
  std::vector<float> rope_cos, rope_sin;
  llm_rope_table(c.max_context, d, c.rope_theta, rope_cos, rope_sin);

  // [layer][batch][kv_head][position][head_dim]
  const std::size_t cache_layer = static_cast<std::size_t>(batch) * nkv * c.max_context * d;
  std::vector<float> k_cache(cache_layer * c.layers), v_cache(cache_layer * c.layers);
  auto cache_at = [&](std::vector<float>& cache, int l, int b, int kvh, int p) {
    return &cache[l * cache_layer +
                  ((static_cast<std::size_t>(b) * nkv + kvh) * c.max_context + p) * d];
  };

  LlmReferenceResult result;
  result.tokens.assign(static_cast<std::size_t>(batch) * new_tokens, 0);
  result.logits.assign(static_cast<std::size_t>(batch) * new_tokens * c.vocab, 0.0f);
  result.top2_margin.assign(static_cast<std::size_t>(batch) * new_tokens, 0.0f);
  std::vector<float> pooled(static_cast<std::size_t>(batch) * h, 0.0f);
  std::vector<std::int32_t> fed(static_cast<std::size_t>(batch) * new_tokens, 0);

  const int steps = prompt_len + new_tokens - 1;
  std::vector<float> x(static_cast<std::size_t>(batch) * h);
  auto norm_rows = [&](const std::vector<float>& in) {
    std::vector<float> out(in.size());
    for (int b = 0; b < batch; ++b) {
      std::vector<float> row(in.begin() + static_cast<std::ptrdiff_t>(b) * h,
                             in.begin() + static_cast<std::ptrdiff_t>(b + 1) * h);
      row = llm_rms_norm_reference(row, c.rms_eps);
      std::copy(row.begin(), row.end(), out.begin() + static_cast<std::ptrdiff_t>(b) * h);
    }
    return out;
  };
  for (int s = 0; s < steps; ++s) {
    for (int b = 0; b < batch; ++b) {
      const std::int32_t token =
          s < prompt_len ? prompts[static_cast<std::size_t>(b) * prompt_len + s]
                         : fed[static_cast<std::size_t>(b) * new_tokens + (s - prompt_len)];
      for (int i = 0; i < h; ++i) {
        x[static_cast<std::size_t>(b) * h + i] =
            llm_token_embedding(c.seed, static_cast<std::uint64_t>(token) * h + i);
      }
    }
    for (int l = 0; l < c.layers; ++l) {
      std::vector<float> qkv = gemm(layers[l].qkv, norm_rows(x), batch);
      std::vector<float> attn(static_cast<std::size_t>(batch) * nh * d);
      const int half = d / 2;
      for (int b = 0; b < batch; ++b) {
        float* row = &qkv[static_cast<std::size_t>(b) * qkv_n];
        for (int head = 0; head < nh + nkv; ++head) {  // q heads then k heads are rotated
          float* v = row + static_cast<std::size_t>(head) * d;
          for (int i = 0; i < half; ++i) {
            const float cs = rope_cos[static_cast<std::size_t>(s) * half + i];
            const float sn = rope_sin[static_cast<std::size_t>(s) * half + i];
            const float a = v[i], bb = v[i + half];
            v[i] = a * cs - bb * sn;
            v[i + half] = bb * cs + a * sn;
          }
        }
        for (int kvh = 0; kvh < nkv; ++kvh) {
          std::copy_n(row + static_cast<std::size_t>(nh + kvh) * d, d,
                      cache_at(k_cache, l, b, kvh, s));
          std::copy_n(row + static_cast<std::size_t>(nh + nkv + kvh) * d, d,
                      cache_at(v_cache, l, b, kvh, s));
        }
        for (int head = 0; head < nh; ++head) {
          const int kvh = head / (nh / nkv);
          const std::vector<float> out = llm_attention_reference(
              row + static_cast<std::size_t>(head) * d, cache_at(k_cache, l, b, kvh, 0),
              cache_at(v_cache, l, b, kvh, 0), s + 1, d);
          std::copy(out.begin(), out.end(),
                    attn.begin() + (static_cast<std::ptrdiff_t>(b) * nh + head) * d);
        }
      }
      const std::vector<float> o = gemm(layers[l].o, attn, batch);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += o[i];
      const std::vector<float> gu = gemm(layers[l].gate_up, norm_rows(x), batch);
      std::vector<float> act(static_cast<std::size_t>(batch) * f);
      for (int b = 0; b < batch; ++b) {
        for (int i = 0; i < f; ++i) {
          const float g = gu[static_cast<std::size_t>(b) * 2 * f + i];
          const float u = gu[static_cast<std::size_t>(b) * 2 * f + f + i];
          act[static_cast<std::size_t>(b) * f + i] = g / (1.0f + std::exp(-g)) * u;
        }
      }
      const std::vector<float> down = gemm(layers[l].down, act, batch);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += down[i];
    }
    const std::vector<float> final_hidden = norm_rows(x);
    for (std::size_t i = 0; i < pooled.size(); ++i) pooled[i] += final_hidden[i];
    if (s < prompt_len - 1) continue;
    const int j = s - (prompt_len - 1);  // index of the token this step generates
    const std::vector<float> logits = gemm(lm_head, final_hidden, batch);
    for (int b = 0; b < batch; ++b) {
      const float* row = &logits[static_cast<std::size_t>(b) * c.vocab];
      int best = 0;
      for (int v = 1; v < c.vocab; ++v) {
        if (row[v] > row[best]) best = v;  // strict: the lowest index wins ties
      }
      float second = -INFINITY;
      for (int v = 0; v < c.vocab; ++v) {
        if (v != best) second = std::max(second, row[v]);
      }
      const std::size_t out = static_cast<std::size_t>(b) * new_tokens + j;
      result.tokens[out] = best;
      result.top2_margin[out] = row[best] - second;
      fed[out] = forced_tokens != nullptr ? (*forced_tokens)[out] : best;
      std::copy_n(row, c.vocab, result.logits.begin() + static_cast<std::ptrdiff_t>(out) * c.vocab);
    }
  }

  // The cache of the positions the forward wrote, [2][layer][batch][kv_head][steps][head_dim].
  const std::size_t per_layer = static_cast<std::size_t>(batch) * nkv * steps * d;
  result.kv_cache.assign(2 * per_layer * c.layers, 0.0f);
  for (int which = 0; which < 2; ++which) {
    std::vector<float>& cache = which == 0 ? k_cache : v_cache;
    for (int l = 0; l < c.layers; ++l) {
      for (int b = 0; b < batch; ++b) {
        for (int kvh = 0; kvh < nkv; ++kvh) {
          const std::size_t out = (static_cast<std::size_t>(which) * c.layers + l) * per_layer +
                                  ((static_cast<std::size_t>(b) * nkv + kvh) * steps) * d;
          std::copy_n(cache_at(cache, l, b, kvh, 0), static_cast<std::size_t>(steps) * d,
                      result.kv_cache.begin() + static_cast<std::ptrdiff_t>(out));
        }
      }
    }
  }

  const float projection_scale = llm_projection_scale(h);
  result.embeddings.assign(static_cast<std::size_t>(batch) * c.embed_dim, 0.0f);
  for (int b = 0; b < batch; ++b) {
    float* e = &result.embeddings[static_cast<std::size_t>(b) * c.embed_dim];
    for (int i = 0; i < h; ++i) {
      const float mean = pooled[static_cast<std::size_t>(b) * h + i] / static_cast<float>(steps);
      for (int k = 0; k < c.embed_dim; ++k) {
        e[k] += mean * llm_projection(c.seed, static_cast<std::uint64_t>(i) * c.embed_dim + k,
                                      projection_scale);
      }
    }
    double norm = 0;
    for (int k = 0; k < c.embed_dim; ++k) norm += static_cast<double>(e[k]) * e[k];
    const float inv = static_cast<float>(1.0 / std::sqrt(std::max(norm, 1e-30)));
    for (int k = 0; k < c.embed_dim; ++k) e[k] *= inv;
  }
  return result;
}

}  // namespace gpuopt::pipeline
