"""The ``data:`` section: where the rows come from, how they are split, and a synthetic set's shape."""

import math
from dataclasses import dataclass

from metricpipe.config.schema import Reading, Section, read_section, setting
from metricpipe.tasks.normalize import NORMALIZATIONS
from metricpipe.tasks.splits import SPLIT_NAMES, USER_SPLITS  # noqa: F401 - code = position; stored as int8

BUILTINS = ("digits", "fashion-mnist", "synthetic")
# What only a file has, with the values that say nothing: a built-in source would silently ignore any
# other (a groups: the user believes is scored), so configs and command lines refuse them alike.
FILE_ONLY = {"features": ("X",), "labels": ("y",), "groups": (), "ids": (), "pairs": ()}


def file_only_given(values: dict) -> str | None:
    """The first of ``values``'s FILE_ONLY keys set to something a built-in source would ignore."""
    for key, quiet in FILE_ONLY.items():
        if values.get(key) is not None and values[key] not in quiet:
            return key
    return None


def _test_share(v: float, rd: Reading, key: str) -> None:
    if not 0.0 < v < 1.0:  # both splits need rows
        rd.fail(key, f"must be a share in (0, 1) of the rows (the test split), got {v}")


def _val_share(v, rd: Reading, key: str):
    if v == "auto":
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
        rd.fail(key, f"expected auto or a fraction in [0, 1), got {v!r}")
    return float(v)


def _held_out_classes(v, rd: Reading, key: str):
    """A fraction in (0, 1) of the classes, or a list of labels (checked against the data's labels when
    it is staged)."""
    if v is None:
        return None
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not (math.isfinite(v) and 0.0 < v < 1.0):
            rd.fail(
                key,
                f"a fraction of the classes to hold out must be in (0, 1), got {v!r}; or give a list of class labels",
            )
        return float(v)
    if (
        not isinstance(v, list)
        or not v
        or not all(isinstance(c, (int, float, str)) and not isinstance(c, bool) for c in v)
    ):
        rd.fail(key, f"expected a fraction in (0, 1) of the classes or a list of class labels to hold out, got {v!r}")
    return tuple(v)


@dataclass(frozen=True)
class SplitConfig(Section):
    test: float | None = setting(
        0.2,
        "Share of the rows drawn (stratified) for the test split",
        kind=float,
        check=_test_share,
        shown="float in (0, 1)",
    )
    val: float | str = setting(
        "auto",
        "Share of the rows for the validation split, or auto: a stratified share of train, by its size; 0: none",
        parse=_val_share,
        shown="auto or a fraction in [0, 1)",
    )
    seed: int = setting(0, "Seed of the split's draw (and of the held-out classes')", kind=int, minimum=0)
    column: str | None = setting(
        None,
        "Array (or column) of train/test/val/negatives strings beside the "
        "features: the split as the data gives it, instead of a test share",
        kind=str,
    )
    classes: float | tuple | None = setting(
        None,
        "Classes held out of training and evaluated apart (unseen "
        "classes): a fraction drawn with seed, or their labels",
        parse=_held_out_classes,
        shown="fraction in (0, 1) or list of labels",
    )

    @classmethod
    def rules(cls, values: dict, given: dict, rd: Reading) -> dict:
        if not values["column"]:
            if values["val"] != "auto" and not 0.0 < values["test"] + values["val"] < 1.0:
                rd.fail(
                    "data.split",
                    f"test + val must be below 1, so that train rows remain; got {values['test']} "
                    f"+ {values['val']}; lower val or test",
                )
            return values
        if "test" in given:
            rd.fail("data.split", "give either column or a test fraction, not both")
        if values["val"] not in ("auto", 0.0):
            rd.fail(
                "data.split.val",
                "with data.split.column the val rows are the column's 'val' rows (or, when "
                "it has none, a stratified share of its train rows: val: auto); use auto or 0",
            )
        return {**values, "test": None}


