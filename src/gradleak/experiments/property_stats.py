"""Melis et al.'s property classifier (standardised features, L2 logistic regression, C by
cross-validated AUC) and the AUCs with paired bootstrap intervals that property-inference reports."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError

BOOTSTRAP = 2000           # resamples of the target batches for the AUC intervals
C_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)   # the classifier's inverse L2 strength, chosen by CV
CV_FOLDS = 5


def require_sklearn() -> Any:
    """scikit-learn's ``sklearn`` module, or one line saying how to install it."""
    try:
        import sklearn
    except ImportError:
        raise ConfigError("property-inference needs scikit-learn (pip install scikit-learn==1.9.1)") from None
    return sklearn


def fit_classifier(x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    """Melis et al.'s property classifier: standardised features, L2 logistic regression whose C
    is chosen by 5-fold cross-validated AUC on the auxiliary updates only (the targets are never
    seen), then refitted on all of them. One BLAS thread: the fit is small, and OpenBLAS threads
    spinning on a loaded 2-core machine made it 30-100x slower (20 s instead of 0.2 s)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV, StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    folds = int(min(CV_FOLDS, y.sum(), (~y).sum()))
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    with threadpool_limits(limits=1, user_api="blas"):
        if folds < 2:  # too few auxiliary updates to cross-validate: sklearn's default C
            return pipe.fit(x, y)
        search = GridSearchCV(pipe, {"logisticregression__C": list(C_GRID)}, scoring="roc_auc",
                              cv=StratifiedKFold(folds, shuffle=True, random_state=seed))
        return search.fit(x, y)


def predict(classifier: Any, x: np.ndarray) -> np.ndarray:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        return classifier.predict_proba(x)[:, 1]


def auc(y: Sequence[bool], scores: Sequence[float]) -> float | None:
    """ROC AUC (sklearn), None unless both classes are present."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y, dtype=bool)
    if y.all() or not y.any():
        return None
    return float(roc_auc_score(y, np.asarray(scores, dtype=np.float64)))


def rank_aucs(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Row-wise ROC AUC of [B, n] labels and scores by the Mann-Whitney rank sum (ties at mid
    rank): the value roc_auc_score gives, for many resamples at once (rows with one class: nan)."""
    from scipy.stats import rankdata

    y = np.asarray(y, dtype=bool)
    ranks = rankdata(scores, axis=1)
    pos = y.sum(axis=1).astype(np.float64)
    neg = y.shape[1] - pos
    with np.errstate(invalid="ignore", divide="ignore"):
        return ((ranks * y).sum(axis=1) - pos * (pos + 1) / 2) / (pos * neg)


def bootstrap_aucs(y: np.ndarray, scores: dict[str, np.ndarray], seed: int,
                   n: int = BOOTSTRAP) -> dict[str, np.ndarray]:
    """Per method, the AUC over ``n`` resamples (with replacement) of the targets; the same
    resamples for every method (paired); resamples holding one class only are dropped."""
    rng = np.random.default_rng([seed, 2])
    picks = rng.integers(len(y), size=(n, len(y)))
    ys = np.asarray(y, dtype=bool)[picks]
    both = ys.any(axis=1) & ~ys.all(axis=1)
    return {m: rank_aucs(ys[both], np.asarray(s, dtype=np.float64)[picks[both]]) for m, s in scores.items()}


def interval(values: np.ndarray) -> tuple[float | None, float | None]:
    if values.size == 0:
        return None, None
    lo, hi = np.percentile(values, [2.5, 97.5])
    return float(lo), float(hi)
