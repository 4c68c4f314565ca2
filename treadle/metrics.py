"""Every Prometheus metric name Treadle exports, in one place.

Services, the operator and the Grafana dashboards all take names from here; a test checks that
each dashboard query names only metrics defined in this module. Each component builds its
collectors on its own ``CollectorRegistry`` (never the global default) so tests can run many.
Sections below belong to one component each.
"""

from __future__ import annotations

PREFIX = "treadle"

# --- edges: HTTP plumbing, env, reward, agent (owner: edges) ----------------------------------------
# Every FastAPI app (treadle.services.httputil.app), labelled by route template and status code.
HTTP_REQUESTS_TOTAL = f"{PREFIX}_http_requests_total"
HTTP_REQUEST_SECONDS = f"{PREFIX}_http_request_seconds"
# Environment service (treadle.services.env).
ENV_SESSIONS_ACTIVE = f"{PREFIX}_env_sessions_active"
ENV_SESSIONS_OPENED_TOTAL = f"{PREFIX}_env_sessions_opened_total"
ENV_STEP_SECONDS = f"{PREFIX}_env_step_seconds"
ENV_FAILURES_TOTAL = f"{PREFIX}_env_failures_total"
ENV_WARM_READY = f"{PREFIX}_env_warm_ready"
# Reward gateway (treadle.services.reward).
REWARD_REQUESTS_TOTAL = f"{PREFIX}_reward_requests_total"
REWARD_LATENCY_SECONDS = f"{PREFIX}_reward_latency_seconds"
REWARD_INFLIGHT = f"{PREFIX}_reward_inflight"
REWARD_FAILURES_TOTAL = f"{PREFIX}_reward_failures_total"
# Inference agent sidecar (treadle.services.agent).
AGENT_REQUESTS_TOTAL = f"{PREFIX}_agent_requests_total"
AGENT_INFLIGHT = f"{PREFIX}_agent_inflight"
AGENT_ABORTS_TOTAL = f"{PREFIX}_agent_aborts_total"
AGENT_GENERATED_TOKENS_TOTAL = f"{PREFIX}_agent_generated_tokens_total"
AGENT_ENGINE_SECONDS = f"{PREFIX}_agent_engine_seconds"
AGENT_OVERHEAD_SECONDS = f"{PREFIX}_agent_overhead_seconds"
AGENT_SWAP_LEASES_EXPIRED_TOTAL = f"{PREFIX}_agent_swap_leases_expired_total"
# Swaps the agent ran by itself to the version placement wants its worker to serve (after a failed
# swap, an engine restart, or a swap its own restart orphaned), by outcome (loaded, failed).
AGENT_WEIGHT_RELOADS_TOTAL = f"{PREFIX}_agent_weight_reloads_total"
# vLLM's own names: exported by the simulated engine (treadle.services.fakevllm) exactly as vLLM
# 0.32 does, and read back by the agent from either engine to report load.
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
VLLM_PROMPT_TOKENS = "vllm:prompt_tokens"
VLLM_GENERATION_TOKENS = "vllm:generation_tokens"
VLLM_REQUEST_SUCCESS = "vllm:request_success"
VLLM_PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
VLLM_PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
VLLM_ITERATION_TOKENS = "vllm:iteration_tokens_total"
"""A histogram of tokens per engine step: its ``_count`` is the steps run, ``_sum`` their tokens."""

