"""Fetching an external run's canaries from the service, the part of
:class:`flaudit.server.http_reporter.HttpRoundReporter` on the training path: each round's canary
sum (``GET .../rounds/{t}/canary-sum``), the next ``canaries_ahead`` rounds' fetched ahead on a
thread of their own, and the rounds that train without canaries (service away, round budget
spent), stated as gaps.

:class:`CanaryFetching` is a mixin: its state (``_canaries``, ``_no_canaries``, ``_given_up``,
``_ahead_busy``) is set up by ``HttpRoundReporter.__init__``, and it sends through the
reporter's requests and fail-open state.
"""

from __future__ import annotations

import threading

import numpy as np

from .reporting import ReportingError, ServiceUnreachable

__all__ = ["CanaryFetching"]


class CanaryFetching:
    """Canary fetches of :class:`flaudit.server.http_reporter.HttpRoundReporter` (a mixin)."""

    def _prerequisites_pending(self) -> bool:
        with self._cond:
            return any(item.path in ("claim", "initial-model") for item in self._outbox)

    def _kick_and_wait(self, seconds: float) -> bool:
        """Have the outbox tried now and wait up to ``seconds`` for the claim and the initial
        model to be delivered (canaries need them); whether they were."""
        return self._kick_until(self._prerequisites_pending, seconds)

    def _fetch_canaries(self, server_round: int, attempts: int) -> tuple[np.ndarray, int]:
        """``(sum, c)``: the sum of the round's ``c`` unit canaries, float32 ``(d,)``
        (``GET .../canary-sum``: ``4 d`` bytes on the wire and in memory whatever ``c``;
        docs/estimators.md, "Canary replies from the round's sum")."""
        response = self._request(
            "GET",
            f"rounds/{int(server_round) + self._round_offset}/canary-sum",
            attempts=attempts,
            headers={"Accept": "application/octet-stream"},
            timeout=self.fetch_timeout,
        )
        dim = int(response.headers["X-Canary-Dim"])
        total = np.frombuffer(response.content, dtype="<f4").reshape(dim)
        return total, int(response.headers["X-Canary-Count"])

    @property
    def missing_canaries(self) -> dict[int, str]:
        """Rounds whose canaries could not be had so far, with the reason (a copy)."""
        with self._cond:
            return dict(self._no_canaries)

    def without_canaries(self, server_round: int, reason: str) -> None:
        """Round ``server_round`` trains without its canaries (they did not arrive within the
        wrapper's round budget): reported with ``canaries_missing``; a fetch of them still in
        flight is dropped when it returns."""
        with self._cond:
            if int(server_round) in self._given_up:
                return
            self._given_up.add(int(server_round))
        self._without_canaries(server_round, reason)  # (stated once: a failed fetch may have)

    def _without_canaries(self, server_round: int, reason: str) -> tuple[np.ndarray, int]:
        # a failed prefetch and the round's own second try both end here, and a later try may
        # still succeed: the round is logged once, when it is reported without canaries
        with self._cond:
            first = int(server_round) not in self._no_canaries
            self._no_canaries[int(server_round)] = reason
        if first:
            self._gap(server_round, "no_canaries", reason)
        return np.empty(0, dtype=np.float32), 0

    def round_canaries(self, server_round: int) -> np.ndarray:
        """The unit canary vectors the service schedules for ``server_round``: float32 ``(c, d)``,
        ``c`` canary replies per unit of clip norm, rows ``sum / c``: a read-only broadcast view
        of one ``d``-vector (:meth:`round_canary_sum`; empty when they cannot be had)."""
        total, count = self.round_canary_sum(server_round)
        if count == 0:
            return np.empty((0, total.shape[0]), dtype=np.float32)
        return np.broadcast_to(total / np.float32(count), (count, total.shape[0]))

    def round_canary_sum(self, server_round: int) -> tuple[np.ndarray, int]:
        """``(sum, c)``: the sum of the ``c`` unit canaries the service schedules for
        ``server_round``, float32 ``(d,)`` (the built-in ServerApp of a deployment audit adds it
        times the clip norm; the wrapper splits it into ``c`` replies).

        With ``"continue"``, ``c = 0`` (and an empty sum) when they cannot be had (the round
        then trains without canaries and is reported so); the next ``canaries_ahead`` rounds'
        are fetched with them.
        """
        self._raise_pending()
        t = int(server_round)
        self.moved(t, "training")
        empty = np.empty(0, dtype=np.float32), 0
        if not self._fail_open:
            if t in self._canaries:
                return self._canaries.pop(t)
            try:
                return self._fetch_canaries(t, self.max_retries + 1)
            except ServiceUnreachable as error:
                raise self._stopped("GET", f"rounds/{t}/canaries", error) from None
        if self._disabled is not None or t in self._given_up:
            return empty
        block = self._canaries.pop(t, None)
        if block is None:
            if self._prerequisites_pending() and not self._kick_and_wait(2.0):
                if self._disabled is not None:
                    return empty
                return self._without_canaries(
                    t, "service unreachable: the claim and the initial model were not delivered yet"
                )
            down = self._down_since is not None
            try:
                block = self._fetch_canaries(t, 1 if down else min(self.max_retries, 2) + 1)
            except ServiceUnreachable as error:
                self._went_down(error.problem)
                if t in self._given_up:
                    return empty
                return self._without_canaries(t, f"service unreachable ({error.problem})")
            except ReportingError as error:
                self._refused(error, f"the canaries of round {t}")
                return empty
        # fetched after all (an earlier attempt, e.g. a prefetch during the outage, had failed)
        with self._cond:
            if t in self._given_up:  # too late: the round trained without them
                return empty
            self._no_canaries.pop(t, None)
        self._fetch_ahead_later(t, int(block[0].nbytes))
        return block

    def _fetch_ahead_later(self, t: int, block_bytes: int) -> None:
        """Fetch the next rounds' canaries on a thread of their own (one at a time), so a
        round's canaries fetched ahead are handed over at once, even while the service hangs."""
        with self._cond:
            if self._ahead_busy or self._closed.is_set():
                return
            self._ahead_busy = True

        def work() -> None:
            try:
                self._fetch_ahead(t, block_bytes)
            finally:
                with self._cond:
                    self._ahead_busy = False

        threading.Thread(target=work, name="flaudit-canaries-ahead", daemon=True).start()

    def _fetch_ahead(self, t: int, block_bytes: int) -> None:
        last = t + self.canaries_ahead
        if self._num_rounds is not None:
            last = min(last, int(self._num_rounds) - self._round_offset)
        budget = self.buffer_bytes // 4
        for ahead in range(t + 1, last + 1):
            if ahead in self._canaries:
                continue
            if sum(int(b[0].nbytes) for b in list(self._canaries.values())) + block_bytes > budget:
                return
            try:
                self._canaries[ahead] = self._fetch_canaries(ahead, 1)
            except (ServiceUnreachable, ReportingError):
                return
        for old in [r for r in list(self._canaries) if r <= t]:
            self._canaries.pop(old, None)
