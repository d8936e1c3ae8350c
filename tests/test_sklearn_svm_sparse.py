"""scikit-learn's own sparse SVC tests (sklearn/svm/tests/test_sparse.py) against CASVMClassifier.

As tests/test_sklearn_svm.py, for the file that compares sparse and dense fits.
"""

from _sklearn_suite import functions_of, global_random_seed, load  # noqa: F401

globals().update(functions_of(load("svm/tests/test_sparse.py",
                                   {"test_svm": load("svm/tests/test_svm.py")})))

DESELECT: dict[str, str] = {
    "test_linearsvc": "tests LinearSVC (liblinear), not SVC",
    "test_linearsvc_iris": "tests LinearSVC (liblinear), not SVC",
    "test_sparse_liblinear_intercept_handling": "tests LinearSVC (liblinear), not SVC",
    "test_sparse_oneclasssvm": "tests another class (OneClassSVM), not SVC",
}

KNOWN_FAILURES: dict[str, str] = {}
