"""The policy model: load a Hugging Face causal LM, sample from it, score tokens under it.

Called by ``treadle.trainer.local`` (sampling and scoring in one process) and ``treadle.trainer.step``
(scoring token ids that an engine sampled, on each rank's device; ``treadle.trainer.parallel`` shards
the model in place). Tests and the dev cluster use the tiny random Llama or Qwen3 of
``treadle.models.tiny``, generated once per seed into the cache: no weights are downloaded.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from treadle import errors


def model_dir(seed: int = 0, arch: str = "llama") -> pathlib.Path:
    """Where the tiny model of ``arch`` (``treadle.models.tiny.ARCHS``) for ``seed`` lives (generated on
    first use): ``tiny-<arch>-seed<N>`` in the cache."""
    base = pathlib.Path(os.environ.get("TREADLE_CACHE", pathlib.Path.home() / ".cache" / "treadle"))
    return base / "models" / f"tiny-{arch}-seed{seed}"


def ensure_model(path: pathlib.Path, *, seed: int = 0, arch: str = "llama") -> pathlib.Path:
    """Generate the tiny model into ``path`` unless a complete one is there (its metadata is last).

    Generated beside ``path`` and renamed into place: processes that ask at once (parallel test
    workers, a job's pods) each see no model or a whole one, never another's half-written files."""
    if not (path / "treadle-model.json").exists():
        from treadle.models import tiny

        staging = path.with_name(f".{path.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        tiny.generate(staging, seed=seed, arch=arch)
        try:
            staging.rename(path)
        except OSError:
            if (path / "treadle-model.json").exists():  # another process's (same seed and arch, same bytes)
                shutil.rmtree(staging, ignore_errors=True)
            else:  # the remains of a generation that was interrupted
                shutil.rmtree(path)
                staging.rename(path)
    return path


@dataclasses.dataclass
class Policy:
    model: Any
    """A ``transformers`` causal LM, loaded in float32 (FSDP2 keeps float32 master weights)."""
    tokenizer: Any
    eos_id: int

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of a one-message chat prompt, as the engine's chat template builds them."""
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))


def load(path: pathlib.Path) -> Policy:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    return Policy(model=model, tokenizer=tokenizer, eos_id=int(tokenizer.eos_token_id))


@dataclasses.dataclass(frozen=True)
class Sampled:
    output_ids: list[int]
    logprobs: list[float]
    """Logprob of each output token under the sampling distribution (temperature applied)."""


@torch.no_grad()
def sample(
    policy: Policy,
    prompt_ids: Sequence[int],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> list[Sampled]:
    """``n`` completions of one prompt, batched with a KV cache; each stops after its EOS token."""
    if n < 1 or max_new_tokens < 1:
        raise errors.SpecError("n and max_new_tokens must be >= 1", field="n", value=(n, max_new_tokens))
    if temperature <= 0:
        raise errors.SpecError("must be > 0", field="temperature", value=temperature)
    model = policy.model
    model.eval()
    input_ids = torch.tensor([list(prompt_ids)] * n, dtype=torch.long)
    out = model(input_ids=input_ids, use_cache=True)
    past = out.past_key_values
    logits = out.logits[:, -1, :]
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        picked = logp.gather(1, nxt.unsqueeze(1)).squeeze(1)
        for i in range(n):
            if not done[i]:
                tokens[i].append(int(nxt[i]))
                logprobs[i].append(float(picked[i]))
                done[i] = int(nxt[i]) == policy.eos_id
        if all(done):
            break
        out = model(input_ids=nxt.unsqueeze(1), past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1, :]
    return [Sampled(t, lp) for t, lp in zip(tokens, logprobs, strict=True)]


class Scored(NamedTuple):
    logprobs: torch.Tensor
    """[B, T] logprob of each output token, with grad."""
    mask: torch.Tensor
    """[B, T] 1.0 on output tokens, 0.0 on padding."""
    entropy: torch.Tensor
    """[B, T] entropy of the policy's next-token distribution at each output token (no grad)."""


def token_logprobs(
    policy: Policy,
    sequences: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    temperature: float = 1.0,
) -> Scored:
    """Logprobs of each output token given its prompt, with grad, and the entropy there.

    ``sequences`` are (prompt ids, output ids); T is the longest output. Sequences are right-padded
    so every position keeps its index (the attention mask hides the padding from later tokens).
    ``temperature`` must be the sampling temperature, or the ratio to the behaviour policy is off.
    Tensors are made on the model's device; the results are float32 there.
    """
    if not sequences:
        raise errors.SpecError("no sequences to score", field="sequences")
    if any(not p for p, _ in sequences):
        raise errors.SpecError("every sequence needs a non-empty prompt", field="sequences")
    device = next(policy.model.parameters()).device
    pad = policy.eos_id
    full = [list(p) + list(o) for p, o in sequences]
    width = max(len(s) for s in full)
    t_out = max(len(o) for _, o in sequences)
    ids = torch.full((len(full), width), pad, dtype=torch.long)
    attention = torch.zeros((len(full), width), dtype=torch.long)
    for i, s in enumerate(full):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        attention[i, : len(s)] = 1
    logits = policy.model(input_ids=ids.to(device), attention_mask=attention.to(device)).logits
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    # The token at position p is predicted by the logits at p - 1; padding rows gather position 0.
    positions = torch.zeros((len(full), t_out), dtype=torch.long)
    targets = torch.zeros((len(full), t_out), dtype=torch.long)
    mask = torch.zeros((len(full), t_out), dtype=torch.float32)
    for i, (prompt, output) in enumerate(sequences):
        n = len(output)
        positions[i, :n] = torch.arange(len(prompt) - 1, len(prompt) - 1 + n)
        targets[i, :n] = torch.tensor(list(output), dtype=torch.long)
        mask[i, :n] = 1.0
    positions, targets, mask = positions.to(device), targets.to(device), mask.to(device)
    at = logp_all.gather(1, positions.unsqueeze(-1).expand(-1, -1, logp_all.shape[-1]))
    picked = at.gather(2, targets.unsqueeze(-1)).squeeze(-1) * mask
    with torch.no_grad():
        entropy = -(at.exp() * at).sum(-1) * mask
    return Scored(picked, mask, entropy)