# --- core: scheduler, placement, buffer (owner: core) -----------------------------------------------
# Scheduler (treadle.services.scheduler). Stage is one of generation / environment / reward / waiting.
SCHED_STAGE_SECONDS = f"{PREFIX}_scheduler_stage_seconds"
SCHED_TURNS_TOTAL = f"{PREFIX}_scheduler_turns_total"
SCHED_TRAJECTORIES_TOTAL = f"{PREFIX}_scheduler_trajectories_total"
SCHED_INFLIGHT = f"{PREFIX}_scheduler_inflight_trajectories"
SCHED_PENDING = f"{PREFIX}_scheduler_pending_trajectories"
SCHED_ENV_FAILURES_TOTAL = f"{PREFIX}_scheduler_env_failures_total"
SCHED_REWARD_SECONDS = f"{PREFIX}_scheduler_reward_latency_seconds"
# Rewards of completed trajectories, by task: a summary (``_sum`` / ``_count``, no quantiles).
SCHED_TRAJECTORY_REWARD = f"{PREFIX}_scheduler_trajectory_reward"
SCHED_POLICY_VERSION = f"{PREFIX}_scheduler_policy_version"
SCHED_PREEMPTIONS_TOTAL = f"{PREFIX}_scheduler_preemptions_total"
SCHED_PREDICTION_ERROR_TOKENS = f"{PREFIX}_scheduler_prediction_error_tokens"
SCHED_ENV_SERVERS = f"{PREFIX}_scheduler_env_servers"
# DARTS in the scheduler (treadle.services.scheduler.darts), by task; aborted by reason (early_stop).
SCHED_DARTS_CANDIDATES_TOTAL = f"{PREFIX}_scheduler_darts_candidates_total"
SCHED_DARTS_SELECTED_TOTAL = f"{PREFIX}_scheduler_darts_selected_total"
SCHED_DARTS_UNSELECTED_TOTAL = f"{PREFIX}_scheduler_darts_unselected_total"
SCHED_DARTS_ABORTED_TOTAL = f"{PREFIX}_scheduler_darts_aborted_total"
SCHED_DARTS_BUDGET = f"{PREFIX}_scheduler_darts_budget_candidates"
SCHED_DARTS_PTL_SAMPLES = f"{PREFIX}_scheduler_darts_ptl_samples"
# Placement (treadle.services.placement).
PLACEMENT_ASSIGNMENTS_TOTAL = f"{PREFIX}_placement_assignments_total"
PLACEMENT_OUTSTANDING = f"{PREFIX}_placement_outstanding_turns"
PLACEMENT_MIGRATIONS_TOTAL = f"{PREFIX}_placement_migrations_total"
PLACEMENT_REBALANCE_MOVES_TOTAL = f"{PREFIX}_placement_rebalance_moves_total"
PLACEMENT_AGENT_QUEUE = f"{PREFIX}_placement_agent_queue_turns"
# Weight sync driven by placement (SwapWeights), by pool: per-worker swap time (the exposed part, the
# worker paused, labelled by how the version got there: prefetched = pulled while generating),
# failures by outcome, and the lowest/highest version the pool's workers serve and their target.
PLACEMENT_WEIGHT_SWAP_SECONDS = f"{PREFIX}_placement_weight_swap_seconds"
PLACEMENT_WEIGHT_SWAP_FAILURES_TOTAL = f"{PREFIX}_placement_weight_swap_failures_total"
PLACEMENT_POOL_WEIGHT_VERSION = f"{PREFIX}_placement_pool_weight_version"
# Buffer (treadle.services.buffer).
BUFFER_STORED = f"{PREFIX}_buffer_stored_trajectories"
BUFFER_PUT_TOTAL = f"{PREFIX}_buffer_put_total"
BUFFER_DELIVERED_TOTAL = f"{PREFIX}_buffer_delivered_total"
BUFFER_EVICTED_TOTAL = f"{PREFIX}_buffer_evicted_total"
BUFFER_STALENESS = f"{PREFIX}_buffer_staleness_versions"
# Feeder (treadle.services.feeder), labelled by task: dataset rows accepted as new groups, the epoch
# and the rows of it submitted (the durable position), and the dataset's size.
FEEDER_ROWS_FED_TOTAL = f"{PREFIX}_feeder_rows_fed_total"
FEEDER_EPOCH = f"{PREFIX}_feeder_epoch"
FEEDER_POSITION = f"{PREFIX}_feeder_position_rows"
FEEDER_ROWS = f"{PREFIX}_feeder_dataset_rows"

