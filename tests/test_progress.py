"""verbose output and the fit warnings: one line per part/pair, from the fitting thread only,
in order; ConvergenceWarning and PartitionWarning once per fit, naming what they are about."""

import re
import threading
import warnings

import numpy as np
import pytest
from sklearn.datasets import make_classification, make_regression
from sklearn.exceptions import ConvergenceWarning

import gpuml._progress as progress_module
from gpuml import AsyGCDSVC, BKRRRegressor, CASVMClassifier, PartitionWarning
from gpuml._progress import Progress

# Small fits with several parts: the rows-per-class rule warns; the tests here are about output.
pytestmark = pytest.mark.filterwarnings("ignore::gpuml.PartitionWarning")

LINE = re.compile(r"^\[(\w+)\] (part|pair) (\d+): (.*) \((\d+)/(\d+)\)$")


def _lines(out, name):
    """The per-unit lines of ``name`` as (unit, message, done, total), in printed order."""
    found = []
    for line in out.splitlines():
        m = LINE.match(line)
        if m and m.group(1) == name:
            found.append((int(m.group(3)), m.group(4), int(m.group(5)), int(m.group(6))))
    return found


def _check_one_per_unit(lines, total):
    assert [done for _, _, done, _ in lines] == list(range(1, total + 1))
    assert all(t == total for *_, t in lines)
    assert sorted(unit for unit, *_ in lines) == list(range(total))


@pytest.fixture(scope="module")
def three_classes():
    return make_classification(1600, 8, n_classes=3, n_informative=5, random_state=0)


@pytest.mark.parametrize("setup", [{"n_jobs": 2}, {"n_jobs": None},
                                   {"devices": ["cpu", "cpu"]}],
                         ids=["threads", "serial", "two-cpu-ranks"])
def test_casvm_verbose_prints_one_line_per_part_in_order(three_classes, capsys, setup):
    X, y = three_classes
    clf = CASVMClassifier(n_partitions=4, verbose=1, random_state=0, **setup).fit(X, y)
    out = capsys.readouterr().out
    lines = _lines(out, "CASVM")
    _check_one_per_unit(lines, 4)
    for part, message, *_ in lines:
        m = re.match(r"(\d+) rows, (\d+) SMO problems, (\d+) iterations$", message)
        assert m, message
        assert int(m.group(1)) == clf.partition_sizes_[part]
        assert int(m.group(2)) == int((clf.pair_status_[part] == 2).sum()) == 3
        assert int(m.group(3)) == int(clf.part_n_iter_[part].sum())
    # The summary line closes the report.
    assert out.splitlines()[-1] == (f"[CASVM] 4 parts, 12 SMO problems, "
                                    f"{int(clf.part_n_iter_.sum())} iterations, "
                                    f"{len(clf.support_)} support vectors")


def test_casvm_verbose_reports_single_class_parts_and_silence_by_default(capsys):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(size=(200, 2)), rng.normal(size=(200, 2)) + 50])
    y = np.repeat([0, 1], 200)
    with pytest.warns(PartitionWarning):
        CASVMClassifier(n_partitions=2, partition="kmeans", verbose=1, random_state=0).fit(X, y)
    lines = _lines(capsys.readouterr().out, "CASVM")
    _check_one_per_unit(lines, 2)
    assert all(msg == "200 rows, 0 SMO problems, 0 iterations" for _, msg, *_ in lines)
    CASVMClassifier(n_partitions=2, random_state=0).fit(X[::2], y[::2])
    assert capsys.readouterr().out == ""


def test_asygcd_verbose_prints_one_line_per_pair_in_order(three_classes, capsys):
    X, y = three_classes
    clf = AsyGCDSVC(verbose=1, device="cpu", random_state=0).fit(X, y)
    lines = _lines(capsys.readouterr().out, "AsyGCDSVC")
    _check_one_per_unit(lines, 3)
    assert [unit for unit, *_ in lines] == [0, 1, 2]
    for (k, message, *_), pair in zip(lines, [(0, 1), (0, 2), (1, 2)]):
        assert message.startswith(f"classes {pair}, ")
        assert f"{clf.n_updates_[k]} updates" in message


