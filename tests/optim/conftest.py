"""Every test here needs torch, which the ``test`` extra does not bring: the right build
depends on the machine (the README's Install gives the CPU-only one). Without torch the
directory skips, with its reason."""

import pytest

pytest.importorskip("torch", reason="torch is not installed: gpuml.optim is for PyTorch "
                    "(pip install \".[torch]\", or its CPU build first: see the README's Install)")
