"""Config checks of the ``rlcr`` keys, run when an rlcr workflow is selected (``nemo_azr.preflight``)."""

from __future__ import annotations

from nemo_azr.config.checks import one_of, require
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.rlcr.common import confidence_candidate_texts, confidence_rows_kl_weight

ANSWER_DECODINGS = ("sample", "greedy", "greedy_and_sample")  # rlcr.answer_decoding
CONFIDENCE_DECODINGS = ("sample", "enumerate")  # rlcr.confidence_decoding
CANDIDATE_WEIGHTINGS = ("policy", "uniform")  # rlcr.candidate_weighting
CANDIDATE_BASELINES = ("answer", "batch", "kind")  # rlcr.candidate_baseline
CONTRAST_BASELINES = ("batch", "kind")  # the baselines that compare a candidate across answers


def check_rlcr_config(cfg: NemoAzrConfig) -> None:
    """RLCR keys, checked only when an rlcr workflow is selected."""
    r, wf = cfg.rlcr, cfg.rollout.workflow
    require(
        not (wf == "rlcr_two_turn" and not r.multi_turn) and not (wf == "rlcr_single_turn" and r.multi_turn),
        f"rollout.workflow={wf} contradicts rlcr.multi_turn={r.multi_turn}; set both consistently "
        "(or use rollout.workflow=rlcr, which follows rlcr.multi_turn)",
    )
    two_turn = wf == "rlcr_two_turn" or (wf == "rlcr" and r.multi_turn)
    one_of("rlcr.answer_match", r.answer_match, ("auto", "math", "qa"))
    one_of("rlcr.qa_match", r.qa_match, ("exact", "f1"))
    require(0 < r.f1_threshold <= 1, f"rlcr.f1_threshold must be in (0, 1], got {r.f1_threshold}")
    require(r.eps >= 0, f"rlcr.eps must be >= 0, got {r.eps}")
    require(
        0 <= r.warmup_wrong_frac <= 1, f"rlcr.warmup_wrong_frac must be in [0, 1], got {r.warmup_wrong_frac}"
    )
    require(
        r.answer_max_new_tokens >= 0 and r.confidence_max_new_tokens >= 0,
        "rlcr.answer_max_new_tokens / confidence_max_new_tokens must be >= 0 (0 = generation.max_new_tokens)",
    )
    if two_turn:
        require(
            cfg.algorithm.estimator == "rlcr_hierarchical",
            f"rollout.workflow={wf} (two turns) needs algorithm.estimator=rlcr_hierarchical, got "
            f"{cfg.algorithm.estimator!r}: a flat estimator would mix answer and confidence rewards",
        )
        one_of("rlcr.answer_decoding", r.answer_decoding, ANSWER_DECODINGS)
        if r.answer_decoding == "greedy":
            require(
                r.num_generations_answer == 1,
                "rlcr.answer_decoding=greedy decodes one answer per prompt (more would be copies): set "
                f"rlcr.num_generations_answer=1, got {r.num_generations_answer}",
            )
        else:
            require(
                r.num_generations_answer >= 2,
                f"rlcr.num_generations_answer (G_a) must be >= 2 to normalise answers per prompt, got "
                f"{r.num_generations_answer} (or rlcr.answer_decoding=greedy: one untrained answer per prompt)",
            )
        kl_in_loss = cfg.algorithm.kl.coef > 0 and cfg.algorithm.kl.mode == "loss"
        require(
            not r.greedy_answer_kl or r.answer_decoding in ("greedy", "greedy_and_sample"),
            "rlcr.greedy_answer_kl holds the argmax answers with the KL term: set rlcr.answer_decoding "
            f"to greedy or greedy_and_sample, got {r.answer_decoding!r}",
        )
        require(
            r.confidence_kl_weight >= 0,
            f"rlcr.confidence_kl_weight must be >= 0, got {r.confidence_kl_weight}",
        )
        require(
            r.confidence_kl or r.confidence_kl_weight == 1,
            "rlcr.confidence_kl=false already gives the confidence rows KL weight 0: leave "
            f"rlcr.confidence_kl_weight at 1, got {r.confidence_kl_weight}",
        )
        require(
            kl_in_loss or (not r.greedy_answer_kl and confidence_rows_kl_weight(r) == 1),
            "rlcr.greedy_answer_kl / rlcr.confidence_kl=false / rlcr.confidence_kl_weight choose the rows "
            "of the KL term: set "
            f"algorithm.kl.coef > 0 with algorithm.kl.mode=loss (got coef {cfg.algorithm.kl.coef}, "
            f"mode {cfg.algorithm.kl.mode})",
        )
        one_of("rlcr.confidence_decoding", r.confidence_decoding, CONFIDENCE_DECODINGS)
        if r.confidence_decoding == "enumerate" or r.expected_confidence_readout:
            _check_enumerated_confidences(cfg)
        one_of("rlcr.candidate_weighting", r.candidate_weighting, CANDIDATE_WEIGHTINGS)
        require(
            r.candidate_weighting == "policy" or r.confidence_decoding == "enumerate",
            f"rlcr.candidate_weighting={r.candidate_weighting} weighs enumerated candidates: set "
            "rlcr.confidence_decoding=enumerate (sampled confidences are weighed by being sampled)",
        )
        one_of("rlcr.candidate_baseline", r.candidate_baseline, CANDIDATE_BASELINES)
        require(
            r.candidate_baseline == "answer" or r.candidate_weighting == "uniform",
            f"rlcr.candidate_baseline={r.candidate_baseline} compares each candidate value across the "
            "step's answers with uniform weights: set rlcr.candidate_weighting=uniform",
        )
        require(
            0 < r.candidate_batch_share <= 1,
            f"rlcr.candidate_batch_share must be in (0, 1], got {r.candidate_batch_share}",
        )
        require(
            r.candidate_batch_share == 1 or r.candidate_baseline in CONTRAST_BASELINES,
            "rlcr.candidate_batch_share mixes the batch contrast with the answer baseline: set "
            "rlcr.candidate_baseline=batch (or kind)",
        )
        require(
            r.candidate_mass_coef >= 0, f"rlcr.candidate_mass_coef must be >= 0, got {r.candidate_mass_coef}"
        )
        require(
            r.candidate_mass_coef == 0 or r.confidence_decoding == "enumerate",
            "rlcr.candidate_mass_coef keeps the probability on the enumerated candidates: set "
            "rlcr.confidence_decoding=enumerate",
        )
        require(
            r.candidate_level_coef >= 0,
            f"rlcr.candidate_level_coef must be >= 0, got {r.candidate_level_coef}",
        )
        require(
            r.candidate_level_coef == 0 or r.candidate_baseline in CONTRAST_BASELINES,
            "rlcr.candidate_level_coef sets the level that the batch contrast leaves free: set "
            "rlcr.candidate_baseline=batch or kind (with confidence_decoding=enumerate, "
            "candidate_weighting=uniform)",
        )
        require(
            r.analyses_per_answer >= 0, f"rlcr.analyses_per_answer must be >= 0, got {r.analyses_per_answer}"
        )
        require(
            r.analyses_per_answer == 0 or r.confidence_decoding == "enumerate",
            "rlcr.analyses_per_answer samples analyses before enumerated confidences: set "
            "rlcr.confidence_decoding=enumerate (a sampled confidence reply writes its own analysis when "
            "rlcr.confidence_prompt asks for one)",
        )
        if r.confidence_decoding != "enumerate":
            require(
                r.num_generations_confidence >= 2,
                "rlcr.num_generations_confidence (G_c) must be >= 2 to normalise confidences per answer, "
                f"got {r.num_generations_confidence}",
            )
        require(bool(r.confidence_prompt.strip()), "rlcr.confidence_prompt must not be empty")
        require(
            "</confidence>" not in r.confidence_prefill,
            "rlcr.confidence_prefill must not close the <confidence> tag (the model writes the number "
            f"and the closing tag), got {r.confidence_prefill!r}",
        )
    else:
        require(
            not r.greedy_answer_kl and confidence_rows_kl_weight(r) == 1,
            "rlcr.greedy_answer_kl / rlcr.confidence_kl / rlcr.confidence_kl_weight choose the two-turn "
            "rollout's rows of the KL term; the single turn has one reply per row (leave them at false / "
            "true / 1)",
        )
        require(
            not r.expected_confidence_readout,
            "rlcr.expected_confidence_readout scores the candidates after the two-turn rollout's prefilled "
            "<confidence> tag; the single turn has none (set it to false)",
        )
        require(
            not r.confidence_prefill,
            "rlcr.confidence_prefill starts the confidence turn of the two-turn rollout; the single turn "
            f"has none (set rlcr.confidence_prefill=''), got {r.confidence_prefill!r}",
        )
        require(
            cfg.algorithm.estimator != "rlcr_hierarchical",
            "algorithm.estimator=rlcr_hierarchical needs the two-turn rollout; the single turn uses a "
            "group-mean baseline (e.g. algorithm.estimator=grpo)",
        )
        for key in ("format_weight", "accuracy_weight", "brier_weight"):
            require(getattr(r, key) >= 0, f"rlcr.{key} must be >= 0, got {getattr(r, key)}")


