"""The map from ``method:`` names in configs to learners, with each learner's declared parameters.

Later learners (slde, sparse, ncmml, nml, slem) plug in here: an entry names the fit function, the
stored inputs it needs and its parameters with defaults and checks. Config validation reads the
declarations, so an unknown or ill-typed parameter is refused before any work starts.
"""
from dataclasses import dataclass, field
from typing import Callable

from metricpipe.tasks import baselines
from metricpipe.tasks.errors import InputError


@dataclass(frozen=True)
class Param:
    kind: type                 # int, float, str, bool, list (class indices) or dict (keys in choices)
    default: object = None
    minimum: float | None = None
    choices: tuple = ()
    sweep: bool = False        # a list value means one model per entry
    words: tuple = ()          # strings also accepted (e.g. rank: full), stored as given


@dataclass(frozen=True)
class Method:
    name: str
    fit: Callable
    params: dict = field(default_factory=dict)
    inputs: tuple = ("statistics",)  # which stored results the learner needs
    needs_covariance: bool = True
    trainer: str = "statistics"      # statistics: fit(stats, **params) in one task; slne / slde: see pipeline


DIM = Param(int, None, minimum=1, sweep=True)

# SL-NE / SL-DE (Wang et al.): defaults are the paper's (b = 0.02, rho0 = 0.2).
SLNE_PARAMS = {
    "margin": Param(float, 0.02, minimum=0, sweep=True),
    "step": Param(float, 0.2, minimum=0, sweep=True),
    "epochs": Param(int, 3, minimum=1, sweep=True),
    "batch": Param(int, 64, minimum=1),
    "sampling": Param(str, "violating", choices=("violating", "uniform"), sweep=True),
    "normalize": Param(float, None, minimum=0),  # rescale ||M||_F to this after each batch (None: off)
    "rank": Param(int, None, minimum=1),   # rank kept when factoring M into codes (None: all positive)
    "seed": Param(int, 0, minimum=0),
}

OPTIMIZERS = ("sgd", "adam")
# SLEM's negative pool: the images of one split (never test), a seeded sample of count of them (None: all)
NEGATIVES = Param(dict, {"split": "train", "count": 15000, "seed": 0}, choices=("split", "count", "seed"))
PAIR_PARAMS = {
    "pairs": Param(int, 500000, minimum=2),      # pairs sampled from labels when the store has none
    "iters": Param(int, 1000000, minimum=1),     # pairs seen by SGD
    "batch": Param(int, 64, minimum=1),
    "learn_bias": Param(bool, False),
    "seed": Param(int, 0, minimum=0),
}

NCM_PARAMS = {
    "batch": Param(int, 1000, minimum=2),
    "lr": Param(float, 30.0, minimum=0, sweep=True),   # tuned on l2-normalised features
    "iters": Param(int, 2000, minimum=1),
    "validate_every": Param(int, 100, minimum=1),
    "validation": Param(int, 5000, minimum=10),        # validation rows (the val split, else held out of train)
    "classes": Param(list, None),
    "seed": Param(int, 0, minimum=0),
}

