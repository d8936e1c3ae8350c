"""scikit-learn estimators of gpuml."""
