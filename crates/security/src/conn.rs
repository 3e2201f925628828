//! The connection limits of the gRPC port, applied to each accepted socket
//! before any TLS or HTTP/2 work is spent on it:
//!
//! * at most `edge.max_connections` open at once, from everywhere;
//! * at most `edge.max_connections_per_source` from one source address, so
//!   one misbehaving host cannot take every place (and lock out the others
//!   and the node's peers);
//! * a connection must send its first [`HANDSHAKE_BYTES`] bytes (the HTTP/2
//!   client preface, or a TLS ClientHello) within
//!   `edge.handshake_timeout_ms`, or it is closed: an idle socket that never
//!   speaks holds a place and nothing else notices it.
//!
//! A connection refused or closed for one of these counts in
//! `fencelock_connections_refused_total{reason}` and is logged, at most
//! once per [`REFUSAL_LOG_INTERVAL`] with the number left unlogged (a
//! flood of refusals must not become a flood of log lines).

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpConnectInfo};

/// The length of the HTTP/2 client preface (`PRI * HTTP/2.0...`); a TLS
/// ClientHello is longer. A client that sent this much has started to
/// speak; the HTTP/2 keepalive and the TLS handshake timeout take it from
/// there.
pub const HANDSHAKE_BYTES: usize = 24;

/// Refusals are logged at most this often (the counter counts every one).
pub const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Why a connection was closed before it served a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `edge.max_connections` were open.
    MaxConnections,
    /// `edge.max_connections_per_source` were open from its address.
    PerSource,
    /// It did not send its first bytes within `edge.handshake_timeout_ms`.
    HandshakeTimeout,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [
        Refusal::MaxConnections,
        Refusal::PerSource,
        Refusal::HandshakeTimeout,
    ];

    /// The `reason` label of the refusal counter.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::PerSource => "per_source",
            Refusal::HandshakeTimeout => "handshake_timeout",
        }
    }

    fn explain(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "connection refused: edge.max_connections reached",
            Refusal::PerSource => {
                "connection refused: edge.max_connections_per_source reached for its address"
            }
            Refusal::HandshakeTimeout => {
                "connection closed: nothing sent within edge.handshake_timeout_ms"
            }
        }
    }
}

/// The limits of [`limited_incoming`], from the `[edge]` config section.
#[derive(Clone, Copy, Debug)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub handshake_timeout: Duration,
}

/// Counts refusals (one counter per [`Refusal`], in [`Refusal::ALL`]
/// order) and logs them, rate-limited.
pub struct Refusals {
    counters: [IntCounter; 3],
    log: Mutex<RefusalLogState>,
}

#[derive(Default)]
struct RefusalLogState {
    last_logged: Option<Instant>,
    unlogged: u64,
}

impl Refusals {
    pub fn new(counters: [IntCounter; 3]) -> Refusals {
        Refusals {
            counters,
            log: Mutex::new(RefusalLogState::default()),
        }
    }

    fn record(&self, why: Refusal, peer: Option<SocketAddr>) {
        let i = Refusal::ALL.iter().position(|r| *r == why).expect("listed");
        self.counters[i].inc();
        let unlogged = {
            let mut state = self.log.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if state
                .last_logged
                .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL)
            {
                state.unlogged += 1;
                return;
            }
            state.last_logged = Some(now);
            std::mem::take(&mut state.unlogged)
        };
        tracing::warn!(
            reason = why.label(),
            peer = ?peer,
            unlogged_since_last = unlogged,
            "{}",
            why.explain()
        );
    }
}

/// Open connections per source address.
#[derive(Default)]
struct Sources {
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl Sources {
    /// Takes a place for `ip` unless it has `max` already.
    fn try_take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<SourcePlace> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(ip).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(SourcePlace {
            sources: self.clone(),
            ip,
        })
    }
}

/// One connection's place in its source address's count, given back when
/// the connection is dropped.
struct SourcePlace {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Drop for SourcePlace {
    fn drop(&mut self) {
        let mut open = self.sources.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            debug_assert!(*count > 0, "a place given back twice");
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// The handshake deadline of a connection that has not yet sent
/// [`HANDSHAKE_BYTES`].
struct Handshake {
    deadline: Pin<Box<Sleep>>,
    bytes_seen: usize,
}

/// An accepted connection holding its places until dropped, and closed if
/// it does not start to speak in time.
pub struct LimitedStream {
    stream: TcpStream,
    handshake: Option<Handshake>,
    refusals: Arc<Refusals>,
    _place: OwnedSemaphorePermit,
    _source_place: Option<SourcePlace>,
}

impl Connected for LimitedStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(handshake) = &mut this.handshake {
            if handshake.deadline.as_mut().poll(cx).is_ready() {
                this.handshake = None;
                this.refusals
                    .record(Refusal::HandshakeTimeout, this.stream.peer_addr().ok());
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "nothing sent within edge.handshake_timeout_ms",
                )));
            }
        }
        let filled_before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(handshake)) = (&polled, &mut this.handshake) {
            handshake.bytes_seen += buf.filled().len() - filled_before;
            if handshake.bytes_seen >= HANDSHAKE_BYTES {
                this.handshake = None;
            }
        }
        polled
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The accepted connections of `listener` within `limits`; the rest are
/// closed as soon as accepted (dropped), and counted in `refusals`.
pub fn limited_incoming(
    listener: TcpListener,
    limits: ConnLimits,
    refusals: Arc<Refusals>,
) -> impl Stream<Item = std::io::Result<LimitedStream>> {
    assert!(limits.max_connections > 0 && limits.max_connections_per_source > 0);
    let places = Arc::new(Semaphore::new(limits.max_connections));
    let sources = Arc::new(Sources::default());
    tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| {
        let stream = match accepted {
            Ok(stream) => stream,
            // Accept errors (out of file descriptors) are passed on; the
            // server logs them and keeps accepting.
            Err(e) => return Some(Err(e)),
        };
        let peer = stream.peer_addr().ok();
        let Ok(place) = places.clone().try_acquire_owned() else {
            refusals.record(Refusal::MaxConnections, peer);
            return None; // dropped: closed at once
        };
        // A socket whose peer address cannot be read (already reset) is
        // not counted per source; it will fail on its first read anyway.
        let source_place = match peer {
            Some(addr) => match sources.try_take(addr.ip(), limits.max_connections_per_source) {
                Some(source_place) => Some(source_place),
                None => {
                    refusals.record(Refusal::PerSource, peer);
                    return None;
                }
            },
            None => None,
        };
        let _ = stream.set_nodelay(true);
        Some(Ok(LimitedStream {
            stream,
            handshake: Some(Handshake {
                deadline: Box::pin(tokio::time::sleep(limits.handshake_timeout)),
                bytes_seen: 0,
            }),
            refusals: refusals.clone(),
            _place: place,
            _source_place: source_place,
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_places_back_when_its_connections_close() {
        let sources = Arc::new(Sources::default());
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let other: IpAddr = "127.0.0.3".parse().unwrap();
        let first = sources.try_take(ip, 2).expect("first place");
        let second = sources.try_take(ip, 2).expect("second place");
        assert!(sources.try_take(ip, 2).is_none(), "a third is over the cap");
        assert!(
            sources.try_take(other, 2).is_some(),
            "other sources are not affected"
        );
        drop(first);
        let third = sources.try_take(ip, 2).expect("a place freed by a close");
        drop((second, third));
        assert!(
            sources.open.lock().unwrap().get(&ip).is_none(),
            "a source with nothing open is forgotten"
        );
    }
}
