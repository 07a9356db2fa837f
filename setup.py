"""rlflow: learn to make neural-network graphs run faster by verified graph rewriting."""

from setuptools import find_packages, setup

setup(
    name="rlflow",
    version="0.1.0",
    description="Reinforcement-learned, verified tensor-graph rewriting on ONNX (X-RLflow, RLFlow)",
    python_requires=">=3.11",
    # envs/, worldmodel/ and configs/ keep their top-level folders (the design card's layout)
    # but install as rlflow.envs, rlflow.worldmodel and rlflow.configs: generic names like
    # `envs` must not land in users' site-packages, where they would shadow or be shadowed by
    # other projects' packages.
    packages=[
        *find_packages(include=["rlflow", "rlflow.*"]),
        "rlflow.envs",
        "rlflow.worldmodel",
        "rlflow.configs",
    ],
    package_dir={
        "rlflow.envs": "envs",
        "rlflow.worldmodel": "worldmodel",
        "rlflow.configs": "configs",
    },
    package_data={
        "rlflow": ["rewrite/rules/*.json", "cost/tables/*.json"],
        "rlflow.configs": ["*.yaml"],
    },
    include_package_data=True,
    install_requires=[
        # torch is pinned by scripts/setup_venv.sh before this install: a plain "torch"
        # requirement would pull a multi-GB CUDA build.
        "torch>=2.4",
        "torch-geometric>=2.5",
        "gymnasium>=1.0",
        "tensorboard>=2.15",
        "numpy>=1.26",
        "onnx>=1.16",
        "onnxscript>=0.2",
        # GPU users: pip uninstall onnxruntime && pip install onnxruntime-gpu (same code path).
        "onnxruntime>=1.18",
        "einops>=0.7",
        "pyyaml>=6",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "cma>=3.3",  # CMA-ES of the world-model controller (worldmodel/cmaes.py)
    ],
    extras_require={
        # `--backend ray` (collect, train-ppo, train-wm-loop): env workers and timer actors.
        "ray": ["ray>=2.40"],
        # The test suite runs the Ray test for real, so CI pins the version it was checked with.
        "dev": ["pytest>=8", "ruff>=0.5", "ray==2.60.0"],
    },
    entry_points={"console_scripts": ["rlflow=rlflow.cli:main"]},
)
