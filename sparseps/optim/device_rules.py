"""The server-side optimizer rules as torch kernels, for rows held on a device (GPUPS).

GPUPS mode (:mod:`sparseps.worker.gpups`) trains a pass's rows in torch tensors on the
worker's device, so each rule needs a second implementation there. It follows the
compiled server kernels formula for formula, including their floating-point model
(:mod:`.numerics`): rows and state are stored as float32 but every update reads them
into float64 and computes there, stored values saturate at float32's max instead of
becoming infinite, and the same guards apply (negative stored accumulators count as 0,
FTRL flushes gradients below ``2**-63`` and never divides by a zero denominator). The
results therefore equal the server's to the last float32 bit on almost every element
(``pow``/``sqrt`` of a different math library can differ in float64's last bit, which
rarely survives the float32 store); ``tests/worker/test_gpups_rules.py`` checks each rule
against its numba kernel on identical inputs.

Layout: ``weights`` float32 ``[N, dim]`` and ``state`` float32 ``[N, state_dim]`` (the
rule's ``state_columns`` in order), both on the device; ``rows`` int64 ``[u]`` unique
row indices and ``grads`` float32 ``[u, dim]`` the merged gradient of each row.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import ConfigError
from .base import Rule
from .numerics import F32_MAX

__all__ = ["DEVICE_RULES", "apply_rule", "apply_table_rules", "check_device_rule", "step_rows"]

_FLUSH = 2.0**-63  # FTRL's flush-to-zero threshold (sparseps.optim.ftrl.FLUSH)

Kernel = Callable[[Rule, torch.Tensor, torch.Tensor, torch.Tensor, int], None]


def _fit32(x: torch.Tensor) -> torch.Tensor:
    """Clamp to the finite float32 range (NaN passes through), still float64."""
    return x.clamp(-F32_MAX, F32_MAX)


def _settle(rule: Rule, w: torch.Tensor) -> torch.Tensor:
    """What the rule stores for new weights: clipped when the rule clips, then fit32."""
    clip = getattr(rule, "clip", None)
    if clip is not None:
        w = w.clamp(clip[0], clip[1])
    return _fit32(w).to(torch.float32)


def _sgd(rule, w, state, g, dim) -> tuple[torch.Tensor, torch.Tensor]:
    return _settle(rule, w - rule.lr * (g + rule.l2 * w)), state


def _adagrad(rule, w, state, g, dim):
    g = g + rule.l2 * w
    acc = state.to(torch.float64).clamp_min(0.0) + g * g
    w = w - rule.lr * g / (acc.sqrt() + rule.eps)
    return _settle(rule, w), _fit32(acc).to(torch.float32)


def _rowwise_adagrad(rule, w, state, g, dim):
    g = g + rule.l2 * w
    acc = state[:, :1].to(torch.float64).clamp_min(0.0) + (g * g).sum(1, keepdim=True) / dim
    w = w - rule.lr / (acc.sqrt() + rule.eps) * g
    return _settle(rule, w), _fit32(acc).to(torch.float32)


def _adam(rule, w, state, g, dim):
    old = state.to(torch.float64)
    m_old, v_old, t_old = old[:, :dim], old[:, dim : 2 * dim], old[:, 2 * dim :]
    t = t_old.clamp_min(0.0) + 1.0
    step_size = rule.lr / (1.0 - torch.pow(rule.beta1, t))
    correction2 = torch.sqrt(1.0 - torch.pow(rule.beta2, t))
    g = g + rule.l2 * w
    m = rule.beta1 * m_old + (1.0 - rule.beta1) * g
    v = rule.beta2 * v_old.clamp_min(0.0) + (1.0 - rule.beta2) * g * g
    w = w - step_size * m / (v.sqrt() / correction2 + rule.eps)
    new_state = torch.cat([_fit32(m), _fit32(v), _fit32(t)], dim=1).to(torch.float32)
    return _settle(rule, w), new_state


def _ftrl(rule, w, state, g, dim):
    old = state.to(torch.float64)
    z_old, n_old = old[:, :dim], old[:, dim:].clamp_min(0.0)
    g = torch.where(g.abs() < _FLUSH, torch.zeros_like(g), g)
    n_new = _fit32(n_old + g * g)
    sigma = (n_new.sqrt() - n_old.sqrt()) / rule.alpha
    z = _fit32(z_old + g - sigma * w)
    denominator = (rule.beta + n_new.sqrt()) / rule.alpha + rule.l2
    safe = torch.where(denominator > 0.0, denominator, torch.ones_like(denominator))
    shrunk = -(z - torch.sign(z) * rule.l1) / safe
    w = torch.where((z.abs() <= rule.l1) | (denominator <= 0.0), torch.zeros_like(z), shrunk)
    return _settle(rule, w), torch.cat([z, n_new], dim=1).to(torch.float32)


#: rule name -> ``kernel(rule, w64, state, g64, dim) -> (weights f32, state f32)``
def _sparse_adagrad(rule, w, state, g, dim):
    g = g + rule.l2 * w
    g2sum = state[:, :1].to(torch.float64).clamp_min(0.0)  # the accumulator before the step
    step = rule.lr * (rule.initial_g2sum / (rule.initial_g2sum + g2sum)).sqrt()
    w = w - step * g
    g2sum = g2sum + (g * g).sum(dim=1, keepdim=True) / dim
    return _settle(rule, w), _fit32(g2sum).to(torch.float32)


DEVICE_RULES = {
    "sparse_adagrad": _sparse_adagrad,
    "sgd": _sgd,
    "adagrad": _adagrad,
    "rowwise_adagrad": _rowwise_adagrad,
    "adam": _adam,
    "ftrl": _ftrl,
}


def check_device_rule(rule: Rule, table: str) -> None:
    """Raise ``ConfigError`` unless ``rule`` has a device kernel (GPUPS needs one)."""
    if rule.name not in DEVICE_RULES:
        raise ConfigError(
            f"table {table!r}: Strategy(mode='gpups') has no device kernel for the rule "
            f"{rule.name!r}; device rules: {sorted(DEVICE_RULES)} (train this table with "
            "mode='sync' or 'async', or add its kernel to sparseps.optim.device_rules)"
        )


def apply_rule(
    rule: Rule, weights: torch.Tensor, state: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor
) -> None:
    """One step of ``rule`` on ``weights[rows]`` / ``state[rows]``, in place.

    Args:
        rule: the table's rule (one of :data:`DEVICE_RULES`).
        weights: float32 ``[N, dim]`` on the device.
        state: float32 ``[N, state_dim]`` on the same device.
        rows: int64 ``[u]`` unique row indices.
        grads: float32 ``[u, dim]``, the merged gradient of each row.
    """
    if rows.numel() == 0:
        return
    dim = weights.shape[1]
    w = weights.index_select(0, rows).to(torch.float64)
    g = grads.to(device=weights.device, dtype=torch.float64)
    new_w, new_state = DEVICE_RULES[rule.name](rule, w, state.index_select(0, rows), g, dim)
    weights.index_copy_(0, rows, new_w)
    if state.shape[1]:
        state.index_copy_(0, rows, new_state)


def apply_table_rules(config, weights: torch.Tensor, state: torch.Tensor, rows: torch.Tensor,
                      grads: torch.Tensor) -> None:  # fmt: skip
    """:func:`apply_rule` of a table's rule(s): a split table (Paddle's CTR accessor) steps
    its embed columns (the first ``embed_dim`` of ``weights``, the embed rule's state first
    in ``state``) and its embedx columns each with their own rule, as the server does."""
    accessor = config.accessor
    if not accessor.split:
        apply_rule(config.rule, weights, state, rows, grads)
        return
    edim = accessor.embed_dim
    embed_rule = accessor.embed_rule_or(config.rule)
    esd = embed_rule.state_dim(edim)
    for rule, cols, states in (
        (embed_rule, slice(0, edim), slice(0, esd)),
        (config.rule, slice(edim, None), slice(esd, None)),
    ):
        w, s = weights[:, cols].contiguous(), state[:, states].contiguous()
        apply_rule(rule, w, s, rows, grads[:, cols])
        weights[:, cols] = w
        state[:, states] = s


def step_rows(rule: Rule, storage: torch.Tensor, rows: torch.Tensor, grads: torch.Tensor,
              dim: int) -> None:  # fmt: skip
    """One step of ``rule`` on ``storage[rows]`` in place, ``storage`` float32
    ``[N, dim + state_dim]`` contiguous (the server's row layout).

    On a CPU device the rule's own compiled kernel runs on the tensor's memory (what the
    servers run: the same numbers, bit for bit, and several times faster than the torch
    kernels in float64); elsewhere :func:`apply_rule` on the two column blocks.
    """
    if rows.numel() == 0:
        return
    if storage.device.type == "cpu":
        g = grads.detach().to(torch.float32).contiguous().numpy()
        rule.update(storage.numpy(), rows.contiguous().numpy(), g, dim)
        return
    weights, state = storage[:, :dim], storage[:, dim:]
    apply_rule(rule, weights, state, rows, grads)
