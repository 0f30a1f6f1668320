"""Train a mean-flow run with one lever of its objective changed, the rest as `tinydit train` trains it.

    python experiments/meanflow_levers.py --out /tmp/mf/paper --seed 0 --minutes 5
    python experiments/meanflow_levers.py --out /tmp/mf/tangent --seed 0 --minutes 5 --tangent predicted
    python experiments/meanflow_levers.py --out /tmp/mf/below --seed 0 --minutes 5 --interval below
    python experiments/meanflow_levers.py --out /tmp/mf/first --seed 0 --minutes 5 --flow-first-steps 1200
    python experiments/meanflow_levers.py --out /tmp/mf/first15 --seed 0 --minutes 15 --flow-first-share 0.35
    tinydit eval --checkpoint /tmp/mf/paper/checkpoint.pt --n 1000 --seed 0 --out /tmp/mf/paper-eval

The run is `tinydit train --data shapes --objective meanflow --repa 0.5 --minutes M --seed S` (``--data`` and
``--set FIELD=VALUE`` change its TrainConfig) with, at most, these changes to its objective:

- ``--tangent predicted``: the derivative in the target follows the model's own instantaneous velocity
  u(z, t, t | y), as improved mean flows do (Geng et al. 2025b), instead of the pair's velocity noise - x0.
  It costs one more forward pass, without gradients, over the images on an interval.
- ``--interval below``: an image on an interval takes r ~ U(0, t) below its time t, instead of the two times'
  (min, max): longer intervals, more of them reaching the data end that one step needs.
- ``--flow-first-steps N``: plain flow matching (every r = t, no folded guidance) until step N, then the
  paper's objective: the instantaneous velocity first, the average over intervals from it (Kim et al. 2025,
  "Understanding, Accelerating, and Improving MeanFlow Training"; AlphaFlow, Zhang et al. 2025, anneals the
  same way). The flow-matching steps cost what a plain step costs. ``--flow-first-share F``: the same until
  F of the time budget has passed (the step is then fixed and printed).

Each run prints the product's log; ``tinydit eval`` then judges its one-step samples. The runs behind
docs/few_step.md's "Levers" table used this script with ``--minutes 5`` and ``--minutes 15``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from shapes_levers import parse_value  # noqa: E402

from tinydit.flow.meanflow import TANGENTS  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the run directory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--data", default="shapes")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a TrainConfig field")
    p.add_argument("--tangent", choices=TANGENTS, default="conditional")
    p.add_argument("--interval", choices=("paper", "below"), default="paper")
    p.add_argument("--flow-first-steps", type=int, default=0, metavar="N")
    p.add_argument("--flow-first-share", type=float, default=0.0, metavar="F")
    args = p.parse_args()

    import torch

    from tinydit.compiling import unwrap
    from tinydit.config import TrainConfig
    from tinydit.flow.meanflow import R_NEQ_T, FoldedGuidance, meanflow_loss
    from tinydit.flow.objectives import MeanFlow, StepLoss
    from tinydit.train.trainer import Trainer

    fields = {"repa": 0.5} | {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.set)}
    cfg = TrainConfig(
        data=args.data, minutes=args.minutes, objective="meanflow", seed=args.seed, out=args.out, **fields
    )

    def below(t, s, generator=None, share=R_NEQ_T):
        """r ~ U(0, t) for a share of the images; the rest keep r = t (``s`` is drawn and not used)."""
        interval = (torch.rand(t.shape[0], generator=generator) < share).to(t.device)  # (N,) bool
        frac = torch.rand(t.shape[0], generator=generator).to(t.device)  # (N,)
        return torch.where(interval, frac * t, t), t

    # The first step on intervals: given, or (by time) None until the share of the budget has passed.
    start = {"step": None if args.flow_first_share else args.flow_first_steps}

    def flow_first(step: int) -> bool:
        if start["step"] is None and step > 0 and run.clock() >= args.flow_first_share * args.minutes * 60:
            start["step"] = step
            print(f"intervals from step {step}", file=sys.stderr, flush=True)
        return start["step"] is None or step < start["step"]

    class Levers(MeanFlow):
        """The trainer's mean-flow objective with the tangent and the intervals chosen, and flow matching
        first where asked."""

        def draw_times(self, t, draw_t, generator):
            return (
                below(t, draw_t(), generator) if args.interval == "below" else super().draw_times(t, draw_t, generator)
            )

        def __call__(self, forward, model, b):
            guidance = FoldedGuidance(b.guidance, ~b.drop, b.null)
            if flow_first(run.run.step):
                b.r, guidance = b.t, None
            weighted, per_sample = meanflow_loss(
                forward, unwrap(model), b.x, b.y, b.r, b.t, b.noise, guidance, tangent=args.tangent
            )
            at_t = b.r == b.t  # (n,) bool
            reported = (per_sample[at_t] if at_t.any() else per_sample).mean()
            return StepLoss(weighted.mean(), reported, per_sample, at_t)

    run = Trainer(cfg, objective=Levers())
    run.fit()


if __name__ == "__main__":
    main()
