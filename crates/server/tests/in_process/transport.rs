//! The peer transport over real sockets on 127.0.0.1: delivery order and
//! batching, fault rules, reconnecting to a restarted peer, and malformed
//! input on the receiving side.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fencelock_server::internal::raft_transport_client::RaftTransportClient;
use fencelock_server::internal::{RaftBatch, RaftEnvelope};
use fencelock_server::netfilter::NetworkRules;
use fencelock_server::transport::{Envelope, RaftService, Transport, MAX_INBOUND_BATCH_MESSAGES};
use protobuf::Message as _;
use raft::prelude::{Message as RaftMessage, MessageType};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};
use tokio_stream::wrappers::TcpListenerStream;

/// Node id of the sending side in every test.
const SENDER: u64 = 1;
/// Node id of the receiving side in every test.
const RECEIVER: u64 = 2;
/// Queue depth of the sender's peer queues; above the largest burst below,
/// so a burst is never cut by the queue.
const QUEUE_DEPTH: usize = 32_768;
/// Longest a test waits for something that should happen.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a test watches for something that must not happen.
const QUIET_PERIOD: Duration = Duration::from_millis(300);
/// Pause between resends while waiting for a path to work, standing in for
/// Raft's own retransmission.
const RESEND_INTERVAL: Duration = Duration::from_millis(50);

/// A running receiving node: a `RaftService` on a real socket.
struct Receiver {
    address: SocketAddr,
    service: RaftService,
    inbox: mpsc::UnboundedReceiver<(u64, Envelope)>,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
}

impl Receiver {
    /// Serves on `address` (port 0 for any free port).
    async fn start(address: SocketAddr) -> Receiver {
        let listener = TcpListener::bind(address).await.expect("bind");
        let address = listener.local_addr().expect("local address");
        let (inbox_tx, inbox) = mpsc::unbounded_channel();
        let service = RaftService::new(Arc::new(move |from, envelopes| {
            for envelope in envelopes {
                // The test may have stopped listening; that is fine.
                let _ = inbox_tx.send((from, envelope));
            }
        }));
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn({
            let service = service.clone();
            async move {
                tonic::transport::Server::builder()
                    .add_service(service.into_server())
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("serve");
            }
        });
        Receiver {
            address,
            service,
            inbox,
            stop: Some(stop),
            server,
        }
    }

    /// Stops the server the way a node does: end the peers' streams, then a
    /// graceful shutdown, which frees the port.
    async fn stop(mut self) -> SocketAddr {
        self.service.close();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        timeout(PATIENCE, self.server)
            .await
            .expect("server stops once its streams are closed")
            .expect("server task");
        self.address
    }

    /// The next `count` messages, or a panic after [`PATIENCE`].
    async fn next(&mut self, count: usize) -> Vec<(u64, Envelope)> {
        let mut received = Vec::with_capacity(count);
        let deadline = Instant::now() + PATIENCE;
        while received.len() < count {
            match tokio::time::timeout_at(deadline, self.inbox.recv()).await {
                Ok(Some(item)) => received.push(item),
                Ok(None) => panic!("inbox closed"),
                Err(_) => panic!("received {} of {count} messages", received.len()),
            }
        }
        received
    }

    /// Asserts that nothing arrives for [`QUIET_PERIOD`].
    async fn expect_nothing(&mut self) {
        if let Ok(item) = timeout(QUIET_PERIOD, self.inbox.recv()).await {
            panic!("unexpected delivery: {item:?}");
        }
    }

    /// Discards whatever has arrived so far.
    fn clear(&mut self) {
        while self.inbox.try_recv().is_ok() {}
    }
}

/// A sender with `RECEIVER` at `address`, and itself listed at an address
/// nobody listens on (a self entry must be ignored).
fn sender(address: SocketAddr, rules: Arc<NetworkRules>) -> Transport {
    let peers = BTreeMap::from([
        (SENDER, "127.0.0.1:1".to_owned()),
        (RECEIVER, address.to_string()),
    ]);
    Transport::new(
        SENDER,
        peers,
        QUEUE_DEPTH,
        tokio::runtime::Handle::current(),
    )
    .with_fault_rules(rules)
}

/// A recognisable Raft message: `seq` travels in the `index` field.
fn envelope(shard_id: u64, seq: u64) -> Envelope {
    let mut msg = RaftMessage::default();
    msg.set_msg_type(MessageType::MsgAppend);
    msg.from = SENDER;
    msg.to = RECEIVER;
    msg.term = 7;
    msg.index = seq;
    Envelope { shard_id, msg }
}

/// Resends a probe until one arrives, as Raft would retransmit; returns
/// once the path works. Drains the inbox afterwards.
async fn until_delivered(transport: &Transport, receiver: &mut Receiver) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        transport.send(RECEIVER, vec![envelope(0, u64::MAX)]);
        if timeout(RESEND_INTERVAL, receiver.inbox.recv())
            .await
            .is_ok()
        {
            break;
        }
        assert!(Instant::now() < deadline, "path never started working");
    }
    // Probes still in flight would confuse the next assertion.
    tokio::time::sleep(QUIET_PERIOD).await;
    receiver.clear();
}

fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().expect("address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_arrives_in_order_in_fewer_batches() {
    const BURST: u64 = 20_000;
    /// Messages per `send` call, like the messages of one `Ready`.
    const PER_SEND: u64 = 50;
    /// Shards the burst is spread over: one stream carries them all.
    const SHARDS: u64 = 7;

    let mut receiver = Receiver::start(any_port()).await;
    let transport = Arc::new(sender(receiver.address, Arc::default()));
    until_delivered(&transport, &mut receiver).await;
    let batches_before = transport.batches_sent_total();
    let dropped_before = transport.dropped_total();

    // The store loop is a plain thread, not a runtime task.
    let producer = {
        let transport = transport.clone();
        std::thread::spawn(move || {
            for start in (0..BURST).step_by(PER_SEND as usize) {
                let msgs = (start..start + PER_SEND)
                    .map(|seq| envelope(seq % SHARDS, seq))
                    .collect();
                transport.send(RECEIVER, msgs);
            }
        })
    };
    producer.join().expect("producer thread");

    let received = receiver.next(BURST as usize).await;
    for (seq, (from, envelope)) in received.iter().enumerate() {
        assert_eq!(*from, SENDER);
        assert_eq!(envelope, &self::envelope(seq as u64 % SHARDS, seq as u64));
    }
    receiver.expect_nothing().await;

    assert_eq!(transport.dropped_total(), dropped_before);
    let batches = transport.batches_sent_total() - batches_before;
    assert!(
        batches < BURST / 4,
        "{batches} batches for {BURST} messages: not batched"
    );
    assert!(transport.messages_sent_total() >= BURST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_rules_stop_delivery_and_heal_resumes_it() {
    const MESSAGES: u64 = 100;

    let mut receiver = Receiver::start(any_port()).await;
    let rules = Arc::new(NetworkRules::default());
    let transport = sender(receiver.address, rules.clone());
    until_delivered(&transport, &mut receiver).await;

    // Partition, isolation of either side, a one-way block and certain
    // loss: each stops every message, and each is counted as dropped.
    type Fault = fn(&NetworkRules);
    let faults: [(&str, Fault); 5] = [
        ("partition", |r| r.partition(&[&[SENDER], &[RECEIVER]])),
        ("isolate receiver", |r| r.isolate(RECEIVER)),
        ("isolate sender", |r| r.isolate(SENDER)),
        ("block", |r| r.block(SENDER, RECEIVER)),
        ("drop rate 1", |r| r.set_drop_rate(1.0)),
    ];
    for (name, fault) in faults {
        fault(&rules);
        let dropped_before = transport.dropped_total();
        transport.send(RECEIVER, (0..MESSAGES).map(|i| envelope(1, i)).collect());
        receiver.expect_nothing().await;
        assert_eq!(
            transport.dropped_total() - dropped_before,
            MESSAGES,
            "{name}: every message counted as dropped"
        );

        rules.heal();
        transport.send(RECEIVER, (0..MESSAGES).map(|i| envelope(1, i)).collect());
        let received = receiver.next(MESSAGES as usize).await;
        assert_eq!(
            received.len() as u64,
            MESSAGES,
            "{name}: heal resumes delivery"
        );
    }

    // Blocking the other direction does not affect this one.
    rules.block(RECEIVER, SENDER);
    transport.send(RECEIVER, vec![envelope(1, 1)]);
    receiver.next(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_rule_delivers_late_without_blocking_the_sender() {
    const DELAY: Duration = Duration::from_millis(400);
    const MESSAGES: u64 = 10;

    let mut receiver = Receiver::start(any_port()).await;
    let rules = Arc::new(NetworkRules::default());
    let transport = sender(receiver.address, rules.clone());
    until_delivered(&transport, &mut receiver).await;

    rules.set_delay(DELAY);
    let sent_at = Instant::now();
    transport.send(RECEIVER, (0..MESSAGES).map(|i| envelope(3, i)).collect());
    assert!(sent_at.elapsed() < DELAY / 4, "send blocked on the delay");

    let received = receiver.next(MESSAGES as usize).await;
    assert!(sent_at.elapsed() >= DELAY, "delivered early");
    let order: Vec<u64> = received.iter().map(|(_, e)| e.msg.index).collect();
    assert_eq!(order, (0..MESSAGES).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_reconnects_to_a_restarted_peer() {
    const MESSAGES: u64 = 50;

    let mut receiver = Receiver::start(any_port()).await;
    let transport = sender(receiver.address, Arc::default());
    until_delivered(&transport, &mut receiver).await;

    let address = receiver.stop().await;
    // Sent while the peer is down: lost, like on a real network.
    transport.send(RECEIVER, (0..MESSAGES).map(|i| envelope(5, i)).collect());
    tokio::time::sleep(QUIET_PERIOD).await;

    let mut receiver = Receiver::start(address).await;
    until_delivered(&transport, &mut receiver).await;
    transport.send(RECEIVER, (0..MESSAGES).map(|i| envelope(5, i)).collect());
    let received = receiver.next(MESSAGES as usize).await;
    let order: Vec<u64> = received.iter().map(|(_, e)| e.msg.index).collect();
    assert_eq!(order, (0..MESSAGES).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_envelopes_are_skipped_not_fatal() {
    let mut receiver = Receiver::start(any_port()).await;
    let mut client = RaftTransportClient::connect(format!("http://{}", receiver.address))
        .await
        .expect("connect");

    let valid = |seq: u64| RaftEnvelope {
        shard_id: 9,
        message: envelope(9, seq).msg.write_to_bytes().expect("encode"),
    };
    let garbage = |bytes: &[u8]| RaftEnvelope {
        shard_id: 9,
        message: bytes.to_vec(),
    };
    // Wire type 7 does not exist; a length prefix past the end; a varint
    // that never ends.
    let garbage_kinds: [&[u8]; 3] = [&[0x0f, 0x01], &[0x12, 0x7f, 0x00], &[0xff; 11]];

    let (batches_tx, batches_rx) = mpsc::channel(4);
    let call = tokio::spawn(async move {
        client
            .stream(tokio_stream::wrappers::ReceiverStream::new(batches_rx))
            .await
    });
    let mut mixed = vec![valid(1)];
    mixed.extend(garbage_kinds.iter().map(|bytes| garbage(bytes)));
    mixed.push(valid(2));
    batches_tx
        .send(RaftBatch {
            from_node: 77,
            messages: mixed,
        })
        .await
        .expect("send mixed batch");

    let received = receiver.next(2).await;
    let seqs: Vec<(u64, u64)> = received.iter().map(|(f, e)| (*f, e.msg.index)).collect();
    assert_eq!(seqs, vec![(77, 1), (77, 2)]);
    assert_eq!(
        receiver.service.malformed_total(),
        garbage_kinds.len() as u64
    );

    // A batch over the message cap is dropped whole; the stream survives.
    batches_tx
        .send(RaftBatch {
            from_node: 77,
            messages: vec![valid(3); MAX_INBOUND_BATCH_MESSAGES + 1],
        })
        .await
        .expect("send oversized batch");
    batches_tx
        .send(RaftBatch {
            from_node: 77,
            messages: vec![valid(4)],
        })
        .await
        .expect("send batch after oversized");
    let received = receiver.next(1).await;
    assert_eq!(received[0].1.msg.index, 4);
    assert_eq!(receiver.service.rejected_batches_total(), 1);

    // Closing the stream cleanly gets the (empty) acknowledgement.
    drop(batches_tx);
    timeout(PATIENCE, call)
        .await
        .expect("call finishes")
        .expect("call task")
        .expect("stream acknowledged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_peers_self_and_shutdown_drop_and_count() {
    let mut receiver = Receiver::start(any_port()).await;
    let transport = sender(receiver.address, Arc::default());
    until_delivered(&transport, &mut receiver).await;
    let dropped_before = transport.dropped_total();

    transport.send(42, vec![envelope(1, 1), envelope(1, 2)]);
    transport.send(SENDER, vec![envelope(1, 3)]);
    assert_eq!(transport.dropped_total() - dropped_before, 3);

    transport.shutdown();
    transport.shutdown();
    transport.send(RECEIVER, vec![envelope(1, 4)]);
    assert_eq!(transport.dropped_total() - dropped_before, 4);
    receiver.expect_nothing().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_larger_than_a_batch_travels_alone() {
    /// Bigger than both the sender's batch cap and gRPC's default 4 MiB
    /// decoding limit, so it only arrives if the receiver raised its limit.
    const LARGE_BYTES: usize = 6 * 1024 * 1024;

    let mut receiver = Receiver::start(any_port()).await;
    let transport = sender(receiver.address, Arc::default());
    until_delivered(&transport, &mut receiver).await;
    let batches_before = transport.batches_sent_total();

    let mut large = envelope(4, 1);
    large.msg.set_msg_type(MessageType::MsgSnapshot);
    large.msg.mut_snapshot().data = vec![0xab; LARGE_BYTES].into();
    transport.send(
        RECEIVER,
        vec![envelope(4, 0), large.clone(), envelope(4, 2)],
    );

    let received = receiver.next(3).await;
    assert_eq!(received[0].1, envelope(4, 0));
    assert_eq!(received[1].1, large);
    assert_eq!(received[2].1, envelope(4, 2));
    assert!(transport.batches_sent_total() - batches_before >= 2);
}
