"""Sampling an exported TinyDiT model with numpy and onnxruntime alone: no torch, no tinydit.

This file imports nothing of tinydit or torch, so it can be copied beside a ``model.onnx`` written by
``tinydit export --format onnx`` and used anywhere onnxruntime runs. It follows ``tinydit sample``
exactly (the time convention t = 1 noise -> t = 0 data, Euler and Heun on the uniform grid, classifier-
free guidance inside an interval of t), so from the same initial noise it draws the same images, to
within float rounding (tests/test_export.py checks one uint8 level). Its ancestral sampler does the same
given the same noise at every step (``fresh``).

    sampler = OnnxSampler("model.onnx")
    x = sampler.sample(noise, y, steps=16, cfg_scale=2.0, sampler="heun", cfg_interval=(0.1, 0.8))
    # noise: float32 (N, C, H, W); y: int64 labels (N,) or caption ids (N, L) (sampler.encode(prompts))
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort

__all__ = ["OnnxSampler", "to_uint8"]

_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")  # the tokenizer's words (tinydit.tokens)
PAD, BOS, UNK = 0, 1, 2


def to_uint8(x: np.ndarray) -> np.ndarray:
    """Images in [-1, 1] -> uint8 [0, 255], rounded (half to even) as tinydit.images.to_uint8 rounds them."""
    return np.round(np.clip((x.astype(np.float32) + 1) / 2, 0, 1) * 255).astype(np.uint8)


class OnnxSampler:
    """The velocity model v(x, t, y) of an exported checkpoint and the samplers of ``tinydit sample``."""

    def __init__(self, path: str):
        self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        props = self.session.get_modelmeta().custom_metadata_map
        self.meta = json.loads(props["tinydit"])  # image shape, conditioning, time convention, sampler settings

    def encode(self, prompts: list[str]) -> np.ndarray:
        """Captions -> ids (N, L) int64, as the checkpoint's tokenizer encodes them."""
        tok = self.meta["tokenizer"]
        ids = {w: i + 3 for i, w in enumerate(tok["vocab"])}
        rows = []
        for p in prompts:
            row = [BOS] + [ids.get(w, UNK) for w in _WORD.findall(p.lower())][: tok["max_len"] - 1]
            rows.append(row + [PAD] * (tok["max_len"] - len(row)))
        return np.array(rows, dtype=np.int64)

    def null(self, y: np.ndarray) -> np.ndarray:
        """The unconditional input shaped like y: the null label, or the empty caption (BOS, then PAD)."""
        if y.ndim == 1:
            return np.full_like(y, self.meta["n_classes"])
        empty = np.zeros_like(y)
        empty[:, 0] = BOS
        return empty

    def velocity(
        self, x: np.ndarray, t: float, y: np.ndarray, cfg_scale: float, guided: bool, d: float = 0.0
    ) -> np.ndarray:
        """v at time t for x (N, C, H, W); guided: v_uncond + s (v_cond - v_uncond) in one batch of 2N.
        ``d``: the step a shortcut model is told it will take (0: the instantaneous velocity)."""
        n = x.shape[0]
        if not guided or cfg_scale == 1.0:
            return self._v(x, np.full(n, t, np.float32), y, d)
        v = self._v(np.concatenate([x, x]), np.full(2 * n, t, np.float32), np.concatenate([y, self.null(y)]), d)
        v_cond, v_uncond = v[:n], v[n:]
        return v_uncond + np.float32(cfg_scale) * (v_cond - v_uncond)

    @staticmethod
    def _ancestral_step(x, v, t, t_next, eta, fresh, i):
        """x at t_next from x and v at t: the predictions x0 and eps put back at t_next with part of the
        noise drawn afresh (s of it; eta 1: DDPM's posterior noise, 0: none)."""
        x0, eps = x - np.float32(t) * v, x + np.float32(1.0 - t) * v
        if t_next <= 0.0:
            return x0
        r = (1.0 - t) * t_next / ((1.0 - t_next) * t)
        s = eta * t_next * float(np.sqrt(max(0.0, 1.0 - r * r)))
        keep = np.float32(np.sqrt(max(0.0, t_next**2 - s**2)))
        return np.float32(1.0 - t_next) * x0 + keep * eps + np.float32(s) * fresh(i)

    def _v(self, x, t, y, d):
        feed = {"x": x.astype(np.float32), "t": t, "y": y.astype(np.int64)}
        if self.meta["shortcut"]:
            feed["d"] = np.full_like(t, d)
        return self.session.run(None, feed)[0]

    def sample(
        self,
        noise: np.ndarray,
        y: np.ndarray,
        steps: int = 32,
        cfg_scale: float = 2.0,
        sampler: str = "euler",
        cfg_interval: tuple[float, float] | None = None,
        on_step=None,
        eta: float = 1.0,
        fresh=None,
    ) -> np.ndarray:
        """From noise (N, C, H, W) at t = 1 to images at t = 0. ``on_step(i, x)`` sees every step.

        ``ancestral`` (DDIM's eta family on the straight path, as ``tinydit.flow.samplers.ancestral``) draws
        fresh noise at every step but the last: ``fresh(i)`` returns step i's (N, C, H, W) normal noise
        (default: numpy's, seeded 0). Its noise is not torch's, so it draws other images than ``tinydit
        sample`` from the same initial noise; at eta 0 it is Euler."""
        if sampler not in ("euler", "heun", "ancestral"):
            raise ValueError(f"sampler {sampler!r}: this sampler runs euler, heun or ancestral")
        if fresh is None:
            rng = np.random.default_rng(0)
            fresh = lambda i: rng.standard_normal(noise.shape).astype(np.float32)  # noqa: E731
        lo, hi = (0.0, 1.0) if cfg_interval is None else cfg_interval
        ts = np.linspace(1.0, 0.0, steps + 1)  # the uniform grid, float64 as in tinydit.flow.grids
        ts[0], ts[-1] = 1.0, 0.0
        x = noise.astype(np.float32)
        for i, (t, t_next) in enumerate(zip(ts[:-1], ts[1:], strict=True)):
            t, t_next = float(t), float(t_next)
            dt = t_next - t
            v = self.velocity(x, t, y, cfg_scale, lo <= t <= hi, d=-dt if sampler == "euler" else 0.0)
            x_pred = x + np.float32(dt) * v
            if sampler == "ancestral":
                x = self._ancestral_step(x, v, t, t_next, eta, fresh, i)
            elif sampler == "heun" and t_next > 0:  # the trapezoidal corrector; the last step stays Euler
                v2 = self.velocity(x_pred, t_next, y, cfg_scale, lo <= t_next <= hi)
                x = x + np.float32(dt) * np.float32(0.5) * (v + v2)
            else:
                x = x_pred
            if on_step is not None:
                on_step(i, x)
        return x
