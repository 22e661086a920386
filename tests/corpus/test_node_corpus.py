"""The ONNX backend node-test corpus through graphfix run, doctor and check (issue 15).

Every model: `graphfix.api.run` with the default pipeline, the doctor's rules and
`graphfix check MODEL MODEL` raise nothing but GraphfixError (a refusal, recorded with
its reason), onnx.checker passes on the output, no pass is rolled back, and where
onnxruntime runs the original on the stored inputs, the rewritten model's outputs match
the stored outputs (rtol 1e-3, atol 1e-7, the backend tests' tolerances), or
onnxruntime's own outputs on the original where those differ from the stored ones.
See `nodecorpus` for how one model is run and where the corpus comes from.

Plain `pytest` runs `SAMPLE` (about 170 models covering every op type of the corpus,
in parallel workers); `pytest -m corpus` runs every model (README: "The node-test
corpus"). Both run the models in worker processes (`nodecorpus.run_all`), one
onnxruntime thread each; `GRAPHFIX_CORPUS_WORKERS` sets how many (default: the CPUs).
"""

from __future__ import annotations

import os
import time

import nodecorpus
import pytest

# Every op type in the corpus at least once (a greedy cover preferring small models),
# plus expanded attention, Range, Loop, If, Scan, sequence and optional models.
SAMPLE = [
    "test_abs", "test_acos", "test_acosh", "test_adagrad", "test_adam", "test_affine_grid_2d",
    "test_affine_grid_2d_expanded", "test_ai_onnx_ml_array_feature_extractor",
    "test_ai_onnx_ml_binarizer", "test_ai_onnx_ml_label_encoder_string_int",
    "test_ai_onnx_ml_tree_ensemble_set_membership", "test_argmax_default_axis_example",
    "test_argmin_default_axis_example", "test_asin", "test_asinh", "test_atan", "test_atanh",
    "test_attention_23_boolmask_fullymasked_row_nan_robustness", "test_attention_3d_expanded",
    "test_attention_4d_causal_expanded", "test_averagepool_1d_default",
    "test_basic_conv_with_padding", "test_basic_deform_conv_with_padding",
    "test_batchnorm_epsilon", "test_bernoulli", "test_bernoulli_double_expanded",
    "test_bitcast_2d_float32_to_int32", "test_bitshift_left_int16", "test_bitwise_and_i16_3d",
    "test_bitwise_not_2d", "test_bitwise_or_i16_4d", "test_bitwise_xor_i16_3d",
    "test_blackmanwindow", "test_castlike_FLOAT_to_BFLOAT16_expanded",
    "test_causal_conv_with_state_b1_c1_degenerate", "test_celu", "test_center_crop_pad_crop",
    "test_center_crop_pad_crop_expanded", "test_col2im", "test_compress_0", "test_constant",
    "test_convinteger_with_padding", "test_convtranspose", "test_cos", "test_cosh",
    "test_cumprod_1d", "test_cumsum_1d", "test_depthtospace_crd_mode_example",
    "test_dequantizelinear", "test_det_2d", "test_dft", "test_dropout_default",
    "test_dynamicquantizelinear", "test_dynamicquantizelinear_expanded",
    "test_einsum_batch_diagonal", "test_elu", "test_erf",
    "test_eyelike_populate_off_main_diagonal", "test_flexattention_causal_mask", "test_floor",
    "test_gathernd_example_float32", "test_gelu_default_1", "test_gelu_tanh_2_expanded",
    "test_gemm_all_attributes", "test_globalaveragepool", "test_globalmaxpool", "test_gridsample",
    "test_group_normalization_epsilon", "test_gru_batchwise", "test_hammingwindow",
    "test_hannwindow", "test_hardmax_axis_0", "test_hardsigmoid", "test_hardswish",
    "test_identity_sequence", "test_if", "test_if_opt", "test_if_seq",
    "test_image_decoder_decode_bmp_rgb", "test_instancenorm_epsilon", "test_isinf", "test_isnan",
    "test_l1normalization_axis_0", "test_layer_normalization_2d_axis0",
    "test_layer_normalization_4d_axis0_expanded", "test_leakyrelu", "test_less_equal",
    "test_linear_attention_decode_step", "test_log", "test_logsoftmax_axis_0", "test_loop11",
    "test_loop13_seq", "test_loop16_seq_none", "test_lppool_1d_default", "test_lrn",
    "test_lstm_batchwise", "test_matmulinteger", "test_maxpool_1d_default",
    "test_maxunpool_export_with_output_shape", "test_mean_example", "test_melweightmatrix",
    "test_mish", "test_momentum", "test_mvn", "test_neg", "test_nllloss_NC",
    "test_nonmaxsuppression_center_point_box_format", "test_nonzero_example",
    "test_onehot_negative_indices", "test_optional_get_element_sequence", "test_or2d",
    "test_prelu_broadcast", "test_qlinearconv", "test_qlinearmatmul_2D_int8_float16",
    "test_range_float_type_positive_delta_expanded",
    "test_range_int32_type_negative_delta_expanded",
    "test_reduce_l1_default_axes_keepdims_example", "test_reduce_l2_default_axes_keepdims_example",
    "test_reduce_log_sum_asc_axes", "test_reduce_log_sum_exp_default_axes_keepdims_example",
    "test_reduce_prod_default_axes_keepdims_example",
    "test_reduce_sum_square_default_axes_keepdims_example", "test_regex_full_match_basic",
    "test_resize_downsample_scales_cubic", "test_reversesequence_batch",
    "test_rms_normalization_2d_axis0", "test_rnn_seq_length", "test_roialign_aligned_false",
    "test_rotary_embedding", "test_scan9_sum", "test_scatter_elements_with_axis",
    "test_scatter_with_axis", "test_scatternd", "test_sce_NCd1_mean_weight_negative_ii",
    "test_selu", "test_sequence_insert_at_back",
    "test_sequence_map_add_1_sequence_1_tensor_expanded", "test_sequence_map_add_2_sequences",
    "test_shape_end_negative_1", "test_shape_start_1", "test_shape_start_negative_1",
    "test_shrink_hard", "test_sigmoid", "test_sign", "test_sin", "test_sinh", "test_size",
    "test_softmax_axis_1_expanded", "test_softplus", "test_softsign", "test_spacetodepth",
    "test_split_to_sequence_1", "test_stft", "test_string_concat", "test_string_split_basic",
    "test_strnormalizer_export_monday_casesensintive_lower", "test_swiglu", "test_swish",
    "test_tan", "test_tensorscatter", "test_tfidfvectorizer_tf_batch_onlybigrams_skip0",
    "test_thresholdedrelu", "test_tile", "test_top_k", "test_tril", "test_unique_sorted_with_axis",
    "test_upsample_nearest", "test_xor2d",
]

