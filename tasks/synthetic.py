"""Seeded class-structured synthetic features, generated in fixed units so that any row range gives
the same rows whatever the chunking."""
import numpy as np

UNIT = 1024  # rows per independently seeded unit


class SyntheticSpec:
    """A Gaussian mixture: class means in a random low-rank subspace plus anisotropic noise.

    x = mu_y + s * e, with mu_y = separation * A z_y (A: D x r orthonormal, z_y ~ N(0, I_r)) and
    noise scales s_j decaying as 1 / sqrt(1 + j / 8). Labels are uniform over classes.
    """

    def __init__(self, n_samples: int, n_features: int, n_classes: int, seed: int = 0,
                 rank: int | None = None, separation: float = 3.0, nonnegative: bool = False):
        self.n_samples, self.n_features, self.n_classes = n_samples, n_features, n_classes
        self.seed, self.separation, self.nonnegative = seed, separation, nonnegative
        self.rank = rank or min(n_features, max(2, n_classes))
        rng = np.random.default_rng([seed, 0])
        A, _ = np.linalg.qr(rng.standard_normal((n_features, self.rank)))
        self.means = (separation * rng.standard_normal((n_classes, self.rank)) @ A.T).astype(np.float32)
        self.scales = (1.0 / np.sqrt(1.0 + np.arange(n_features) / 8.0)).astype(np.float32)

    def labels(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 1]).integers(0, self.n_classes, self.n_samples).astype(np.int32)

    def rows(self, start: int, stop: int, labels: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` (float32)."""
        y = self.labels() if labels is None else labels
        out = np.empty((stop - start, self.n_features), np.float32)
        for u in range(start // UNIT, (stop - 1) // UNIT + 1 if stop > start else 0):
            a, b = u * UNIT, min((u + 1) * UNIT, self.n_samples)
            noise = np.random.default_rng([self.seed, 2, u]).standard_normal((b - a, self.n_features),
                                                                             dtype=np.float32)
            block = self.means[y[a:b]] + noise * self.scales
            lo, hi = max(a, start), min(b, stop)
            out[lo - start:hi - start] = block[lo - a:hi - a]
        if self.nonnegative:
            np.maximum(out, 0.0, out=out)
        return out
