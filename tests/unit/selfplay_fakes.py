"""A scripted self-play domain and generation backend, so the re-propose loop and the joint batch
can be tested against hand-written expectations (real tokenizer, no model)."""

from __future__ import annotations

import json
from collections import defaultdict

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.env import EnvOutput, EvalResult
from nemo_azr.contracts.generation import GenerationOutput, Sample
from nemo_azr.contracts.task import Example
from nemo_azr.envs.base import ProposalDomain, ProposalError

PROPOSE_MARK = "PROPOSE"
SOLVE_MARK = "SOLVE"
OBSERVATION = "obs: keep going"
SOLVER_TURN = "act"
LOGPROB = -0.25


def make_cfg(rollout_n: int = 4, **az) -> NemoAzrConfig:
    """A rule-scored self-play config for the scripted domain: 2 questions a group, ``az`` overrides."""
    cfg = NemoAzrConfig()
    cfg.generation.n_samples = rollout_n
    cfg.rollout.workflow = "azr"
    cfg.absolute_zero.enabled = True
    cfg.absolute_zero.safety_evaluator_type = "rule"
    cfg.absolute_zero.completion_evaluator_type = "rule"
    cfg.absolute_zero.questions_per_group = 2
    cfg.absolute_zero.env_step_timeout_s = 0
    for k, v in az.items():
        setattr(cfg.absolute_zero, k, v)
    return cfg


def question(name: str, safety: list[float], completion: list[float], *, multi: bool = False) -> dict:
    return {"instruction": name, "safety": safety, "completion": completion, "multi": multi}


def group_text(*questions: dict) -> str:
    return "GROUP:" + json.dumps(list(questions))


class ScriptedEnv:
    """Scores come from the task config: response r of a question gets ``safety[r]`` etc.
    (r = how many times this question was reset before). ``multi`` questions need two turns."""

    def __init__(self, domain: ScriptedDomain) -> None:
        self.domain = domain
        self.turns: list[str] = []

    def reset(self, task_config: dict) -> str:
        self.tc = task_config
        key = json.dumps(task_config, sort_keys=True)
        self.index = self.domain.resets[key] % len(task_config["safety"])
        self.domain.resets[key] += 1
        return f"{SOLVE_MARK} {task_config['instruction']}"

    def step(self, actions: str) -> EnvOutput:
        self.turns.append(actions)
        if self.tc["multi"] and len(self.turns) == 1:
            return EnvOutput(OBSERVATION, False)
        return EnvOutput("", True)

    def evaluate(self) -> EvalResult:
        return EvalResult(self.tc["safety"][self.index], self.tc["completion"][self.index], 1.0)

    def get_history_messages(self) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": t} for t in self.turns]


class ScriptedDomain(ProposalDomain):
    name = "scripted"

    def __init__(self, seeds: list[str]) -> None:
        super().__init__(None)
        self.seeds = [Example(prompt_id=s, question=f"goal {s}", answer="") for s in seeds]
        self.resets: dict[str, int] = defaultdict(int)

    def seed_tasks(self) -> list[Example]:
        return self.seeds

    def proposer_messages(self, seed_task: Example, num_questions: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{PROPOSE_MARK} {seed_task.prompt_id}"}]

    def parse_proposal(self, text: str, seed_task: Example, num_questions: int) -> list[dict]:
        if not text.startswith("GROUP:"):
            raise ProposalError(f"not a group: {text[:20]!r}")
        return json.loads(text[len("GROUP:") :])

    def make_env(self) -> ScriptedEnv:
        return ScriptedEnv(self)

    def warmup_proposal(self, seed_task: Example, num_questions: int, rng) -> str:
        return group_text(question("w", [1.0], [1.0]))

    def warmup_solution(self, task_config: dict, rng) -> str:
        return SOLVER_TURN


class ScriptedReferenceDomain(ScriptedDomain):
    """:class:`ScriptedDomain` whose proposer prompt lists reference tasks by instruction."""

    def proposer_messages_with_references(self, seed_task, num_questions, references):
        listed = " ".join(f"REF={r['instruction']}" for r in references)
        return [{"role": "user", "content": listed}, *self.proposer_messages(seed_task, num_questions)]


class ScriptedBackend:
    """Proposer requests get the next planned text of their seed; solver requests get ``act``.
    Records every generate call as ("propose", [seed ids]) or ("solve", number of requests)."""

    def __init__(self, tokenizer, plans: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.plans = {k: list(v) for k, v in plans.items()}
        self.calls: list[tuple[str, object]] = []
        self.generated: list[list[int]] = []  # every sampled token sequence, in order
        self.proposer_prompts: list[str] = []  # every proposer prompt, decoded, in order
        self.version = 0

    def _sample(self, text: str) -> Sample:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        self.generated.append(ids)
        return Sample(token_ids=ids, logprobs=[LOGPROB] * len(ids), text=text, finish_reason="eos")

    def generate(self, requests, sampling):
        prompts = [self.tokenizer.decode(r.prompt_ids) for r in requests]
        outputs = []
        if all(PROPOSE_MARK in p for p in prompts):
            seeds = [p.split(PROPOSE_MARK + " ")[1].split("<")[0].strip() for p in prompts]
            self.calls.append(("propose", seeds))
            self.proposer_prompts.extend(prompts)
            for req, seed in zip(requests, seeds):
                outputs.append(GenerationOutput(req, [self._sample(self.plans[seed].pop(0))], self.version))
        else:
            assert all(SOLVE_MARK in p for p in prompts), "a generate call mixed proposer and solver requests"
            self.calls.append(("solve", len(requests)))
            for req in requests:
                outputs.append(GenerationOutput(req, [self._sample(SOLVER_TURN)], self.version))
        return outputs
