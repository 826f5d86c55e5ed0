// The pipeline's case engine: LLM instruction + embedding for frames with detections, retrieval of
// past cases from the seeded archive, and each new case added to the case store on the device.
#include "pipeline_workers.hpp"

#if GPUOPT_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <numeric>

#include "gpuopt/core/cuda_check.hpp"

namespace gpuopt::pipeline::runner {

CaseEngine::~CaseEngine() {
  if (pinned_) {
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_prompts_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_tokens_));
    GPUOPT_CUDA_TRY_NO_THROW(cudaFreeHost(h_embeddings_));
  } else {
    delete[] h_prompts_;
    delete[] h_tokens_;
    delete[] h_embeddings_;
  }
}

Status CaseEngine::create(const runtime::Device& device, const PipelineOptions& options,
                          int priority, bool pinned) {
  options_ = options;
  pinned_ = pinned;
  LlmConfig config = options.llm_model == "tiny" ? tiny_llm() : llama_1b_shaped();
  // The same config (and so the same kernels) in both modes; the baseline decodes batch 1.
  config.max_batch = options.llm_max_batch;
  config.seed = options.seed;
  GPUOPT_ASSIGN_OR_RETURN(llm_, LlmDecoder::create(config));
  embed_dim_ = config.embed_dim;
  vocab_ = config.vocab;
  GPUOPT_ASSIGN_OR_RETURN(stream_, runtime::Stream::create(device, priority));
  for (auto& event : events_) {
    GPUOPT_ASSIGN_OR_RETURN(event, runtime::Event::create(true));
  }
  const std::size_t batch = static_cast<std::size_t>(config.max_batch);
  const std::size_t prompt_words = batch * kPromptTokens;
  const std::size_t token_words = batch * static_cast<std::size_t>(options.new_tokens);
  const std::size_t embed_words = batch * static_cast<std::size_t>(embed_dim_);
  GPUOPT_ASSIGN_OR_RETURN(d_prompts_, runtime::DeviceBuffer::allocate(prompt_words * 4));
  GPUOPT_ASSIGN_OR_RETURN(d_tokens_, runtime::DeviceBuffer::allocate(token_words * 4));
  GPUOPT_ASSIGN_OR_RETURN(d_embeddings_, runtime::DeviceBuffer::allocate(embed_words * 4));
  if (pinned) {
    GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_prompts_), prompt_words * 4, 0));
    GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_tokens_), token_words * 4, 0));
    GPUOPT_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&h_embeddings_), embed_words * 4, 0));
  } else {
    h_prompts_ = new std::int32_t[prompt_words];
    h_tokens_ = new std::int32_t[token_words];
    h_embeddings_ = new float[embed_words];
  }
  // The archive of past cases, seeded identically in both modes.
  const auto dim = static_cast<std::size_t>(embed_dim_);
  GPUOPT_ASSIGN_OR_RETURN(
      archive_, vector::GpuDataset::create(dim, vector::Metric::kL2, options.archive_cases));
  std::vector<float> past = seeded_past_cases(options.archive_cases, embed_dim_, options.seed);
  // Past case i has id i.
  std::vector<std::uint64_t> case_ids(options.archive_cases);
  std::iota(case_ids.begin(), case_ids.end(), std::uint64_t{0});
  GPUOPT_RETURN_IF_ERROR(
      archive_->append_host(past.data(), options.archive_cases, stream_.handle(), case_ids));
  GPUOPT_ASSIGN_OR_RETURN(cases_, vector::GpuDataset::create(dim, vector::Metric::kL2, 4096));
  // Warm-up: first decodes and the first search initialise kernels and cuBLAS, in both modes.
  std::vector<LlmRequest> warm(batch);
  for (auto& request : warm) request.prompt.fill(1);
  GPUOPT_RETURN_IF_ERROR(decode(warm.data(), 1));
  if (batch > 1) GPUOPT_RETURN_IF_ERROR(decode(warm.data(), static_cast<int>(batch)));
  GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
  vector::GpuSearchOptions search;
  search.k = static_cast<std::size_t>(options.retrieve_k);
  GPUOPT_RETURN_IF_ERROR(archive_->search(past.data(), 1, search, stream_.handle()).status());
  return ok_status();
}

