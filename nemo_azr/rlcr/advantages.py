"""Hierarchical RLCR advantages (seed 003).

Answers: ``A_ans[j,k] = (acc[j,k] - mean_j) / (std_j + eps)`` over the ``G_a`` answers of prompt ``j``.
Confidences: ``A_conf[j,k,h] = (conf[j,k,h] - mean_jk) / (std_jk + eps)`` over the ``G_c`` confidences
of answer ``(j, k)`` only, so no confidence advantage depends on another answer's confidences.
Optionally (``conf_prompt_level_norm``) a second stage re-normalises the stage-one confidence
advantages over all confidences of the prompt, and (``conf_batch_scale``) all confidence advantages
of the step are divided by their std, one scalar that sets the step size without touching any
baseline. Then ``lambda_ans`` / ``lambda_conf`` scale them and they are projected onto each row's
span mask (``loss_mask``).

With ``rlcr.confidence_decoding=enumerate`` the confidence rows are every candidate value of an
answer and their advantages weigh each by the policy's probability of it
(:func:`expected_confidence_advantages`); with ``rlcr.analyses_per_answer`` the analyses before them
are sampled rows, normalised per answer on the expected Brier reward after each
(:mod:`nemo_azr.rlcr.analysis`).

Population std (1/G), as the seed writes it. A group whose rewards are all equal gets exactly 0
(never rounding noise divided by eps). With ``scale_std=False`` only the mean is subtracted.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from nemo_azr.algorithms.advantages import ADVANTAGE_DTYPE, STATS_DTYPE, advantage_estimator, sequence_rewards
from nemo_azr.algorithms.grouping import group_index, group_mean, group_range, group_size, group_std
from nemo_azr.config.schema import AlgorithmConfig, RLCRConfig
from nemo_azr.contracts import Batch, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.errors import BatchContractError
from nemo_azr.rlcr.common import ANSWER_CORRECT, CANDIDATE_OF, CONFIDENCE, GREEDY_ANSWER, QUESTION_KIND
from nemo_azr.rlcr.config_check import CANDIDATE_WEIGHTINGS, CONTRAST_BASELINES

#: ``batch.info`` key under which the RLCR workflows hand their settings to the estimator.
RLCR_INFO_KEY = "rlcr"

Ids = Sequence[Hashable] | torch.Tensor


def _as_ids(ids: Ids) -> list[Hashable]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)


def group_normalize(
    rewards: torch.Tensor | Sequence[float], ids: Ids, *, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """``(r - mean_g) / (std_g + eps)`` (or ``r - mean_g``) per group of equal ``ids``; ``out[N]`` float32.

    Groups come from the ids only (rows of a group need not be adjacent). Constant groups get 0.
    """
    values = torch.as_tensor(rewards, dtype=STATS_DTYPE).reshape(-1)
    ids = _as_ids(ids)
    if len(ids) != values.numel():
        raise BatchContractError(f"{values.numel()} rewards but {len(ids)} group ids")
    if values.numel() == 0:
        return torch.zeros(0, dtype=ADVANTAGE_DTYPE)
    index = group_index(ids)
    num_groups = int(index.max()) + 1
    mean = group_mean(values, index, num_groups)
    deviation = values - mean[index]
    if scale_std:
        std = group_std(values, index, num_groups, mean=mean)
        deviation = deviation / (std[index] + eps)
    constant = group_range(values, index, num_groups)[index] == 0
    return torch.where(constant, 0.0, deviation).to(ADVANTAGE_DTYPE)


def answer_advantages(
    rewards: torch.Tensor | Sequence[float], prompt_ids: Ids, scale_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """``A_ans[N]``: accuracy rewards of answer rows normalised per prompt over its ``G_a`` answers."""
    return group_normalize(rewards, prompt_ids, scale_std=scale_std, eps=eps)


def confidence_advantages(
    rewards: torch.Tensor | Sequence[float],
    answer_ids: Ids,
    scale_std: bool = True,
    eps: float = 1e-6,
    *,
    prompt_ids: Ids | None = None,
    batch_scale: bool = False,
) -> torch.Tensor:
    """``A_conf[N]``: Brier rewards of confidence rows normalised per answer over its ``G_c`` confidences.

    Never mixed across answers. With ``prompt_ids`` the stage-one advantages are normalised again
    over each prompt's confidences (seed 003's optional prompt-level stage; it shares one scale per
    prompt, so it is off by default). With ``batch_scale`` they are divided by their population std
    over all ``N`` rows: every baseline stays its own answer's mean and the ratios between rows are
    kept (so with ``scale_std=False`` the step still follows the Brier score's expected gradient),
    only the step size is normalised. All zero stays all zero.
    """
    advantages = group_normalize(rewards, answer_ids, scale_std=scale_std, eps=eps)
    if prompt_ids is not None:
        advantages = group_normalize(advantages, prompt_ids, scale_std=scale_std, eps=eps)
    if batch_scale and advantages.numel():
        std = advantages.to(STATS_DTYPE).std(unbiased=False)
        if std > 0:
            advantages = (advantages.to(STATS_DTYPE) / (std + eps)).to(ADVANTAGE_DTYPE)
    return advantages


def expected_confidence_advantages(
    rewards: torch.Tensor | Sequence[float],
    logprobs: torch.Tensor | Sequence[float],
    answer_ids: Ids,
    weighting: str = "policy",
) -> torch.Tensor:
    """``rlcr.confidence_decoding=enumerate``: the advantage of candidate ``c`` of one answer is
    ``w_c * (R_c - sum_c' w_c' R_c')``, ``R`` the candidates' Brier rewards and ``w`` (``weighting``)
    the policy's probabilities of the answer's candidates (``exp(logprobs)`` renormalised over them)
    or, with ``"uniform"``, ``1 / K`` for each of the answer's ``K`` candidates.

    ``"policy"``: under the PPO ratio ``pi / pi_old`` this gives the loss ``-sum_c pi(c) (R_c - V)``,
    whose gradient is the exact gradient of the expected Brier reward over the candidates (the
    all-action policy gradient of mean actor-critic, Allen et al. 2017): what sampled confidences
    estimate with noise. Its logit gradient is ``pi(c) (R_c - V)``, which vanishes once the policy
    writes one value nearly always. ``"uniform"``: each candidate's log-prob is pushed by its reward
    above the candidates' mean whatever its probability, so the likeliest value keeps moving towards
    the Brier-best one for the answer's context (decision 218).
    """
    if weighting not in CANDIDATE_WEIGHTINGS:
        raise ValueError(f"weighting must be one of {CANDIDATE_WEIGHTINGS}, got {weighting!r}")
    values = torch.as_tensor(rewards, dtype=STATS_DTYPE).reshape(-1)
    logp = torch.as_tensor(logprobs, dtype=STATS_DTYPE).reshape(-1)
    ids = _as_ids(answer_ids)
    if not (len(ids) == values.numel() == logp.numel()):
        raise BatchContractError(f"{values.numel()} rewards, {logp.numel()} log-probs, {len(ids)} answer ids")
    if values.numel() == 0:
        return torch.zeros(0, dtype=ADVANTAGE_DTYPE)
    index = group_index(ids)
    num_groups = int(index.max()) + 1
    if weighting == "uniform":
        weight = group_share(torch.ones_like(logp), index, num_groups)
    else:
        weight = _probabilities_in_groups(logp, index, num_groups)
    expected = torch.zeros(num_groups, dtype=STATS_DTYPE).index_add(0, index, weight * values)
    return (weight * (values - expected[index])).to(ADVANTAGE_DTYPE)


def group_share(values: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Each row's share of its group's total (``values`` >= 0, every group's total > 0)."""
    total = torch.zeros(num_groups, dtype=STATS_DTYPE).index_add(0, index, values)
    return values / total[index]


def candidate_probabilities(logprobs: torch.Tensor | Sequence[float], answer_ids: Ids) -> torch.Tensor:
    """``pi~(c)``: the policy's probability of each candidate renormalised over its answer's candidates,
    from the candidates' sequence log-probs (``float64[N]``)."""
    logp = torch.as_tensor(logprobs, dtype=STATS_DTYPE).reshape(-1)
    index = group_index(_as_ids(answer_ids))
    return _probabilities_in_groups(logp, index, int(index.max()) + 1)


def _probabilities_in_groups(logp: torch.Tensor, index: torch.Tensor, num_groups: int) -> torch.Tensor:
    top = torch.full((num_groups,), float("-inf"), dtype=STATS_DTYPE).scatter_reduce(0, index, logp, "amax")
    # stable: the likeliest candidate of each answer has 1 before the division
    return group_share((logp - top[index]).exp(), index, num_groups)


def candidate_mass_advantages(
    logprobs: torch.Tensor | Sequence[float], answer_ids: Ids, coef: float
) -> torch.Tensor:
    """``rlcr.candidate_mass_coef``: ``coef * pi~(c)`` for each candidate, whose policy-gradient step is
    ``coef * grad log M``, ``M = sum_c pi(c)`` the probability of writing any candidate after the tag
    (``grad log M = sum_c pi~(c) grad log pi(c)``). It raises the candidates together, in proportion
    to how the policy already shares them out, so to first order their relative probabilities (what
    the Brier advantages move) stay where they are; it vanishes as ``M`` nears 1 (decision 220).
    The enumeration scores only the candidates, so an advantage on them is all a step can use; this
    one is the exact gradient of the format's log-probability, not a heuristic push."""
    if len(_as_ids(answer_ids)) == 0:
        return torch.zeros(0, dtype=ADVANTAGE_DTYPE)
    return (coef * candidate_probabilities(logprobs, answer_ids)).to(ADVANTAGE_DTYPE)


def candidate_level_advantages(
    correct: Sequence[float],
    candidate_values: Sequence[float],
    logprobs: torch.Tensor | Sequence[float],
    answer_ids: Ids,
    coef: float,
    strata: Sequence[Hashable] | None = None,
) -> torch.Tensor:
    """``rlcr.candidate_level_coef``: candidate ``c`` of answer ``i`` gets
    ``coef * 2 (mean y - mean e) (c - cbar_i) / K_i``, ``mean y`` the step's accuracy over its answers,
    ``mean e`` the mean over answers of the policy's expected confidence ``e_i = sum_c pi~(c) c``,
    ``cbar_i`` the mean of the answer's ``K_i`` candidate values. With ``strata`` (one per row, e.g.
    the question's kind; ``rlcr.candidate_baseline=kind``) both means are taken over the answers of
    the row's stratum: each stratum's level is pulled to its own accuracy.

    It is the gradient of ``-coef (mean y - mean e)^2`` (calibration in the large) with the uniform
    candidate weights of the batch contrast: every answer's candidates are pushed up along their
    values when the policy's confidence sits below the step's accuracy and down when above, by the
    same amount for every answer, so it sets the level the contrast leaves free without telling
    answers apart; it is 0 once the two agree (decision 224).
    """
    values = torch.as_tensor(candidate_values, dtype=STATS_DTYPE).reshape(-1)
    y = torch.as_tensor(correct, dtype=STATS_DTYPE).reshape(-1)
    logp = torch.as_tensor(logprobs, dtype=STATS_DTYPE).reshape(-1)
    ids = _as_ids(answer_ids)
    if not (len(ids) == values.numel() == y.numel() == logp.numel()):
        raise BatchContractError(
            f"{y.numel()} accuracies, {values.numel()} candidate values, {logp.numel()} log-probs, "
            f"{len(ids)} answer ids"
        )
    if values.numel() == 0:
        return torch.zeros(0, dtype=ADVANTAGE_DTYPE)
    index = group_index(ids)
    num_groups = int(index.max()) + 1
    expected = torch.zeros(num_groups, dtype=STATS_DTYPE).index_add(
        0, index, _probabilities_in_groups(logp, index, num_groups) * values
    )
    accuracy = group_mean(y, index, num_groups)  # one value per answer: its candidates share it
    stratum = _answer_strata(index, num_groups, strata, len(ids))
    num_strata = int(stratum.max()) + 1
    gap = group_mean(accuracy, stratum, num_strata) - group_mean(expected, stratum, num_strata)
    count = group_size(index, num_groups).to(STATS_DTYPE)
    centred = values - group_mean(values, index, num_groups)[index]
    return (coef * 2 * gap[stratum][index] * centred / count[index]).to(ADVANTAGE_DTYPE)


def _answer_strata(
    index: torch.Tensor, num_groups: int, strata: Sequence[Hashable] | None, num_rows: int
) -> torch.Tensor:
    """Each answer's stratum index (``[num_groups]``) from per-row strata; one stratum without."""
    per_row = _row_strata(strata, num_rows)
    if per_row is None:
        return torch.zeros(num_groups, dtype=torch.long)
    per_answer = torch.zeros(num_groups, dtype=torch.long).scatter(0, index, per_row)
    if not torch.equal(per_answer[index], per_row):
        raise BatchContractError("the candidates of one answer must share its stratum (question kind)")
    return per_answer


def _row_strata(strata: Sequence[Hashable] | None, num_rows: int) -> torch.Tensor | None:
    """Dense per-row stratum ids (``[num_rows]``), checked against the row count; None without strata."""
    if strata is None:
        return None
    if len(strata) != num_rows:
        raise BatchContractError(f"{len(strata)} strata for {num_rows} candidate rows")
    return group_index(list(strata))


def contrast_confidence_advantages(
    rewards: torch.Tensor | Sequence[float],
    candidate_values: Sequence[float],
    answer_ids: Ids,
    strata: Sequence[Hashable] | None = None,
) -> torch.Tensor:
    """``rlcr.candidate_baseline=batch`` (uniform weights): candidate ``c`` of answer ``i`` gets
    ``(R_ic - mean_j R_jc) / K_i``, its reward against the mean reward of the same value ``c`` over
    every answer ``j`` of the batch, ``K_i`` the answer's candidate count.

    For the Brier reward ``R_ic = 1 - (y_i - c)^2`` this is ``(y_i - mean y)(2c - 1) / K_i``: right
    answers push every candidate up in proportion to its value and wrong ones down, and what all
    answers share (the batch's base rate) no longer moves the confidence (decision 218).

    ``strata`` (one per row; ``rlcr.candidate_baseline=kind``): the mean runs over the answers ``j``
    of the row's stratum only, ``(y_i - mean y_kind)(2c - 1) / K_i``, so a kind whose answers are
    right more often than the batch's no longer pushes all its confidences up: only what tells
    answers of one kind apart moves them (decision 226).
    """
    values = torch.as_tensor(rewards, dtype=STATS_DTYPE).reshape(-1)
    ids = _as_ids(answer_ids)
    if not (len(ids) == values.numel() == len(candidate_values)):
        raise BatchContractError(
            f"{values.numel()} rewards, {len(candidate_values)} candidate values, {len(ids)} answer ids"
        )
    if values.numel() == 0:
        return torch.zeros(0, dtype=ADVANTAGE_DTYPE)
    keys = [round(float(v), 6) for v in candidate_values]
    per_row = _row_strata(strata, len(keys))
    by_value = group_index(keys if per_row is None else list(zip(per_row.tolist(), keys)))
    index = group_index(ids)
    per_value = group_mean(values, by_value, int(by_value.max()) + 1)
    count = group_size(index, int(index.max()) + 1).to(STATS_DTYPE)
    return ((values - per_value[by_value]) / count[index]).to(ADVANTAGE_DTYPE)


@advantage_estimator("rlcr_hierarchical", required_meta=(F.GROUP_ID, F.SUBGROUP_ID, F.SAMPLE_TYPE))
def rlcr_hierarchical(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Answer rows per prompt (``group_id``; argmax answers left out), confidence rows per answer
    (``subgroup_id``), scaled by ``lambda_ans`` / ``lambda_conf``, projected onto ``loss_mask``:
    ``advantages[B, T]``.

    Settings come from ``batch.info["rlcr"]`` (an :class:`RLCRConfig` set by the RLCR workflows);
    without it the :class:`RLCRConfig` defaults apply.
    """
    settings = batch.info.get(RLCR_INFO_KEY) or RLCRConfig()
    types = batch.meta[F.SAMPLE_TYPE]
    known = {SampleType.ANSWER.value, SampleType.CONFIDENCE.value}
    unknown = sorted({str(t) for t in types} - known)
    if unknown:
        raise BatchContractError(
            f"advantage estimator 'rlcr_hierarchical': sample_type must be answer|confidence, got {unknown}"
        )
    rewards = sequence_rewards(batch).to(STATS_DTYPE).cpu()
    is_answer = [t == SampleType.ANSWER.value for t in types]
    # argmax answers (rlcr.answer_decoding greedy / greedy_and_sample) are not trained and stay out
    # of the sampled answers' baseline: it is the mean of the policy's own samples
    greedy = batch.meta.get(GREEDY_ANSWER) or [False] * len(batch)
    ans_rows = [i for i, a in enumerate(is_answer) if a and not greedy[i]]
    conf_rows = [i for i, a in enumerate(is_answer) if not a]
    groups, subgroups = batch.meta[F.GROUP_ID], batch.meta[F.SUBGROUP_ID]

    row = torch.zeros(len(batch), dtype=ADVANTAGE_DTYPE)
    if ans_rows:
        row[ans_rows] = settings.lambda_ans * answer_advantages(
            rewards[ans_rows], [groups[i] for i in ans_rows], settings.scale_std, settings.eps
        )
    if conf_rows and settings.confidence_decoding == "enumerate":
        # every candidate is a row: weighted by the policy's probability of writing it (pi_old: the
        # PPO ratio's denominator; the rollout's where the trainer reuses the update's own)
        logprobs = batch.tensors.get(F.OLD_LOGPROBS, batch.tensors.get(F.ROLLOUT_LOGPROBS))
        if logprobs is None:
            raise BatchContractError(
                "rlcr.confidence_decoding=enumerate weighs each candidate by its probability: the batch "
                f"needs {F.OLD_LOGPROBS!r} or {F.ROLLOUT_LOGPROBS!r}"
            )
        sums = (logprobs.float() * batch.tensors[F.LOSS_MASK].float()).sum(1).cpu()
        # candidates share a baseline within the context they follow (the answer, or an analysis of
        # it: rlcr.analyses_per_answer); without the key (older batches) every row is a candidate
        candidate_of = batch.meta.get(CANDIDATE_OF) or [subgroups[i] for i in range(len(batch))]
        cand_rows = [i for i in conf_rows if candidate_of[i] is not None]
        analysis_rows = [i for i in conf_rows if candidate_of[i] is None]
        if cand_rows:
            row[cand_rows] = settings.lambda_conf * _candidate_advantages(
                batch,
                settings,
                cand_rows,
                rewards[cand_rows],
                sums[cand_rows],
                [candidate_of[i] for i in cand_rows],
            )
        if analysis_rows:  # rewarded with the expected Brier reward after them: per answer, as sampled
            row[analysis_rows] = settings.lambda_conf * confidence_advantages(
                rewards[analysis_rows],
                [subgroups[i] for i in analysis_rows],
                settings.scale_std,
                settings.eps,
                batch_scale=settings.conf_batch_scale,
            )
    elif conf_rows:
        prompt_ids = [groups[i] for i in conf_rows] if settings.conf_prompt_level_norm else None
        row[conf_rows] = settings.lambda_conf * confidence_advantages(
            rewards[conf_rows],
            [subgroups[i] for i in conf_rows],
            settings.scale_std,
            settings.eps,
            prompt_ids=prompt_ids,
            batch_scale=settings.conf_batch_scale,
        )
    mask = batch.tensors[F.LOSS_MASK].bool().to(ADVANTAGE_DTYPE)
    advantages = row.to(mask.device).unsqueeze(1) * mask
    return advantages, advantages.clone()


def _meta_of_rows(batch: Batch, key: str, rows: list[int], needed_by: str) -> list:
    if key not in batch.meta:
        raise BatchContractError(f"{needed_by}: the batch needs each candidate row's {key!r} in meta")
    return [batch.meta[key][i] for i in rows]


def _question_kinds(batch: Batch, rows: list[int]) -> list[Hashable]:
    """``rlcr.candidate_baseline=kind``: each candidate row's question kind (its stratum)."""
    kinds = _meta_of_rows(batch, QUESTION_KIND, rows, "rlcr.candidate_baseline=kind")
    if rows and all(k is None for k in kinds):
        raise BatchContractError(
            "rlcr.candidate_baseline=kind compares answers of the same question kind, and this task's "
            "questions carry none (Example.meta['kind'], as synthetic_qa and arithmetic set it): use "
            "rlcr.candidate_baseline=batch"
        )
    return kinds


def _candidate_advantages(
    batch: Batch,
    settings: RLCRConfig,
    rows: list[int],
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    answers: list[Hashable],
) -> torch.Tensor:
    """The enumerated candidates' advantages before ``lambda_conf``: the Brier term against the
    answer's or the batch's baseline, then the optional level and mass terms."""
    strata = _question_kinds(batch, rows) if settings.candidate_baseline == "kind" else None
    if settings.candidate_baseline in CONTRAST_BASELINES:
        values = _meta_of_rows(
            batch,
            CONFIDENCE,
            rows,
            f"rlcr.candidate_baseline={settings.candidate_baseline} compares candidates of the same value",
        )
        share = settings.candidate_batch_share
        adv = share * contrast_confidence_advantages(rewards, values, answers, strata)
        if share < 1:  # the answer baseline sets the level the contrast alone leaves free
            adv += (1 - share) * expected_confidence_advantages(
                rewards, logprobs, answers, weighting="uniform"
            )
    else:
        adv = expected_confidence_advantages(
            rewards, logprobs, answers, weighting=settings.candidate_weighting
        )
    if settings.candidate_level_coef > 0:
        why = "rlcr.candidate_level_coef pulls the mean confidence to the step's accuracy"
        adv += candidate_level_advantages(
            _meta_of_rows(batch, ANSWER_CORRECT, rows, why),
            _meta_of_rows(batch, CONFIDENCE, rows, why),
            logprobs,
            answers,
            settings.candidate_level_coef,
            strata,
        )
    if settings.candidate_mass_coef > 0:
        adv += candidate_mass_advantages(logprobs, answers, settings.candidate_mass_coef)
    return adv
