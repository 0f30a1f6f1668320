"""What a FID, KID or precision/recall was measured under: its protocol. Two such numbers compare only where
every field agrees: the feature network, the reference (data set, split and image count), the sample
count, the sampler with its guidance and evaluations per image, and the precision the samples were drawn
in. FID in particular is biased by the sample count (lower with more samples) and shifts with the reference.

``protocol_of`` reads it from an evaluation's metrics (a ``tinydit eval`` metrics.json, old ones too, or a
sweep's row), ``describe_protocol`` says it in a line.
"""

from __future__ import annotations

__all__ = ["PROTOCOL_FIELDS", "protocol_of", "describe_protocol"]

# every field of a protocol, in the order a line says them
PROTOCOL_FIELDS = (
    "feature_net",  # the network whose features the metrics compare (fmnist_cnn, shapes_cnn, inception)
    "reference",  # the reference data set and split: "shapes test"
    "n_reference",  # reference images
    "n_samples",  # generated images
    "sampler",  # sampler and steps (and its grid and options), or None for images scored from a file
    "guidance",  # the classifier-free guidance scale, and the interval of t it acts on
    "nfe_per_image",  # model evaluations per image (a guided velocity costs 2)
    "precision",  # what the samples were drawn in; None where not known (images from a file)
)


def _guidance(sampler: dict) -> str | None:
    scale = sampler.get("cfg_scale", sampler.get("cfg"))  # older metrics.json named it cfg
    if scale is None:
        return None
    interval = sampler.get("cfg_interval")
    if interval and scale != 1:
        return f"{scale:g} on t in [{interval[0]:g}, {interval[1]:g}]"
    return f"{scale:g}" if scale != 1 else "1 (none)"


def _sampler(sampler: dict) -> str | None:
    name = sampler.get("sampler", sampler.get("name"))  # older metrics.json named it name
    if name is None:
        return None
    what = f"{name}, {sampler['steps']} steps" if sampler.get("steps") is not None else str(name)
    if sampler.get("grid") not in (None, "uniform"):
        what += f", {sampler['grid']} grid" + (f" (shift {sampler['shift']:g})" if sampler.get("shift") else "")
    options = [f"{k} {sampler[k]:g}" for k in ("eta", "rtol", "atol") if sampler.get(k) is not None]
    return ", ".join([what, *options])


def protocol_of(metrics: dict) -> dict:
    """The protocol (``PROTOCOL_FIELDS``) of an evaluation's ``metrics``: a ``tinydit eval`` metrics.json's
    fields (``feature_nets``, ``data``, ``split``, ``n_reference``, ``n_samples``, ``sampler``,
    ``nfe_per_image``, ``precision``), or a sweep row's (``feature_net``, ``sampler_settings``, ``nfe``).
    A field the metrics do not hold is None."""
    if isinstance(metrics.get("protocol"), dict):
        return {k: metrics["protocol"].get(k) for k in PROTOCOL_FIELDS}
    nets = metrics.get("feature_nets")
    net = ", ".join(nets) if isinstance(nets, dict) and nets else metrics.get("feature_net")
    sampler = metrics.get("sampler") if isinstance(metrics.get("sampler"), dict) else metrics.get("sampler_settings")
    sampler = sampler if isinstance(sampler, dict) else {}
    data, split = metrics.get("data"), metrics.get("split")
    return {
        "feature_net": net,
        "reference": f"{data} {split}" if data and split else None,
        "n_reference": metrics.get("n_reference"),
        "n_samples": metrics.get("n_samples"),
        "sampler": _sampler(sampler),
        "guidance": _guidance(sampler),
        "nfe_per_image": metrics.get("nfe_per_image", metrics.get("nfe")),
        "precision": metrics.get("precision"),
    }


def _count(n) -> str:
    return f"{n:,}" if isinstance(n, int) else "?"


def describe_protocol(protocol: dict, sampling: bool = True) -> str:
    """A protocol in a line: "shapes_cnn features; reference shapes test, 2,000 images; 1,000 samples;
    ancestral, 64 steps, guidance 50 on t in [0.8, 1], 128 evaluations per image; fp32". ``sampling``
    False leaves the sampler out (a sweep's table gives it per row)."""
    p = {k: protocol.get(k) for k in PROTOCOL_FIELDS}
    parts = [
        f"{p['feature_net'] or '?'} features",
        f"reference {p['reference'] or '?'}, {_count(p['n_reference'])} images",
        f"{_count(p['n_samples'])} samples",
    ]
    if not sampling:
        pass
    elif p["sampler"] is None:
        parts.append("sampler not recorded (images from a file)")
    else:
        sampling = p["sampler"] + (f", guidance {p['guidance']}" if p["guidance"] is not None else "")
        nfe = p["nfe_per_image"]
        if nfe is not None:
            sampling += f", {nfe:g} evaluations per image"
        parts.append(sampling)
    parts.append(p["precision"] or "precision not recorded")
    return "; ".join(parts)
