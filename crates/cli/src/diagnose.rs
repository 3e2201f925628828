//! One-line causes, with the fix, for connection failures that the gRPC
//! stack reports in its own words ("transport error", "received corrupt
//! message of type InvalidContentType", "tcp connect error").
//!
//! After such a failure the CLI looks at the node itself, with one short
//! TCP probe: a plaintext gRPC node speaks first (its HTTP/2 SETTINGS frame
//! arrives as soon as the connection is open), a TLS node waits for the
//! client's hello and sends nothing, and a port nobody listens on refuses
//! the connection. Probing only after a failure keeps the normal path free
//! of the wait.

use std::time::Duration;

use tokio::io::AsyncReadExt as _;

/// How long the probe waits for the TCP connection.
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long it waits for a plaintext node's first bytes: a node sends them
/// at once, so silence this long means the node waits for a TLS hello.
const PROBE_FIRST_BYTES_TIMEOUT: Duration = Duration::from_millis(700);
/// Endpoints probed after one failure, at most.
const MAX_PROBED_ENDPOINTS: usize = 3;

/// What the probe found at one endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// The connection was refused or timed out.
    NotListening,
    /// The node waits for a TLS hello; the client spoke plaintext.
    ExpectsTls,
    /// The node speaks plaintext gRPC; the client spoke TLS.
    SpeaksPlaintext,
    /// Nothing the probe can explain.
    Unexplained,
}

/// `http://host:port/` → `host:port`.
pub fn host_port(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.trim_end_matches('/')
}

/// Probes `endpoint`; `client_tls` is whether the client spoke TLS.
pub async fn probe(endpoint: &str, client_tls: bool) -> Finding {
    let addr = host_port(endpoint);
    let connected =
        tokio::time::timeout(PROBE_CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await;
    let mut stream = match connected {
        Ok(Ok(stream)) => stream,
        Ok(Err(_)) | Err(_) => return Finding::NotListening,
    };
    let mut first = [0u8; 16];
    let spoke = match tokio::time::timeout(PROBE_FIRST_BYTES_TIMEOUT, stream.read(&mut first)).await
    {
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
        Err(_) => false,
    };
    match (spoke, client_tls) {
        (false, false) => Finding::ExpectsTls,
        (true, true) => Finding::SpeaksPlaintext,
        _ => Finding::Unexplained,
    }
}

/// The one-line cause and fix for `finding` at `endpoint`.
pub fn hint(finding: Finding, endpoint: &str) -> Option<String> {
    let addr = host_port(endpoint);
    match finding {
        Finding::NotListening => Some(format!(
            "nothing accepts connections at {addr}: is the node running, and is the address \
             right? (`make run` starts a local cluster on 127.0.0.1:7001-7003)"
        )),
        Finding::ExpectsTls => Some(format!(
            "{addr} expects TLS and this command spoke plaintext: pass --ca-file, --cert-file \
             and --key-file (or FENCELOCK_TLS_CA_FILE, _CERT_FILE, _KEY_FILE); see \
             docs/security.md"
        )),
        Finding::SpeaksPlaintext => Some(format!(
            "{addr} speaks plaintext (a cluster in insecure dev mode) and this command spoke \
             TLS: drop --ca-file, --cert-file and --key-file (and FENCELOCK_TLS_*)"
        )),
        Finding::Unexplained => None,
    }
}

/// What the probes of up to [`MAX_PROBED_ENDPOINTS`] of a command's
/// endpoints found.
pub struct Diagnosis {
    findings: Vec<(Finding, String)>,
}

impl Diagnosis {
    /// Probes the first endpoints; prints nothing.
    pub async fn of(endpoints: &[String], client_tls: bool) -> Diagnosis {
        let mut findings = Vec::new();
        for endpoint in endpoints.iter().take(MAX_PROBED_ENDPOINTS) {
            findings.push((probe(endpoint, client_tls).await, endpoint.clone()));
        }
        Diagnosis { findings }
    }

    /// Every probed node refused the client's choice of TLS or plaintext:
    /// no request can have reached a lock service.
    fn tls_mismatch_everywhere(&self) -> bool {
        !self.findings.is_empty()
            && self
                .findings
                .iter()
                .all(|(f, _)| matches!(f, Finding::ExpectsTls | Finding::SpeaksPlaintext))
    }

    /// Whether a call that got no answer may have reached a lock service
    /// (and so may have taken effect): false only when every probed node
    /// refused the client's choice of TLS or plaintext. No diagnosis (no
    /// probe made): it may have.
    pub fn may_have_reached_a_node(diagnosis: Option<&Diagnosis>) -> bool {
        !diagnosis.is_some_and(Diagnosis::tls_mismatch_everywhere)
    }

    /// Prints a `hint:` line for each explained failure.
    pub fn print(&self) {
        for (finding, endpoint) in &self.findings {
            if let Some(text) = hint(*finding, endpoint) {
                eprintln!("hint: {text}");
            }
        }
    }
}

/// Probes the endpoints and prints the hints.
pub async fn explain(endpoints: &[String], client_tls: bool) {
    Diagnosis::of(endpoints, client_tls).await.print();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_as_host_and_port() {
        assert_eq!(host_port("http://127.0.0.1:7001"), "127.0.0.1:7001");
        assert_eq!(host_port("https://node1:7001/"), "node1:7001");
        assert_eq!(host_port("127.0.0.1:7001"), "127.0.0.1:7001");
    }

    #[tokio::test]
    async fn a_silent_server_expects_tls_and_a_talking_one_is_plaintext() {
        use tokio::io::AsyncWriteExt as _;
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_addr = silent.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket); // says nothing, like a TLS server
            }
        });
        let talking = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let talking_addr = talking.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut socket, _)) = talking.accept().await {
                let _ = socket.write_all(b"\0\0\0\x04\0\0\0\0\0").await; // SETTINGS
                held.push(socket);
            }
        });
        assert_eq!(probe(&silent_addr, false).await, Finding::ExpectsTls);
        assert_eq!(probe(&silent_addr, true).await, Finding::Unexplained);
        assert_eq!(probe(&talking_addr, true).await, Finding::SpeaksPlaintext);
        assert_eq!(probe(&talking_addr, false).await, Finding::Unexplained);
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        assert_eq!(probe(&dead, false).await, Finding::NotListening);
        assert!(hint(Finding::ExpectsTls, &silent_addr)
            .unwrap()
            .contains("--ca-file"));
    }
}
