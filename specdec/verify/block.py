"""Block verification of a chain: the drafts judged jointly (Sun et al., arXiv 2403.10444).

Same arguments and answer as chain.sampled_chain, never fewer accepted tokens in expectation.
block_plan holds the math and the proof; block_weights and token_weights are the two rules'
P(keep at least i drafts) along one drafted path, side by side.
"""

from __future__ import annotations

import numpy as np

from ..sampling import draw


def block_chain(drafts: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Block verification: the drafts judged jointly (Sun et al., arXiv 2403.10444, Algorithm 2).

    Same arguments and answer as sampled_chain: drafts, k tokens; q: [k, n_vocab]
    the rows they were drawn from; p: [k+1, n_vocab] target rows (filtered like q).
    Returns (n accepted, the token emitted after them). Two draws: how many drafts
    to keep, then the token after them; block_plan holds all the math.

    Why jointly. Token-wise, a draft the draft model over-proposes (q > p) is
    rejected with probability 1 - p/q even when the drafts before it were ones
    the target likes more than the draft does (p > q): that surplus is thrown
    away. Block verification carries it along the block as a weight, so a later
    token can spend it. The paper's binary example (target P(a) = 1/3, draft
    P(a) = 2/3, two drafts): 10/9 accepted drafts per round token-wise, 11/9 here.
    """
    stop, rows = block_plan(drafts, q, p)  # [k+1], [k+1, n_vocab]
    n = draw(stop, rng)  # accept the first n drafts
    # n < k: the block residual at row n; n == k: the bonus from p[k].
    # NOTE: the residual must be renormalised; it sums to r_n, not 1.
    return n, draw(rows[n] / rows[n].sum(), rng)


def block_plan(drafts: list[int], q: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stop [k+1]: P(accept exactly the first i drafts), rows [k+1, n_vocab]: what to draw after them).

    rows are unnormalised: row i < k is the block residual max(w_i p[i] - q[i], 0),
    row k is p[k] (the bonus); the token after i accepted drafts follows rows[i] / rows[i].sum().

    The paper's letters -> specdec's. Sun et al. write M_b for the target and M_s
    for the draft, gamma for the block length, X_1..X_gamma for the drafts and p_i
    for a *weight*; here the target is p, the draft q, the block length k, and
    the weight is w (p is taken). With 0-based rows as everywhere in specdec:
    drafts[i] was drawn from q[i] and is judged on p[i]; "stop at i" means keep
    drafts[:i] and draw the next token at row i.

    Algorithm 2, in specdec's letters:
        w_0 = 1,   w_i = min(1, w_(i-1) p[i-1](x_(i-1)) / q[i-1](x_(i-1)))   for i = 1..k
            (the weight carried along the block: NOT a per-token min(1, p/q))
        r_i = sum_x max(w_i p[i](x) - q[i](x), 0)                            for i < k
            (the mass of the block residual at row i)
        h_k = w_k,   h_i = r_i / (r_i + 1 - w_i)                             for 1 <= i < k
        coins u_1..u_k uniform; tau = the LARGEST i with u_i <= h_i (0 if none)
        tau == k: emit all drafts and a bonus from p[k]
        tau < k:  emit drafts[:tau] and a token from the block residual
                  norm(max(w_tau p[tau] - q[tau], 0))
    Going from the end, tau = k with probability h_k, else k-1 with probability
    h_(k-1), ...; so P(tau = i) = h_i prod_(j > i) (1 - h_j), with h_0 = 1. This
    function returns that law (stop) instead of flipping k coins: one draw.

    Why the output is exactly p (a proof sketch, written for this code; the
    paper proves it its own way). Write Q(x_:i) = prod_(j<i) q[j](x_j), P(x_:i)
    likewise with p, all rows along the drafted path.
    (1) P(tau >= i and the first i drafts are x_:i) = Q(x_:i) w_i.  From the end:
        at i = k it is Q h_k = Q w_k. If it holds at i + 1, summing over the
        next draft y gives Q(x_:i) sum_y min(q[i](y), w_i p[i](y)) = Q (w_i - r_i),
        so P(tau < i + 1, x_:i) = Q (1 - w_i + r_i), and the fresh coin at i
        stops there with probability h_i: P(tau = i, x_:i) = Q r_i. Together
        P(tau >= i, x_:i) = Q (w_i - r_i + r_i) = Q w_i.  (This is what h_i is for.)
    (2) Let A_m(s) = P(tau >= m, drafts start with s) = Q(s) w_m and B_m(s) the
        probability that the round stops earlier and its output, continued by
        the target itself, starts with s (|s| = m). Claim: A_m + B_m = P(s).
        True at m = 0 (1 + 0). Step m -> m + 1 with s' = s + (y,):
            A_(m+1) = Q(s) q[m](y) w_(m+1) = Q(s) min(q[m](y), w_m p[m](y))
            B_(m+1) = B_m p[m](y) + P(tau = m, s) norm(residual)(y)
                    = B_m p[m](y) + Q(s) max(w_m p[m](y) - q[m](y), 0)     (by (1))
        and min(q, w p) + max(w p - q, 0) = w p, so A + B = (A_m + B_m) p[m](y)
        = P(s'). At m = k the bonus is drawn from p[k], so every sequence of
        k + 1 tokens has probability P(s): the round's output, continued by the
        target, is distributed exactly as the target's own sampling.
    Never fewer accepted in expectation than token-wise: E[tau] = sum_i E_q[w_i]
    by (1), and w_i >= prod_(j<i) min(1, p[j](x_j) / q[j](x_j)), token-wise's
    P(accept the first i), draft by draft (block_weights, token_weights).

    NOTE: the residual carries the weight w_i. norm(max(p - q, 0)), the
    token-wise residual, is wrong here, and so nearly right that only the exact
    law of a round shows it (tests/test_block.py).
    """
    k = len(drafts)
    w = block_weights(drafts, q, p)  # [k+1]
    if k == 0:  # nothing drafted: draw from p[0] (q may be None)
        return np.ones(1, np.float32), p[:1]
    rows = np.empty((k + 1, p.shape[-1]), np.float32)  # [k+1, n_vocab]
    residual = rows[:k]  # [k, n_vocab]: the block residual max(w_i p[i] - q[i], 0) at rows 0..k-1, in place
    np.multiply(w[:k, None], p[:k], out=residual)
    residual -= q
    np.maximum(residual, 0, out=residual)
    r = residual.sum(axis=-1)  # [k]: r_i
    # h_i = r_i / (r_i + 1 - w_i) for 1 <= i < k. A zero denominator (r_i = 0 and w_i = 1: p[i] == q[i]
    # up to rounding) means stopping at i has probability 0; h_i = 1 then, any value would do.
    denominator = r[1:] + 1 - w[1:k]  # [k-1]
    h = np.ones(k + 1, np.float32)  # h_0 = 1: when every later coin fails, the round keeps 0 drafts
    h[1:k] = np.divide(r[1:], denominator, out=np.ones_like(denominator), where=denominator > 0)
    h[k] = w[k]
    # P(tau = i) = h_i prod_(j > i) (1 - h_j): the coins from the end, the first success wins.
    later = np.cumprod((1 - h)[::-1])[::-1]  # [k+1]: later[i] = prod_(j >= i) (1 - h_j)
    stop = h * np.append(later[1:], np.float32(1))  # [k+1]; sums to 1 because h_0 = 1
    # NOTE: the residual rows are NOT renormalised here (k x n_vocab divisions per round for one row
    # drawn): block_chain renormalises the row it draws from. A row of mass 0 is replaced by p[i]:
    # it is drawn from only where stopping had probability ~0 (h_i = 1 above, or h_0 with p[0] == q[0]
    # up to rounding), and p is the right answer there, as in sampled_chain.
    empty = np.flatnonzero(r <= 0)
    rows[empty] = p[empty]
    rows[k] = p[k]  # all k accepted: the bonus token
    return stop, rows


def block_weights(drafts: list[int], q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """[k+1] float32: w_0 = 1, w_i = min(1, w_(i-1) p[i-1](x) / q[i-1](x)): the weight carried along the block.

    w_i is also P(block verification keeps at least i drafts | the first i drafts),
    averaged over the later drafts (block_plan, step (1)): sum(w[1:]) is the
    expected number of drafts a round accepts, from the drafted path alone.
    """
    w = np.ones(len(drafts) + 1, np.float32)
    for i, x in enumerate(drafts):
        # q[i, x] > 0: x was drawn from q[i].
        w[i + 1] = min(np.float32(1), w[i] * p[i, x] / q[i, x])
    return w


def token_weights(drafts: list[int], q: np.ndarray, p: np.ndarray) -> np.ndarray:
    """[k+1] float32: prod_(j<i) min(1, p[j](x_j) / q[j](x_j)), token-wise's P(accept the first i drafts).

    Never above block_weights, draft by draft: min(1, w r) >= w min(1, r) for w <= 1.
    """
    ratios = np.array([min(1, p[i, x] / q[i, x]) for i, x in enumerate(drafts)], np.float32)  # [k]
    return np.cumprod(np.append(np.float32(1), ratios)).astype(np.float32)
