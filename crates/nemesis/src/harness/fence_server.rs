//! The fenced resource over TCP, for client processes (which cannot share
//! the harness's memory), and a recording client for it.
//!
//! The protocol is one line each way, words separated by single spaces
//! (resource names and values never contain spaces):
//!
//! ```text
//! W <resource> <token> <value>   ->  A <seq>  |  R <highest>  |  E <message>
//! G <resource>                   ->  V <token> <seq> <value or ->
//! ```
//!
//! It listens on loopback in the host namespace: client processes are never
//! partitioned from the protected system, only nodes from each other.

use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use super::recorder::Recorder;
use crate::fence::{FencedResource, WriteOutcome};
use crate::history::{Call, ProcessId, Reply};

/// Longest request line, in bytes; longer ones end the connection.
pub const MAX_LINE_BYTES: usize = 1024;

/// Serves `fence` on `127.0.0.1:<any port>`; returns the address.
pub async fn serve(fence: Arc<FencedResource>) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve_connection(stream, fence.clone()));
        }
    });
    Ok(addr)
}

async fn serve_connection(stream: TcpStream, fence: Arc<FencedResource>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read);
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) if line.len() > MAX_LINE_BYTES => return,
            Ok(_) => {}
        }
        let answer = answer(&fence, line.trim_end()).await;
        if write.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

async fn answer(fence: &FencedResource, line: &str) -> String {
    let words: Vec<&str> = line.split(' ').collect();
    match words[..] {
        ["W", resource, token, value] => {
            let Ok(token) = token.parse::<i64>() else {
                return "E bad token\n".into();
            };
            match fence.write(resource, token, value).await {
                Ok(WriteOutcome::Accepted { seq }) => format!("A {seq}\n"),
                Ok(WriteOutcome::Rejected { highest }) => format!("R {highest}\n"),
                Err(e) => format!("E {e}\n"),
            }
        }
        ["G", resource] => {
            let last = fence.read(resource).await;
            let value = last.value.unwrap_or_else(|| "-".into());
            format!("V {} {} {value}\n", last.token, last.seq)
        }
        _ => "E bad request\n".into(),
    }
}

/// A client of the fenced resource that records each write and read.
pub struct FenceClient {
    process: ProcessId,
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    recorder: Recorder,
}

impl FenceClient {
    pub fn new(process: ProcessId, addr: String, recorder: Recorder) -> FenceClient {
        FenceClient {
            process,
            addr,
            conn: None,
            recorder,
        }
    }

    async fn request(&mut self, line: &str) -> std::io::Result<String> {
        if self.conn.is_none() {
            self.conn = Some(BufReader::new(TcpStream::connect(&self.addr).await?));
        }
        let conn = self.conn.as_mut().expect("connected above");
        let result = async {
            conn.get_mut().write_all(line.as_bytes()).await?;
            let mut answer = String::new();
            if conn.read_line(&mut answer).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Ok(answer.trim_end().to_owned())
        }
        .await;
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// Writes `value` with `token`; true if accepted.
    pub async fn write(&mut self, resource: &str, token: i64, value: &str) -> bool {
        self.recorder.invoke(
            self.process,
            Call::FenceWrite {
                resource: resource.to_owned(),
                token,
                value: value.to_owned(),
            },
        );
        let answer = self
            .request(&format!("W {resource} {token} {value}\n"))
            .await;
        let words: Vec<String> = answer
            .as_deref()
            .unwrap_or("")
            .split(' ')
            .map(str::to_owned)
            .collect();
        let reply = match (words.first().map(String::as_str), words.get(1)) {
            (Some("A"), Some(seq)) => seq.parse().ok().map(|seq| Reply::FenceAccepted { seq }),
            (Some("R"), Some(h)) => h
                .parse()
                .ok()
                .map(|highest| Reply::FenceRejected { highest }),
            _ => None,
        };
        match reply {
            Some(reply) => {
                let accepted = matches!(reply, Reply::FenceAccepted { .. });
                self.recorder.ok(self.process, reply);
                accepted
            }
            None => {
                let error = format!("fenced resource answered {answer:?}");
                self.recorder.unknown(self.process, error);
                false
            }
        }
    }

    /// Reads the last accepted write.
    pub async fn read(&mut self, resource: &str) {
        self.recorder.invoke(
            self.process,
            Call::FenceRead {
                resource: resource.to_owned(),
            },
        );
        let answer = self.request(&format!("G {resource}\n")).await;
        let parsed = answer.as_deref().ok().and_then(|a| {
            let mut w = a.splitn(4, ' ');
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("V"), Some(token), Some(seq), Some(value)) => Some(Reply::FenceValue {
                    token: token.parse().ok()?,
                    seq: seq.parse().ok()?,
                    value: (value != "-").then(|| value.to_owned()),
                }),
                _ => None,
            }
        });
        match parsed {
            Some(reply) => self.recorder.ok(self.process, reply),
            None => {
                let error = format!("fenced resource answered {answer:?}");
                self.recorder.unknown(self.process, error);
            }
        }
    }
}