def _check_enumerated_confidences(cfg: NemoAzrConfig) -> None:
    """``rlcr.confidence_decoding=enumerate`` or ``rlcr.expected_confidence_readout``: the candidates
    follow the prefilled tag, and the generation backend must score them."""
    r = cfg.rlcr
    what = (
        "rlcr.confidence_decoding=enumerate"
        if r.confidence_decoding == "enumerate"
        else "rlcr.expected_confidence_readout"
    )
    values = list(r.confidence_candidates)
    require(
        len(values) >= 2 and all(0.0 <= float(v) <= 1.0 for v in values),
        f"rlcr.confidence_candidates must hold at least two values in [0, 1], got {values}",
    )
    texts = confidence_candidate_texts(values)
    require(
        len(set(texts)) == len(texts),
        f"rlcr.confidence_candidates are written with one decimal and must differ there, got {texts}",
    )
    require(
        r.confidence_prefill.endswith("<confidence>"),
        f"{what} scores each candidate as the text right after the opening "
        f"tag: set rlcr.confidence_prefill='<confidence>', got {r.confidence_prefill!r}",
    )
    require(
        cfg.generation.backend == "hf",
        f"{what} needs a generation backend that scores continuations "
        f"(generation.backend=hf), got {cfg.generation.backend!r}",
    )
