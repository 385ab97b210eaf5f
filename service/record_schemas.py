"""Request bodies of the record-level routes (``service/routers/record.py``): every field
validated, unknown fields refused, NaN and infinities refused."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ClientDPIn", "PlanRequest", "RoundClientIn", "RoundHead"]

ClientKey = Field(min_length=1, max_length=200, description="The client's Flower node id (str).")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ClientDPIn(_Strict):
    """One client's DP-SGD parameters in one round (Opacus's names)."""

    noise_multiplier: float = Field(ge=0, le=1e3, description="Opacus's noise multiplier z.")
    max_grad_norm: float = Field(gt=0, le=1e6, description="Opacus's flat clip norm C.")
    sample_rate: float = Field(gt=0, le=1, description="Opacus's Poisson rate q.")
    steps: int = Field(ge=1, le=100_000, description="Noised DP-SGD steps this round.")
    lr: float = Field(gt=0, le=1e6, description="The optimizer's learning rate.")
    momentum: float = Field(ge=0, lt=1, description="The SGD momentum (0: plain SGD).")
    expected_batch_size: int = Field(
        ge=1,
        le=1_000_000_000,
        description="Opacus's expected batch size (the noised sum's divisor).",
    )
    optimizer: str = Field(min_length=1, max_length=200, description="Optimizer class names.")


class PlanRequest(_Strict):
    """``POST /audits/{id}/record/plans``."""

    client: str = ClientKey
    round: int = Field(ge=1, le=100_000, description="The round the plan is for.")
    dimension: int = Field(ge=2, le=1_000_000_000, description="The model's dimension d.")
    dp: ClientDPIn = Field(description="The client's DP parameters from its previous reply.")


class RoundClientIn(_Strict):
    client: str = ClientKey
    dp: ClientDPIn


class RoundHead(_Strict):
    """The JSON head of ``PUT /audits/{id}/record/rounds/{round}`` (protocol/record_wire.py)."""

    dimension: int = Field(ge=2, le=1_000_000_000, description="The model's dimension d.")
    dtype: Literal["float32"] = Field(description='The updates\' dtype: always "float32".')
    clients: list[RoundClientIn] = Field(
        max_length=1000, description="The round's clients, in the order of their updates."
    )
