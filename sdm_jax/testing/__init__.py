"""What the tests and the benchmarks share: random inputs (`inputs`), running a mixer and differentiating the test loss
(`runs`), the relative-error measures and the tolerance table (`errors`), and the 'cuda' lowering check of the Pallas
kernels (`lowering`). Depends on sdm_jax.ops and jax alone, so a benchmark imports it without pytest."""
