"""The service client of a record-level audit (issue #37): what a Flower ServerApp's strategy
wrapper calls to audit the DP-SGD inside its clients (docs/record-level.md, "The service").

Every round, for each client it sends a train message to, the wrapper asks for that client's
canary plan (:meth:`RecordAuditClient.canary_plan`): a ``(steps, d)`` float32 array whose row
``s`` is the sum of the unit canary directions sampled at the client's DP-SGD step ``s``. The
canary seed and the seen/unseen split stay in the service. After training it reports every
client's update and DP parameters (:meth:`RecordAuditClient.report_round`) and gets the audit's
look back; :meth:`RecordAuditClient.end` gives the verdict with its cause.

Errors: :class:`RecordServiceError` (an HTTP error answer, with its status and the service's
words) or ``httpx.TransportError`` (no answer). The wrapper decides whether training goes on
without the audit; this client never retries a refused request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from ..protocol.record_wire import (
    PLAN_DIMENSION_HEADER,
    PLAN_STEPS_HEADER,
    RECORD_DTYPE,
    encode_round,
)

__all__ = ["ClientDP", "RecordAuditClient", "RecordServiceError", "METRIC_PREFIX"]

#: Prefix of the DP parameters in a client's reply metrics (``record_metrics``).
METRIC_PREFIX = "flaudit."


class RecordServiceError(RuntimeError):
    """The service answered a record-level request with an HTTP error."""

    def __init__(self, status_code: int, detail: Any, what: str) -> None:
        self.status_code = int(status_code)
        self.detail = detail
        super().__init__(f"{what}: HTTP {status_code}: {detail}")


@dataclass(frozen=True)
class ClientDP:
    """One client's DP-SGD parameters in one round, as its reply reports them (Opacus's names).

    ``steps``: the noised DP-SGD steps it trained this round; ``sample_rate``: Opacus's Poisson
    rate ``q``; ``expected_batch_size``: the divisor of the noised sum; ``optimizer``: class
    names (e.g. ``"DPOptimizer(SGD)"``)."""

    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    steps: int
    lr: float
    momentum: float
    expected_batch_size: int
    optimizer: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_metrics(
        cls, metrics: Mapping[str, Any], config: Mapping[str, Any] | None = None
    ) -> ClientDP:
        """From a reply's metrics (keys prefixed :data:`METRIC_PREFIX`; strings such as
        ``optimizer`` from ``config``, a ConfigRecord, when the metrics cannot hold them).

        Raises
        ------
        KeyError
            A parameter is missing (the message names it).
        """
        merged = {**dict(config or {}), **dict(metrics)}
        values = {}
        for f in fields(cls):
            key = METRIC_PREFIX + f.name
            if key not in merged:
                raise KeyError(f"the client's reply has no {key!r}")
            values[f.name] = merged[key]
        return cls(
            noise_multiplier=float(values["noise_multiplier"]),
            max_grad_norm=float(values["max_grad_norm"]),
            sample_rate=float(values["sample_rate"]),
            steps=int(values["steps"]),
            lr=float(values["lr"]),
            momentum=float(values["momentum"]),
            expected_batch_size=int(values["expected_batch_size"]),
            optimizer=str(values["optimizer"]),
        )


def _detail(response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except ValueError:
        return response.text[:600]


class RecordAuditClient:
    """One record-level audit in a flaudit service (``POST /audits`` with ``"level": "record"``).

    Parameters
    ----------
    base_url : str
        The service's URL.
    audit_id : str
        The audit's id (``create`` returns a client for a new one).
    api_key : str, optional
        The service's API key (every record route needs it).
    timeout : float
        Seconds per request.
    http_client : httpx.Client, optional
        The client to send with (a FastAPI ``TestClient`` in tests); one is made otherwise.
    """

    def __init__(
        self,
        base_url: str,
        audit_id: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        http_client=None,
    ) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.audit_id = str(audit_id)
        self._headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._client = http_client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(float(timeout), 5.0))
        )

    def __repr__(self) -> str:  # never show the key
        return f"RecordAuditClient(base_url={self.base_url!r}, audit_id={self.audit_id!r})"

    @classmethod
    def create(
        cls,
        base_url: str,
        spec: dict,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        http_client=None,
    ) -> RecordAuditClient:
        """Create a record-level audit from ``spec`` (``"level": "record"`` is added when
        missing) and return a client for it; the creation answer is in ``.created``."""
        import httpx

        client = http_client or httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(float(timeout), 5.0))
        )
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        body = {"level": "record", **dict(spec)}
        response = client.post(f"{base_url.rstrip('/')}/audits", json=body, headers=headers)
        if response.status_code >= 400:
            raise RecordServiceError(response.status_code, _detail(response), "POST /audits")
        created = response.json()
        out = cls(base_url, created["id"], api_key=api_key, timeout=timeout, http_client=client)
        out.created = created
        return out

    def _request(self, method: str, path: str, **kwargs):
        url = f"{self.base_url}/audits/{self.audit_id}/record/{path}"
        headers = dict(self._headers, **kwargs.pop("headers", {}))
        response = self._client.request(method, url, headers=headers, **kwargs)
        if response.status_code >= 400:
            raise RecordServiceError(
                response.status_code, _detail(response), f"{method} .../record/{path}"
            )
        return response

    def canary_plan(
        self, client: str, round: int, *, dp: ClientDP | None, dimension: int
    ) -> np.ndarray:
        """Client ``client``'s canary plan for ``round``: ``(steps, dimension)`` float32, row
        ``s`` the canaries sampled at its DP-SGD step ``s``; ``(0, dimension)`` when it has none.

        ``dp`` is what the client reported in its previous round (its ``sample_rate`` and
        ``steps`` size the plan); ``None`` (a client's first round: nothing known yet) gives the
        empty plan without asking the service."""
        d = int(dimension)
        if dp is None:
            return np.zeros((0, d), dtype=np.float32)
        response = self._request(
            "POST",
            "plans",
            json={"client": str(client), "round": int(round), "dimension": d, "dp": dp.to_dict()},
        )
        steps = int(response.headers[PLAN_STEPS_HEADER])
        width = int(response.headers[PLAN_DIMENSION_HEADER])
        plan = np.frombuffer(response.content, dtype="<f4")
        if width != d or plan.size != steps * d:
            raise RecordServiceError(
                200, f"a plan of {plan.size} values for shape ({steps}, {width})", "plans"
            )
        return plan.reshape(steps, d).astype(np.float32, copy=False)

    def report_round(
        self, round: int, updates: Mapping[str, np.ndarray], dp: Mapping[str, ClientDP]
    ) -> dict:
        """Report ``round``: every client's update (parameters after local training minus those
        sent, flattened in the model's parameter order) and its DP parameters this round.
        Returns the audit's status after the round's look (``status``, ``alarm``, ``look``,
        ``claim_epsilon``, ``cause`` once the alarm fired). Reporting a round again with the
        same clients returns the stored look (nothing counted twice)."""
        if set(updates) != set(dp):
            missing = sorted(set(updates) ^ set(dp))
            raise ValueError(f"updates and dp must name the same clients; differ on {missing}")
        keys = [str(k) for k in updates]
        vectors = [np.asarray(updates[k]).ravel() for k in updates]
        sizes = {v.size for v in vectors}
        if len(sizes) > 1:
            raise ValueError(f"updates have different lengths: {sorted(sizes)}")
        d = sizes.pop() if sizes else 0
        for key, vector in zip(keys, vectors, strict=True):
            if not np.all(np.isfinite(vector)):
                raise ValueError(f"client {key!r}: the update has NaN or infinite values")
        head = {
            "dimension": int(d),
            "dtype": RECORD_DTYPE,
            "clients": [{"client": k, "dp": dp[k].to_dict()} for k in updates],
        }
        response = self._request(
            "PUT",
            f"rounds/{int(round)}",
            content=encode_round(head, vectors),
            headers={"Content-Type": "application/octet-stream"},
        )
        return response.json()

    def end(self) -> dict:
        """End the audit: the final look, the verdict (``status``: ``claim_refuted``,
        ``consistent``, ``inconclusive``, ``no_dp_claim``) with its ``summary`` and ``cause``."""
        return self._request("POST", "end").json()

    def status(self) -> dict:
        """``GET /audits/{id}``: the audit as the dashboard shows it."""
        response = self._client.get(
            f"{self.base_url}/audits/{self.audit_id}", headers=self._headers
        )
        if response.status_code >= 400:
            raise RecordServiceError(response.status_code, _detail(response), "GET /audits/{id}")
        return response.json()
