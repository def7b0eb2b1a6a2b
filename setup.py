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
    # Lowest versions run (README "Set up and test"); no upper bounds: this machine's pins are in constraints.txt.
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
        "test": ["pytest", "pytest-xdist>=3", "hypothesis", "transformers>=5", "monai", "einops", "diffusers"],
    },
    entry_points={"console_scripts": ["monet=monet.cli:main"]},
)
