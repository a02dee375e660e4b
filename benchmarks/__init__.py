"""Side-by-side speed and memory benchmarks of posformers models against their transformers counterparts.

`python -m benchmarks.run --model roformer` runs one suite; suites are registered in `benchmarks.registry.SUITES`.
"""
