package vllm

// Metric names as vLLM's V1 PrometheusStatLogger exposes them (design §7.2).
// Counters carry the "_total" suffix that Python's prometheus_client appends
// on exposition: the constants are the names a scraper sees, which is what
// both the simulator (registering them with client_golang, which appends
// nothing) and a parser of /metrics need.
const (
	MetricNumRequestsRunning = "vllm:num_requests_running"
	MetricNumRequestsWaiting = "vllm:num_requests_waiting"
	// MetricKVCacheUsagePerc is a fraction in [0, 1] despite its name.
	MetricKVCacheUsagePerc = "vllm:kv_cache_usage_perc"
	// MetricGPUCacheUsagePerc is the name before vLLM 0.9.2, removed in
	// late 2025; a reader of older engines falls back to it.
	MetricGPUCacheUsagePerc = "vllm:gpu_cache_usage_perc"

	// MetricPrefixCacheQueries and MetricPrefixCacheHits count tokens, not
	// requests: hits/queries is the prefix-cache hit rate.
	MetricPrefixCacheQueries = "vllm:prefix_cache_queries_total"
	MetricPrefixCacheHits    = "vllm:prefix_cache_hits_total"

	MetricPromptTokens     = "vllm:prompt_tokens_total"
	MetricGenerationTokens = "vllm:generation_tokens_total"
	// MetricRequestSuccess is labelled by LabelFinishedReason.
	MetricRequestSuccess = "vllm:request_success_total"

	MetricTimeToFirstToken      = "vllm:time_to_first_token_seconds"
	MetricE2ERequestLatency     = "vllm:e2e_request_latency_seconds"
	MetricInterTokenLatency     = "vllm:inter_token_latency_seconds"
	MetricRequestQueueTime      = "vllm:request_queue_time_seconds"
	MetricCacheConfigInfo       = "vllm:cache_config_info"
	MetricLoRARequestsInfo      = "vllm:lora_requests_info"
	MetricNumPreemptions        = "vllm:num_preemptions_total"
	MetricExternalPrefixQueries = "vllm:external_prefix_cache_queries_total"
)

// Labels on vLLM's per-engine metrics. LabelModelName is the first served
// model name (else the model path); LabelEngine the data-parallel engine
// index, "0" without data parallelism.
const (
	LabelModelName      = "model_name"
	LabelEngine         = "engine"
	LabelFinishedReason = "finished_reason"

	// The labels of MetricLoRARequestsInfo, which carries no model_name or
	// engine: values are comma-joined adapter names, and the series with the
	// largest sample value (a unix timestamp) is the current one.
	LabelMaxLoRA              = "max_lora"
	LabelWaitingLoRAAdapters  = "waiting_lora_adapters"
	LabelRunningLoRAAdapters  = "running_lora_adapters"
	LabelCacheBlockSize       = "block_size"
	LabelCacheNumGPUBlocks    = "num_gpu_blocks"
	LabelCacheHashAlgo        = "prefix_caching_hash_algo"
	LabelCacheEnablePrefixing = "enable_prefix_caching"
)

// TimeToFirstTokenBuckets are vLLM's histogram buckets for
// MetricTimeToFirstToken, so a histogram_quantile over the simulator and
// over vLLM interpolates the same way.
var TimeToFirstTokenBuckets = []float64{
	0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
	1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
}

// RequestLatencyBuckets are vLLM's buckets for the e2e and queue-time
// histograms.
var RequestLatencyBuckets = []float64{
	0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
}

// Finished reasons as vLLM labels MetricRequestSuccess.
const (
	FinishedStop   = "stop"
	FinishedLength = "length"
	FinishedAbort  = "abort"
)
