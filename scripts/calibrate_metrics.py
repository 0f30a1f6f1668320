"""What do the offline metrics' numbers mean? Evaluate degraded real images against the test split.

    python scripts/calibrate_metrics.py --data fashion-mnist --n 10000

Rows: real training images (the best a generator can hope for), the same images blurred (3x3 box
filter, 1-3 passes) or with Gaussian pixel noise (std in 0-255 units), and pure noise images. Prints a
Markdown table per feature network the data set is evaluated in (its own, and an independent one where it
has one), with the machine, torch version and date, for docs/metrics.md.
"""

import argparse
import datetime
import platform
import sys

import torch

from tinydit.data import load_dataset
from tinydit.eval.evaluate import add_noise, blur, evaluate, to_eval_images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist", choices=["fashion-mnist", "shapes"])
    parser.add_argument("--n", type=int, default=10000, help="images per row (the first N training images)")
    args = parser.parse_args()
    train = load_dataset(args.data, train=True, limit=args.n)
    real, labels = to_eval_images(train.images, args.data), train.labels
    g = torch.Generator().manual_seed(1)
    rows = [
        ("real training images", real),
        ("blurred, 1 pass", blur(real, 1)),
        ("blurred, 2 passes", blur(real, 2)),
        ("blurred, 3 passes", blur(real, 3)),
        ("noise std 8", add_noise(real, 8)),
        ("noise std 16", add_noise(real, 16)),
        ("noise std 32", add_noise(real, 32)),
        ("noise std 64", add_noise(real, 64)),
        ("pure noise (uniform pixels)", torch.randint(0, 256, real.shape, generator=g, dtype=torch.uint8)),
    ]
    print(
        f"{args.data}, {args.n} images per row against the test split; {platform.machine()}, "
        f"torch {torch.__version__}, {datetime.date.today()}"
    )
    print(f"command: python scripts/calibrate_metrics.py {' '.join(sys.argv[1:])}")
    results = []
    for name, images in rows:  # every row is read in each network, then one table per network
        results.append((name, evaluate(images, labels, args.data)))
        print(f"evaluated: {name}", file=sys.stderr, flush=True)
    for tag in results[0][1]["feature_nets"]:
        print()
        print(f"| images | fid_{tag} | kid_{tag} (x1000) | precision | recall | class consistency |")
        print("|---|---|---|---|---|---|")
        for name, m in results:
            kid_text = f"{1000 * m[f'kid_{tag}_mean']:.3f} ± {1000 * m[f'kid_{tag}_std']:.3f}"
            print(
                f"| {name} | {m[f'fid_{tag}']:.3f} | {kid_text} "
                f"| {m[f'precision_{tag}']:.3f} | {m[f'recall_{tag}']:.3f} | {m[f'class_consistency_{tag}']:.3f} |"
            )


if __name__ == "__main__":
    main()
