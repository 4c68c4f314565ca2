"""Benchmark: error of the default Heddle predictor on a synthetic multi-step task (cf. Heddle Fig. 13).

Run: ``python bench/policy_heddle_predictor.py [--groups 64] [--seed 0] [--out DIR]``.
A synthetic long-tailed agentic task (ours; the paper's distributions were lost): each prompt has a
lognormal difficulty, each of its 16 samples a difficulty-driven number of steps and lognormal
tokens per step. The predictor learns 256 finished groups, then predicts the remaining tokens of
every new trajectory before its first step (prompt only, "step 0") and after steps 1 and 2 (the
paper's Heddle-1 and Heddle-2), knowing the siblings that finished first (tokens stand in for time,
as if all decoded at one rate). Prints MAE, median ratio error, Pearson r and long-tail recall (top
10 %) per step. The paper's Fig. 13 numbers were lost from the text; it reports only that Heddle-2
beats Heddle-1 beats the history- and model-based baselines. Nothing is asserted.

Also times ``learn`` as the scheduler calls it: a batch of ``LEARN_EVERY`` (8) finished trajectories
of this task into a model whose window (2,048, the default) is full, so as many fall out as enter.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import statistics
import time

from treadle.policy.heddle import predictor


@dataclasses.dataclass(frozen=True)
class Config:
    history_groups: int = 256
    """Finished groups the predictor learns first."""
    groups: int = 64
    """New groups whose trajectories are predicted."""
    group_size: int = 16
    seed: int = 0


def task(rng: random.Random, name: str, groups: int, size: int) -> list[tuple[str, list[list[int]]]]:
    """Per group: each trajectory's tokens per step."""
    out = []
    for g in range(groups):
        difficulty = rng.lognormvariate(0.0, 0.7)
        trajs = []
        for _ in range(size):
            steps = 1 + min(30, int(rng.expovariate(1.0 / (2.0 * difficulty))))
            trajs.append([max(1, int(rng.lognormvariate(6.0, 0.6) * difficulty)) for _ in range(steps)])
        out.append((f"{name}{g}", trajs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=Config.groups)
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    cfg = Config(groups=args.groups, seed=args.seed)
    rng = random.Random(cfg.seed)
    model = predictor.HistoryModel(window=8192)  # holds the whole history, so learning siblings is cheap
    for group, trajs in task(rng, "past", cfg.history_groups, cfg.group_size):
        model = predictor.learn(model, [predictor.Finished("t", group, sum(t), tuple(t)) for t in trajs])
    preds: dict[int, list[float]] = {0: [], 1: [], 2: []}
    truth: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for group, trajs in task(rng, "now", cfg.groups, cfg.group_size):
        totals = [sum(t) for t in trajs]
        for i, steps in enumerate(trajs):
            for s in (0, 1, 2):
                if len(steps) <= s:
                    continue  # finished before this step boundary
                seen = sum(steps[:s])
                first = [
                    predictor.Finished("t", group, x) for j, x in enumerate(totals) if j != i and x <= seen
                ]
                known = predictor.learn(model, first) if first else model
                preds[s].append(known.predict(predictor.Observation("t", group, seen, s)))
                truth[s].append(float(totals[i] - seen))
    results = {}
    print(f"Heddle default predictor on a synthetic task ({cfg.groups} groups x {cfg.group_size}), simulated")
    print(f"{'when':22} {'n':>5} {'MAE tok':>9} {'med ratio':>10} {'pearson':>8} {'tail recall':>12}")
    for s, label in ((0, "prompt only (step 0)"), (1, "after step 1 (H-1)"), (2, "after step 2 (H-2)")):
        acc = predictor.accuracy(preds[s], truth[s])
        results[label] = dataclasses.asdict(acc)
        print(
            f"{label:22} {acc.n:5d} {acc.mae:9.0f} {acc.median_ratio_error:10.2f} "
            f"{acc.pearson:8.3f} {acc.long_tail_recall:12.2f}"
        )
    results["learn_ms"] = learn_ms(rng)
    print(
        "learn, a batch of 8 into a full 2,048 window: median {median:.3f} ms, p90 {p90:.3f} ms "
        "({n} batches)".format(**results["learn_ms"])
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
        (args.out / "results.json").write_text(json.dumps(results, indent=2))


def learn_ms(rng: random.Random, batches: int = 200) -> dict[str, float]:
    """Wall time of one ``learn`` call once the default window is full, in ms."""
    finished = [
        predictor.Finished("t", group, sum(t), tuple(t))
        for group, trajs in task(rng, "w", 200, 16)
        for t in trajs
    ]
    window = predictor.HistoryModel().window
    model = predictor.learn(predictor.HistoryModel(), finished[:window])
    times = []
    for i in range(window, window + 8 * batches, 8):
        began = time.perf_counter()
        model = predictor.learn(model, finished[i : i + 8])
        times.append((time.perf_counter() - began) * 1e3)
    return {"median": statistics.median(times), "p90": statistics.quantiles(times, n=10)[-1], "n": len(times)}


if __name__ == "__main__":
    main()
