"""Seeded class-structured synthetic features, generated in fixed units so that any row range gives
the same rows whatever the chunking."""

import numpy as np

from metricpipe.tasks.errors import InputError

GENERATION = 2  # bumped whenever some setting's rows change (issue 48: ranks above 32), so stored data is made again
UNIT = 1024  # rows per independently seeded unit
REFERENCE_RANK = 32  # the class signal's energy grows with its rank up to this many directions, no further


def class_scales(rank: int) -> np.ndarray:
    """(rank,) standard deviations of the class means along the signal directions: 1 for the first
    REFERENCE_RANK, then falling like 1 / sqrt(j + 1), all scaled so that their squares sum to
    min(rank, REFERENCE_RANK). The distance between two class means is then the same at any rank (it
    grew like sqrt(rank)), and most of it lies in the leading directions, as a decaying spectrum puts it."""
    profile = np.minimum(1.0, REFERENCE_RANK / np.arange(1.0, rank + 1.0))
    return np.sqrt(profile * (min(rank, REFERENCE_RANK) / profile.sum()))


class SyntheticSpec:
    """A mixture whose raw Euclidean geometry is only partly about the classes.

    x = separation * A (c * z_y + spread * w_{y,m} + width * h) + nuisance * B g + s * e, where A (D x r,
    orthonormal) spans the class signal and B (D x q, orthonormal and orthogonal to A unless
    ``overlap``) spans nuisance directions that carry no class information; z_y (per class), w_{y,m}
    (per mode), and h, g, e (per row) are standard normal; m, one of ``modes`` sub-clusters of class y,
    is drawn per row; the noise scales s_j decay as 1 / sqrt(1 + j / 8). Labels are uniform over
    classes. c (`class_scales`) is 1 up to rank 32 and shrinks beyond it, so that the class means' energy
    stays that of 32 unit directions (the modes' own mean is scaled with them; their spread about it is
    not).

    Why c: a squared distance sums over directions. Unscaled, the distance between two class means grows
    like r while the within-class spread along it does not, so the classes became trivially separable as
    r = min(C, D // 4) grew with the shape (identity mAP 1.0 at 4,096 x 1,000 classes). With c, the
    nearest-class-mean margin (class-mean distance against the within-class spread along it) is a
    property of separation, spread and width, not of D or C; a row's own mode stays easy to retrieve at
    any rank (its distance to the other modes grows with r), so raw mAP tends to about 1 / modes there.

    A projection learned from labels keeps A and drops the nuisance and the noise outside it, which raw
    features (``identity``) keep and PCA partly keeps (each nuisance direction has more variance,
    nuisance ** 2, than a signal direction's separation ** 2 * (1 + spread ** 2 + width ** 2) on
    defaults); the modes make a class more than one Gaussian and ``width`` makes classes overlap. With
    ``overlap`` > 0 part of each nuisance direction lies inside A, where it also blurs the class means
    for nearest-class-mean classification, which a learned metric (LDA, NCMML) can undo and PCA cannot.
    Defaults chosen for 128 features and 100 classes (issue 21): mAP of raw features about 0.38, an
    LDA projection about 0.64; the rows there (any rank <= 32, overlap 0) are those of issue 21's
    generator. ``nuisance=0, modes=1, width=0, rank=min(D, max(2, C))`` with rank <= 32 is the generator
    before issue 21 (the same rows for the same seed).

    Parameters
    ----------
    n_samples, n_features, n_classes : int
    seed : int, default=0
    rank : int or None, default=None
        r, the dimension of the class signal; None: min(max(2, C), max(1, D // 4)), at most D (32 at
        D = 128 and 32+ classes).
    separation : float, default=1.0
        Scale of the class signal against the unit noise (lower is harder).
    nonnegative : bool, default=False
        Clip at 0 (ReLU-like features).
    nuisance : float, default=1.7
        Standard deviation along each of the q = min(D - r, max(1, D // 16)) nuisance directions
        (8 at D = 128); 0 = none.
    modes : int, default=3
        Sub-clusters per class.
    spread : float, default=0.7
        Standard deviation of a mode's offset from its class mean, relative to that of the class means
        at rank <= 32 (per signal direction).
    width : float, default=0.8
        Standard deviation of a row about its mode within the signal subspace, relative to that of
        the class means at rank <= 32 (per signal direction).
    overlap : float, default=0.0
        Share of each nuisance direction's variance inside the class signal's subspace, in [0, 1]: 0
        keeps the nuisance orthogonal to it (it hurts retrieval, not the class means); 1 puts it inside.
    """

    def __init__(
        self,
        n_samples: int,
        n_features: int,
        n_classes: int,
        seed: int = 0,
        rank: int | None = None,
        separation: float = 1.0,
        nonnegative: bool = False,
        nuisance: float = 1.7,
        modes: int = 3,
        spread: float = 0.7,
        width: float = 0.8,
        overlap: float = 0.0,
    ):
        if not 0.0 <= overlap <= 1.0:
            raise InputError(
                f"The 'overlap' parameter of SyntheticSpec must be a float in [0, 1]. Got {overlap!r} instead."
            )
        self.n_samples, self.n_features, self.n_classes = n_samples, n_features, n_classes
        self.seed, self.separation, self.nonnegative = seed, separation, nonnegative
        self.nuisance, self.modes, self.spread, self.width = nuisance, modes, spread, width
        self.overlap = overlap
        self.rank = min(rank or min(max(2, n_classes), max(1, n_features // 4)), n_features)
        self.class_scales = class_scales(self.rank)
        rng = np.random.default_rng([seed, 0])
        A, _ = np.linalg.qr(rng.standard_normal((n_features, self.rank)))
        z = self.class_scales * rng.standard_normal((n_classes, self.rank))
        extra = np.random.default_rng([seed, 4])  # after the draws of the old generator: it stays a special case
        if modes > 1:
            w = spread * extra.standard_normal((n_classes, modes, self.rank))
            # the modes' own mean is part of the class mean: scaled with it; their spread about it is not
            z = z[:, None, :] + (w - (1.0 - self.class_scales) * w.mean(1, keepdims=True))
        # mode centres (C, M, D); one mode per class is the class mean itself
        self.means = (separation * z.reshape(n_classes, -1, self.rank) @ A.T).astype(np.float32)
        q = min(n_features - self.rank, max(1, n_features // 16)) if nuisance > 0 else 0
        G = extra.standard_normal((n_features, q))
        B, _ = np.linalg.qr(G - A @ (A.T @ G))
        if overlap > 0:  # random unit directions in A (a stream of their own), mixed into B's
            inside = A @ np.random.default_rng([seed, 5]).standard_normal((self.rank, q))
            inside /= np.maximum(np.linalg.norm(inside, axis=0), 1e-12)
            B = np.sqrt(1.0 - overlap) * B + np.sqrt(overlap) * inside
        self.signal_basis, self.nuisance_basis = A.astype(np.float32), B.astype(np.float32)
        self.scales = (1.0 / np.sqrt(1.0 + np.arange(n_features) / 8.0)).astype(np.float32)

    def labels(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 1]).integers(0, self.n_classes, self.n_samples).astype(np.int32)

    def rows(self, start: int, stop: int, labels: np.ndarray | None = None) -> np.ndarray:
        """Rows ``start:stop`` (float32)."""
        y = self.labels() if labels is None else labels
        out = np.empty((stop - start, self.n_features), np.float32)
        q = self.nuisance_basis.shape[1]
        for u in range(start // UNIT, (stop - 1) // UNIT + 1 if stop > start else 0):
            a, b = u * UNIT, min((u + 1) * UNIT, self.n_samples)
            noise = np.random.default_rng([self.seed, 2, u]).standard_normal((b - a, self.n_features), dtype=np.float32)
            extra = np.random.default_rng([self.seed, 3, u])
            m = extra.integers(0, self.modes, b - a) if self.modes > 1 else 0
            block = self.means[y[a:b], m] + noise * self.scales
            if self.width > 0:
                h = extra.standard_normal((b - a, self.rank), dtype=np.float32)
                block += (self.separation * self.width * h) @ self.signal_basis.T
            if q:
                g = extra.standard_normal((b - a, q), dtype=np.float32)
                block += (self.nuisance * g) @ self.nuisance_basis.T
            lo, hi = max(a, start), min(b, stop)
            out[lo - start : hi - start] = block[lo - a : hi - a]
        if self.nonnegative:
            np.maximum(out, 0.0, out=out)
        return out