@dataclass(frozen=True)
class SyntheticConfig(Section):
    samples: int = setting(20000, "Rows N", kind=int, minimum=4)
    dim: int = setting(128, "Features D", kind=int, minimum=1)
    classes: int = setting(10, "Classes", kind=int, minimum=2)
    seed: int = setting(0, "Seed of the rows", kind=int, minimum=0)
    separation: float = setting(
        1.0, "Scale of the class signal against unit noise (lower is harder)", kind=float, minimum=0.0
    )
    nonnegative: bool = setting(False, "Clip at 0 (ReLU-like features, e.g. for NML)", kind=bool)
    nuisance: float = setting(
        1.7,
        "Standard deviation along the D // 16 class-free directions (0: none; higher is harder)",
        kind=float,
        minimum=0.0,
    )
    overlap: float = setting(
        0.0,
        "Share of the nuisance inside the class signal's subspace (0: orthogonal; 1: inside, blurring the class means)",
        kind=float,
        minimum=0.0,
        maximum=1.0,
    )


def _defaults_when_empty(cls):
    """A section that an empty value (null, false, 0, '') leaves at its defaults."""
    return lambda v, rd, key: read_section(cls, v or None, rd, key)


@dataclass(frozen=True)
class DataConfig(Section):
    source: str | None = setting(
        None, "A built-in data set (it has its own arrays); give this or path", kind=str, choices=BUILTINS
    )
    path: str | None = setting(
        None,
        "Features file or folder: .npy/.npz/.h5/.zarr/.parquet/.fvecs/.bvecs or IDX; give this or source",
        kind=str,
        path=True,
    )
    root: str | None = setting(
        None,
        "Folder of built-in fashion-mnist's IDX files (unset: $METRICPIPE_DATA, else Debian's path)",
        kind=str,
        path=True,
    )
    features: str = setting("X", "Array of the features in a data.path file (a list column of a .parquet)", kind=str)
    labels: str = setting(
        "y",
        "Array (or column) of the labels in the file, or a separate .npy path",
        kind=str,
        path=lambda v: v.endswith(".npy"),
    )
    groups: str | None = setting(
        None,
        "Array of instance-level ground truth (Holidays/UKB groups): retrieval's relevant images are the query's group",
        kind=str,
    )
    ids: str | None = setting(None, "Array of integer row ids", kind=str)
    normalize: str = setting(
        "none",
        "Row normalization before every stage (power: signed square root, then l2)",
        kind=str,
        choices=NORMALIZATIONS,
    )
    split: SplitConfig = setting(
        SplitConfig(),
        "How the rows are split into train, val and test",
        section=SplitConfig,
        parse=_defaults_when_empty(SplitConfig),
    )
    chunk_mb: float = setting(
        64.0,
        "Rows per chunk such that a chunk of float32 features is about this many MB; also the SGD learners' pool size",
        kind=float,
        minimum=0.001,
    )
    synthetic: SyntheticConfig = setting(
        SyntheticConfig(),
        "The synthetic set's shape (with data.source: synthetic), as metricpipe synth's flags",
        section=SyntheticConfig,
        parse=_defaults_when_empty(SyntheticConfig),
    )
    pairs: str | None = setting(
        None, "npz of similar/dissimilar pairs (arrays i, j, y) for nml and linear-ml", kind=str, path=True
    )
    verify_source: bool = setting(
        False, "Key the staged data by its bytes (a full read), not the files' paths, sizes and mtimes", kind=bool
    )

    @classmethod
    def rules(cls, values: dict, given: dict, rd: Reading) -> dict:
        source = values["source"]
        if (source is None) == (values["path"] is None):
            rd.fail("data", "give exactly one of data.source (digits | fashion-mnist | synthetic) and data.path")
        key = source and file_only_given(given)
        if key:
            rd.fail(
                f"data.{key}",
                f"names an array or column of a data.path file; data.source: {source} has its own "
                f"(remove it, or stage your file with data.path)",
            )
        if given.get("synthetic") is not None and source != "synthetic":
            rd.fail("data.synthetic", "is read only with data.source: synthetic; remove it or set that source")
        if given.get("root") is not None and source != "fashion-mnist":
            rd.fail(
                "data.root", "is read only with data.source: fashion-mnist (the folder of its IDX files); remove it"
            )
        return values


def read_data(v, rd: Reading, key: str) -> DataConfig:
    if v is None:
        rd.fail(key, "missing; give data.source (digits | fashion-mnist | synthetic) or data.path")
    return read_section(DataConfig, v, rd, key)
