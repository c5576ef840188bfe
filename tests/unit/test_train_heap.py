"""training/heap.py: once the trainer raised malloc's thresholds, a step's freed arrays are reused, not re-faulted."""
import resource

import numpy as np
import pytest

from ffnlab.training.heap import keep_freed_memory

PAGE = resource.getpagesize()


def _faults_per_round(rounds=4, arrays=10, size=4 << 20):
    """allocate `arrays` blocks of `size` bytes, touch every page, free them all; -> minor faults per round
    after the first (40 MB at the top of the heap: more than glibc's default trim threshold)"""
    def one():
        blocks = [np.ones(size // 4, np.float32) for _ in range(arrays)]
        del blocks
    one()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        one()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / rounds


def test_freed_training_arrays_are_not_faulted_in_again():
    if not keep_freed_memory():
        pytest.skip("not glibc: malloc's thresholds cannot be set (training/heap.py changes nothing)")
    pages = 10 * (4 << 20) // PAGE                      # 10240 pages touched per round
    assert _faults_per_round() < pages / 20             # re-faulted each round, it would be ~pages


def test_keep_freed_memory_answers_the_same_twice():
    assert keep_freed_memory() == keep_freed_memory()
