"""Attention data parallelism as TensorRT-LLM's PyTorch executor serves it (issue 29): the ``dp``
ranks of one TP group, each with its own requests and scheduler, iterating in lock-step.

Why: a rank's MoE layers gather every rank's tokens (``costmodel.inference.attention_dp_dispatch``),
so each layer waits for the slowest rank's attention, and the executor's host collectives keep the
ranks on the same iteration. Simulating one rank with the others assumed its mirror image prices a
prompt only on the iterations the simulated rank prefills; under Poisson arrivals each rank's
prompts come at other times, and every one of them stalls all ranks. What the executor does
(NVIDIA/TensorRT-LLM@9521caf4 tensorrt_llm/_torch/pyexecutor/py_executor.py,
executor_request_queue.py), as simulated here:

- **request placement** (``ExecutorRequestQueue._schedule_attention_dp_requests`` /
  ``_balance_requests_across_ranks``): rank 0 fetches the new requests up to the ranks' room
  (``max_num_active_requests`` each) and hands them out longest prompt first, each to the rank
  with the fewest active prompt tokens (then requests, then rank: the heap's ``HeapVal`` order)
  among those below ``expected_num_active_requests`` = max(ceil((active + new) / ranks), the most
  any rank holds).
- **each rank's iteration**: its own capacity (paged KV) and micro-batch scheduling, as one
  replica's (``serve.simulate``): every decoding request one token, then whole prompts (or chunks)
  under ``max_num_tokens``.
- **context balancing** (``PyExecutor._balance_adp_requests`` under ``attention_dp_config.
  enable_balance``; ``Scheduler.adp_balance`` = (batching_wait_iters W, timeout_iters T)): the
  ranks all-gather their scheduled context and generation counts; when every rank has a context
  scheduled and room for it, contexts run (after W iterations more of waiting while every rank also
  decodes); otherwise no rank runs its contexts until T iterations have passed so (or some rank has
  no generation request): the counter runs whether or not any prompt waits.
- **lock-step price**: an iteration costs the slowest rank's pass less its MoE part, plus the MoE
  part (routed experts, their kernels, the token exchange: ``inference.routed_moe_time``) at the
  ranks' mean tokens (the experts run on all ranks' tokens). With identical ranks this is the
  one-rank ``IterationCost.time`` exactly. A rank with nothing scheduled runs a one-token dummy
  (``PyExecutor._pad_attention_dp_dummy_request``; assumed for a rank whose contexts are held too).

Not simulated: the overlap scheduler's one-iteration lag of a response, and the per-token
gather of streamed responses to rank 0 (no published rate).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from heapq import heapify, heappop, heappush

import numpy as np

from autoparallel.serve.simulate import IterationCost, Scheduler, SimResult


def simulate_ranks(cost: IterationCost, sched: Scheduler, arrival, inp, out) -> SimResult:
    """The ``sched.dp`` ranks of one attention-DP replica serving ``arrival`` / ``inp`` / ``out``
    (the module docstring); ``sched``'s limits and pool are one rank's. One iteration at a time."""
    if cost.pp != 1 or sched.steps != 1 or sched.multi_step != 1 or sched.prefill_priority or sched.prefill_min_waiting:
        raise ValueError("attention DP is simulated without PP, multi-step scheduling or a prefill policy")
    return _Ranks(cost, sched, arrival, inp, out).run()


class _Ranks:
    def __init__(self, cost: IterationCost, sched: Scheduler, arrival, inp, out):
        n = self.n = len(arrival)
        self.cost, self.sched = cost, sched
        self.arrival_in, self.inp_in, self.out_in = arrival, inp, out
        self.arrival = np.asarray(arrival, float).tolist()
        inp_a, out_a = np.asarray(inp).astype(np.int64), np.asarray(out).astype(np.int64)
        self.inp, self.out = inp_a.tolist(), out_a.tolist()
        B = self.B = sched.block
        self.full = sched.reserve_full
        self.need_full = ((-(-(inp_a + np.maximum(out_a, sched.max_new_tokens)) // B)).tolist()
                          if self.full else None)
        self.first, self.finish = [math.nan] * n, [math.nan] * n
        self.rank, self.phase = [0] * n, [0] * n  # phase: 0 queued / gone, 1 prefilling, 2 decoding
        self.gen, self.target, self.done, self.held = [0] * n, [0] * n, [0] * n, [0] * n
        self.d0, self.p0, self.fin, self.residue = [0] * n, [0] * n, [0] * n, [0] * n
        dp = self.dp = sched.dp
        self.waiting = [deque() for _ in range(dp)]  # placed on the rank, not admitted
        self.prefilling = [deque() for _ in range(dp)]
        self.order = [[] for _ in range(dp)]  # admissions, for preemption
        self.active = [0] * dp  # requests placed on the rank (waiting and running)
        self.active_tokens = [0] * dp  # their prompt tokens
        self.running, self.n_dec, self.ctx_sum = [0] * dp, [0] * dp, [0] * dp
        self.free = [sched.kv_blocks] * dp
        self.cnt = [[0] * B for _ in range(dp)]
        self.heap: list[int] = []

    def place(self, new: list[int]) -> None:
        """``_balance_requests_across_ranks``: longest prompt first, each to the rank with the
        fewest active prompt tokens among those under the expected count."""
        active, tokens, inp = self.active, self.active_tokens, self.inp
        expected = max(-(-(sum(active) + len(new)) // self.dp), max(active))
        heap = [(tokens[q], active[q], q) for q in range(self.dp) if active[q] < expected]
        heapify(heap)
        for r in sorted(new, key=lambda r: -inp[r]):
            tok, count, q = heappop(heap)
            self.rank[r] = q
            self.target[r] = inp[r]
            self.waiting[q].append(r)
            active[q] += 1
            tokens[q] += inp[r]
            if count + 1 < expected:
                heappush(heap, (tok + inp[r], count + 1, q))

    def admit(self, q: int) -> None:
        """The rank's capacity scheduler: the head of its queue while a slot and its blocks are free."""
        waiting, B, full = self.waiting[q], self.B, self.full
        while waiting and self.running[q] < self.sched.max_running:
            r = waiting[0]
            need = self.need_full[r] if full else -(-self.target[r] // B)
            if need > self.free[q]:
                break
            waiting.popleft()
            self.free[q] -= need
            self.held[r], self.phase[r], self.done[r] = need, 1, 0
            self.prefilling[q].append(r)
            self.order[q].append(r)
            self.running[q] += 1

    def evict(self, q: int, D: int) -> None:
        """``_Replay._evict`` on rank ``q``: its latest admitted request back to its queue's front."""
        order, phase = self.order[q], self.phase
        victim = order.pop()
        while phase[victim] == 0:
            victim = order.pop()
        positions = self.p0[victim] + (D - self.d0[victim])
        if phase[victim] == 2:
            self.gen[victim] += D - self.d0[victim]
            self.n_dec[q] -= 1
            self.ctx_sum[q] -= positions
            self.cnt[q][self.residue[victim]] -= 1
        else:
            self.prefilling[q].remove(victim)
        self.free[q] += self.held[victim] if (self.full or phase[victim] == 1) else -(-positions // self.B)
        phase[victim] = 0
        self.running[q] -= 1
        self.target[victim] = self.inp[victim] + self.gen[victim]
        self.waiting[q].appendleft(victim)

    def contexts(self, q: int) -> list[tuple[int, int]]:
        """The rank's prompt chunks this iteration, (request, tokens), under its token budget beside
        its decodes (``Scheduler.chunks`` at one micro-batch step)."""
        budget, chunked = self.sched.budget, self.sched.chunked
        tokens, out = self.n_dec[q], []
        for r in self.prefilling[q]:
            rem = self.target[r] - self.done[r]
            left = budget - tokens
            c = min(rem, left) if chunked else (rem if rem <= left or tokens == 0 else 0)
            if c <= 0:
                break
            tokens += c
            out.append((r, c))
        return out

    def release(self, chunks: list[list]) -> bool:
        """``_balance_adp_requests``: whether the ranks run their contexts this iteration."""
        balance = self.sched.adp_balance
        if not balance:
            return True
        wait_iters, timeout = balance
        max_batch = self.sched.max_running
        all_ctx = all(chunks)
        all_gen = all(n > 0 for n in self.n_dec)
        if all_ctx and all(n < max_batch for n in self.n_dec):
            self.waited = 0
            if all_gen:
                if self.batching < wait_iters:
                    self.batching += 1
                    return False
                self.batching = 0
            return True
        self.waited += 1
        if self.waited >= timeout or not all_gen:
            self.waited = 0
            return True
        return False

    def price(self, chunks: list[list]) -> float:
        """The lock-step iteration: the slowest rank's pass less its MoE part, plus the MoE part at
        the ranks' mean tokens (``IterationCost``'s tables: ``per_moe``)."""
        cost = self.cost
        per_tokens, per_moe, per_sampled = cost.per_tokens, cost.per_moe, cost.per_sampled
        max_t, max_s = cost.max_tokens, cost.max_seqs
        ctx_flops, ctx_bytes, chunk_flops = cost.ctx_flops, cost.ctx_bytes, cost.chunk_flops
        slowest, total = 0.0, 0
        for q in range(self.dp):
            dec = self.n_dec[q]
            tokens, sampled = dec, dec
            flops, nbytes = self.ctx_sum[q] * ctx_flops, self.ctx_sum[q] * ctx_bytes
            for r, c in chunks[q]:
                d = self.done[r]
                flops += chunk_flops * c * (d + c / 2.0)
                nbytes += ctx_bytes * d
                tokens += c
                sampled += d + c == self.target[r]
            if tokens == 0:  # a dummy generation request
                tokens = sampled = 1
            tokens = min(tokens, max_t)
            rank = (per_tokens[tokens] - per_moe[tokens] + per_sampled[min(sampled, max_s)]
                    + cost.attention(flops, nbytes))
            slowest = max(slowest, rank)
            total += tokens
        mean = min(round(total / self.dp), max_t)
        return slowest + per_moe[mean] + cost.hop[mean] + cost.pass_s

    def run(self) -> SimResult:
        n, B, full, dp = self.n, self.B, self.full, self.dp
        arrival, out, first, finish = self.arrival, self.out, self.first, self.finish
        gen, target, done, held, d0, p0, fin, residue, phase, rank = (
            self.gen, self.target, self.done, self.held, self.d0, self.p0, self.fin, self.residue, self.phase,
            self.rank)
        n_dec, ctx_sum, cnt, free, running, active = (self.n_dec, self.ctx_sum, self.cnt, self.free, self.running,
                                                     self.active)
        heap, queue, ranks = self.heap, deque(), range(dp)
        room = self.sched.max_running
        self.waited = self.batching = 0
        t, D, nxt, iterations, preemptions = 0.0, 0, 0, 0, 0
        while nxt < n or queue or any(active):
            while nxt < n and arrival[nxt] <= t:
                queue.append(nxt)
                nxt += 1
            space = dp * room - sum(active)
            if queue and space > 0:
                self.place([queue.popleft() for _ in range(min(space, len(queue)))])
            for q in ranks:
                if self.waiting[q]:
                    self.admit(q)
            if not any(running):
                t = max(t, arrival[nxt]) if nxt < n else t
                continue
            if not full:  # the decode tokens' new blocks, evicting while a rank's pool is short
                for q in ranks:
                    while cnt[q][(D + 1) % B] > free[q]:
                        self.evict(q, D)
                        preemptions += 1
                    free[q] -= cnt[q][(D + 1) % B]
            chunks = [self.contexts(q) for q in ranks]
            if not self.release(chunks):  # every iteration, contexts or none: its counters move on
                chunks = [[] for _ in ranks]
            t += self.price(chunks)
            iterations += 1
            D += 1
            for q in ranks:
                ctx_sum[q] += n_dec[q]
            below = (D + 1) * n
            while heap and heap[0] < below:
                f, r = divmod(heappop(heap), n)
                if phase[r] != 2 or fin[r] != f:
                    continue
                q = rank[r]
                finish[r] = t
                pos = p0[r] + (D - d0[r])
                n_dec[q] -= 1
                ctx_sum[q] -= pos
                cnt[q][residue[r]] -= 1
                free[q] += held[r] if full else -(-pos // B)
                self._gone(r, q)
            for q in ranks:
                for r, c in chunks[q]:
                    done[r] += c
                    if done[r] < target[r]:
                        continue
                    self.prefilling[q].remove(r)
                    gen[r] += 1
                    if first[r] != first[r]:
                        first[r] = t
                    if gen[r] >= out[r]:
                        finish[r] = t
                        free[q] += held[r]
                        self._gone(r, q)
                        continue
                    phase[r], d0[r], p0[r] = 2, D, target[r]
                    residue[r] = (D + 1 - target[r]) % B
                    cnt[q][residue[r]] += 1
                    n_dec[q] += 1
                    ctx_sum[q] += target[r]
                    fin[r] = D + out[r] - gen[r]
                    heappush(heap, fin[r] * n + r)
            # Decode-only stretch: no prompt anywhere and nothing the next iterations could place or admit.
            if not heap or any(self.prefilling[q] for q in ranks) or not self._stuck(queue, room):
                continue
            horizon = arrival[nxt] if nxt < n and not queue else math.inf
            k = heap[0] // n - D - 1  # stop one iteration before the first finish
            if horizon <= t or k <= 0:
                continue
            k, span = self._stretch(k, horizon, t, D)
            t += span
            iterations += k
            D += k
        return SimResult(np.asarray(self.arrival_in, float), np.asarray(first), np.asarray(finish),
                         np.asarray(self.inp_in), np.asarray(self.out_in), iterations, preemptions)

    def _stuck(self, queue, room: int) -> bool:
        """Whether no request could be placed or admitted before the next arrival or finish: the
        queue waits only for room, and each rank's queue head for a slot or blocks."""
        if queue and sum(self.active) < self.dp * room:
            return False
        for q in range(self.dp):
            waiting = self.waiting[q]
            if waiting:
                r = waiting[0]
                need = self.need_full[r] if self.full else -(-self.target[r] // self.B)
                if self.running[q] < room and need <= self.free[q]:
                    return False
        return True

    def _stretch(self, k: int, horizon: float, t: float, D: int) -> tuple[int, float]:
        """Decode-only iterations priced at once (numpy): at most ``k``, fewer where the next
        arrival (at ``horizon``) or a rank's free blocks come first; the balance counter moves on
        as on any iteration without contexts. Returns how many and their seconds (the state moved on)."""
        cost, B, dp = self.cost, self.B, self.dp
        rings = []
        if not self.full:  # as many as each rank's free blocks last (``_Replay._stretch``)
            for q in range(dp):
                if not self.n_dec[q]:
                    rings.append(None)
                    continue
                s = (D + 1) % B
                ring = list(itertools.accumulate(self.cnt[q][s:] + self.cnt[q][:s]))
                rounds, rest = divmod(self.free[q], self.n_dec[q])
                k = min(k, rounds * B + bisect.bisect_right(ring, rest))
                rings.append(ring)
            if k <= 0:
                return 0, 0.0
        steps = np.arange(k, dtype=float)
        slowest = np.zeros(k)
        total = 0
        per_tokens, per_moe, per_sampled, max_t, max_s = (cost.per_tokens, cost.per_moe, cost.per_sampled,
                                                          cost.max_tokens, cost.max_seqs)
        for q in range(dp):
            dec = self.n_dec[q]
            tokens = min(max(dec, 1), max_t)
            ctx = self.ctx_sum[q] + dec * steps
            a, b = ctx * (cost.ctx_flops * cost.per_flop), ctx * (cost.ctx_bytes * cost.per_byte)
            hi = np.maximum(np.maximum(a, b), 1e-300)
            att = hi * ((a / hi) ** cost.k + (b / hi) ** cost.k) ** (1.0 / cost.k)
            rank = att + (per_tokens[tokens] - per_moe[tokens] + per_sampled[min(max(dec, 1), max_s)])
            np.maximum(slowest, rank, out=slowest)
            total += tokens
        mean = min(round(total / dp), max_t)
        times = slowest + (per_moe[mean] + cost.hop[mean] + cost.pass_s)
        if horizon < math.inf:  # the iterations that start before the arrival (the first starts at t < horizon)
            k = 1 + int(np.searchsorted(t + np.cumsum(times[:k - 1]), horizon, side="left"))
        for q in range(dp):
            self.ctx_sum[q] += k * self.n_dec[q]
            if rings and rings[q] is not None:
                self.free[q] -= (k - 1) // B * self.n_dec[q] + rings[q][(k - 1) % B]
        if self.sched.adp_balance:
            self.waited = (self.waited + k) % self.sched.adp_balance[1] if all(self.n_dec) else 0
        return k, float(np.sum(times[:k]))

    def _gone(self, r: int, q: int) -> None:
        self.phase[r] = 0
        self.running[q] -= 1
        self.active[q] -= 1
        self.active_tokens[q] -= self.inp[r]