// The seed users' path: one request decoded alone, its embedding brought to the host and
// serialised to JSON for the store, parsed there, added and queried through the host entry
// points.
Status CaseEngine::run_one_through_json(const LlmRequest& request, CaseOutcome& out,
                                        StageLog& log) {
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  GPUOPT_RETURN_IF_ERROR(events_[0].record(stream_));
  GPUOPT_RETURN_IF_ERROR(decode(&request, 1));
  GPUOPT_RETURN_IF_ERROR(events_[1].record(stream_));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_tokens_, d_tokens_.data(), options_.new_tokens * 4,
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_embeddings_, d_embeddings_.data(), embed_dim_ * 4,
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_RETURN_IF_ERROR(stream_.synchronize());
  const std::string text = embedding_to_json_text({h_embeddings_, std::size_t(embed_dim_)});
  GPUOPT_ASSIGN_OR_RETURN(std::vector<float> embedding, embedding_from_json_text(text));
  GPUOPT_RETURN_IF_ERROR(events_[2].record(stream_));
  vector::GpuSearchOptions search;
  search.k = static_cast<std::size_t>(options_.retrieve_k);
  GPUOPT_ASSIGN_OR_RETURN(auto hits,
                          archive_->search(embedding.data(), 1, search, stream_.handle()));
  GPUOPT_RETURN_IF_ERROR(events_[3].record(stream_));
  GPUOPT_RETURN_IF_ERROR(cases_->append_host(embedding.data(), 1, stream_.handle()));
  GPUOPT_RETURN_IF_ERROR(events_[4].record(stream_));
  GPUOPT_RETURN_IF_ERROR(events_[4].synchronize());
  out.tokens.assign(h_tokens_, h_tokens_ + options_.new_tokens);
  out.retrieved = std::move(hits.ids);
  out.distances = std::move(hits.distances);
  return log_times(log, 1);
}

// gpuopt's path: the waiting requests decoded together on this engine's stream, the embeddings
// appended to the case store device-to-device, the queries searched as one batch.
Status CaseEngine::run_batch(const std::vector<LlmRequest>& requests, std::vector<CaseOutcome>& out,
                             StageLog& log) {
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  const int batch = static_cast<int>(requests.size());
  GPUOPT_RETURN_IF_ERROR(events_[0].record(stream_));
  GPUOPT_RETURN_IF_ERROR(decode(requests.data(), batch));
  GPUOPT_RETURN_IF_ERROR(events_[1].record(stream_));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_tokens_, d_tokens_.data(),
                                  static_cast<std::size_t>(batch) * options_.new_tokens * 4,
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(h_embeddings_, d_embeddings_.data(),
                                  static_cast<std::size_t>(batch) * embed_dim_ * 4,
                                  cudaMemcpyDeviceToHost, stream));
  GPUOPT_RETURN_IF_ERROR(events_[2].record(stream_));
  // The queries must be on the host before search() reads them.
  GPUOPT_RETURN_IF_ERROR(events_[2].synchronize());
  vector::GpuSearchOptions search;
  search.k = static_cast<std::size_t>(options_.retrieve_k);
  GPUOPT_ASSIGN_OR_RETURN(
      auto hits, archive_->search(h_embeddings_, requests.size(), search, stream_.handle()));
  GPUOPT_RETURN_IF_ERROR(events_[3].record(stream_));
  // Zero-copy ingest: the embeddings go from the decoder's buffer into the store on the device.
  GPUOPT_RETURN_IF_ERROR(
      cases_->append_device(d_embeddings_.data_as<float>(), requests.size(), stream_.handle()));
  GPUOPT_RETURN_IF_ERROR(events_[4].record(stream_));
  GPUOPT_RETURN_IF_ERROR(events_[4].synchronize());
  out.resize(requests.size());
  const std::size_t k = search.k;
  for (int i = 0; i < batch; ++i) {
    out[i].tokens.assign(h_tokens_ + i * options_.new_tokens,
                         h_tokens_ + (i + 1) * options_.new_tokens);
    out[i].retrieved.assign(hits.ids.begin() + i * k, hits.ids.begin() + (i + 1) * k);
    out[i].distances.assign(hits.distances.begin() + i * k, hits.distances.begin() + (i + 1) * k);
  }
  return log_times(log, static_cast<std::uint64_t>(batch));
}

Status CaseEngine::decode(const LlmRequest* requests, int batch) {
  auto stream = static_cast<cudaStream_t>(stream_.handle());
  for (int i = 0; i < batch; ++i) {
    std::copy(requests[i].prompt.begin(), requests[i].prompt.end(), h_prompts_ + i * kPromptTokens);
  }
  GPUOPT_CUDA_TRY(cudaMemcpyAsync(d_prompts_.data(), h_prompts_,
                                  static_cast<std::size_t>(batch) * kPromptTokens * 4,
                                  cudaMemcpyHostToDevice, stream));
  return llm_->generate(d_prompts_.data_as<std::int32_t>(), batch, kPromptTokens,
                        options_.new_tokens, d_tokens_.data_as<std::int32_t>(),
                        d_embeddings_.data_as<float>(), stream_.handle());
}
Status CaseEngine::log_times(StageLog& log, std::uint64_t requests) {
  GPUOPT_ASSIGN_OR_RETURN(float llm_ms, runtime::Event::elapsed_ms(events_[0], events_[1]));
  GPUOPT_ASSIGN_OR_RETURN(float search_ms, runtime::Event::elapsed_ms(events_[2], events_[3]));
  GPUOPT_ASSIGN_OR_RETURN(float ingest_ms, runtime::Event::elapsed_ms(events_[3], events_[4]));
  log.add("llm (per call)", llm_ms);
  // Batch time shared over its requests: the mean is the GPU time per request.
  log.add("llm (per request)", llm_ms, requests);
  log.add("retrieval", search_ms);
  log.add("ingest", ingest_ms);
  llm_requests_ += requests;
  return ok_status();
}

}  // namespace gpuopt::pipeline::runner
#endif  // GPUOPT_CUDA
