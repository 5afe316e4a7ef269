//! The `engine` commands, one module each: `run` takes the command's parsed arguments, makes the
//! library calls and returns the exit status (2 with one `error:` line on stderr when it fails).
//! This is the binary's, not the library's: it prints, and reads the files its flags name.

pub mod bench;
pub mod fit;
pub mod generate;
pub mod score;
pub mod serve;
pub mod tokenize;

use std::path::Path;
use std::process::ExitCode;

use engine::model_file::ModelFile;

/// The failed command's exit: `message` as one `error:` line on stderr, status 2.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// The model file at `path`, or the failed command's exit having said why.
fn open(path: &std::path::Path) -> Result<ModelFile, ExitCode> {
    ModelFile::open(path).map_err(fail)
}

/// The CPUs this process may run on (affinity and cgroup quota included), at least 1.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The memory limit to check against: `--memory-limit` in MiB (0: none), else what this
/// process's cgroup and the machine allow.
fn memory_limit_of(mib: Option<u64>) -> Option<engine::memory::Limit> {
    match mib {
        Some(0) => None,
        Some(mib) => Some(engine::memory::Limit::given(mib)),
        None => engine::memory::Limit::detect(Path::new("/")),
    }
}
