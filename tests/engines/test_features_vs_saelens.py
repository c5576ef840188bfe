"""ffnlab's dictionaries against SAELens (tests/reference/features_saelens.py, run where sae_lens imports:
tests/reference/saelens_env.py says where).

Bounds: a reconstruction is a sum of ~d_in + k float32 products, so the two libraries' orders of summation
differ by at most (d_in + k) * eps32 relative to the output's scale (64 * 1.2e-7 here, taken as 1e-5 with room).
Training: 100 Adam steps from the same weights on the same batches; each step's gradients differ by float32
reordering (~B * eps32 relative), Adam divides by sqrt(v) so a relative gradient error stays relative in the
step; 100 steps of lr 1e-3 keep the weights within 1e-4 of their scale, the losses within 1e-5 relative.
A TopK selection that flipped on a near-tie would break these bounds, and the test with it."""
import numpy as np
import pytest

from saelens_env import run_driver

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return run_driver("features_saelens.py", tmp_path_factory.mktemp("saelens"))


@pytest.mark.parametrize("case", ["ours_topk_in_saelens", "ours_jumprelu_in_saelens", "ours_relu_in_saelens",
                                  "saelens_topk_in_ffnlab", "saelens_transcoder_in_ffnlab",
                                  "saelens_skip_transcoder_in_ffnlab"])
def test_files_load_on_the_other_side_with_the_same_reconstructions(result, case):
    r = result["files"][case]
    assert r["max_abs_diff"] <= 1e-5 * r["scale"], r


def test_saelens_reads_each_architecture_as_its_own_class(result):
    assert [result["files"][f"ours_{a}_in_saelens"]["class"] for a in ("topk", "jumprelu", "relu")] == \
        ["TopKSAE", "JumpReLUSAE", "StandardSAE"]
    assert [(result["files"][f"saelens_{a}_in_ffnlab"]["kind"], result["files"][f"saelens_{a}_in_ffnlab"]["act"])
            for a in ("topk", "transcoder", "skip_transcoder")] == [("sae", "topk"), ("transcoder", "relu"),
                                                                    ("skip-transcoder", "relu")]


@pytest.mark.parametrize("act", ["topk", "relu"])
def test_100_training_steps_agree_with_saelens(result, act):
    r = result[act]
    lt, lo = np.array(r["losses_saelens"]), np.array(r["losses_ffnlab"])
    assert len(lt) == 100 and lt[-1] < 0.8 * lt[0], "the run should learn something"
    np.testing.assert_allclose(lo, lt, rtol=1e-5)
    for n, d in r["max_abs_diff"].items():
        assert d <= 1e-4 * r["scale"][n], (n, d, r["scale"][n])
    assert r["dead_masks_equal"]
    if act == "topk":
        assert r["aux_used"], "AuxK should have been on for some steps"
