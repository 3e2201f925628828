//! The bounded, stable-Rust run of a fuzz target that `make test` does.
//!
//! For one target: every file of its committed corpus
//! (`fuzz/corpus/<target>/`), then a fixed number of inputs made from a
//! seeded generator — random bytes, and the corpus entries damaged (bit
//! flips, interesting values, cuts, inserts, duplicated chunks, splices).
//! Not coverage-guided (that is `make fuzz`), but deterministic for a seed
//! and fast enough for every test run.
//!
//! Environment:
//! * `FENCELOCK_FUZZ_ITERS` — generated inputs per target (default: the
//!   caller's).
//! * `FENCELOCK_FUZZ_SEED` — generator seed (default fixed, so a run is
//!   reproducible; the seed is printed).
//! * `FENCELOCK_FUZZ_INPUT` — a file: run only that input (on every target
//!   of the test, or on `FENCELOCK_FUZZ_TARGET` if set), to reproduce a
//!   crash found by the smoke or by `cargo fuzz`.
//! * `FENCELOCK_WRITE_CORPUS=1` — (re)write the `seed-*` files of each
//!   corpus from the current encoders before replaying it.
//!
//! An input that panics is written to
//! `$TMPDIR/fencelock-fuzz-smoke/<target>-<hash>.bin` and the run fails
//! naming it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The default seed of the generator.
pub const DEFAULT_SEED: u64 = 0x5eed_f00d_2026_0008;
/// Longest generated or mutated input.
pub const MAX_INPUT_LEN: usize = 4_096;

/// `fuzz/corpus` of this repository.
pub fn corpus_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

/// A small xorshift generator: no dependency, same sequence everywhere.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // One splitmix64 step, so that nearby seeds start far apart (and
        // never at the xorshift's fixed point, zero).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// 64-bit FNV-1a: names saved inputs by content.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

const INTERESTING_U32: [u32; 8] = [0, 1, 0x7f, 0xff, 0xffff, 0x7fff_ffff, 0xffff_ffff, 16];
const INTERESTING_U64: [u64; 5] = [0, 1, u64::MAX, 1 << 63, (1 << 23) - 1];

