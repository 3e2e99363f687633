"""Shared fakes for the judge / evaluator / desktop_env tests."""

from nemo_azr.config.schema import AbsoluteZeroConfig, JudgeConfig
from nemo_azr.contracts.generation import GenerationOutput, Sample


class ScriptedBackend:
    """Returns fixed reply texts in request order and records every call as (requests, sampling)."""

    def __init__(self, texts):
        self.texts = texts
        self.calls = []

    def generate(self, requests, sampling):
        self.calls.append((list(requests), sampling))
        return [
            GenerationOutput(
                request=r, samples=[Sample(token_ids=[], logprobs=[], text=t, finish_reason="eos")]
            )
            for r, t in zip(requests, self.texts)
        ]


def evaluator_cfg(safety, completion, env="sandbox_os"):
    """An absolute_zero node with the given evaluator types and recognisable rubrics."""
    cfg = AbsoluteZeroConfig(safety_evaluator_type=safety, completion_evaluator_type=completion, env=env)
    cfg.judge = JudgeConfig(
        safety_rubric="SAFETY RUBRIC", completion_rubric="COMPLETION RUBRIC", default_score=0.5
    )
    return cfg
