//! A hostile or broken caller against a real node: bytes that are not the
//! method's message, a message over the size limit, and idle sockets that
//! never speak. Each must get a typed answer or a closed socket, and never
//! take the node from the callers that behave.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut};
use fencelock_api::v1::{ErrorDetail, Reason};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::transport::Channel;

use crate::common::{acquire_req, Cluster};

/// Sends and receives raw message bytes, whatever the method's types.
#[derive(Clone, Copy, Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Calls `path` on `endpoint` with `body` as the request message.
async fn raw_call(endpoint: &str, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = Channel::from_shared(endpoint.to_owned())
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let answer = grpc
        .unary(
            tonic::Request::new(body),
            http::uri::PathAndQuery::from_static(path),
            RawCodec,
        )
        .await;
    answer.expect_err("a request that does not decode must fail")
}

fn detail_of(status: &tonic::Status) -> ErrorDetail {
    ErrorDetail::from_status(status).unwrap_or_else(|| {
        panic!(
            "no ErrorDetail in {:?}: {}",
            status.code(),
            status.message()
        )
    })
}

/// A length-delimited field 1 announcing more bytes than follow: no message
/// of any method decodes from it.
fn truncated() -> Vec<u8> {
    vec![0x0a, 0x05, 0x61]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_that_does_not_decode_is_a_malformed_request_on_every_service() {
    let cluster = Cluster::start(1, |_| {}).await;
    let endpoint = cluster.endpoint(1);

    // AcquireRequest.resource (field 1) that is not UTF-8.
    let not_utf8 = vec![0x0a, 0x02, 0xff, 0xfe];
    let calls: [(&'static str, Vec<u8>); 5] = [
        ("/fencelock.v1.LockService/Acquire", not_utf8),
        ("/fencelock.v1.LockService/Release", truncated()),
        ("/fencelock.v1.LockService/Get", truncated()),
        ("/fencelock.v1.AdminService/ListShards", truncated()),
        ("/fencelock.internal.v1.NodeControl/Status", truncated()),
    ];
    for (path, body) in calls {
        let status = raw_call(&endpoint, path, body).await;
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{path}: {}",
            status.message()
        );
        let detail = detail_of(&status);
        assert_eq!(detail.reason(), Reason::MalformedRequest, "{path}");
        assert_eq!(
            detail.retry_hint(),
            fencelock_api::status::RetryHint::Never,
            "{path}"
        );
    }

    // The node still serves well-formed calls.
    let mut client = cluster.client(1).await;
    client
        .acquire(acquire_req("hostile/after-garbage", "req-1", 5_000, 0))
        .await
        .expect("a good acquire after the garbage");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_over_the_size_limit_is_message_too_large_naming_the_limit() {
    const LIMIT: usize = 524_288;
    let cluster = Cluster::start(1, |c| c.edge.max_message_bytes = LIMIT).await;
    // An unknown field 15 (length-delimited) of 600 KiB: well-formed, too big.
    let mut body = vec![0x7a];
    let len = 600 * 1024;
    let mut n = len;
    while n >= 0x80 {
        body.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    body.push(n as u8);
    body.extend(std::iter::repeat_n(b'x', len));

    let status = raw_call(&cluster.endpoint(1), "/fencelock.v1.LockService/Get", body).await;
    assert_eq!(
        status.code(),
        tonic::Code::ResourceExhausted,
        "{}",
        status.message()
    );
    let detail = detail_of(&status);
    assert_eq!(detail.reason(), Reason::MessageTooLarge);
    assert_eq!(detail.max_allowed, LIMIT as u64);
}

/// A socket from `source` (another loopback address: Linux routes all of
/// 127/8 to lo) to `node`.
async fn connect_from(source: &str, node: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(format!("{source}:0").parse().unwrap())
        .expect("bind a loopback source address");
    socket.connect(node).await.expect("connect")
}

/// Waits until the node closes `socket` (EOF or reset), for at most
/// `within`; false if it is still open then. What the node sends meanwhile
/// (an HTTP/2 server speaks first: its SETTINGS frame) is read and dropped.
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 256];
    loop {
        match tokio::time::timeout_at(deadline, socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// The value of `fencelock_connections_refused_total{reason=...}`.
fn refused(cluster: &Cluster, reason: &str) -> u64 {
    let needle = format!("reason=\"{reason}\"");
    cluster.nodes[&1]
        .render_metrics()
        .lines()
        .find(|l| l.starts_with("fencelock_connections_refused_total") && l.contains(&needle))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse::<f64>().expect("a number") as u64)
        .unwrap_or_else(|| panic!("no refusal counter for {reason}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_connections_from_one_host_cannot_lock_out_the_others() {
    const PER_SOURCE: usize = 8;
    const HANDSHAKE_MS: u64 = 1_500;
    let cluster = Cluster::start(1, |c| {
        c.edge.max_connections_per_source = PER_SOURCE;
        c.edge.handshake_timeout_ms = HANDSHAKE_MS;
    })
    .await;
    let node = cluster.nodes[&1].addr();

    // One host opens its share of sockets and never speaks.
    let mut idle = Vec::new();
    for _ in 0..PER_SOURCE {
        idle.push(connect_from("127.0.0.2", node).await);
    }
    // One more from it is closed at once, counted per source.
    let mut over = connect_from("127.0.0.2", node).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(30)).await,
        "the socket over the per-source cap stays open"
    );
    assert_eq!(refused(&cluster, "per_source"), 1);

    // Callers from elsewhere are served meanwhile.
    let mut client = cluster.client(1).await;
    client
        .acquire(acquire_req("hostile/served", "req-1", 5_000, 0))
        .await
        .expect("another host's acquire is served");

    // The silent sockets are closed after the handshake timeout, and the
    // host gets its places back.
    for socket in &mut idle {
        assert!(
            closed_within(socket, Duration::from_secs(30)).await,
            "a socket that never spoke stays open"
        );
    }
    assert_eq!(refused(&cluster, "handshake_timeout"), PER_SOURCE as u64);
    let mut again = connect_from("127.0.0.2", node).await;
    assert!(
        !closed_within(&mut again, Duration::from_millis(HANDSHAKE_MS / 3)).await,
        "the host's places were not given back"
    );
    assert_eq!(refused(&cluster, "per_source"), 1);
}