/// One to four random changes to `bytes`; `other` is a splice source.
pub fn mutate(rng: &mut Rng, mut bytes: Vec<u8>, other: &[u8]) -> Vec<u8> {
    for _ in 0..1 + rng.below(4) {
        let len = bytes.len();
        let at = rng.below(len + 1);
        match rng.below(9) {
            0 if len > 0 => {
                let i = at.min(len - 1);
                bytes[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = at.min(len - 1);
                bytes[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 => bytes.truncate(at),
            3 => {
                let n = 1 + rng.below(8);
                let new = rng.bytes(n);
                bytes.splice(at..at, new);
            }
            4 if len > 0 => {
                let end = (at + 1 + rng.below(16)).min(len);
                bytes.drain(at.min(len - 1)..end);
            }
            5 if len > 0 => {
                // Duplicate a chunk: repeated records, counts that lie.
                let start = at.min(len - 1);
                let end = (start + 1 + rng.below(32)).min(len);
                let chunk = bytes[start..end].to_vec();
                bytes.splice(start..start, chunk);
            }
            6 if len >= 4 => {
                let i = at.min(len - 4);
                let v = INTERESTING_U32[rng.below(INTERESTING_U32.len())];
                bytes[i..i + 4].copy_from_slice(&v.to_be_bytes());
            }
            7 if len >= 8 => {
                let i = at.min(len - 8);
                let v = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
                bytes[i..i + 8].copy_from_slice(&v.to_be_bytes());
            }
            _ if !other.is_empty() => {
                // Splice: our head, the other input's tail.
                let from = rng.below(other.len());
                bytes.truncate(at);
                bytes.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    bytes.truncate(MAX_INPUT_LEN);
    bytes
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={value} is not a number")))
}

/// Runs `f` on `input`; on a panic saves the input and returns where.
fn try_one(name: &str, f: fn(&[u8]), input: &[u8]) -> Result<(), PathBuf> {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_ok() {
        return Ok(());
    }
    let dir = std::env::temp_dir().join("fencelock-fuzz-smoke");
    let path = dir.join(format!("{name}-{:016x}.bin", fnv(input)));
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(&path, input);
    Err(path)
}

/// Reads every file of a corpus directory, sorted by name.
pub fn read_corpus(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            let bytes = std::fs::read(e.path()).expect("corpus file readable");
            (e.file_name().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    out.sort();
    out
}

/// Writes `seeds` as `seed-<label>` files of `dir` (other files, such as
/// `regression-*` inputs, stay).
pub fn write_seeds(dir: &Path, seeds: &[(String, Vec<u8>)]) {
    std::fs::create_dir_all(dir).expect("corpus directory");
    for (label, bytes) in seeds {
        std::fs::write(dir.join(format!("seed-{label}")), bytes).expect("corpus file");
    }
}

/// What one target's smoke run did.
#[derive(Debug)]
pub struct Report {
    pub corpus: usize,
    pub generated: usize,
    pub millis: u128,
}

/// The smoke run of one target (see the module documentation). Panics,
/// naming the saved input, if any input panicked.
pub fn run(
    name: &str,
    f: fn(&[u8]),
    seeds: &[(String, Vec<u8>)],
    default_iterations: usize,
) -> Report {
    let started = Instant::now();
    if let Ok(file) = std::env::var("FENCELOCK_FUZZ_INPUT") {
        let only = std::env::var("FENCELOCK_FUZZ_TARGET").ok();
        if only.as_deref().is_some_and(|t| t != name) {
            return Report {
                corpus: 0,
                generated: 0,
                millis: 0,
            };
        }
        let input = std::fs::read(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        eprintln!("{name}: running only {file} ({} bytes)", input.len());
        f(&input);
        return Report {
            corpus: 1,
            generated: 0,
            millis: started.elapsed().as_millis(),
        };
    }
    let dir = corpus_root().join(name);
    if std::env::var_os("FENCELOCK_WRITE_CORPUS").is_some() {
        write_seeds(&dir, seeds);
    }
    let corpus = read_corpus(&dir);
    assert!(
        !corpus.is_empty(),
        "{}: no corpus; write it with FENCELOCK_WRITE_CORPUS=1",
        dir.display()
    );
    let mut failures = Vec::new();
    for (file, bytes) in &corpus {
        if let Err(saved) = try_one(name, f, bytes) {
            failures.push(format!("corpus file {file} (copy: {})", saved.display()));
        }
    }
    let iterations = env_u64("FENCELOCK_FUZZ_ITERS").map_or(default_iterations, |n| n as usize);
    let seed = env_u64("FENCELOCK_FUZZ_SEED").unwrap_or(DEFAULT_SEED) ^ fnv(name.as_bytes());
    let mut rng = Rng::new(seed);
    let mut generated = 0;
    while generated < iterations && failures.is_empty() {
        let input = if rng.below(8) == 0 {
            let n = rng.below(512);
            rng.bytes(n)
        } else {
            let base = &corpus[rng.below(corpus.len())].1;
            let other = &corpus[rng.below(corpus.len())].1;
            mutate(&mut rng, base.clone(), other)
        };
        generated += 1;
        if let Err(saved) = try_one(name, f, &input) {
            failures.push(format!(
                "generated input #{generated} saved as {}",
                saved.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz target {name} panicked (seed {seed:#x}):\n  {}\nreproduce: FENCELOCK_FUZZ_INPUT=<file> FENCELOCK_FUZZ_TARGET={name} <this test binary>, \
         or `cargo fuzz run {name} <file>` in fuzz/ for the pure targets",
        failures.join("\n  ")
    );
    Report {
        corpus: corpus.len(),
        generated,
        millis: started.elapsed().as_millis(),
    }
}
