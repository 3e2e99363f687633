import pytest

from nemo_azr.errors import ConfigError
from nemo_azr.registry import Registry


def test_register_and_lookup():
    reg = Registry("widget")

    @reg.register("a", "alias_a")
    def a():
        return 1

    assert reg.get("a") is a and reg.get("alias_a") is a
    assert "a" in reg and reg.names() == ["a", "alias_a"]


def test_unknown_name_lists_known():
    reg = Registry("widget")
    reg.register("one")(object())
    with pytest.raises(ConfigError, match="unknown widget 'two'; known: one"):
        reg.get("two")


def test_double_registration_is_refused():
    reg = Registry("widget")
    reg.register("x")(lambda: 1)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("x")(lambda: 2)


def test_every_registered_estimator_is_an_advantage_estimator_with_its_needs():
    import nemo_azr.plugins  # noqa: F401
    from nemo_azr.algorithms.per_role import role_split_estimator
    from nemo_azr.contracts.algorithm import AdvantageEstimator
    from nemo_azr.registry import ADVANTAGE_ESTIMATORS

    for name in ADVANTAGE_ESTIMATORS.names():
        assert isinstance(ADVANTAGE_ESTIMATORS.get(name), AdvantageEstimator), name
    # the group baselines need two samples of a prompt; the others one
    needs = {
        n: ADVANTAGE_ESTIMATORS.get(n).min_samples_per_prompt
        for n in ("grpo", "rloo", "reinforce_plus_plus", "gae")
    }
    assert needs == {"grpo": 2, "rloo": 2, "reinforce_plus_plus": 1, "gae": 1}
    assert isinstance(role_split_estimator({"solver": "grpo", "proposer": "gae"}), AdvantageEstimator)


def test_the_preflight_check_reads_the_estimators_sample_need():
    from nemo_azr.errors import ConfigError
    from nemo_azr.preflight import load_config

    with pytest.raises(ConfigError, match=r"algorithm.estimator=rloo .* generation.n_samples >= 2 \(got 1\)"):
        load_config(["algorithm.estimator=rloo", "generation.n_samples=1"])
    load_config(["algorithm.estimator=reinforce_plus_plus", "generation.n_samples=1"])


def test_registered_workflows_and_critics_implement_their_protocols():
    import inspect

    import nemo_azr.plugins  # noqa: F401
    from nemo_azr.contracts.capabilities import Workflow
    from nemo_azr.contracts.policy import Critic
    from nemo_azr.models.hf.critic import HFCritic, SharedTrunkCritic
    from nemo_azr.registry import WORKFLOWS

    classes = [WORKFLOWS.get(n) for n in WORKFLOWS.names() if inspect.isclass(WORKFLOWS.get(n))]
    assert len(classes) >= 4  # single_turn, azr, rlcr_two_turn, rlcr_single_turn ("rlcr" is a factory)
    for cls in classes:
        assert callable(getattr(cls, "run", None)), cls.__name__
    assert "run" in dict(inspect.getmembers(Workflow, inspect.isfunction))
    methods = [n for n, _ in inspect.getmembers(Critic, inspect.isfunction) if not n.startswith("_")]
    assert {"compute_values", "update", "save", "load", "setup_optimizer"} <= set(methods)
    critics = [HFCritic, SharedTrunkCritic]
    try:
        from nemo_azr.models.megatron.critic import MegatronCritic

        critics.append(MegatronCritic)
    except ImportError:  # megatron-core not installed
        pass
    for cls in critics:
        assert all(callable(getattr(cls, n, None)) for n in methods), cls.__name__