METHODS = {
    "identity": Method("identity", baselines.fit_identity, {}, needs_covariance=False),
    "pca": Method("pca", baselines.fit_pca, {"dim": DIM}),
    "pcaw": Method("pcaw", baselines.fit_pcaw, {"dim": DIM, "eps": Param(float, 1e-6, minimum=0)}),
    "lda": Method("lda", baselines.fit_lda, {"dim": DIM, "reg": Param(float, 1e-4, minimum=0)}),
    "random": Method("random", baselines.fit_random, {"dim": DIM, "seed": Param(int, 0, minimum=0)},
                     needs_covariance=False),
    # dim: PCA directions kept for the input space (None: all)
    "slne": Method("slne", None, {"dim": DIM, **SLNE_PARAMS}, inputs=("statistics", "neighbours"), trainer="slne"),
    # dim: the dimension d of each member's subspace; input_dim: PCA directions of the input space
    "slde": Method("slde", None, {"dim": Param(int, 64, minimum=1, sweep=True),
                                  "members": Param(int, 8, minimum=1, sweep=True),
                                  "subspace": Param(str, "pca-blocks", choices=("pca-blocks", "random"), sweep=True),
                                  "input_dim": Param(int, None, minimum=1),
                                  "refine": Param(bool, False), **SLNE_PARAMS},
                   inputs=("statistics", "neighbours"), trainer="slde"),
    # Negrel et al.: dim = R projectors, sparsity = tau (Eq. 19); train_size images form the training
    # set (each a query against the others), queries = P per iteration
    "sparse": Method("sparse", None, {"dim": DIM, "sparsity": Param(float, 0.9, minimum=0, sweep=True),
                                      "queries": Param(int, 100, minimum=2), "train_size": Param(int, 2000, minimum=4),
                                      "max_iter": Param(int, 200, minimum=1), "anneal": Param(float, 0.5, minimum=0),
                                      "epsilon": Param(float, 1e-6, minimum=0),
                                      "seed": Param(int, 0, minimum=0)},
                     trainer="sparse"),
    # Sharma & Schiele: pairs sampled from labels (balanced, seeded) or the store's user pairs;
    # iters: pairs seen (Algorithm 1's steps), in mini-batches of batch pairs
    "nml": Method("nml", None, {"dim": Param(int, 64, minimum=1, sweep=True), **PAIR_PARAMS,
                                "bias": Param(float, 0.1), "margin": Param(float, 0.02, minimum=0),
                                # Adam: Algorithm 1's plain SGD ('sgd') needs lr ~300 on l1-normalised 784-d
                                # input and lands below Adam (benchmarks/README.md)
                                "optimizer": Param(str, "adam", choices=OPTIMIZERS),
                                # threads of the one task that trains this model (the kernel's passes are
                                # split over L's rows; the model is the same bit for bit)
                                "threads": Param(int, 1, minimum=1),
                                "lr": Param(float, 0.001, minimum=0, sweep=True)}, trainer="nml", needs_covariance=False),
    "linear-ml": Method("linear-ml", None, {"dim": Param(int, 64, minimum=1, sweep=True), **PAIR_PARAMS,
                                            "bias": Param(float, 1.0), "margin": Param(float, 0.2, minimum=0),
                                            "optimizer": Param(str, "sgd", choices=OPTIMIZERS),
                                            "lr": Param(float, 0.1, minimum=0, sweep=True)}, trainer="nml"),
    # Mensink et al.: W (dim x D) from PCA, SGD on m = batch images per step at a fixed lr, the W with
    # the lowest validation error (every validate_every steps) kept; classes: train on these class
    # indices only (the others are new classes the NCM classifier meets at test time)
    "ncmml": Method("ncmml", None, {"dim": DIM, "objective": Param(str, "euclidean", choices=("euclidean", "dot")),
                                    **NCM_PARAMS}, trainer="ncmml"),
    # centroids: k per class (k-means in the input space); train_centroids: 1 = NCMC-test (the metric
    # learns with the class means and is used with the k centroids)
    "ncmc": Method("ncmc", None, {"dim": DIM, "centroids": Param(int, 10, minimum=1, sweep=True),
                                  "train_centroids": Param(int, None, minimum=1, choices=(1,)),
                                  "kmeans_iters": Param(int, 10, minimum=1), **NCM_PARAMS}, trainer="ncmml"),
    # Rezende et al.: each image is encoded by its square-loss exemplar classifier against a pool of
    # negatives (negatives.split, a seeded sample of negatives.count images; never the test split);
    # kernel linear: code A^-1 (x - mu) normalised; gaussian / poly: Lemma 1 and Eq. 16 on a factor of
    # the negatives' kernel (rank full or r; decomposition cholesky, kpca or icd)
    "slem": Method("slem", None, {"kernel": Param(str, "linear", choices=("linear", "gaussian", "poly"), sweep=True),
                                  "gamma": Param(float, 1.0, minimum=0, sweep=True),
                                  "lambda": Param(float, 0.1, minimum=0, sweep=True),   # for l2-normalised features
                                  "rank": Param(int, "full", minimum=1, sweep=True, words=("full",)),
                                  "decomposition": Param(str, "cholesky", choices=("cholesky", "kpca", "icd"), sweep=True),
                                  "negatives": NEGATIVES},
                   trainer="slem", needs_covariance=False),
    # the exemplar SVM baseline (Eq. 1, hinge loss) by SGD per image: epochs over the negatives in
    # batches of batch negatives, positive weight theta
    "esvm": Method("esvm", None, {"lambda": Param(float, 0.1, minimum=0, sweep=True),
                                  "theta": Param(float, 1.0, minimum=0, sweep=True),
                                  "epochs": Param(int, 2, minimum=1), "batch": Param(int, 64, minimum=1),
                                  "negatives": NEGATIVES, "seed": Param(int, 0, minimum=0)},
                   trainer="slem", needs_covariance=False),
    # k-NN metric learning: triplet hinge with targets fixed (l2), all same-class, or dynamic (current
    # W), k targets per query, batch = m images per step (2/3 from one class)
    "knnml": Method("knnml", None, {"dim": DIM, "targets": Param(str, "dynamic", choices=("dynamic", "all", "fixed"),
                                                                 sweep=True),
                                    "k": Param(int, 5, minimum=1), **{**NCM_PARAMS, "batch": Param(int, 300, minimum=3),
                                                                     "lr": Param(float, 0.1, minimum=0, sweep=True)}},
                    trainer="ncmml"),
}


