"""Progress of ``fedmf tune``: one line on stderr per evaluated candidate.

scikit-learn's searches report progress only from inside their (possibly remote) workers.
The searches here evaluate their candidates in batches just large enough to keep ``--jobs``
workers busy, and print a line in the calling process after each batch.
"""

from __future__ import annotations

import inspect
import math
import sys
import time

from joblib import effective_n_jobs


class _ProgressMixin:
    """Evaluate candidates in batches and print each one's CV score when its batch ends.

    The scores are those of one ``evaluate_candidates`` call over all candidates: each
    candidate is fitted on the same folds whatever the batch it is in.
    """

    _progress_sign = -1.0  # completion methods report RMSE, the negated score
    _progress_metric = "CV RMSE"
    _progress_quiet = False
    _progress_prefix = ""  # RatingRegressor's "estimator__", left out of the lines

    def _run_search(self, evaluate_candidates, *, callback_ctx=None):
        # scikit-learn >= 1.9 passes callback_ctx only to a _run_search that names it
        parent = super()._run_search
        kwargs = ({"callback_ctx": callback_ctx}
                  if "callback_ctx" in inspect.signature(parent).parameters else {})
        start = time.perf_counter()

        # Batches of one search context would reuse its task ids (scikit-learn >= 1.9 refuses
        # that), so the batches run without one: no callbacks are registered here.
        def evaluate(candidate_params, cv=None, more_results=None, **callback_ctx):
            candidates = list(candidate_params)
            batch = max(1, math.ceil(effective_n_jobs(self.n_jobs) / self.n_splits_))
            results = None
            for lo in range(0, len(candidates), batch):
                part = candidates[lo:lo + batch]
                more = None if more_results is None else {
                    key: values[lo:lo + batch] for key, values in more_results.items()}
                results = evaluate_candidates(part, cv, more)
                for i, params in enumerate(part):
                    self._progress_line(lo + i, len(candidates), params,
                                        results["mean_test_score"][i - len(part)],
                                        time.perf_counter() - start)
            return results

        return parent(evaluate, **kwargs)

    def _progress_line(self, index, n_candidates, params, score, seconds):
        if self._progress_quiet:
            return
        cut = len(self._progress_prefix)
        shown = ", ".join(f"{k[cut:]}={v!r}" for k, v in sorted(params.items())) or "defaults"
        print(f"fedmf: tune: candidate {index + 1}/{n_candidates}: {self._progress_metric} "
              f"{self._progress_sign * score:.4f} ({shown}); {seconds:.1f} s elapsed",
              file=sys.stderr, flush=True)


def with_progress(search_class, *, binary, quiet, prefix=""):
    """A subclass of ``search_class`` that prints a line per evaluated candidate."""
    return type(search_class.__name__, (_ProgressMixin, search_class), {
        "_progress_sign": 1.0 if binary else -1.0,
        "_progress_metric": "CV F1" if binary else "CV RMSE",
        "_progress_quiet": quiet,
        "_progress_prefix": prefix,
        "__module__": __name__,
    })
