"""scikit-learn's own SVC tests (sklearn/svm/tests/test_svm.py) against CASVMClassifier.

The file runs as shipped with the installed scikit-learn, with ``SVC`` mapped
to ``CASVMClassifier(n_partitions=1, ...)`` (tests/_sklearn_suite.py). Tests of
other classes (NuSVC, SVR, NuSVR, OneClassSVM, LinearSVC, LinearSVR) and of
scikit-learn's internals are deselected, each for the reason given in
``DESELECT``; ``KNOWN_FAILURES`` lists the selected tests gpuml fails, with why.
"""

from _sklearn_suite import functions_of, global_random_seed, load  # noqa: F401

globals().update(functions_of(load("svm/tests/test_svm.py")))

_OTHER = "tests another class ({}), not SVC"
_LIBLINEAR = "tests LinearSVC/LinearSVR (liblinear), not SVC"

DESELECT: dict[str, str] = {
    "test_svr": _OTHER.format("NuSVR, SVR, LinearSVR"),
    "test_linearsvr": _OTHER.format("LinearSVR against SVR"),
    "test_linearsvr_fit_sampleweight": _OTHER.format("LinearSVR"),
    "test_svr_errors": _OTHER.format("SVR"),
    "test_oneclass": _OTHER.format("OneClassSVM"),
    "test_oneclass_decision_function": _OTHER.format("OneClassSVM"),
    "test_oneclass_score_samples": _OTHER.format("OneClassSVM"),
    "test_decision_function_shape[NuSVC]": _OTHER.format("NuSVC"),
    "test_svr_predict": _OTHER.format("SVR"),
    "test_svm_classifier_sided_sample_weight[estimator1]": _OTHER.format("NuSVC"),
    "test_svm_regressor_sided_sample_weight": _OTHER.format("SVR, NuSVR"),
    **{f"test_negative_sample_weights_mask_all_samples[weights-are-{w}-{c}]": _OTHER.format(c)
       for w in ("zero", "negative") for c in ("NuSVC", "SVR", "NuSVR", "OneClassSVM")},
    **{f"test_negative_weights_svc_leave_just_one_label[mask-label-{k}-NuSVC]":
       _OTHER.format("NuSVC") for k in (1, 2)},
    **{f"test_negative_weights_svc_leave_two_labels[partial-mask-label-{k}-NuSVC]":
       _OTHER.format("NuSVC") for k in (1, 2)},
    **{f"test_negative_weight_equal_coeffs[partial-mask-label-{k}-{c}]": _OTHER.format(c)
       for k in (1, 2) for c in ("NuSVC", "NuSVR")},
    "test_sparse_fit_support_vectors_empty": _OTHER.format("SVR"),
    "test_linearsvc_parameters": _LIBLINEAR,
    "test_linearsvc": _LIBLINEAR,
    "test_linearsvc_crammer_singer": _LIBLINEAR,
    "test_linearsvc_fit_sampleweight": _LIBLINEAR,
    "test_crammer_singer_binary": _LIBLINEAR,
    "test_linearsvc_iris": _LIBLINEAR,
    "test_dense_liblinear_intercept_handling": _LIBLINEAR,
    "test_liblinear_set_coef": _LIBLINEAR,
    "test_linearsvc_verbose": _LIBLINEAR,
    "test_linear_svm_convergence_warnings": _LIBLINEAR,
    "test_svr_coef_sign": _OTHER.format("SVR, NuSVR, LinearSVR"),
    "test_lsvc_intercept_scaling_zero": _LIBLINEAR,
    "test_linearsvm_liblinear_sample_weight": _LIBLINEAR,
    "test_dual_auto": _LIBLINEAR,
    "test_dual_auto_edge_cases": _LIBLINEAR,
    "test_svc_invalid_break_ties_param[NuSVC]": _OTHER.format("NuSVC"),
    "test_svc_ovr_tie_breaking[NuSVC]": _OTHER.format("NuSVC"),
    "test_n_support": _OTHER.format("OneClassSVM, SVR, NuSVR"),
    "test_custom_kernel_not_array_input[SVR]": _OTHER.format("SVR"),
    **{f"test_n_iter_libsvm[{n}-{c}-{t}]": _OTHER.format(c) for n in (2, 3, 4)
       for c, t in (("NuSVC", "ndarray"), ("SVR", "int"), ("NuSVR", "int"),
                    ("OneClassSVM", "int"))},
    **{f"test_svm_with_infinite_C[{c}-SVR-make_regression]": _OTHER.format("SVR")
       for c in ("inf0", "inf1")},
    **{f"test_probability_raises_futurewarning[{p}-NuSVC-NuSVC]": _OTHER.format("NuSVC")
       for p in (True, False)},
    "test_svc_nusvc_probA_probB_deprecated[NuSVC]": _OTHER.format("NuSVC"),
    "test_tweak_params": "writes SVC's private _dual_coef_ (scikit-learn's internal LIBSVM "
                         "buffer), which gpuml does not have",
    "test_svc_raises_error_internal_representation":
        "corrupts SVC's private _n_support to test the guard on LIBSVM's C buffers "
        "(CVE-2020-28975): scikit-learn internals",
}

KNOWN_FAILURES: dict[str, str] = {
    "test_unfitted": "the NotFittedError names the class that is not fitted, "
                     "'CASVMClassifier', and the test looks for the word 'SVC' in it",
}