# --- trainer: the reference trainer (treadle.trainer.job), one sample per step -----------------------
TRAINER_STEP = f"{PREFIX}_trainer_step"
TRAINER_LOSS = f"{PREFIX}_trainer_loss"
# Label ``to``: reference (k3 to the reference policy; 0 without one) or behaviour (to the sampler).
TRAINER_KL = f"{PREFIX}_trainer_kl"
TRAINER_CLIP_FRACTION = f"{PREFIX}_trainer_clip_fraction"
TRAINER_MEAN_REWARD = f"{PREFIX}_trainer_mean_reward"
TRAINER_STALENESS = f"{PREFIX}_trainer_staleness_versions"
# Label ``phase``: batch_wait (for the buffer's batch), train, publish (to the weight store),
# weight_sync (the suspend -> swap -> commit -> resume fence). A histogram.
TRAINER_PHASE_SECONDS = f"{PREFIX}_trainer_phase_seconds"
TRAINER_PUBLISHED_BYTES_TOTAL = f"{PREFIX}_trainer_published_bytes_total"
TRAINER_PUBLISHED_VERSION = f"{PREFIX}_trainer_published_version"
TRAINER_ENTROPY = f"{PREFIX}_trainer_entropy"
TRAINER_GRAD_NORM = f"{PREFIX}_trainer_grad_norm"
# Prompt and output tokens the last step put through the model, per second of its training phase.
TRAINER_TOKENS_PER_SECOND = f"{PREFIX}_trainer_tokens_per_second"
TRAINER_RANKS = f"{PREFIX}_trainer_ranks"

# --- tangram: the action manager (ARL-Tangram, live; owner: tangramlive) ---------------------------
# Label ``resource``: ``cpu`` (the pod's cores, treadle.sandbox.cores) or ``api:<tool>`` (a quota of
# spec.externalResources.apiQuotas, at most 32); ``phase``: queue / execution / overhead (Table 1).
TANGRAM_ACTION_SECONDS = f"{PREFIX}_tangram_action_seconds"
TANGRAM_QUEUED = f"{PREFIX}_tangram_queued_actions"
TANGRAM_GRANTED_UNITS_TOTAL = f"{PREFIX}_tangram_granted_units_total"
# API quotas across the job's env pods, as this pod last read them from Redis (label ``tool``).
TANGRAM_QUOTA_IN_FLIGHT = f"{PREFIX}_tangram_quota_in_flight"
TANGRAM_QUOTA_WINDOW_REQUESTS = f"{PREFIX}_tangram_quota_window_requests"
# Reward-model GPUs of the reward gateway (treadle.services.reward.gpus; label ``model``: a name of
# spec.externalResources.rewardModels, at most 16). Actions use ``resource="gpu"`` above.
REWARD_MODEL_RESTORES_TOTAL = f"{PREFIX}_reward_model_restores_total"
REWARD_MODEL_EVICTIONS_TOTAL = f"{PREFIX}_reward_model_evictions_total"
REWARD_MODEL_RESTORE_SECONDS = f"{PREFIX}_reward_model_restore_seconds"
REWARD_MODEL_GPUS_BUSY = f"{PREFIX}_reward_model_gpus_busy"

# --- operator (owner: operator) ---------------------------------------------------------------------
# Controller health, shaped like controller-runtime's so KubeRay-style operator dashboards apply.
OPERATOR_RECONCILE_TOTAL = f"{PREFIX}_operator_reconcile_total"  # label result: success|error|invalid
OPERATOR_RECONCILE_SECONDS = f"{PREFIX}_operator_reconcile_seconds"  # histogram
OPERATOR_RECONCILE_INFLIGHT = f"{PREFIX}_operator_reconcile_inflight"  # handlers running now
OPERATOR_JOBS_PENDING = f"{PREFIX}_operator_jobs_pending"  # work-queue depth: generation > observed
OPERATOR_CHILDREN_APPLIED_TOTAL = f"{PREFIX}_operator_children_applied_total"  # labels kind, action
OPERATOR_STATUS_UPDATES_TOTAL = f"{PREFIX}_operator_status_updates_total"
# Per-job state, like kuberay_*_info / *_condition_*.
OPERATOR_JOB_INFO = f"{PREFIX}_operator_job_info"  # labels namespace, name, uid, phase
OPERATOR_JOB_CONDITION = f"{PREFIX}_operator_job_condition"  # labels namespace, name, condition, reason
# labels namespace, name, pool, accelerator, state
OPERATOR_POOL_REPLICAS = f"{PREFIX}_operator_pool_replicas"
