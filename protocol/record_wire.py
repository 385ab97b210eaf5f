"""The wire format of a record-level audit fed by a Flower app (issue #37): how a ServerApp's
:class:`flaudit.server.record_http.RecordAuditClient` and the service's record routes
(``service/routers/record.py``) frame a round's updates and a client's canary plan.

A round report (``PUT /audits/{id}/record/rounds/{round}``, ``application/octet-stream``) is

    4 bytes   little-endian uint32: the length ``L`` of the JSON head
    L bytes   UTF-8 JSON head: ``{"dimension": d, "dtype": "float32", "clients": [{"client": key,
              "dp": {...}}, ...]}``
    n*d*4     the ``n`` clients' updates, little-endian float32, in the head's client order

A canary plan answer (``POST /audits/{id}/record/plans``) is ``steps * d`` little-endian float32
(row ``s``: the sum of the unit canary directions sampled at the client's DP-SGD step ``s``), with
its shape in the headers :data:`PLAN_STEPS_HEADER` and :data:`PLAN_DIMENSION_HEADER`.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence

import numpy as np

__all__ = [
    "HEAD_LENGTH_BYTES",
    "PLAN_DIMENSION_HEADER",
    "PLAN_STEPS_HEADER",
    "RECORD_DTYPE",
    "encode_round",
    "split_round",
]

#: Bytes of the head-length prefix of a round report.
HEAD_LENGTH_BYTES = 4
#: The one dtype updates and plans travel in (the parameters' precision).
RECORD_DTYPE = "float32"
PLAN_STEPS_HEADER = "X-Flaudit-Plan-Steps"
PLAN_DIMENSION_HEADER = "X-Flaudit-Plan-Dimension"


def encode_round(head: dict, updates: Sequence[np.ndarray]) -> bytes:
    """The body of a round report: the JSON ``head`` then ``updates`` as float32 (each raveled;
    the head's ``clients`` list must name them in the same order)."""
    raw = json.dumps(head, separators=(",", ":"), allow_nan=False).encode("utf-8")
    parts = [struct.pack("<I", len(raw)), raw]
    parts += [np.ascontiguousarray(np.ravel(u), dtype="<f4").tobytes() for u in updates]
    return b"".join(parts)


def split_round(body: bytes) -> tuple[bytes, memoryview]:
    """``(head bytes, the rest)`` of a round report.

    Raises
    ------
    ValueError
        The body is shorter than its head-length prefix says (truncated).
    """
    if len(body) < HEAD_LENGTH_BYTES:
        raise ValueError(
            f"truncated body: {len(body)} bytes, not even the {HEAD_LENGTH_BYTES}-byte head length"
        )
    (length,) = struct.unpack("<I", body[:HEAD_LENGTH_BYTES])
    end = HEAD_LENGTH_BYTES + length
    if len(body) < end:
        raise ValueError(
            f"truncated body: the head says {length} bytes of JSON, only "
            f"{len(body) - HEAD_LENGTH_BYTES} follow"
        )
    return bytes(body[HEAD_LENGTH_BYTES:end]), memoryview(body)[end:]
