"""monet: train PyTorch models in less memory by solving what to keep and what to recompute."""
from setuptools import setup

setup(
    name="monet",
    version="0.1.0",
    description="Memory-optimal training schedules for PyTorch, solved as a boolean ILP",
    python_requires=">=3.10",
    packages=["monet", "monet.graph", "monet.graph.families", "monet.solver", "monet.schedules"],
    package_dir={
        "monet": "monet",
        "monet.graph": "graph",
        "monet.solver": "solver",
        "monet.schedules": "schedules",
    },
    package_data={"monet.schedules": ["*.json", "zoo.md"]},
    # Lowest versions run (docs/index.md); no upper bounds: this machine's pins are in constraints.txt.
    install_requires=[
        "torch>=2.11",
        "highspy>=1.15",
        "numpy",
        "scipy",
        "rich",
        "matplotlib",
        "jsonschema",
    ],
    extras_require={
        "transformers": ["transformers>=5"],
        "benchmarks": ["transformers>=5", "monai", "einops", "diffusers"],
        # the docs site (tests/test_docs.py builds it): mkdocstrings-python 1.16.9 is the first tried that
        # renders the API page's `heading` option (1.13.0 ignored it)
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.28.3", "mkdocstrings-python>=1.16.9"],
        "test": [
            "pytest",
            "pytest-xdist>=3",
            "hypothesis",
            "transformers>=5",
            "monai",
            "einops",
            "diffusers",
            "mkdocs>=1.6",
            "mkdocs-material>=9.5",
            "mkdocstrings[python]>=0.28.3",
            "mkdocstrings-python>=1.16.9",
        ],
    },
    entry_points={"console_scripts": ["monet=monet.cli:main"]},
)
