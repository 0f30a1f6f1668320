"""Sampling an exported TinyDiT model with numpy and onnxruntime alone: no torch, no tinydit.

This file imports nothing of tinydit or torch, so it can be copied beside a ``model.onnx`` written by
``tinydit export --format onnx`` and used anywhere onnxruntime runs. It follows ``tinydit sample``
exactly (the time convention t = 1 noise -> t = 0 data; every fixed-step sampler: euler, heun, midpoint,
heun-first and ancestral; the uniform or the shifted time grid; classifier-free guidance inside an
interval of t), so from the same initial noise it draws the same images, to within float rounding
(tests/test_export.py checks one uint8 level). Its ancestral sampler does the same given the same noise
at every step (``fresh``). For dopri5, whose adaptive steps it does not take, it runs ``STAND_IN``.

    sampler = OnnxSampler("model.onnx")
    x = sampler.sample(noise, y, steps=16, cfg_scale=2.0, sampler="heun", cfg_interval=(0.1, 0.8))
    x = sampler.sample(noise, y, **sampler.recorded())   # the settings the checkpoint records
    # noise: float32 (N, C, H, W); y: int64 labels (N,) or caption ids (N, L) (sampler.encode(prompts))
"""

from __future__ import annotations

import json
import re

import numpy as np
import onnxruntime as ort

__all__ = ["OnnxSampler", "to_uint8", "time_grid", "SAMPLERS", "STAND_IN"]

_WORD = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*")  # the tokenizer's words (tinydit.tokens)
PAD, BOS, UNK = 0, 1, 2
SAMPLERS = ("euler", "heun", "midpoint", "heun-first", "ancestral")  # tinydit.flow.solvers' fixed-step ones
STAND_IN = {"dopri5": "heun"}  # run in place of a recorded sampler with adaptive steps, with its steps
DEFAULT_SHIFT = 3.0  # tinydit.flow.grids.DEFAULT_SHIFT, SD3's


def time_grid(steps: int, grid: str = "uniform", shift: float | None = None) -> np.ndarray:
    """The times (steps + 1,) float64 from 1 to 0 exactly, as tinydit.flow.grids.time_grid: equal steps, or
    the shifted grid t' = s t / (1 + (s - 1) t) (SD3), short steps near the noise."""
    ts = np.linspace(1.0, 0.0, steps + 1)
    if grid == "shifted":
        s = DEFAULT_SHIFT if shift is None else shift
        ts = s * ts / (1 + (s - 1) * ts)
    elif grid != "uniform":
        raise ValueError(f"grid {grid!r}: use uniform or shifted")
    ts[0], ts[-1] = 1.0, 0.0
    return ts


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

    def recorded(self) -> dict:
        """The sampler settings the checkpoint records, as keywords of ``sample`` (dopri5 replaced by its
        ``STAND_IN``, with the recorded steps, guidance and interval)."""
        r = self.meta["sampler"]
        sampler = STAND_IN.get(r["sampler"], r["sampler"])
        out = dict(steps=r["steps"], cfg_scale=r["cfg_scale"], sampler=sampler, cfg_interval=r.get("cfg_interval"))
        out |= dict(grid=r.get("grid") or "uniform", shift=r.get("shift"))
        return out | ({"eta": 1.0 if r.get("eta") is None else r["eta"]} if sampler == "ancestral" else {})

    def velocity(
        self, x: np.ndarray, t: float, y: np.ndarray, cfg_scale: float, guided: bool, d: float = 0.0
    ) -> np.ndarray:
        """v at time t for x (N, C, H, W); guided: v_uncond + s (v_cond - v_uncond) in one batch of 2N.
        ``d``: the step a shortcut model is told it will take (0: the instantaneous velocity). An
        x-prediction model's clip of t is undone as tinydit.flow.guidance.unclipped_scale undoes it."""
        n = x.shape[0]
        if not guided or cfg_scale == 1.0:
            v = self._v(x, np.full(n, t, np.float32), y, d)
        else:
            v = self._v(np.concatenate([x, x]), np.full(2 * n, t, np.float32), np.concatenate([y, self.null(y)]), d)
            v_cond, v_uncond = v[:n], v[n:]
            v = v_uncond + np.float32(cfg_scale) * (v_cond - v_uncond)
        t_min = self.meta.get("x_pred_t_min")  # None: a velocity model (or an export from before the key)
        return v * np.float32(t_min / t) if t_min and 0.0 < t < t_min else v

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
        grid: str | None = None,
        shift: float | None = None,
    ) -> np.ndarray:
        """From noise (N, C, H, W) at t = 1 to images at t = 0 with ``sampler`` (one of ``SAMPLERS``) on
        ``steps`` of the time grid ``grid`` (None: the grid the checkpoint records, and its shift).

        ``on_step(i, t, x, x0)`` sees every step, as in tinydit.flow.solvers: x at the time t it reached,
        x0 = x_s - s v the clean image the step predicted from where it began.

        ``ancestral`` (DDIM's eta family on the straight path, as ``tinydit.flow.samplers.ancestral``) draws
        fresh noise at every step but the last: ``fresh(i)`` returns step i's (N, C, H, W) normal noise
        (default: numpy's, seeded 0). Its noise is not torch's, so it draws other images than ``tinydit
        sample`` from the same initial noise; at eta 0 it is Euler."""
        if sampler not in SAMPLERS:
            instead = f"; for {sampler} use {STAND_IN[sampler]}" if sampler in STAND_IN else ""
            raise ValueError(f"sampler {sampler!r}: this sampler runs {', '.join(SAMPLERS)}{instead}")
        if grid is None:
            record = self.meta["sampler"]
            grid, shift = record.get("grid") or "uniform", record.get("shift") if shift is None else shift
        if fresh is None:
            rng = np.random.default_rng(0)
            fresh = lambda i: rng.standard_normal(noise.shape).astype(np.float32)  # noqa: E731
        lo, hi = (0.0, 1.0) if cfg_interval is None else cfg_interval

        def f(x, t, d=0.0):  # the guided field, guided inside [lo, hi]
            return self.velocity(x, t, y, cfg_scale, lo <= t <= hi, d)

        ts = time_grid(steps, grid, shift)
        x = noise.astype(np.float32)
        for i, (t, t_next) in enumerate(zip(ts[:-1], ts[1:], strict=True)):
            t, t_next = float(t), float(t_next)
            dt = t_next - t
            euler = sampler == "euler" or (sampler == "heun-first" and t != 1.0)  # heun-first: Heun at t = 1 only
            v = f(x, t, d=-dt if euler else 0.0)  # a shortcut model is told an Euler step's size
            x_pred = x + np.float32(dt) * v  # the Euler step
            if sampler == "ancestral":
                x_next = self._ancestral_step(x, v, t, t_next, eta, fresh, i)
            elif sampler == "midpoint":
                x_mid = x + np.float32(0.5 * dt) * v
                x_next = x + np.float32(dt) * f(x_mid, t + 0.5 * dt)
            elif not euler and t_next > 0:  # heun's trapezoidal corrector; a last step to t = 0 stays Euler
                x_next = x + np.float32(dt) * np.float32(0.5) * (v + f(x_pred, t_next))
            else:
                x_next = x_pred
            if on_step is not None:
                on_step(i, t_next, x_next, x - np.float32(t) * v)
            x = x_next
        return x
