"""What a gate run proves: an exact upper confidence bound on the rate of suspect divergences.

Zero divergences in n prompts does not show that the rate is zero; it shows, at confidence
1 - a, that the rate is below the exact one-sided Clopper-Pearson bound

    U(x, n) = the p with P(X <= x | n, p) = a,   X ~ Binomial(n, p)
            = BetaInv(1 - a; x + 1, n - x)         (x < n; U = 1 at x = n, 0 prompts)
    U(0, n) = 1 - a^(1/n)                          (6 prompts: 39%; 59 prompts: 5%; 299 prompts: 1%)

over the prompts on which speculation took part (analysis/activity.py: a prompt whose spec-on
answers used no accepted draft proves nothing about speculation), x being those of them with a
suspect or untriaged divergence. The prompts are treated as independent draws from the traffic
the prompt set stands for: the bound is about that traffic, not about prompts unlike it.

``prompts_needed(x, rate)``: the least n at which U(x, n) <= rate, the suspect count staying x.
"""

from __future__ import annotations

import math

from scipy.special import betaincinv

CONFIDENCE = 0.95
RATES = (0.01, 0.05)  # the rates a report states the prompts needed for


def rate_upper_bound(suspect: int, prompts: int, confidence: float = CONFIDENCE) -> float:
    """U(x, n) at ``confidence``; 1.0 when nothing was exercised or every prompt was suspect."""
    if prompts < 0 or not 0 <= suspect <= max(prompts, 0):
        raise ValueError(f"{suspect} suspect of {prompts} prompts")
    if prompts == 0 or suspect == prompts:
        return 1.0
    if suspect == 0:  # closed form, exact also where the inverse beta loses digits
        return 1.0 - (1.0 - confidence) ** (1.0 / prompts)
    return float(betaincinv(suspect + 1, prompts - suspect, confidence))


def prompts_needed(suspect: int, rate: float, confidence: float = CONFIDENCE) -> int:
    """The least number of exercised prompts whose bound, with ``suspect`` of them suspect, is at
    most ``rate`` (0 < rate < 1): counted up from the number zero suspects need (the bound only
    grows with the suspects), closed form at zero."""
    if not 0 < rate < 1:
        raise ValueError(f"rate {rate} outside (0, 1)")
    n = math.ceil(math.log(1.0 - confidence) / math.log(1.0 - rate) - 1e-9)
    if suspect == 0:
        return n
    n = max(n, suspect + 1)
    while rate_upper_bound(suspect, n, confidence) > rate:
        n += 1
    return n


def percent(rate: float) -> str:
    """0.393 -> "39.3%", 0.0153 -> "1.53%", 0.01 -> "1%", 1.0 -> "100%" (three significant digits)."""
    return f"{rate * 100:.3g}%"
