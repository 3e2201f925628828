//! A throwaway PostgreSQL server for tests: `initdb` into a temp dir, started
//! with `pg_ctl` on a free loopback port (and a unix socket in the same
//! dir), stopped and deleted on drop.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does),
//! the server runs as the `postgres` system user (or `nobody`), which the
//! temp dir is handed to.

use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::FenceError;

/// Environment variable naming a directory that holds `initdb` and `pg_ctl`,
/// to use instead of the ones found on the machine.
pub const PG_BIN_ENV: &str = "FENCELOCK_PG_BIN";

/// The superuser the test cluster is created with (trust authentication on
/// loopback, so no password).
pub const PG_SUPERUSER: &str = "fencelock";

/// What installs the server binaries on the machines this project runs on.
const INSTALL_HINT: &str = "apt-get install -y postgresql";

/// Where Debian installs each major version's server binaries.
const DEBIAN_PG_LIB: &str = "/usr/lib/postgresql";

/// System users a root test process hands the server to, in order.
const RUN_AS_CANDIDATES: [&str; 2] = ["postgres", "nobody"];

/// A free port can be taken by someone else between choosing it and the
/// server binding it; that many fresh ports are tried.
const START_ATTEMPTS: usize = 3;

/// How long `pg_ctl` waits for the server to accept connections.
const START_TIMEOUT_SECS: u32 = 30;

/// How much of the server log an error quotes.
const LOG_TAIL_BYTES: usize = 4_000;

/// A running PostgreSQL server owned by a test. Dropping it stops the server
/// (immediate shutdown: nothing in it is meant to outlive the test) and
/// deletes its files.
#[derive(Debug)]
pub struct PgServer {
    // Declared first so that it is still there when `drop` stops the server;
    // the directory itself is removed after `drop` returns.
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    port: u16,
    run_as: Option<(u32, u32)>,
}

impl PgServer {
    /// Creates a cluster in a new temp dir and starts it on loopback.
    pub fn start() -> Result<PgServer, FenceError> {
        let bin_dir = find_bin_dir()?;
        let run_as = run_as_user()?;
        let dir = tempfile::Builder::new()
            .prefix("fencelock-pg-")
            .tempdir()
            .map_err(|e| setup_error("creating a temp dir", e))?;
        if let Some((uid, gid)) = run_as {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| setup_error("handing the temp dir to the server's user", e))?;
        }
        let mut server = PgServer {
            dir,
            bin_dir,
            port: 0,
            run_as,
        };
        let data = server.data_dir();
        // No fsync at initdb or at run time: the data dies with the test.
        let out = server
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", PG_SUPERUSER, "--auth=trust", "--no-locale"])
            .args(["-E", "UTF8", "--no-sync"])
            .output()
            .map_err(|e| setup_error("running initdb", e))?;
        check_output("initdb", &out)?;

        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            server.port = free_port().map_err(|e| setup_error("choosing a port", e))?;
            match server.pg_ctl_start() {
                Ok(()) => return Ok(server),
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.expect("at least one start attempt"))
    }

    /// The loopback TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libpq-style connection string for the `postgres` database as the
    /// superuser, for `tokio_postgres::connect` or `psql`.
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={PG_SUPERUSER} dbname=postgres connect_timeout=10",
            self.port
        )
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("postgres.log")
    }

    fn pg_ctl_start(&self) -> Result<(), FenceError> {
        let options = format!(
            "-p {} -h 127.0.0.1 -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .arg("-l")
            .arg(self.log_path())
            .args(["-w", "-t", &START_TIMEOUT_SECS.to_string(), "-o", &options])
            .arg("start")
            .output()
            .map_err(|e| setup_error("running pg_ctl start", e))?;
        check_output("pg_ctl start", &out).map_err(|e| {
            FenceError::TestServer(format!(
                "{e}\n--- server log (tail) ---\n{}",
                log_tail(&self.log_path())
            ))
        })
    }

    /// A command for one of the server binaries, run as the server's user
    /// and from its directory (the caller's working directory may not be
    /// readable by that user).
    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(program));
        cmd.current_dir(self.dir.path()).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port == 0 {
            return; // never started
        }
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn setup_error(what: &str, e: std::io::Error) -> FenceError {
    FenceError::TestServer(format!("{what}: {e}"))
}

fn check_output(what: &str, out: &Output) -> Result<(), FenceError> {
    if out.status.success() {
        return Ok(());
    }
    Err(FenceError::TestServer(format!(
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )))
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// `$FENCELOCK_PG_BIN`, else the newest `/usr/lib/postgresql/<major>/bin`,
/// else `PATH` (Debian keeps initdb off `PATH`, other systems do not).
fn find_bin_dir() -> Result<PathBuf, FenceError> {
    if let Some(dir) = std::env::var_os(PG_BIN_ENV) {
        let dir = PathBuf::from(dir);
        return if has_server_binaries(&dir) {
            Ok(dir)
        } else {
            Err(FenceError::TestServer(format!(
                "{PG_BIN_ENV}={} has no initdb and pg_ctl",
                dir.display()
            )))
        };
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir(DEBIAN_PG_LIB)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_server_binaries(&bin).then_some((major, bin))
        })
        .collect();
    versioned.sort();
    if let Some((_, bin)) = versioned.pop() {
        return Ok(bin);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| has_server_binaries(dir));
    on_path.ok_or_else(|| {
        FenceError::TestServer(format!(
            "PostgreSQL server binaries (initdb, pg_ctl) not found in ${PG_BIN_ENV}, \
             {DEBIAN_PG_LIB}/*/bin or PATH; install them with: {INSTALL_HINT}"
        ))
    })
}

/// `None` when this process is not root; otherwise the uid and gid of the
/// first existing user of [`RUN_AS_CANDIDATES`].
fn run_as_user() -> Result<Option<(u32, u32)>, FenceError> {
    // The owner of /proc/self is this process's effective uid: no libc call
    // needed for one number.
    let euid = std::fs::metadata("/proc/self")
        .map_err(|e| setup_error("reading /proc/self", e))?
        .uid();
    if euid != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")
        .map_err(|e| setup_error("reading /etc/passwd", e))?;
    for wanted in RUN_AS_CANDIDATES {
        for line in passwd.lines() {
            let fields: Vec<&str> = line.split(':').collect();
            if let [name, _, uid, gid, ..] = fields[..] {
                if name == wanted {
                    if let (Ok(uid), Ok(gid)) = (uid.parse(), gid.parse()) {
                        return Ok(Some((uid, gid)));
                    }
                }
            }
        }
    }
    Err(FenceError::TestServer(format!(
        "running as root, and PostgreSQL refuses to; none of the users {RUN_AS_CANDIDATES:?} \
         exists to run it as ({INSTALL_HINT} creates `postgres`)"
    )))
}
