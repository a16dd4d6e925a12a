"""Benchmarks (`lakehouse dev bench`, `make bench`): figures printed and saved, never asserted.

Every benchmark starts its own Kafka broker and lakes under the output folder
(`LAKEHOUSE_BENCH_DIR`, default `.bench/`), produces its workload with the contract's
generator, and writes `<name>.json` (every figure) and `<name>.png` (the curves).
"""
