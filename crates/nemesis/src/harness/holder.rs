//! A lock holder in its own process — the client the nemesis pauses past its
//! TTL (SIGSTOP, then SIGCONT), as a GC pause or a frozen VM would.
//!
//! The child (`nemesis hold`) loops: acquire its resource, then write to the
//! fenced resource with its token every [`WRITE_INTERVAL_MS`], renewing at a
//! third of the TTL, release, repeat. It is deliberately naive: it writes
//! whenever it wakes, without first checking its stop-by deadline, exactly
//! like a process paused between that check and its write. So after a pause
//! past its TTL it sends a delayed old write — which the fenced resource
//! must refuse once the lock's next holder wrote with a higher token.
//!
//! It records its own history (shared clock, its own process id) as JSONL on
//! stdout; the harness merges those lines into the run's history.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::fence_server::FenceClient;
use super::lock_client::LockClient;
use super::recorder::Recorder;
use crate::history::{read_jsonl, Call, Event, ProcessId, Reply};

/// How often the holder writes while it holds the lock.
pub const WRITE_INTERVAL_MS: u64 = 100;
/// Writes per holding, before it releases and acquires again.
pub const WRITES_PER_HOLD: u64 = 30;

/// The child's main loop; never returns (the harness kills it).
pub async fn hold_forever(
    process: ProcessId,
    resource: &str,
    endpoints: &[String],
    fence_addr: &str,
    ttl_ms: u64,
) {
    let recorder = Recorder::stdout();
    let mut lock = LockClient::new(process, endpoints, recorder.clone());
    let mut fence = FenceClient::new(process, fence_addr.to_owned(), recorder);
    let renew_every = Duration::from_millis(ttl_ms / 3);
    for n in 1.. {
        let request_id = format!("h{process}-{n}");
        let Some(grant) = lock.acquire(resource, &request_id, ttl_ms, 0).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut renewed_at = tokio::time::Instant::now();
        for i in 0..WRITES_PER_HOLD {
            // Sleep first, write right after waking: a pause almost always
            // lands in the sleep, so the first thing a resumed holder does is
            // its delayed write with the old token.
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(WRITE_INTERVAL_MS)).await;
            }
            fence
                .write(resource, grant.token, &format!("h{process}-{n}-{i}"))
                .await;
            if renewed_at.elapsed() >= renew_every {
                if lock
                    .renew(resource, &grant.lease_id, ttl_ms)
                    .await
                    .is_none()
                {
                    break;
                }
                renewed_at = tokio::time::Instant::now();
            }
        }
        lock.release(resource, &grant.lease_id).await;
    }
}

/// The harness's handle on a holder process.
pub struct HolderProc {
    pub process: ProcessId,
    pub resource: String,
    child: Child,
    holding: watch::Receiver<bool>,
    paused: bool,
}

impl HolderProc {
    /// Starts `nemesis hold` (`nemesis_bin`) and merges its history lines
    /// into `recorder`.
    pub fn spawn(
        nemesis_bin: &Path,
        process: ProcessId,
        resource: &str,
        endpoints: &[String],
        fence_addr: &str,
        ttl_ms: u64,
        recorder: Recorder,
    ) -> std::io::Result<HolderProc> {
        let mut command = Command::new(nemesis_bin);
        command
            .arg("hold")
            .args(["--process", &process.to_string()])
            .args(["--resource", resource])
            .args(["--endpoints", &endpoints.join(",")])
            .args(["--fence", fence_addr])
            .args(["--ttl-ms", &ttl_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            command.pre_exec(|| {
                // Dies with the harness, even if the harness is SIGKILLed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, holding) = watch::channel(false);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(events) = read_jsonl(line.as_bytes()) else {
                    continue;
                };
                for event in events {
                    match &event {
                        Event::Ok {
                            reply: Reply::Acquired { .. },
                            ..
                        } => {
                            let _ = tx.send(true);
                        }
                        Event::Invoke {
                            call: Call::Release { .. } | Call::Acquire { .. },
                            ..
                        } => {
                            let _ = tx.send(false);
                        }
                        _ => {}
                    }
                    recorder.external(event);
                }
            }
        });
        Ok(HolderProc {
            process,
            resource: resource.to_owned(),
            child,
            holding,
            paused: false,
        })
    }

    /// Waits until the holder takes its lock anew (a fresh grant, so the
    /// caller knows where in its holding it is); false if not within
    /// `within`.
    pub async fn wait_fresh_grant(&mut self, within: Duration) -> bool {
        self.holding.borrow_and_update();
        let fresh = async {
            loop {
                if self.holding.changed().await.is_err() {
                    return false;
                }
                if *self.holding.borrow_and_update() {
                    return true;
                }
            }
        };
        tokio::time::timeout(within, fresh).await.unwrap_or(false)
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child with a valid signal.
            unsafe {
                libc::kill(pid as libc::pid_t, sig);
            }
        }
    }

    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.paused = true;
    }

    pub fn resume(&mut self) {
        if self.paused {
            self.signal(libc::SIGCONT);
            self.paused = false;
        }
    }

    /// Stops the process for good (the end of a run).
    pub async fn stop(mut self) {
        self.resume();
        let _ = self.child.kill().await;
    }
}
