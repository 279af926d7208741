"""Model containers shared by learners and the encode stage."""
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class LinearModel:
    """Encoder ``code = X @ W + b``; ``W is None`` means the identity (codes are the features).

    W : (D, d) float32 or None; b : (d,) float32 or None; meta: JSON-able facts about the fit.
    """
    W: np.ndarray | None
    b: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, np.float32)
        if self.W is None:
            return X
        out = X @ self.W
        if self.b is not None:
            out += self.b
        return out

    def n_components(self, n_features: int) -> int:
        return n_features if self.W is None else self.W.shape[1]

    def arrays(self) -> dict:
        return {k: v for k, v in (("W", self.W), ("b", self.b)) if v is not None}