def _check_value(method: str, key: str, p: Param, v):
    if isinstance(v, str) and v in p.words:
        return v
    if p.kind is dict:
        if not isinstance(v, dict) or set(v) - set(p.choices):
            raise InputError(f"The '{key}' parameter of {method} must be a mapping with keys among "
                             f"{list(p.choices)}. Got {v!r} instead.")
        return {**p.default, **v}
    if p.kind is list:  # a list of non-negative integers, one value (not a sweep)
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
            raise InputError(f"The '{key}' parameter of {method} must be a non-empty list of class indices "
                             f"(integers >= 0). Got {v!r} instead.")
        return sorted(set(v))
    if p.kind is bool:
        ok = isinstance(v, bool)
    else:
        ok = (isinstance(v, p.kind) or (p.kind is float and isinstance(v, int))) and not isinstance(v, bool)
    if not ok:
        also = "".join(f" or '{w}'" for w in p.words)
        raise InputError(f"The '{key}' parameter of {method} must be {p.kind.__name__}{also}. Got {v!r} instead.")
    if p.minimum is not None and v < p.minimum:
        raise InputError(f"The '{key}' parameter of {method} must be >= {p.minimum}. Got {v!r} instead.")
    if p.choices and v not in p.choices:  # (p.words were accepted above)
        raise InputError(f"The '{key}' parameter of {method} must be one of {list(p.choices)}. Got {v!r} instead.")
    return p.kind(v)


def expand_method(entry: dict) -> list[dict]:
    """Check one ``methods:`` entry and expand its swept parameters into one dict per model.

    Returns dicts ``{"method": name, **params}`` with every declared parameter filled in.
    """
    import difflib
    import itertools

    name = entry.get("method")
    if name not in METHODS:
        near = difflib.get_close_matches(str(name), METHODS, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f"; known methods: {', '.join(METHODS)}"
        raise InputError(f"unknown method {name!r}{hint}")
    spec = METHODS[name]
    for key in entry:
        if key != "method" and key not in spec.params:
            near = difflib.get_close_matches(key, spec.params, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else \
                f"; {name} takes {', '.join(spec.params) or 'no parameters'}"
            raise InputError(f"unknown parameter {key!r} for method {name}{hint}")
    grids = {}
    for key, p in spec.params.items():
        v = entry.get(key, p.default)
        values = v if isinstance(v, list) and p.kind is not list else [v]
        if isinstance(v, list) and not p.sweep and p.kind is not list:
            raise InputError(f"The '{key}' parameter of {name} takes one value, not a list. Got {v!r} instead.")
        if isinstance(v, list) and not v:
            raise InputError(f"The '{key}' parameter of {name} must not be an empty list.")
        grids[key] = [None if x is None else _check_value(name, key, p, x) for x in values]
    keys = list(grids)
    return [{"method": name, **dict(zip(keys, combo))} for combo in itertools.product(*grids.values())]
