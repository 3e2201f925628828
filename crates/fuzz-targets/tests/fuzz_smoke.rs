//! The fuzz smoke of `make test`: every target of this crate over its
//! committed corpus (`fuzz/corpus/<target>/`) plus seeded random and
//! mutated inputs (see `fencelock_fuzz_targets::smoke` for the knobs).
//! Coverage-guided runs of the same targets: `make fuzz`.

use fencelock_fuzz_targets::{seeds, smoke, TARGETS};

#[test]
fn every_target_survives_its_corpus_and_generated_inputs() {
    for target in TARGETS {
        let report = smoke::run(
            target.name,
            target.run,
            &seeds::for_target(target.name),
            target.smoke_iterations,
        );
        eprintln!(
            "{}: {} corpus inputs, {} generated, {} ms",
            target.name, report.corpus, report.generated, report.millis
        );
    }
}
