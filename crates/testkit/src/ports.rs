//! Ports for test servers: free now, below the ephemeral range, never
//! handed out twice in one process.

/// A port free on loopback now that no earlier call in this process handed
/// out (see [`free_ports`]).
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive ports free on loopback now, none of them
/// handed out before in this process (the tests of one binary run side by
/// side; a cluster once got the same port for two of its nodes).
///
/// The ports lie below the kernel's ephemeral range: a node that is
/// restarted, or started minutes after its port was picked (the fourth node
/// of the admin test), must find it still free, and a port in the ephemeral
/// range can meanwhile become the local end of any outgoing connection of
/// the machine (a CI run once failed with "node 4 did not start").
pub fn free_ports(n: u16) -> u16 {
    use rand::Rng as _;
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    assert!((1..=16).contains(&n), "{n} ports in a row");
    let (low, high) = below_ephemeral_range();
    let mut rng = rand::rng();
    for _ in 0..1_000 {
        let base = rng.random_range(low..high - n);
        let mut handed_out = HANDED_OUT.lock().unwrap();
        let all_free = (base..base + n).all(|port| {
            !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
        if all_free {
            handed_out.extend(base..base + n);
            return base;
        }
    }
    panic!("no {n} consecutive free ports in {low}..{high}");
}

/// Ports for test servers: from 10000 up to the start of the ephemeral
/// range (`net.ipv4.ip_local_port_range`, 32768 by default).
fn below_ephemeral_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > 12_000,
        "the ephemeral port range starts at {ephemeral_low}: no room for test ports below it"
    );
    (10_000, ephemeral_low)
}
