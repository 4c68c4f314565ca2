"""vLLM worker extension for the trainer's engines: Treadle's weight swap plus a CPU fix-up.

Loaded by vLLM in its worker (``--worker-extension-cls
treadle.trainer.vllm_worker.TrainerWeightsExtension``, set by ``treadle.trainer.vllm_server``) and
called over ``/collective_rpc`` by ``treadle.trainer.engines``.

Why the fix-up: on vLLM CPU 0.32 an in-place ``reload_weights`` (the path
``treadle.weights.vllm_extension`` uses, and the ``weights_path`` one too) updates the embedding
table but not the packed GEMM copy that the tied LM head multiplies with, which
``process_weights_after_loading`` made at start. Measured here with a trained version: vLLM's
logprobs matched a model with the new weights everywhere except the old output head, not the new
model. ``treadle_refresh_lm_head`` redoes that packing from the reloaded weights.
"""

from __future__ import annotations

from typing import Any

from treadle.weights import vllm_extension


class TrainerWeightsExtension(vllm_extension.WeightsExtension):
    def treadle_refresh_lm_head(self) -> int:
        """Re-pack every vocabulary embedding's CPU GEMM from its current weights; returns how many."""
        from vllm.model_executor.layers import vocab_parallel_embedding

        model: Any = self.model_runner.get_model()
        refreshed = 0
        for module in model.modules():
            if isinstance(module, vocab_parallel_embedding.VocabParallelEmbedding) and hasattr(
                module, "cpu_linear"
            ):
                module.quant_method.process_weights_after_loading(module)
                refreshed += 1
        return refreshed
