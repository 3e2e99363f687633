"""Single-turn workflow: chat prompt -> ``n`` sampled responses per prompt -> a rollout ``Batch``."""

from __future__ import annotations

from collections.abc import Sequence

from nemo_azr.contracts import Batch, Role, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, SamplingParams
from nemo_azr.contracts.task import Example, Task
from nemo_azr.registry import WORKFLOWS


def encode_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Chat-template token ids ending with the assistant header (generation prompt)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@WORKFLOWS.register("single_turn")
class SingleTurnWorkflow:
    def __init__(self, task: Task, tokenizer, cfg=None) -> None:
        self.task = task
        self.tokenizer = tokenizer

    def run(
        self, examples: Sequence[Example], backend: GenerationBackend, sampling: SamplingParams, *, step: int
    ) -> Batch:
        """Rows ordered prompt-major: prompt i's samples are rows ``i*n .. i*n+n-1``, ``group_id`` = prompt i."""
        prompt_ids = [encode_prompt(self.tokenizer, self.task.messages(ex)) for ex in examples]
        requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompt_ids)]
        outputs = backend.generate(requests, sampling)

        rows_prompt, rows_resp, rows_logp = [], [], []
        meta: dict[str, list] = {
            k: []
            for k in (
                F.UID,
                F.GROUP_ID,
                F.PROMPT_ID,
                F.ROLE,
                F.SAMPLE_TYPE,
                F.POLICY_VERSION,
                F.PROMPT_TEXT,
                F.RESPONSE_TEXT,
                "example",
                "finish_reason",
            )
        }
        for i, (ex, out) in enumerate(zip(examples, outputs)):
            group = f"s{step}-p{i}"
            for j, s in enumerate(out.samples):
                rows_prompt.append(prompt_ids[i])
                rows_resp.append(s.token_ids)
                rows_logp.append(s.logprobs)
                meta[F.UID].append(f"{group}-r{j}")
                meta[F.GROUP_ID].append(group)
                meta[F.PROMPT_ID].append(ex.prompt_id)
                meta[F.ROLE].append(Role.SOLVER.value)
                meta[F.SAMPLE_TYPE].append(SampleType.ANSWER.value)
                meta[F.POLICY_VERSION].append(out.policy_version)
                meta[F.PROMPT_TEXT].append(ex.question)
                meta[F.RESPONSE_TEXT].append(s.text)
                meta["example"].append(ex)
                meta["finish_reason"].append(s.finish_reason)
        tensors = pack_prompt_response(rows_prompt, rows_resp, rows_logp, pad_id=_pad_id(self.tokenizer))
        return Batch(tensors, meta, {"max_new_tokens": sampling.max_new_tokens})


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
