// LLM stage: the two configs, their validation and the byte/FLOP arithmetic quoted in docs/llm.md.
#include <cmath>
#include <string>

#include "gpuopt/pipeline/llm.hpp"
#include "pipeline/llm_weights.hpp"

namespace gpuopt::pipeline {

LlmConfig llama_1b_shaped() { return LlmConfig{}; }

LlmConfig llama_8b_shaped() {
  LlmConfig config;
  config.name = "llama-3.1-8b-shaped";
  config.hidden = 4096;
  config.layers = 32;
  config.heads = 32;
  config.kv_heads = 8;
  config.head_dim = 128;
  config.ffn = 14336;
  return config;
}

LlmConfig tiny_llm() {
  LlmConfig config;
  config.name = "tiny-llm";
  config.hidden = 128;
  config.layers = 2;
  config.heads = 4;
  config.kv_heads = 2;
  config.head_dim = 32;
  config.ffn = 256;
  config.vocab = 512;
  config.max_batch = 8;
  config.max_context = 32;
  config.embed_dim = 32;
  config.seed = 7;
  return config;
}

Status check_llm_config(const LlmConfig& c) {
  auto bad = [&](const std::string& what) {
    return invalid_argument("LLM config '" + c.name + "': " + what);
  };
  if (c.hidden <= 0 || c.layers <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 ||
      c.ffn <= 0 || c.vocab <= 0 || c.max_batch <= 0 || c.max_context <= 0 || c.embed_dim <= 0) {
    return bad("every size must be positive");
  }
  if (c.heads % c.kv_heads != 0) {
    return bad("heads=" + std::to_string(c.heads) +
               " is not a multiple of kv_heads=" + std::to_string(c.kv_heads));
  }
  if (c.head_dim % 2 != 0) return bad("head_dim=" + std::to_string(c.head_dim) + " is odd (RoPE)");
  if (c.head_dim > 256) return bad("head_dim=" + std::to_string(c.head_dim) + " > 256");
  if (c.max_context > 4096)
    return bad("max_context > 4096 (attention scores live in shared memory)");
  for (const LlmMatrixShape& m : llm_matrix_shapes(c)) {
    if (m.k % kLlmGroupSize != 0) {
      return bad(std::string(m.name) + ": K=" + std::to_string(m.k) + " is not a multiple of " +
                 std::to_string(kLlmGroupSize) + " (the int4 group)");
    }
    if (m.n % 64 != 0) {
      return bad(std::string(m.name) + ": N=" + std::to_string(m.n) + " is not a multiple of 64");
    }
  }
  if (c.ffn % 64 != 0) {  // gate and up strips are paired in the decode GEMM
    return bad("ffn=" + std::to_string(c.ffn) + " is not a multiple of 64");
  }
  if (!(c.rms_eps > 0.0f)) return bad("rms_eps must be positive");
  if (!(c.rope_theta > 1.0)) return bad("rope_theta must be > 1");
  return ok_status();
}

std::vector<LlmMatrixShape> llm_matrix_shapes(const LlmConfig& c) {
  const int qkv = (c.heads + 2 * c.kv_heads) * c.head_dim;
  return {{"qkv_proj", c.hidden, qkv, c.layers},
          {"o_proj", c.heads * c.head_dim, c.hidden, c.layers},
          {"gate_up_proj", c.hidden, 2 * c.ffn, c.layers},
          {"down_proj", c.ffn, c.hidden, c.layers},
          {"lm_head", c.hidden, c.vocab, 1}};
}

double llm_weight_bytes(const LlmConfig& c) {
  double bytes = 0;
  for (const LlmMatrixShape& m : llm_matrix_shapes(c)) {
    const double kn = static_cast<double>(m.k) * m.n;
    bytes += m.count * (kn / 2.0 + kn / kLlmGroupSize * 2.0);  // nibbles + fp16 scale per group
  }
  return bytes;
}

double llm_embedding_table_bytes(const LlmConfig& c) {
  return static_cast<double>(c.vocab) * c.hidden * 2.0;
}

double llm_kv_cache_bytes(const LlmConfig& c) {
  return 2.0 * c.layers * c.max_batch * c.kv_heads * static_cast<double>(c.max_context) *
         c.head_dim * 2.0;
}

double llm_decode_step_flops(const LlmConfig& c, int batch, int context) {
  double kn = 0;
  for (const LlmMatrixShape& m : llm_matrix_shapes(c)) {
    kn += static_cast<double>(m.count) * m.k * m.n;
  }
  const double attention = 4.0 * c.layers * c.heads * c.head_dim * static_cast<double>(context);
  return batch * (2.0 * kn + attention);
}

int llm_scale_exponent(int k) {
  return static_cast<int>(std::lround(std::log2(1.0 / (47.5 * std::sqrt(17.5 * k)))));
}

std::string LlmDecoderInfo::describe() const {
  return std::string("graphs ") + (cuda_graphs ? "on" : "off") + ", programmatic launch " +
         (programmatic_launch ? "on" : "off") + ", cluster reduction " +
         (cluster_reduction ? "on" : "off") + ", attention K/V " +
         (attention_staged ? "staged" : "from the cache") + ", KV block " +
         std::to_string(kv_block_tokens) + " tokens, GEMMs planned for " +
         std::to_string(sm_count) + " SMs, prefill " +
         (prefill ? "on (W4A16 GEMM slices of " + std::to_string(prefill_gemm_rows) + " rows)"
                  : std::string("off")) +
         ", workspace " + std::to_string(static_cast<long long>(workspace_bytes)) + " bytes" +
         (gemm_splits.empty() ? std::string() : ", k-splits " + gemm_splits);
}

float llm_projection_scale(int hidden) { return static_cast<float>(std::sqrt(3.0 / hidden)); }

}  // namespace gpuopt::pipeline
