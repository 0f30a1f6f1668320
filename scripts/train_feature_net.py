"""Train the offline feature network of a built-in data set and record it in assets/feature_nets.json.

    python scripts/train_feature_net.py --data fashion-mnist
    python scripts/train_feature_net.py --data shapes

Deterministic for a seed on a CPU. Writes src/tinydit/assets/<name>.pt (a plain state dict) and its
SHA-256, test accuracy, training command, torch version and date into the manifest.
"""

import argparse
import datetime
import json
import sys
import time

import torch

from tinydit.data import load_dataset
from tinydit.eval.evaluate import eval_spec, to_eval_images
from tinydit.eval.features import ASSETS, FEATURE_NETS, extract, file_sha256, train_feature_net


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, choices=sorted(FEATURE_NETS))
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    name = FEATURE_NETS[args.data]

    train = load_dataset(args.data, train=True)
    test = load_dataset(args.data, train=False, shapes_size=eval_spec(args.data).reference_size)
    x_train, x_test = to_eval_images(train.images, args.data), to_eval_images(test.images, args.data)
    started = time.perf_counter()
    net = train_feature_net(x_train, train.labels, len(train.classes), epochs=args.epochs, seed=args.seed)
    seconds = time.perf_counter() - started
    _, preds = extract(net, x_test)
    accuracy = (preds == test.labels).double().mean().item()
    print(f"{name}: test accuracy {accuracy:.4f} after {seconds:.0f} s")

    ASSETS.mkdir(exist_ok=True)
    path = ASSETS / f"{name}.pt"
    torch.save(
        {
            "model": net.state_dict(),
            "in_channels": x_train.shape[1],
            "img_size": x_train.shape[2],
            "n_classes": len(train.classes),
            "width": 32,
            "classes": list(train.classes),
        },
        path,
    )
    manifest_path = ASSETS / "feature_nets.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest[name] = {
        "file": path.name,
        "sha256": file_sha256(path),
        "data": args.data,
        "test_accuracy": round(accuracy, 4),
        "test_images": len(test),
        "train_seconds": round(seconds),
        "command": "python scripts/train_feature_net.py " + " ".join(sys.argv[1:]),
        "torch_version": torch.__version__,
        "date": datetime.date.today().isoformat(),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) and {manifest_path}")


if __name__ == "__main__":
    main()
