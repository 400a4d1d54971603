"""The base of every engine config model (engine/config.py and the sections in their own modules).

Unknown keys are refused (a typo must never fall back to a default), types are strict (YAML's
``true`` is not the integer 1, ``"8"`` is not a number), assignments are validated, and floats must
be finite unless a model says otherwise.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False)
