"""What the property-based (hypothesis) model tests share: their settings and one intra-op thread.

Used by tests/models/test_properties_<model>.py and tests/models/test_contract_properties.py.
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings

# Every test's examples are multiplied by POSFORMERS_HYPOTHESIS_SCALE (e.g. 10 for a long local hunt); CI runs 1.
SCALE = float(os.environ.get("POSFORMERS_HYPOTHESIS_SCALE", "1"))


def examples(count: int) -> settings:
    """Settings for a test of `count` examples (times SCALE).

    deadline=None: a first example builds torch's kernels and is much slower than the rest. derandomize: CI draws the
    same examples on every run (a failure reproduces), and no example database is written into the checkout. No
    shrink phase: shrinking a failure of a model test can take minutes; the failing example is reported as drawn
    (set POSFORMERS_HYPOTHESIS_SHRINK=1 to shrink one while debugging).
    """
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if os.environ.get("POSFORMERS_HYPOTHESIS_SHRINK") == "1":
        phases.append(Phase.shrink)
    return settings(
        max_examples=max(1, int(count * SCALE)),
        deadline=None,
        derandomize=True,
        database=None,
        phases=phases,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread for a test module that imports this fixture: tensors this small gain nothing from a second
    thread, and on a loaded machine the threads' hand-offs cost more than the arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