def test_bkrr_verbose_prints_one_line_per_part(capsys):
    X, y = make_regression(600, 5, random_state=0)
    model = BKRRRegressor(n_partitions=3, verbose=1, device="cpu", random_state=0).fit(X, y)
    lines = _lines(capsys.readouterr().out, "BKRR")
    _check_one_per_unit(lines, 3)
    for (_, message, *_), size, shift in zip(lines, model.part_sizes_, model.shifts_):
        assert message == f"{size} rows, (K + {shift:.4g} I) a = y solved"
    BKRRRegressor(n_partitions=3, device="cpu", random_state=0).fit(X, y)
    assert capsys.readouterr().out == ""


def test_progress_refuses_worker_threads_and_shows_a_bar_only_with_tqdm(capsys, monkeypatch):
    progress = Progress("X", 2, verbose=1)
    errors = []

    def from_worker():
        try:
            progress.update(0, "done")
        except RuntimeError as exc:
            errors.append(str(exc))

    worker = threading.Thread(target=from_worker)
    worker.start()
    worker.join()
    assert errors and "worker thread" in errors[0]
    progress.close()
    capsys.readouterr()
    # A bar once the fit lasts (delay 0 here), on stderr; the lines are the same on stdout.
    pytest.importorskip("tqdm")
    monkeypatch.setattr(progress_module, "BAR_DELAY", 0.0)
    with Progress("X", 2, verbose=1) as bar:
        bar.update(1, "a")
        bar.update(0, "b")
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[X] part 1: a (1/2)", "[X] part 0: b (2/2)"]
    assert "0/2" in captured.err
    # Without tqdm: no bar, the same lines.
    monkeypatch.setattr(progress_module, "_tqdm", lambda: None)
    with Progress("X", 2, verbose=1) as plain:
        plain.update(1, "a")
        plain.update(0, "b")
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["[X] part 1: a (1/2)", "[X] part 0: b (2/2)"]
    assert captured.err == ""


def test_casvm_convergence_warning_names_the_parts_once(three_classes):
    X, y = three_classes
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        clf = CASVMClassifier(n_partitions=4, max_iter=5, random_state=0).fit(X, y)
    caught = [w for w in record if issubclass(w.category, ConvergenceWarning)]
    assert len(caught) == 1
    stopped = [p for p in range(4) if (clf.part_n_iter_[p] >= 5).any()]
    assert str(caught[0].message).endswith(
        f"Stopped in {len(stopped)} of 4 parts: parts {', '.join(map(str, stopped))}.")
    assert clf.fit_status_ == 1


def test_asygcd_convergence_warning_names_the_pairs(three_classes):
    X, y = three_classes
    with pytest.warns(ConvergenceWarning, match=r"stopped 3 of 3 binary problems at the update "
                      r"cap.*\(classes \(0, 1\), \(0, 2\), \(1, 2\); largest left"):
        AsyGCDSVC(max_updates=5, device="cpu", random_state=0).fit(X, y)


def test_partition_warning_rule_rows_per_class_and_part():
    """Below MIN_ROWS_PER_CLASS rows per class and part the measured loss is high: warn."""
    from gpuml.estimators._partitioned import MIN_ROWS_PER_CLASS

    X, y = make_classification(2400, 8, n_classes=4, n_informative=6, random_state=0)
    # 2400 / (4 parts * 4 classes) = 150 < 300: the letter-at-P=4 regime.
    with pytest.warns(PartitionWarning, match=rf"hold 150 rows per class on average, fewer "
                      rf"than {MIN_ROWS_PER_CLASS}.*partition='kmeans'.*combine='auto'"):
        CASVMClassifier(n_partitions=4, random_state=0, combine="nearest").fit(X, y)
    # Blending the parts of a sample's nearest support vectors (the default) does not
    # lose accuracy there (letter, 36 rows per class and part): no warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CASVMClassifier(n_partitions=4, random_state=0).fit(X, y)
    # 2400 / (2 * 4) = 300: at the bound, silent.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CASVMClassifier(n_partitions=2, random_state=0).fit(X, y)
