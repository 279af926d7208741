"""The ``evaluate:`` section: its retrieval and classification parts as written, and the
:class:`EvaluateConfig` the evaluate stage keys its units by."""

from dataclasses import dataclass

from metricpipe.config.schema import Reading, Section, read_section, setting
from metricpipe.tasks.evaluation import is_classifier
from metricpipe.tasks.scoring import DEFAULT_CLASSIFIERS, DEFAULT_RETRIEVAL_K
from metricpipe.tasks.validate import whole_number

OBJECTIVES = ("retrieval", "classification")  # what evaluate.objective may name


def _counts(v, rd: Reading, key: str) -> tuple:
    counts = [whole_number(x) for x in v] if isinstance(v, list) else [whole_number(v)]
    if not counts or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in counts):
        rd.fail(key, f"expected integers >= 1 (one or a list), got {v!r}")
    return tuple(counts)


def _classifiers(v, rd: Reading, key: str) -> tuple:
    names = v if isinstance(v, list) else [v]
    for c in names:
        if not is_classifier(c):
            rd.fail(
                key, f"unknown classifier {c!r}; use knnK (e.g. knn1, knn10), softvoteK (Eq. 9 of SL-NE), ncm or ncmc"
            )
    return tuple(names)


def _part(cls):
    """A part of the evaluation: a map of its settings (true or null: its defaults), or false to leave
    it out (None)."""

    def read(v, rd: Reading, key: str):
        if v is False:
            return None
        if v is not None and v is not True and not isinstance(v, dict):
            rd.fail(key, f"got {v!r}; give a map of its settings, or false to leave it out")
        return read_section(cls, None if v is True else v, rd, key)

    return read


@dataclass(frozen=True)
class RetrievalSettings(Section):
    k: tuple = setting(
        DEFAULT_RETRIEVAL_K,
        "The K of precision@K and recall@K (test images query the rest of the test set)",
        parse=_counts,
        shown="int >= 1, or a list of them",
    )
    queries: int | None = setting(
        None,
        "A seeded sample of this many test images query (unset: every test image "
        "up to 10,000, a sample of 10,000 past that)",
        kind=int,
        minimum=1,
    )


@dataclass(frozen=True)
class ClassificationSettings(Section):
    classifiers: tuple = setting(
        DEFAULT_CLASSIFIERS,
        "knnK, softvoteK (Eq. 9 of SL-NE), ncm, ncmc; left "
        "unset, a model skips one it cannot serve (with a note), a listed one is refused",
        parse=_classifiers,
        shown="list of classifier names",
    )
    queries: int | None = setting(
        None,
        "A seeded, class-stratified sample of about this many test images is classified (unset: all)",
        kind=int,
        minimum=1,
    )


@dataclass(frozen=True)
class EvaluateConfig:
    """What the evaluation scores (its fields key the evaluation units)."""

    retrieval_k: tuple = RetrievalSettings.k
    classifiers: tuple = ClassificationSettings.classifiers
    retrieval: bool = True
    queries: int | None = RetrievalSettings.queries  # a seeded sample of this many test images query the test set
    classify_queries: int | None = ClassificationSettings.queries  # a seeded, class-stratified sample classified


@dataclass(frozen=True)
class EvaluateSettings(Section):
    """The ``evaluate:`` mapping as written (:meth:`config` is what the evaluate stage reads)."""

    retrieval: RetrievalSettings | None = setting(
        RetrievalSettings(),
        "Retrieval scores (mAP, precision@K, MAP@R, ...) of test images querying the test set; false: none",
        section=RetrievalSettings,
        parse=_part(RetrievalSettings),
        shown="mapping or false",
    )
    classification: ClassificationSettings | None = setting(
        ClassificationSettings(),
        "Top-1 errors of classifiers over the train codes; false: none",
        section=ClassificationSettings,
        parse=_part(ClassificationSettings),
        shown="mapping or false",
    )
    objective: str | None = setting(
        None,
        "The objective whose winner closes the run's output (null: one line each); the report shows both",
        kind=str,
        choices=OBJECTIVES,
    )

    @classmethod
    def rules(cls, values: dict, given: dict, rd: Reading) -> dict:
        do_retrieval, objective = values["retrieval"] is not None, values["objective"]
        classifiers = values["classification"].classifiers if values["classification"] else ()
        if not do_retrieval and not classifiers:
            rd.fail("evaluate", "retrieval is false and no classifier is left: nothing would be evaluated; keep one")
        if objective == "retrieval" and not do_retrieval or objective == "classification" and not classifiers:
            rd.fail(
                "evaluate.objective",
                f"{objective}, but evaluate.{objective} is off: nothing to report a winner "
                f"on; turn it on, or name the other objective",
            )
        return values

    def config(self) -> EvaluateConfig:
        ret, cls = self.retrieval or RetrievalSettings(), self.classification
        return EvaluateConfig(
            retrieval_k=ret.k,
            classifiers=cls.classifiers if cls else (),
            retrieval=self.retrieval is not None,
            queries=ret.queries,
            classify_queries=cls.queries if cls else None,
        )


def read_evaluate(v, rd: Reading, key: str) -> EvaluateSettings:
    if v is False or isinstance(v, (int, float)) and v == 0:  # a run always evaluates
        rd.fail(
            key,
            f"got {v!r}; give a map (retrieval:, classification:), or leave a part out with retrieval: false "
            f"or classification: false (a run always evaluates)",
        )
    return read_section(EvaluateSettings, v, rd, key)


def classifiers_given(raw: dict) -> bool:
    """Whether the config lists evaluate.classification.classifiers, or turns classification off (else
    they are the defaults, which a model that cannot serve one skips; a classifier the user lists is
    refused instead)."""
    ev = (raw or {}).get("evaluate")
    cls = ev.get("classification") if isinstance(ev, dict) else None
    return cls is False or "classifiers" in (cls if isinstance(cls, dict) else {})
