//! [`BenchError`]: why a benchmark could not run (as opposed to requests
//! that failed, which are measured outcomes, see [`crate::outcome`]).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value or combination is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A program the harness needs to start was not found.
    #[error("{program} not found ({hint})")]
    ProgramNotFound { program: String, hint: String },

    /// Starting, stopping or probing a local cluster failed.
    #[error("cluster: {0}")]
    Cluster(String),

    /// The target never became ready (no leader, unreachable).
    #[error("target not ready within {waited_ms} ms: {last_error}")]
    NotReady { waited_ms: u64, last_error: String },

    /// An endpoint could not be turned into a gRPC channel.
    #[error("invalid endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The client library's package cannot be imported by the interpreter
    /// `client-load` runs.
    #[error(
        "the Python client is not importable by {python} ({detail}): \
         pip install ./clients/python (into a virtualenv: `python3 -m venv .venv`), \
         or pass --python with an interpreter that has it"
    )]
    ClientNotInstalled { python: String, detail: String },

    /// A client process of `client-load` failed, overran its time or
    /// printed no result.
    #[error("client process {process}: {reason}\n--- its stderr (tail)\n{stderr}")]
    ClientProcess {
        process: usize,
        reason: String,
        stderr: String,
    },

    /// Running the client processes failed for another reason.
    #[error("client-load: {0}")]
    Client(String),

    /// Serializing results failed.
    #[error("serializing results: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl BenchError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> BenchError {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}