# Models graphfix refuses, and why; every other refusal fails the test.
KNOWN_REFUSALS: dict[str, str] = {}

# Known failures, and why (each is a bug to fix; the test xfails them, strictly).
KNOWN_FAILURES: dict[str, str] = {}  # model name -> why it fails (none left)


def _workers() -> int | None:
    value = os.environ.get("GRAPHFIX_CORPUS_WORKERS")
    return int(value) if value else None


@pytest.fixture(scope="session")
def corpus(request) -> object:
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    folder = (cache.mkdir("onnx-node-corpus") if cache is not None
              else request.getfixturevalue("tmp_path_factory").mktemp("onnx-node-corpus"))
    return nodecorpus.corpus_dir(folder)


@pytest.fixture(scope="session")
def sample_outcomes(corpus) -> dict[str, nodecorpus.Outcome]:
    outcomes = nodecorpus.run_all([corpus / name for name in SAMPLE], _workers())
    return {o.name: o for o in outcomes}


def _verdict(outcome: nodecorpus.Outcome) -> str | None:
    """Why the outcome fails the test, or None."""
    if outcome.status == nodecorpus.FAILED:
        return "; ".join(outcome.problems)
    if outcome.status == nodecorpus.REFUSED and outcome.name not in KNOWN_REFUSALS:
        return f"refused: {outcome.refused}"
    return None


def test_sample_covers_the_hard_cases(corpus):
    import onnx

    from graphfix.graph.protos import all_nodes

    assert set(SAMPLE) <= set(nodecorpus.case_names(corpus))
    covered = {n.op_type for name in SAMPLE
               for n in all_nodes(onnx.load(str(corpus / name / "model.onnx")).graph)}
    assert {"Attention", "Range", "Loop", "If", "Scan", "SequenceInsert"} <= covered


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_model(name, sample_outcomes):
    outcome = sample_outcomes[name]
    if outcome.status == nodecorpus.PENDING:
        pytest.skip(f"pending test data for this input type: {outcome.refused}")
    problem = _verdict(outcome)
    if name in KNOWN_FAILURES:
        assert problem is not None, f"{name} passes now: drop it from KNOWN_FAILURES"
        pytest.xfail(KNOWN_FAILURES[name])
    assert problem is None, problem


@pytest.mark.corpus
def test_full_corpus(corpus):
    names = nodecorpus.case_names(corpus)
    start = time.perf_counter()
    outcomes = nodecorpus.run_all([corpus / name for name in names], _workers())
    summary = nodecorpus.summary(outcomes, time.perf_counter() - start)
    print(summary)
    failures = [f"{o.name}: {problem[:400]}" for o in outcomes
                if (problem := _verdict(o)) is not None and o.name not in KNOWN_FAILURES]
    assert not failures, summary + "\n" + "\n".join(failures)
    fixed = {o.name for o in outcomes if _verdict(o) is None} & KNOWN_FAILURES.keys()
    assert not fixed, f"these pass now: drop them from KNOWN_FAILURES: {sorted(fixed)}"
