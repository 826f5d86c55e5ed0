// The pipeline's LLM stage: a Llama-shaped decoder (W4A16 GEMMs, KV cache, greedy decoding) that
// writes a short instruction per request and a retrieval embedding. Weights are seeded random int4
// values with the real layer shapes (no weights can be downloaded here); docs/llm.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpuopt/core/status.hpp"
#include "gpuopt/runtime/stream.hpp"

namespace gpuopt::pipeline {

struct LlmConfig {  // Llama-shaped decoder, seeded random int4 weights (W4A16, group 128)
  std::string name = "llama-3.2-1b-shaped";
  int hidden = 2048, layers = 16, heads = 32, kv_heads = 8, head_dim = 64, ffn = 8192;
  int vocab = 128256;    // multiple of 64 (W4A16 rule)
  int max_batch = 16;    // requests decoded together
  int max_context = 64;  // prompt + generated tokens per request
  int embed_dim =
      128;  // retrieval embedding (mean-pooled last hidden state, projected, L2-normalised)
  std::uint64_t seed = 2026;
  // Added beyond the agreed API (defaults are Llama 3's).
  double rope_theta = 500000.0;
  float rms_eps = 1e-5f;
};

LlmConfig llama_1b_shaped();  // the default above
// Llama 3.1 8B's shapes: hidden 4096, 32 layers, 32 query / 8 KV heads of 128, FFN 14336.
LlmConfig llama_8b_shaped();
LlmConfig tiny_llm();  // small config for tests (hidden 128, 2 layers, vocab 512, ...)

// Why a config cannot run (names the field), or OK: every GEMM's K a multiple of 128 (the group)
// and N of 64, heads a multiple of kv_heads, head_dim even, sizes positive.
Status check_llm_config(const LlmConfig& config);

double llm_weight_bytes(const LlmConfig&);  // int4 + scales of every W4A16 matrix, for docs/output
double llm_embedding_table_bytes(const LlmConfig&);  // fp16 token embeddings [vocab][hidden]
double llm_kv_cache_bytes(const LlmConfig&);  // fp16 K and V of max_batch x max_context tokens
// FLOPs of one decode step for `batch` requests that attend over `context` cached positions:
// 2·batch·Σ(K·N) over the W4A16 matrices (lm_head included) +
// 4·batch·layers·heads·head_dim·context.
double llm_decode_step_flops(const LlmConfig&, int batch, int context);

// Optional extra outputs of generate(), for tests and inspection. All device pointers or null.
struct LlmDebugOutputs {
  // float32 [batch][new_tokens][vocab]: the logits whose argmax became each generated token.
  float* d_logits = nullptr;
  // fp16 bits [2 (K, V)][layers][batch][kv_heads][positions][head_dim] with positions =
  // prompt_len + new_tokens - 1 (every position a forward wrote): the KV cache after generate,
  // gathered from its blocks. K is stored after RoPE.
  std::uint16_t* d_kv_cache = nullptr;
};

// How the decoder runs its step; the defaults are the fast path. Results are bitwise the same
// under every choice here (the GPU tests compare them), except that a different SM count or
// cluster_reduction can change the GEMMs' k-splits.
struct LlmDecoderOptions {
  // Each decode step as one CUDA graph per batch size (captured on first use, then replayed);
  // false: the same kernels launched one by one.
  bool cuda_graphs = true;
  // On sm_90: each kernel launched as a programmatic dependent of the previous one, so a GEMM's
  // weight loads start while the kernel before it finishes. Ignored before sm_90.
  bool programmatic_launch = true;
  // Tokens per block of the paged KV cache (a power of two, 1..max_context); 0 = one block per
  // request (a contiguous cache).
  int kv_block_tokens = 16;
  // SMs the decode GEMMs' k-splits are planned for (0: the device's). The splits, and so the bits
  // of every result, follow this count; a given count gives the same bits on any device (with
  // cluster_reduction, on any device that holds the same clusters at once).
  int sm_count = 0;
  // Prompts of more than one token run as one forward over all their tokens (prefill: each
  // layer's GEMMs at M = batch x prompt tokens, a causal attention that writes the prompt's K and
  // V into the cache, lm_head on each request's last prompt token), then token-by-token decoding;
  // false: every prompt token is a decode step of its own. Each request's bits stay independent of
  // the batch either way, but prefill and token-by-token results differ in fp16 rounding
  // (docs/llm.md, "Prefill").
  bool prefill = true;
  // Prefill of prompts over 16 tokens: rows per W4A16 GEMM launch (a multiple of 16, >= 16). The
  // GEMMs' workspace grows with it (deterministic k-split partials, splits x rows x N x 4 bytes).
  int prefill_gemm_rows = 256;
  // On sm_90: the k-splits of each decode GEMM strip are one thread block cluster and add their
  // sums through distributed shared memory, instead of through global memory with a fence and a
  // counter (at most 8 splits, as many clusters as are resident at once, so the split counts, and
  // the bits, can differ from the global fix-up's). Ignored before sm_90.
  bool cluster_reduction = true;
};

// What create() chose, for logs and tests.
struct LlmDecoderInfo {
  bool cuda_graphs = false;
  bool programmatic_launch = false;
  bool cluster_reduction = false;
  // The decode attention copies the earlier positions' K and V rows into shared memory (a
  // context of max_context positions fits in 64 KB); false: it reads them from the cache.
  bool attention_staged = false;
  int kv_block_tokens = 0;  // resolved: max_context when the cache is contiguous
  int sm_count = 0;         // the SMs the GEMMs were planned for
  bool prefill = false;
  int prefill_gemm_rows = 0;
  // Device memory the decoder allocated (weights, tables, KV cache, buffers); the prefill GEMMs'
  // workspace is added when a row count first needs it.
  double workspace_bytes = 0;
  // The decode GEMMs' k-splits of the first layer and lm_head, "qkv 4c, o 4c, gate/up 3c, down 8c,
  // lm_head 1" (c: the splits reduce in a thread block cluster).
  std::string gemm_splits;
  std::string describe() const;
};

class LlmDecoder {  // one instance per stream that uses it; not thread-safe
 public:
  // UNIMPLEMENTED without CUDA; UNAVAILABLE without a device. Weights generated on the device.
  static StatusOr<std::unique_ptr<LlmDecoder>> create(const LlmConfig& config);
  static StatusOr<std::unique_ptr<LlmDecoder>> create(const LlmConfig& config,
                                                      const LlmDecoderOptions& options);
  virtual ~LlmDecoder() = default;
  virtual const LlmConfig& config() const = 0;
  virtual const LlmDecoderInfo& info() const = 0;
  // Greedy decoding for `batch` (1..max_batch) requests enqueued on `stream`, no host sync inside:
  // d_prompts: device int32 [batch][prompt_len]; writes d_tokens: device int32 [batch][new_tokens]
  // and d_embeddings: device float32 [batch][embed_dim]. prompt_len + new_tokens <= max_context.
  // Every request's tokens and embedding are bitwise independent of `batch` and of the other
  // requests in it (so batched and one-at-a-time decoding give identical outputs).
  virtual Status generate(const std::int32_t* d_prompts, int batch, int prompt_len, int new_tokens,
                          std::int32_t* d_tokens, float* d_embeddings,
                          runtime::StreamHandle stream) = 0;
  // The same, also filling the debug outputs that are not null.
  virtual Status generate(const std::int32_t* d_prompts, int batch, int prompt_len, int new_tokens,
                          std::int32_t* d_tokens, float* d_embeddings, const LlmDebugOutputs& debug,
                          runtime::StreamHandle stream) = 0;
  // Enqueues exactly one decode step (every layer, lm_head, argmax) for `batch` requests at
  // position `position` (< max_context) on the current cache contents, for timing a step alone
  // (a one-thread kernel that sets the position, then the step's graph).
  virtual Status decode_step(int batch, int position, runtime::StreamHandle stream) = 0;
};

// ---- CPU twin (float32, W4A16's CPU reference on the same seeded weights) ----

// Pieces, exposed for hand-computed fixtures.
// x [n] -> x / sqrt(mean(x^2) + eps) (norm weights are all ones: docs/llm.md).
std::vector<float> llm_rms_norm_reference(const std::vector<float>& x, float eps);
// RoPE (rotate-half pairing (i, i + head_dim/2)) applied in place to one head's vector [head_dim].
void llm_rope_reference(float* head, int head_dim, int position, double theta);
// cos/sin table [max_context][head_dim/2] used by both the kernel and the twin (double maths,
// stored as float) so the two rotate by exactly the same values.
void llm_rope_table(int max_context, int head_dim, double theta, std::vector<float>& cos_table,
                    std::vector<float>& sin_table);
// softmax(q·k_t / sqrt(head_dim)) · v over t < positions, fp32. keys/values [positions][head_dim].
std::vector<float> llm_attention_reference(const float* q, const float* keys, const float* values,
                                           int positions, int head_dim);

struct LlmReferenceResult {
  std::vector<std::int32_t> tokens;  // [batch][new_tokens]: the twin's own argmax
  std::vector<float> logits;         // [batch][new_tokens][vocab]
  std::vector<float> top2_margin;    // [batch][new_tokens]: logit(top1) - logit(top2)
  std::vector<float> embeddings;     // [batch][embed_dim]
  // [2 (K, V)][layers][batch][kv_heads][positions][head_dim], positions = prompt_len +
  // new_tokens - 1: the cache the forward wrote (K after RoPE), as LlmDebugOutputs::d_kv_cache.
  std::vector<float> kv_cache;
};

// The same forward as LlmDecoder on the host. `forced_tokens` (null, or [batch][new_tokens]): the
// tokens fed back after each step instead of the twin's own argmax, so a test can follow the GPU's
// choices past a near-tie and keep comparing position by position.
StatusOr<LlmReferenceResult> llm_generate_reference(const LlmConfig& config,
                                                    const std::vector<std::int32_t>& prompts,
                                                    int batch, int prompt_len, int new_tokens,
                                                    const std::vector<std::int32_t>* forced_tokens);

}  // namespace gpuopt::pipeline
